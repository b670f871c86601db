// The direct path's building blocks: cross-memory reads and writes
// (agent/core/cross_memory.h) and reduceRange over remote sources and
// destinations (agent/core/local_executor.h), against this test process
// and a child, so every kernel answer is real.
#include "agent/core/cross_memory.h"

#include <gtest/gtest.h>
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

TEST(CrossMemory, ReadsAndWritesAProcessExactly) {
  std::vector<char> src(3 << 20), dst(3 << 20, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 7 + 1);
  ASSERT_TRUE(readRemote(::getpid(), addr(src.data() + 1), dst.data(), src.size() - 1).isOk());
  EXPECT_EQ(std::memcmp(dst.data(), src.data() + 1, src.size() - 1), 0);
  std::vector<char> back(src.size(), 0);
  ASSERT_TRUE(writeRemote(::getpid(), addr(back.data()), src.data(), src.size()).isOk());
  EXPECT_EQ(back, src);
}

TEST(CrossMemory, ErrorsNameTheRangeThePidAndTheCause) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  void* none = ::mmap(nullptr, page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(none, MAP_FAILED);
  char buf[64];
  Status st = readRemote(::getpid(), addr(none), buf, sizeof buf);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("of pid " + std::to_string(::getpid())), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("not mapped or not readable"), std::string::npos) << st.message();
  void* ro = ::mmap(nullptr, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  st = writeRemote(::getpid(), addr(ro), buf, sizeof buf);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_NE(st.message().find("not mapped or not writable"), std::string::npos) << st.message();
  st = readRemote(::getpid(), UINT64_MAX - 8, buf, sizeof buf);
  EXPECT_NE(st.message().find("wraps around"), std::string::npos) << st.message();
  ::munmap(none, page);
  ::munmap(ro, page);
  // A process that is gone.
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ASSERT_GT(child, 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  st = readRemote(child, addr(buf), buf, sizeof buf);
  EXPECT_EQ(st.code(), Code::kUnavailable) << st.toString();
  EXPECT_NE(st.message().find("the process is gone"), std::string::npos) << st.message();
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
  r.remote_slots = {{::getpid(), addr(remote[0].data())}, {::getpid(), addr(remote[1].data())}};
  r.remote_dsts = {{::getpid(), addr(remote[0].data())}, {::getpid(), addr(remote[1].data())}};
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
  r.remote_slots = {{}, {::getpid(), addr(none)}};
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
