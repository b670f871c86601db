// C ABI behaviour that needs no agent. Built twice: against the static
// library (kolo_client_tests) and against libkolo.so (kolo_client_abi_tests).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "kolo/kolo_c.h"
#include "test_env.h"

namespace {

using kolo::testing::ScopedEnv;
using kolo::testing::TempDir;

bool contains(const char* haystack, const std::string& needle) {
  return std::string(haystack).find(needle) != std::string::npos;
}

TEST(CApi, StatusStrings) {
  EXPECT_STREQ(kolo_status_string(KOLO_OK), "KOLO_OK");
  EXPECT_STREQ(kolo_status_string(KOLO_IN_PROGRESS), "KOLO_IN_PROGRESS");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_INVALID_ARGUMENT), "KOLO_ERR_INVALID_ARGUMENT");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_UNAVAILABLE), "KOLO_ERR_UNAVAILABLE");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_TIMED_OUT), "KOLO_ERR_TIMED_OUT");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_ABORTED), "KOLO_ERR_ABORTED");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_PEER_FAILURE), "KOLO_ERR_PEER_FAILURE");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_MEMBERSHIP_CHANGED), "KOLO_ERR_MEMBERSHIP_CHANGED");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_INTERNAL), "KOLO_ERR_INTERNAL");
  EXPECT_STREQ(kolo_status_string(KOLO_ERR_PERMISSION_DENIED), "KOLO_ERR_PERMISSION_DENIED");
  EXPECT_STREQ(kolo_status_string(static_cast<kolo_status_t>(77)), "KOLO_ERR_UNKNOWN");
}

TEST(CApi, DtypeSizes) {
  EXPECT_EQ(kolo_dtype_size(KOLO_FLOAT16), 2u);
  EXPECT_EQ(kolo_dtype_size(KOLO_BFLOAT16), 2u);
  EXPECT_EQ(kolo_dtype_size(KOLO_FLOAT32), 4u);
  EXPECT_EQ(kolo_dtype_size(KOLO_FLOAT64), 8u);
  EXPECT_EQ(kolo_dtype_size(KOLO_INT8), 1u);
  EXPECT_EQ(kolo_dtype_size(KOLO_UINT8), 1u);
  EXPECT_EQ(kolo_dtype_size(KOLO_INT32), 4u);
  EXPECT_EQ(kolo_dtype_size(KOLO_INT64), 8u);
  EXPECT_EQ(kolo_dtype_size(static_cast<kolo_dtype_t>(8)), 0u);
  EXPECT_EQ(kolo_dtype_size(static_cast<kolo_dtype_t>(-1)), 0u);
}

TEST(CApi, EverythingFailsCleanlyBeforeInit) {
  EXPECT_EQ(kolo_is_initialized(), 0);
  EXPECT_EQ(kolo_rank(), -1);
  EXPECT_EQ(kolo_size(), -1);
  EXPECT_EQ(kolo_local_rank(), -1);
  EXPECT_EQ(kolo_local_size(), -1);
  EXPECT_EQ(kolo_cross_rank(), -1);
  EXPECT_EQ(kolo_cross_size(), -1);

  float x = 1;
  int64_t shape[1] = {1};
  kolo_handle_t h = 99;
  EXPECT_EQ(kolo_allreduce_async("x", &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, 0u);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_init")) << kolo_last_error();
  EXPECT_EQ(kolo_last_status(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kolo_allreduce("x", &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kolo_poll(1), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kolo_synchronize(1, 0), KOLO_ERR_INVALID_ARGUMENT);
  kolo_release(1);  // harmless
  EXPECT_EQ(kolo_alloc_shared(64), nullptr);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_init")) << kolo_last_error();
  kolo_free_shared(nullptr);
  EXPECT_EQ(kolo_shutdown(), KOLO_OK);  // idempotent, also before init
  EXPECT_EQ(kolo_allreduce_async("x", &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, nullptr),
            KOLO_ERR_INVALID_ARGUMENT);
}

TEST(CApi, IssueFiveCallsFailCleanlyBeforeInit) {
  float x = 1, y = 0;
  int64_t shape[1] = {1};
  int last = 7;
  EXPECT_EQ(kolo_join(0, &last), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(last, -1);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_init")) << kolo_last_error();
  kolo_handle_t h = 99;
  EXPECT_EQ(kolo_broadcast_oop_async("x", &x, &y, 1, shape, KOLO_FLOAT32, 0, &h), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, 0u);
  EXPECT_EQ(kolo_broadcast_oop("x", &x, &y, 1, shape, KOLO_FLOAT32, 0), KOLO_ERR_INVALID_ARGUMENT);
  h = 99;
  EXPECT_EQ(kolo_allreduce_compressed_async("x", &x, &y, 1, shape, KOLO_SUM, 1, 1, KOLO_COMPRESS_FP16, &h),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(h, 0u);
  EXPECT_EQ(kolo_allreduce_compressed("x", &x, &y, 1, shape, KOLO_SUM, 1, 1, KOLO_COMPRESS_BF16),
            KOLO_ERR_INVALID_ARGUMENT);
  const char* names[1] = {"x"};
  const void* ins[1] = {&x};
  void* outs[1] = {&y};
  int ndims[1] = {1};
  const int64_t* shapes[1] = {shape};
  kolo_dtype_t dts[1] = {KOLO_FLOAT32};
  kolo_handle_t hs[1] = {99};
  EXPECT_EQ(kolo_grouped_allreduce_async(1, names, ins, outs, ndims, shapes, dts, KOLO_SUM, 1, 1, hs),
            KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(hs[0], 0u);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_init")) << kolo_last_error();
  EXPECT_EQ(kolo_grouped_allreduce(1, names, ins, outs, ndims, shapes, dts, KOLO_SUM, 1, 1), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kolo_grouped_allreduce_async(1, names, ins, outs, ndims, shapes, dts, KOLO_SUM, 1, 1, nullptr),
            KOLO_ERR_INVALID_ARGUMENT);
}

TEST(CApi, LastErrorIsPerThread) {
  float x = 1;
  int64_t shape[1] = {1};
  kolo_handle_t h;
  ASSERT_NE(kolo_allreduce_async("x", &x, &x, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1, 1, &h), KOLO_OK);
  std::string other;
  std::thread([&] { other = kolo_last_error(); }).join();
  EXPECT_EQ(other, "");
  EXPECT_NE(std::string(kolo_last_error()), "");
}

TEST(CApi, MissingJobIdSaysWhichVariableAndKolorun) {
  TempDir dir;
  ScopedEnv env;
  env.setJob(dir.path() + "/agent.sock");
  env.unset("KOLO_JOB_ID");
  EXPECT_EQ(kolo_init(), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_JOB_ID")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "kolorun")) << kolo_last_error();
  EXPECT_EQ(kolo_is_initialized(), 0);
}

TEST(CApi, UnreachableAgentFailsWithinTheStartTimeout) {
  TempDir dir;
  ASSERT_TRUE(dir.valid());
  ScopedEnv env;
  std::string path = dir.path() + "/nobody-listens.sock";
  env.setJob(path);
  env.set("KOLO_START_TIMEOUT", "1");
  auto start = std::chrono::steady_clock::now();
  kolo_status_t s = kolo_init();
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_EQ(s, KOLO_ERR_UNAVAILABLE);
  EXPECT_LT(took, std::chrono::seconds(3));
  EXPECT_GE(took, std::chrono::milliseconds(900));  // it kept retrying meanwhile
  EXPECT_TRUE(contains(kolo_last_error(), path)) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "kolo-agent --socket " + path)) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "kolorun")) << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_AGENT_SOCKET")) << kolo_last_error();
  EXPECT_EQ(kolo_is_initialized(), 0);
}

TEST(CApi, StaleSocketFileIsRetriedThenUnavailable) {
  // A socket file with nobody listening (an agent that died): ECONNREFUSED.
  TempDir dir;
  ASSERT_TRUE(dir.valid());
  std::string path = dir.path() + "/stale.sock";
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
  ScopedEnv env;
  env.setJob(path);
  env.set("KOLO_START_TIMEOUT", "1");
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(kolo_init(), KOLO_ERR_UNAVAILABLE);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  EXPECT_TRUE(contains(kolo_last_error(), "Connection refused")) << kolo_last_error();
}

}  // namespace

namespace {

// C ABI revision 2: the calling thread's CUDA stream (kolo_c.h). No GPU
// needed: the stream is only recorded here, and used by device collectives.
// C ABI revision 3: zero copy on the device, before kolo_init (the calls
// with a device arena run in tests/gpu/device_seam_test.cc, SeamZeroCopy).
TEST(CApiDeviceAlloc, BeforeInitAndBadArgumentsAreRefusedWithTheirText) {
  EXPECT_GE(KOLO_ABI_VERSION, 3);
  EXPECT_EQ(kolo_device_alloc(64, nullptr), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_STREQ(kolo_last_error(), "kolo_device_alloc: ptr is NULL");
  int x = 0;
  void* p = &x;
  EXPECT_EQ(kolo_device_alloc(64, &p), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(p, nullptr);
  EXPECT_NE(std::string(kolo_last_error()).find("has not been initialized"), std::string::npos)
      << kolo_last_error();
  EXPECT_EQ(kolo_device_free(nullptr), KOLO_OK);
  EXPECT_EQ(kolo_device_free(&x), KOLO_ERR_INVALID_ARGUMENT);
}

TEST(CApiStream, DefaultIsTheLegacyStreamOnAnyDevice) {
  EXPECT_GE(KOLO_ABI_VERSION, 2);
  kolo_stream_t s = KOLO_STREAM_INIT;
  s.device = 7;
  s.stream = &s;
  ASSERT_EQ(kolo_get_stream(&s), KOLO_OK) << kolo_last_error();
  EXPECT_EQ(s.device, KOLO_DEVICE_ANY);
  EXPECT_EQ(s.stream, nullptr);
}

TEST(CApiStream, SetGetAndResetArePerThread) {
  int fake_stream = 0;  // never dereferenced
  kolo_stream_t s = KOLO_STREAM_INIT;
  s.device = 0;
  s.stream = &fake_stream;
  ASSERT_EQ(kolo_set_stream(&s), KOLO_OK) << kolo_last_error();
  kolo_stream_t got = KOLO_STREAM_INIT;
  ASSERT_EQ(kolo_get_stream(&got), KOLO_OK);
  EXPECT_EQ(got.device, 0);
  EXPECT_EQ(got.stream, &fake_stream);
  // Another thread still has the default.
  kolo_stream_t other = KOLO_STREAM_INIT;
  other.device = 3;
  kolo_status_t other_st = KOLO_ERR_INTERNAL;
  std::thread([&] { other_st = kolo_get_stream(&other); }).join();
  EXPECT_EQ(other_st, KOLO_OK);
  EXPECT_EQ(other.device, KOLO_DEVICE_ANY);
  EXPECT_EQ(other.stream, nullptr);
  // NULL resets this thread's.
  ASSERT_EQ(kolo_set_stream(nullptr), KOLO_OK);
  ASSERT_EQ(kolo_get_stream(&got), KOLO_OK);
  EXPECT_EQ(got.device, KOLO_DEVICE_ANY);
  EXPECT_EQ(got.stream, nullptr);
}

TEST(CApiStream, BadArgumentsAreRefusedWithTheirText) {
  kolo_stream_t s = KOLO_STREAM_INIT;
  s.struct_size = 4;
  EXPECT_EQ(kolo_set_stream(&s), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_set_stream: struct_size is 4; a kolo_stream_t has at least"))
      << kolo_last_error();
  EXPECT_TRUE(contains(kolo_last_error(), "KOLO_STREAM_INIT")) << kolo_last_error();
  EXPECT_EQ(kolo_get_stream(&s), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kolo_get_stream(nullptr), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_get_stream: s is NULL")) << kolo_last_error();

  s = KOLO_STREAM_INIT;
  s.device = -2;
  EXPECT_EQ(kolo_set_stream(&s), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "device is -2; it must be a CUDA device ordinal or KOLO_DEVICE_ANY"))
      << kolo_last_error();

  // A struct from a later revision: larger, with its unknown fields zero,
  // is accepted; with one set, refused (never silently ignored).
  struct Later {
    kolo_stream_t v2;
    int64_t future;
  } later{};
  later.v2 = KOLO_STREAM_INIT;
  later.v2.struct_size = sizeof later;
  later.v2.device = 1;
  EXPECT_EQ(kolo_set_stream(&later.v2), KOLO_OK) << kolo_last_error();
  later.future = 5;
  EXPECT_EQ(kolo_set_stream(&later.v2), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kolo_last_error(), "does not know")) << kolo_last_error();
  // A refused call leaves the thread's stream as it was.
  kolo_stream_t got = KOLO_STREAM_INIT;
  ASSERT_EQ(kolo_get_stream(&got), KOLO_OK);
  EXPECT_EQ(got.device, 1);
  EXPECT_EQ(kolo_set_stream(nullptr), KOLO_OK);
}

TEST(CApiStream, DevicePathNeedsInit) {
  int device = 5;
  EXPECT_EQ(kolo_device_path(&device), KOLO_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(device, -1);
  EXPECT_TRUE(contains(kolo_last_error(), "kolo_init")) << kolo_last_error();
  EXPECT_EQ(kolo_device_path(nullptr), KOLO_ERR_INVALID_ARGUMENT);
}

}  // namespace
