// A rank program for the direct path's attack tests (direct_attack_test.cc,
// docs/security.md "The direct path: the agent in the trainer's memory"):
//
//   kolo_direct_attack exec VICTIM READY   rank 1: granted the direct path,
//       submits an allreduce of a tensor at kTarget, keeps its connection
//       across exec (CLOEXEC cleared) and execs VICTIM (a setuid-root
//       program that puts a secret at the same address); rank 0 waits for
//       READY, then submits its half and reports what came back.
//   kolo_direct_attack victim READY        the setuid program itself.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "check_fail.h"
#include "kolo/kolo_c.h"

namespace {

int g_rank = -1;
constexpr uintptr_t kTarget = 0x5a5a00000000;
constexpr size_t kCount = size_t{1} << 19;  // 2 MiB of float32: the direct path
constexpr float kSecret = 4242.0f;

float* mapTarget() {
  void* p = ::mmap(reinterpret_cast<void*>(kTarget), kCount * sizeof(float), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  return p == reinterpret_cast<void*>(kTarget) ? static_cast<float*>(p) : nullptr;
}

bool waitFile(const std::string& path, std::chrono::seconds limit) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (::access(path.c_str(), F_OK) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The setuid program: the secret at kTarget, READY made, then 4 s in which
// it watches the secret (the agent writing the result would change it).
int victim(const std::string& ready) {
  float* t = mapTarget();
  if (t == nullptr) {
    std::printf("VICTIM cannot map: %s\n", std::strerror(errno));
    return 1;
  }
  for (size_t i = 0; i < kCount; ++i) t[i] = kSecret;
  int fd = ::open(ready.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
  if (fd >= 0) ::close(fd);
  std::this_thread::sleep_for(std::chrono::seconds(4));
  size_t changed = 0;
  for (size_t i = 0; i < kCount; ++i) changed += t[i] != kSecret;
  std::printf("VICTIM euid %d: %zu elements changed\n", static_cast<int>(::geteuid()), changed);
  return 0;
}

void keepFdsAcrossExec() {
  DIR* d = ::opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (dirent* e = ::readdir(d)) {
    int fd = std::atoi(e->d_name);
    if (fd > 2) ::fcntl(fd, F_SETFD, 0);
  }
  ::closedir(d);
}

int attack(const std::string& victim_bin, const std::string& ready) {
  float* t = mapTarget();
  if (t == nullptr)
    FAIL("mmap at 0x%lx: %s", static_cast<unsigned long>(kTarget), std::strerror(errno));
  for (size_t i = 0; i < kCount; ++i) t[i] = 1.0f;
  int64_t shape[1] = {static_cast<int64_t>(kCount)};
  // First an honest direct allreduce: the path is granted and exact.
  kolo_status_t st = kolo_allreduce("granted", t, t, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  if (st != KOLO_OK) FAIL("granted: %s", kolo_last_error());
  for (size_t i = 0; i < kCount; ++i) {
    if (t[i] != 2.0f) FAIL("granted element %zu: got %g want 2", i, t[i]);
  }
  if (g_rank == 1) {
    for (size_t i = 0; i < kCount; ++i) t[i] = 0.0f;
    kolo_handle_t h = 0;
    st = kolo_allreduce_async("exec.target", t, t, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0, &h);
    if (st != KOLO_OK) FAIL("exec.target submit: %s", kolo_last_error());
    std::printf("rank 1: submitted, exec'ing %s\n", victim_bin.c_str());
    std::fflush(stdout);
    keepFdsAcrossExec();
    ::execl(victim_bin.c_str(), victim_bin.c_str(), "victim", ready.c_str(),
            static_cast<char*>(nullptr));
    FAIL("exec %s: %s", victim_bin.c_str(), std::strerror(errno));
  }
  if (!waitFile(ready, std::chrono::seconds(20)))
    FAIL("the victim never became ready (%s)", ready.c_str());
  for (size_t i = 0; i < kCount; ++i) t[i] = 1.0f;
  st = kolo_allreduce("exec.target", t, t, 1, shape, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
  size_t secret = 0;
  for (size_t i = 0; i < kCount; ++i)
    secret += t[i] == kSecret + 1.0f;  // its secret plus this rank's 1
  std::printf("rank 0: exec.target: %s: %s; %zu elements of the victim's secret\n",
              kolo_status_string(st), st == KOLO_OK ? "" : kolo_last_error(), secret);
  kolo_shutdown();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "victim" && argc == 3) return victim(argv[2]);
  if (mode != "exec" || argc != 4) {
    std::fprintf(stderr, "usage: kolo_direct_attack exec VICTIM READY | victim READY\n");
    return 2;
  }
  if (kolo_init() != KOLO_OK) {
    std::printf("init failed: %s\n", kolo_last_error());
    return 3;
  }
  g_rank = kolo_rank();
  return attack(argv[2], argv[3]);
}
