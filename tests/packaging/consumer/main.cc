// An external program built against an installed kolo (find_package(kolo)
// or pkg-config). It needs no agent: it checks the C ABI's pure functions
// and that kolo_init fails cleanly, with a message, when no agent is there.
#include <kolo/kolo.hpp>  // the C++ layer, which includes kolo/kolo_c.h

#include <cstdio>
#include <cstring>

int main() {
  int failures = 0;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      std::fprintf(stderr, "consumer: FAILED: %s\n", what);
      ++failures;
    }
  };
  check(std::strcmp(kolo_status_string(KOLO_OK), "KOLO_OK") == 0, "status string of KOLO_OK");
  check(std::strcmp(kolo_status_string(KOLO_ERR_TIMED_OUT), "KOLO_ERR_TIMED_OUT") == 0,
        "status string of KOLO_ERR_TIMED_OUT");
  check(kolo_dtype_size(KOLO_FLOAT16) == 2, "size of float16");
  check(kolo_dtype_size(KOLO_FLOAT32) == 4, "size of float32");
  check(kolo_dtype_size(KOLO_FLOAT64) == 8, "size of float64");
  check(kolo_dtype_size(KOLO_INT64) == 8, "size of int64");
  check(static_cast<int>(kolo::DataType::kFloat32) == KOLO_FLOAT32, "C++ enum matches the C one");
  check(KOLO_ABI_VERSION == 3, "ABI version 3");
  kolo_stream_t stream = KOLO_STREAM_INIT;
  check(kolo_get_stream(&stream) == KOLO_OK && stream.stream == nullptr, "kolo_get_stream (ABI 2): the legacy default stream");

  void* dev = &stream;
  check(kolo_device_alloc(64, &dev) == KOLO_ERR_INVALID_ARGUMENT && dev == nullptr,
        "kolo_device_alloc (ABI 3) before kolo_init");

  kolo_status_t st = kolo_init();
  const char* msg = kolo_last_error();
  std::printf("consumer: kolo_init without an agent: %s: %s\n", kolo_status_string(st),
              msg ? msg : "(null)");
  check(st == KOLO_ERR_UNAVAILABLE || st == KOLO_ERR_INVALID_ARGUMENT,
        "kolo_init fails with KOLO_ERR_UNAVAILABLE or KOLO_ERR_INVALID_ARGUMENT");
  check(msg != nullptr && std::strlen(msg) > 0, "kolo_init leaves a message");
  check(kolo_is_initialized() == 0, "not initialized after a failed init");
  check(kolo_rank() == -1, "kolo_rank is -1 when not initialized");

  if (failures == 0) std::printf("consumer: OK\n");
  return failures == 0 ? 0 : 1;
}
