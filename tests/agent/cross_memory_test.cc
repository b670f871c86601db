// The direct path's building blocks: cross-memory reads and writes
// (agent/core/cross_memory.h) and reduceRange over remote sources and
// destinations (agent/core/local_executor.h), against this test process
// and a child, so every kernel answer is real.
#include "agent/core/cross_memory.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "agent/core/local_executor.h"
#include "common/reduce.h"

namespace kolo {
namespace {

uint64_t addr(const void* p) { return reinterpret_cast<uint64_t>(p); }

// This process, bound as the agent binds a trainer (its own ids).
std::shared_ptr<const TrainerProcess> self() {
  static char anchor = 1;
  auto p = TrainerProcess::bind(::getpid(), ::getuid(), ::getgid(), addr(&anchor));
  EXPECT_TRUE(p.isOk()) << p.status().toString();
  return p.isOk() ? *p : nullptr;
}

TEST(CrossMemory, ReadsAndWritesAProcessExactly) {
  auto me = self();
  ASSERT_NE(me, nullptr);
  std::vector<char> src(3 << 20), dst(3 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  ASSERT_TRUE(me->read(addr(src.data() + 1), dst.data(), src.size() - 1).isOk());
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 1, src.size() - 1), 0);
  std::vector<char> back(src.size(), 0);
  ASSERT_TRUE(me->write(addr(back.data()), src.data(), src.size()).isOk());
  EXPECT_EQ(back, src);
}

TEST(CrossMemory, ErrorsNameTheRangeThePidAndTheCause) {
  auto me = self();
  ASSERT_NE(me, nullptr);
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* none = ::mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  char buf[64];
  Status st = me->read(addr(none), buf, sizeof buf);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("of pid " + std::to_string(::getpid())), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not mapped or not readable"), std::string::npos) << st.message();
  void* ro = ::mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  st = me->write(addr(ro), buf, sizeof buf);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not mapped or not writable"), std::string::npos) << st.message();
  st = me->read(UINT64_MAX - 8, buf, sizeof buf);
  EXPECT_NE(st.message().find("wraps around"), std::string::npos) << st.message();
  ::munmap(none, page);
  ::munmap(ro, page);
}

// A child bound while it waits on a pipe; `then` is what it does next.
struct Child {
  pid_t pid = -1;
  int go[2] = {-1, -1};
  int ready[2] = {-1, -1};
  static char anchor;
};
char Child::anchor = 7;

Child startChild(void (*then)()) {
  Child c;
  EXPECT_EQ(::pipe(c.go), 0);
  EXPECT_EQ(::pipe(c.ready), 0);
  c.pid = ::fork();
  if (c.pid == 0) {
    char x = 0;
    (void)!::write(c.ready[1], &x, 1);
    (void)!::read(c.go[0], &x, 1);
    then();
    ::_exit(0);
  }
  char x;
  EXPECT_EQ(::read(c.ready[0], &x, 1), 1);
  return c;
}

void waitChild(Child& c) {
  int status = 0;
  ::waitpid(c.pid, &status, 0);
  for (int fd : {c.go[0], c.go[1], c.ready[0], c.ready[1]}) ::close(fd);
}

// A process that exec'd keeps its pid but not its address space: the
// binding refuses every copy from then on (even one the kernel would allow,
// the same user's new program), naming the pid.
TEST(CrossMemory, AProcessThatExecsLosesThePathForGood) {
  Child c = startChild([] { ::execl("/bin/sleep", "sleep", "5", static_cast<char*>(nullptr)); });
  auto p = TrainerProcess::bind(c.pid, ::getuid(), ::getgid(), addr(&Child::anchor));
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  char buf[1];
  ASSERT_TRUE((*p)->read(addr(&Child::anchor), buf, 1).isOk());
  EXPECT_EQ(buf[0], 7);
  char x = 0;
  ASSERT_EQ(::write(c.go[1], &x, 1), 1);
  // The exec is done once /proc/PID/exe names sleep.
  for (int i = 0; i < 500; ++i) {
    char exe[256] = {};
    ssize_t n =
        ::readlink(("/proc/" + std::to_string(c.pid) + "/exe").c_str(), exe, sizeof exe - 1);
    if (n > 0 && std::string(exe).find("sleep") != std::string::npos) break;
    ::usleep(10000);
  }
  Status st = (*p)->read(addr(&Child::anchor), buf, 1);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find("no longer has the address space it connected with"),
            std::string::npos)
      << st.message();
  st = (*p)->write(addr(&Child::anchor), buf, 1);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  ::kill(c.pid, SIGKILL);
  waitChild(c);
}

// A process that exited (still a zombie, its pid not yet free) is never
// touched again, and a pid that is free cannot be bound.
TEST(CrossMemory, AProcessThatExitedIsNeverTouchedAgain) {
  Child c = startChild([] {});
  auto p = TrainerProcess::bind(c.pid, ::getuid(), ::getgid(), addr(&Child::anchor));
  ASSERT_TRUE(p.isOk()) << p.status().toString();
  char x = 0;
  ASSERT_EQ(::write(c.go[1], &x, 1), 1);
  siginfo_t info{};
  ASSERT_EQ(::waitid(P_PID, c.pid, &info, WEXITED | WNOWAIT), 0);  // a zombie now
  char buf[1];
  Status st = (*p)->read(addr(&Child::anchor), buf, 1);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find("has exited"), std::string::npos) << st.message();
  waitChild(c);
  auto gone = TrainerProcess::bind(c.pid, ::getuid(), ::getgid(), addr(&Child::anchor));
  EXPECT_FALSE(gone.isOk());
}

// Credentials that are not the connection's on every id: refused at bind.
TEST(CrossMemory, OtherCredentialsAreRefusedAtBind) {
  static char anchor = 1;
  auto p = TrainerProcess::bind(::getpid(), ::getuid() + 1, ::getgid(), addr(&anchor));
  ASSERT_FALSE(p.isOk());
  EXPECT_EQ(p.status().code(), Code::kPermissionDenied) << p.status().toString();
  if (::geteuid() == 0) {
    EXPECT_NE(p.status().message().find("runs with uids"), std::string::npos)
        << p.status().message();
  } else {
    EXPECT_NE(p.status().message().find("cannot act with the credentials"), std::string::npos)
        << p.status().message();
  }
}

// Three sources (two "remote" in this process, one local), several chunks
// and a ragged end, in place into the remote ones and out to a local one:
// the same bits as reduceBlocks over plain pointers.
TEST(CrossMemory, DirectReduceRangeMatchesThePlainReduction) {
  const size_t n = 3 * (kDirectChunkBytes / sizeof(float)) + 77;
  std::vector<std::vector<float>> in(3, std::vector<float>(n));
  for (int j = 0; j < 3; ++j) {
    for (size_t i = 0; i < n; ++i) in[j][i] = static_cast<float>((j + 1) * (i % 101)) * 0.25f - 3.0f;
  }
  std::vector<float> want(n);
  {
    const void* s[3] = {in[0].data(), in[1].data(), in[2].data()};
    void* d[1] = {want.data()};
    reduceBlocks(DataType::kFloat32, ReduceOp::kSum, s, 3, d, 1, n, 0.5, 3.0);
  }
  std::vector<std::vector<float>> remote = {in[0], in[1]};  // read and written in place
  std::vector<float> local = in[2];
  std::vector<float> local_out(n, -1.0f);
  LocalReduce r;
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.count = n;
  r.prescale = 0.5;
  r.postscale = 3.0;
  r.slots = {nullptr, nullptr, local.data()};
  r.dsts = {nullptr, nullptr, local_out.data()};
  auto me = self();
  r.remote_slots = {{me, addr(remote[0].data())}, {me, addr(remote[1].data())}};
  r.remote_dsts = r.remote_slots;
  r.error = std::make_shared<FirstError>();
  // Two ranges, as two reduce workers would take them.
  const size_t half = n / 2 / 16 * 16;
  reduceRange(r, 0, half);
  reduceRange(r, half, n - half);
  ASSERT_TRUE(r.error->get().isOk()) << r.error->get().toString();
  EXPECT_EQ(std::memcmp(remote[0].data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(remote[1].data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(local_out.data(), want.data(), n * sizeof(float)), 0);
  EXPECT_EQ(local, in[2]);  // a local source is only read
}

TEST(CrossMemory, DirectReduceRangeRecordsTheFirstError) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t n = 4 * page / sizeof(float);
  void* none = ::mmap(nullptr, 4 * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  std::vector<float> ok(n, 1.0f);
  LocalReduce r;
  r.dtype = DataType::kFloat32;
  r.op = ReduceOp::kSum;
  r.count = n;
  r.slots = {ok.data(), nullptr};
  r.remote_slots = {{}, {self(), addr(none)}};
  r.remote_dsts = r.remote_slots;  // in place
  r.error = std::make_shared<FirstError>();
  reduceRange(r, 0, n);
  Status st = r.error->get();
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("cannot read"), std::string::npos) << st.message();
  EXPECT_EQ(ok, std::vector<float>(n, 1.0f));  // nothing written after the failed read
  ::munmap(none, 4 * page);
}

}  // namespace
}  // namespace kolo
