// Unit tests of kolo-bench's pure parts: options, sizes, table, iteration
// plan and check data (the latter reduced with the agent's own kernels).
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <regex>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_options.h"
#include "bench/bench_table.h"
#include "bench/coord_load_stats.h"
#include "bench/cpu_usage.h"
#include "common/reduce.h"

namespace kolo::bench {
namespace {

TEST(BenchOptions, ParsesByteSizes) {
  EXPECT_EQ(parseByteSize("4").value(), 4u);
  EXPECT_EQ(parseByteSize("64K").value(), 65536u);
  EXPECT_EQ(parseByteSize("64k").value(), 65536u);
  EXPECT_EQ(parseByteSize("256M").value(), uint64_t{256} << 20);
  EXPECT_EQ(parseByteSize("1G").value(), uint64_t{1} << 30);
  EXPECT_EQ(parseByteSize("2MiB").value(), uint64_t{2} << 20);
  EXPECT_EQ(parseByteSize("8KB").value(), 8192u);
  EXPECT_FALSE(parseByteSize("").isOk());
  EXPECT_FALSE(parseByteSize("K").isOk());
  EXPECT_FALSE(parseByteSize("12X").isOk());
  EXPECT_FALSE(parseByteSize("-4").isOk());
  EXPECT_FALSE(parseByteSize("99999999999999999999").isOk());
  EXPECT_EQ(formatByteSize(4), "4");
  EXPECT_EQ(formatByteSize(65536), "64K");
  EXPECT_EQ(formatByteSize(uint64_t{256} << 20), "256M");
}

TEST(BenchOptions, Defaults) {
  auto o = parseBenchArgs({});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->min_bytes, 4u);
  EXPECT_EQ(o->max_bytes, uint64_t{256} << 20);
  EXPECT_EQ(o->step_factor, 2.0);
  EXPECT_EQ(o->dtype, DataType::kFloat32);
  EXPECT_EQ(o->op, ReduceOp::kSum);
  EXPECT_EQ(o->warmup_iters, 5);
  EXPECT_EQ(o->iters, 20);
  EXPECT_TRUE(o->check);
  EXPECT_FALSE(o->zero_copy);
  EXPECT_EQ(o->op_kind, OpKind::kAllreduce);
}

TEST(BenchOptions, ShortAndLongFlags) {
  auto o = parseBenchArgs(
      {"-b",          "8",    "-e",        "64K",    "-f",          "4",  "-d", "bfloat16",
       "-o",          "max",  "-w",        "1",      "-n",          "3",  "-c", "0",
       "--zero-copy", "--op", "allreduce", "--json", "/tmp/x.json", "-T", "0"});
  ASSERT_TRUE(o.isOk()) << o.status().toString();
  EXPECT_EQ(o->min_bytes, 8u);
  EXPECT_EQ(o->max_bytes, 65536u);
  EXPECT_EQ(o->step_factor, 4.0);
  EXPECT_EQ(o->dtype, DataType::kBFloat16);
  EXPECT_EQ(o->op, ReduceOp::kMax);
  EXPECT_EQ(o->warmup_iters, 1);
  EXPECT_EQ(o->iters, 3);
  EXPECT_FALSE(o->check);
  EXPECT_TRUE(o->zero_copy);
  EXPECT_EQ(o->json_path, "/tmp/x.json");
  EXPECT_EQ(o->max_time_s, 0.0);

  auto l = parseBenchArgs({"--minbytes", "1K", "--maxbytes", "1M", "--stepfactor", "2", "--dtype",
                           "half", "--redop", "avg", "--warmup-iters", "0", "--iters", "7",
                           "--check", "1"});
  ASSERT_TRUE(l.isOk()) << l.status().toString();
  EXPECT_EQ(l->min_bytes, 1024u);
  EXPECT_EQ(l->dtype, DataType::kFloat16);
  EXPECT_EQ(l->op, ReduceOp::kAverage);
  EXPECT_EQ(l->warmup_iters, 0);
  EXPECT_EQ(l->iters, 7);
}

TEST(BenchOptions, EveryDtypeAndOp) {
  for (const char* d :
       {"float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64"}) {
    auto o = parseBenchArgs({"-d", d});
    ASSERT_TRUE(o.isOk()) << d;
    EXPECT_EQ(dataTypeName(o->dtype), d);
  }
  for (const char* op : {"sum", "average", "min", "max", "product"}) {
    auto o = parseBenchArgs({"-o", op});
    ASSERT_TRUE(o.isOk()) << op;
    EXPECT_EQ(reduceOpName(o->op), op);
  }
}

TEST(BenchOptions, RejectsBadInput) {
  EXPECT_FALSE(parseBenchArgs({"-d", "complex64"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-o", "adasum"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-b", "1M", "-e", "1K"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-b", "0"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-f", "1"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-n", "0"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"-c", "2"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"--no-such-flag"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"--op-kind", "gossip"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"--compute-ms", "-1"}).isOk());
  EXPECT_EQ(parseBenchArgs({"--compute-ms", "250.5"}).value().compute_ms, 250.5);
  EXPECT_EQ(parseBenchArgs({}).value().compute_ms, 0.0);
  auto help = parseBenchArgs({"--help"});
  ASSERT_TRUE(help.isOk());
  EXPECT_TRUE(help->help);
  EXPECT_NE(help->help_text.find("--zero-copy"), std::string::npos);
}

TEST(BenchOptions, EveryCollective) {
  for (OpKind k : kAllOpKinds) {
    auto o = parseBenchArgs({"--op", std::string(opKindName(k))});
    ASSERT_TRUE(o.isOk()) << opKindName(k) << ": " << o.status().toString();
    EXPECT_EQ(o->op_kind, k);
  }
  EXPECT_EQ(parseBenchArgs({"--op-kind", "barrier"}).value().op_kind, OpKind::kBarrier);
  EXPECT_EQ(parseBenchArgs({"--op", "AllGather"}).value().op_kind, OpKind::kAllgather);
  EXPECT_TRUE(opKindReduces(OpKind::kAllreduce));
  EXPECT_TRUE(opKindReduces(OpKind::kReducescatter));
  EXPECT_FALSE(opKindReduces(OpKind::kAllgather));
  EXPECT_FALSE(opKindReduces(OpKind::kBarrier));
  auto b = parseBenchArgs({"--op", "broadcast", "--root", "3"});
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(b->root, 3);
  EXPECT_EQ(parseBenchArgs({}).value().root, 0);
}

TEST(BenchOptions, CollectiveErrors) {
  // --op used to be the reduction: a reduction name says where it went.
  auto red = parseBenchArgs({"--op", "sum"});
  ASSERT_FALSE(red.isOk());
  EXPECT_EQ(red.status().message(),
            "unknown --op 'sum' (allreduce allgather broadcast alltoall reducescatter barrier; "
            "--op names the collective, the reduction is -o/--redop)");
  auto bad = parseBenchArgs({"--op", "gossip"});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(),
            "unknown --op 'gossip' (allreduce allgather broadcast alltoall reducescatter barrier)");
  auto inplace = parseBenchArgs({"--op", "allgather", "--inplace"});
  ASSERT_FALSE(inplace.isOk());
  EXPECT_NE(inplace.status().message().find("--inplace is for --op allreduce"), std::string::npos);
  EXPECT_TRUE(parseBenchArgs({"--op", "allreduce", "--inplace"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"--root", "-1"}).isOk());
  EXPECT_FALSE(parseBenchArgs({"--op", "alltoall", "--model-step", "x.txt"}).isOk());
}

// --device: cuda or host-emulated; broadcast takes --inplace there; not for
// barrier or --model-step.
TEST(BenchOptions, DeviceMode) {
  auto d = parseBenchArgs({"--device", "host-emulated", "--op", "broadcast", "--inplace"});
  ASSERT_TRUE(d.isOk()) << d.status().message();
  EXPECT_EQ(d->device, "host-emulated");
  EXPECT_TRUE(d->in_place);
  EXPECT_TRUE(parseBenchArgs({"--device", "cuda", "--zero-copy"}).isOk());
  EXPECT_TRUE(parseBenchArgs({}).isOk() && parseBenchArgs({})->device.empty());
  auto bad = parseBenchArgs({"--device", "rocm"});
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message(), "unknown --device 'rocm' (cuda host-emulated)");
  auto barrier = parseBenchArgs({"--device", "cuda", "--op", "barrier"});
  ASSERT_FALSE(barrier.isOk());
  EXPECT_EQ(barrier.status().message(),
            "--device is for the collectives with data (not barrier, not --model-step)");
  EXPECT_FALSE(parseBenchArgs({"--op", "broadcast", "--inplace"}).isOk());  // host: always in place
}

// nccl-tests' size per op: the n-part ops round to n elements (at least n).
TEST(BenchOptions, OpMessageSizes) {
  using V = std::vector<OpSize>;
  EXPECT_EQ(opMessageSizes(OpKind::kAllreduce, 4, 4, 64, 2.0, 4),
            (V{{4, 1}, {8, 2}, {16, 4}, {32, 8}, {64, 16}}));
  EXPECT_EQ(opMessageSizes(OpKind::kBroadcast, 4, 4, 16, 2.0, 4), (V{{4, 1}, {8, 2}, {16, 4}}));
  EXPECT_EQ(opMessageSizes(OpKind::kAllgather, 4, 4, 64, 2.0, 4), (V{{16, 1}, {32, 2}, {64, 4}}));
  EXPECT_EQ(opMessageSizes(OpKind::kAlltoall, 2, 4, 32, 2.0, 4), (V{{8, 1}, {16, 2}, {32, 4}}));
  EXPECT_EQ(opMessageSizes(OpKind::kReducescatter, 3, 4, 64, 2.0, 4),
            (V{{12, 1}, {24, 2}, {60, 5}}));
  EXPECT_EQ(opMessageSizes(OpKind::kAllgather, 2, 1024, 1024, 2.0, 2), (V{{1024, 256}}));
  EXPECT_EQ(opMessageSizes(OpKind::kBarrier, 4, 4, 1u << 20, 2.0, 4), (V{{0, 0}}));
}

TEST(BenchOptions, MessageSizes) {
  auto s = messageSizes(4, 256u << 20, 2.0, 4);
  ASSERT_EQ(s.size(), 27u);
  EXPECT_EQ(s.front(), 4u);
  EXPECT_EQ(s.back(), uint64_t{256} << 20);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_EQ(s[i], 2 * s[i - 1]);
  // Rounded to whole elements, at least one, no duplicates.
  EXPECT_EQ(messageSizes(4, 64, 2.0, 8), (std::vector<uint64_t>{8, 16, 32, 64}));
  EXPECT_EQ(messageSizes(6, 30, 2.0, 4), (std::vector<uint64_t>{4, 12, 24}));
  EXPECT_EQ(messageSizes(1, 4, 1.1, 1), (std::vector<uint64_t>{1, 2, 3, 4}));
  EXPECT_EQ(messageSizes(64, 64, 2.0, 4), (std::vector<uint64_t>{64}));
}

// Every row's columns end where the header's column names end.
TEST(BenchTable, RowsLineUpWithTheHeader) {
  std::string header = kTableHeader;
  EXPECT_EQ(header,
            "#       size         count      type   redop    time(us)   algbw(GB/s)   busbw(GB/s)  "
            "#wrong    cpu-s/GB");
  auto ends = [](const std::string& s) {
    std::vector<size_t> out;
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] != ' ' && (i + 1 == s.size() || s[i + 1] == ' ')) out.push_back(i + 1);
    }
    return out;
  };
  std::vector<size_t> want = ends(header);
  want.erase(want.begin());  // the leading "#"
  Row r;
  r.bytes = 268435456;
  r.count = 67108864;
  r.type = "bfloat16";
  r.redop = "average";
  r.time_us = 123456.78;
  r.algbw = 2.17;
  r.busbw = 3.26;
  r.wrong = 0;
  r.cpu_per_gb = 12345.678;
  EXPECT_EQ(ends(formatRow(r)), want);
  EXPECT_NE(formatRow(r).find(" 1.235e+04"), std::string::npos);
  r.cpu_per_gb = 0.5;
  EXPECT_EQ(ends(formatRow(r)), want);
  r.wrong.reset();
  r.cpu_per_gb.reset();
  std::string na = formatRow(r);
  EXPECT_EQ(ends(na), want);
  EXPECT_NE(na.find("N/A"), std::string::npos);
  EXPECT_EQ(formatRow(r).substr(0, 12), "   268435456");
}

TEST(CpuUsage, PerGigabyte) {
  EXPECT_DOUBLE_EQ(cpuSecondsPerGB(2.0, 1000000000, 1), 2.0);
  EXPECT_DOUBLE_EQ(cpuSecondsPerGB(1.0, 16 << 20, 20), 1.0 / (16.0 * (1 << 20) * 20 / 1e9));
  EXPECT_DOUBLE_EQ(cpuSecondsPerGB(1.0, 0, 20), 0.0);
}

TEST(CpuUsage, OwnAndOtherProcessesClocks) {
  double self0 = selfCpuSeconds();
  volatile double x = 0;
  for (int i = 0; i < 20000000; ++i) x = x + i * 1e-9;
  EXPECT_GT(selfCpuSeconds(), self0);
  auto mine = processCpuSeconds(::getpid());
  ASSERT_TRUE(mine.has_value());
  EXPECT_GT(*mine, 0.0);
  // A pid that cannot exist (above pid_max's ceiling).
  EXPECT_FALSE(processCpuSeconds(1 << 23).has_value());
}

// The agent is found as the process holding its listening socket.
TEST(CpuUsage, FindsTheSocketOwner) {
  std::string path = "/tmp/kolo-bench-test-" + std::to_string(::getpid()) + ".sock";
  ::unlink(path.c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  auto owner = socketOwnerPid(path);
  ::close(fd);
  ::unlink(path.c_str());
  ASSERT_TRUE(owner.has_value());
  EXPECT_EQ(*owner, ::getpid());
  EXPECT_FALSE(socketOwnerPid(path + ".none").has_value());
}

TEST(BenchTable, Bandwidth) {
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAllreduce, 2), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAllreduce, 4), 1.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAllreduce, 1), 0.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAllgather, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kReducescatter, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAlltoall, 4), 0.75);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kBroadcast, 4), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kBroadcast, 1), 1.0);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kAllgather, 2), 0.5);
  EXPECT_DOUBLE_EQ(busBandwidthFactor(OpKind::kBarrier, 4), 0.0);
  EXPECT_DOUBLE_EQ(algBandwidth(1000000000, 0.5), 2.0);
  EXPECT_DOUBLE_EQ(algBandwidth(100, 0), 0.0);
  std::vector<Row> rows(2);
  rows[0].busbw = 1;
  rows[1].busbw = 3;
  EXPECT_DOUBLE_EQ(averageBusBandwidth(rows), 2.0);
  EXPECT_DOUBLE_EQ(averageBusBandwidth({}), 0.0);
}

TEST(BenchTable, Median) {
  EXPECT_DOUBLE_EQ(median({}), 0.0);
  EXPECT_DOUBLE_EQ(median({5}), 5.0);
  EXPECT_DOUBLE_EQ(median({9, 1, 5}), 5.0);
  EXPECT_DOUBLE_EQ(median({4, 1, 3, 2}), 2.5);
  EXPECT_DOUBLE_EQ(median({1, 1000, 2, 3, 2}), 2.0);  // an outlier does not move it
}

TEST(BenchTable, IterationPlan) {
  // Fast ops: everything asked for.
  auto p = planIterations(5, 20, 0.5, 1e-5);
  EXPECT_EQ(p.warmup, 5);
  EXPECT_EQ(p.iters, 20);
  // 0.1 s per op with 0.5 s: 2 warm-ups, 5 iterations.
  p = planIterations(5, 20, 0.5, 0.1);
  EXPECT_EQ(p.warmup, 2);
  EXPECT_EQ(p.iters, 5);
  // Very slow ops: 1 warm-up, 3 iterations (never fewer than min(iters, 3)).
  p = planIterations(5, 20, 0.5, 10.0);
  EXPECT_EQ(p.warmup, 1);
  EXPECT_EQ(p.iters, 3);
  p = planIterations(5, 2, 0.5, 10.0);
  EXPECT_EQ(p.iters, 2);
  // max_time 0: never cut; warm-up 0 still runs the one that measures.
  p = planIterations(0, 20, 0, 10.0);
  EXPECT_EQ(p.warmup, 1);
  EXPECT_EQ(p.iters, 20);
}

// Reduces n ranks' check inputs with the agent's kernels (common/reduce.h,
// average as sum with post-scale 1/n, as the agent does) and verifies.
uint64_t reduceAndCount(DataType dt, ReduceOp op, int n, uint64_t count, bool corrupt) {
  CheckPattern p = CheckPattern::make(dt, op, n);
  EXPECT_TRUE(p.feasible);
  size_t es = dataTypeSize(dt);
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(count * es));
  std::vector<const void*> srcs;
  for (int r = 0; r < n; ++r) {
    fillInput(p, r, in[r].data(), count);
    srcs.push_back(in[r].data());
  }
  std::vector<unsigned char> out(count * es);
  fillValue(dt, out.data(), count, 0.0);
  void* dst = out.data();
  ReduceOp kop = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  double post = op == ReduceOp::kAverage ? 1.0 / n : 1.0;
  reduceBlocks(dt, kop, srcs.data(), n, &dst, 1, count, 1.0, post);
  if (corrupt) std::memset(out.data() + (count / 2) * es, 0, es);
  return countWrong(p, out.data(), count);
}

class CheckData : public ::testing::TestWithParam<std::tuple<DataType, ReduceOp>> {};

TEST_P(CheckData, ExactUnderTheAgentKernels) {
  auto [dt, op] = GetParam();
  for (int n : {1, 2, 3, 4, 5, 7, 8, 16}) {
    EXPECT_EQ(reduceAndCount(dt, op, n, 1003, false), 0u)
        << dataTypeName(dt) << " " << reduceOpName(op) << " n=" << n;
    EXPECT_EQ(reduceAndCount(dt, op, n, 1003, true), 1u)
        << dataTypeName(dt) << " " << reduceOpName(op) << " n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypesAndOps, CheckData,
    ::testing::Combine(::testing::Values(DataType::kFloat16, DataType::kBFloat16,
                                         DataType::kFloat32, DataType::kFloat64, DataType::kInt8,
                                         DataType::kUint8, DataType::kInt32, DataType::kInt64),
                       ::testing::Values(ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin,
                                         ReduceOp::kMax, ReduceOp::kProduct)),
    [](const auto& info) {
      return std::string(dataTypeName(std::get<0>(info.param))) + "_" +
             std::string(reduceOpName(std::get<1>(info.param)));
    });

TEST(CheckData, RanksContributeDifferentValues) {
  CheckPattern p = CheckPattern::make(DataType::kFloat32, ReduceOp::kSum, 4);
  EXPECT_TRUE(p.rank_weights);
  EXPECT_EQ(p.modulus, 7);
  EXPECT_EQ(p.input(0, 0), 1.0);
  EXPECT_EQ(p.input(3, 6), 28.0);
  EXPECT_EQ(p.expected(6), 70.0);
  // bfloat16 sums past 256 fall back to equal contributions.
  CheckPattern big = CheckPattern::make(DataType::kBFloat16, ReduceOp::kSum, 30);
  EXPECT_FALSE(big.rank_weights);
  EXPECT_TRUE(big.feasible);
  EXPECT_FALSE(CheckPattern::make(DataType::kInt8, ReduceOp::kSum, 200).feasible);
}

// Reducescatter: every rank reduces the whole n * count vector and keeps its
// block; the check of rank r's block starts at element r * count.
TEST(CheckData, ReducescatterBlocks) {
  const int n = 3;
  const uint64_t count = 10;  // not a multiple of the pattern's period
  for (DataType dt : {DataType::kFloat32, DataType::kBFloat16, DataType::kInt8}) {
    CheckPattern p = CheckPattern::make(dt, ReduceOp::kSum, n);
    size_t es = dataTypeSize(dt);
    std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(n * count * es));
    std::vector<const void*> srcs;
    for (int r = 0; r < n; ++r) {
      fillInput(p, r, in[r].data(), n * count);
      srcs.push_back(in[r].data());
    }
    std::vector<unsigned char> out(n * count * es);
    void* dst = out.data();
    reduceBlocks(dt, ReduceOp::kSum, srcs.data(), n, &dst, 1, n * count, 1.0, 1.0);
    for (int r = 0; r < n; ++r) {
      const unsigned char* block = out.data() + r * count * es;
      EXPECT_EQ(countWrong(p, block, count, r * count), 0u) << dataTypeName(dt) << " r=" << r;
      // Another rank's block (or the right block checked from 0) is wrong.
      if (r > 0) {
        EXPECT_GT(countWrong(p, block, count, 0), 0u) << dataTypeName(dt);
      }
    }
  }
}

const DataType kAllTypes[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32,
                              DataType::kFloat64, DataType::kInt8,     DataType::kUint8,
                              DataType::kInt32,   DataType::kInt64};

TEST(CheckData, MovedValuesAreExactInEveryType) {
  for (DataType dt : kAllTypes) {
    EXPECT_EQ(movedPeriod(dt), dt == DataType::kInt8 ? 127 : 251) << dataTypeName(dt);
    const uint64_t count = 700;  // more than two periods
    std::vector<unsigned char> buf(count * dataTypeSize(dt));
    fillMoved(dt, 5, 2, buf.data(), count);
    EXPECT_EQ(countWrongMoved(dt, 5, 2, buf.data(), count), 0u) << dataTypeName(dt);
    EXPECT_EQ(movedValue(dt, 0, 0, 0), 1.0);
    EXPECT_EQ(movedValue(dt, 1, 0, 0), 4.0);
    EXPECT_EQ(movedValue(dt, 0, 1, 0), 6.0);
    // Another source or destination does not match anywhere.
    EXPECT_EQ(countWrongMoved(dt, 4, 2, buf.data(), count), count) << dataTypeName(dt);
    EXPECT_EQ(countWrongMoved(dt, 5, 1, buf.data(), count), count) << dataTypeName(dt);
  }
}

// Allgather of n ranks' inputs, concatenated in rank order: the reference
// accepts it, and rejects swapped blocks and a poisoned element.
TEST(CheckData, AllgatherReference) {
  for (DataType dt : kAllTypes) {
    const int n = 4;
    const uint64_t count = 33;
    const size_t es = dataTypeSize(dt);
    std::vector<unsigned char> out(n * count * es);
    for (int r = 0; r < n; ++r) fillMoved(dt, r, 0, out.data() + r * count * es, count);
    auto wrong = [&] {
      uint64_t w = 0;
      for (int s = 0; s < n; ++s)
        w += countWrongMoved(dt, s, 0, out.data() + s * count * es, count);
      return w;
    };
    EXPECT_EQ(wrong(), 0u) << dataTypeName(dt);
    std::swap_ranges(out.begin(), out.begin() + count * es, out.begin() + count * es);
    EXPECT_EQ(wrong(), 2 * count) << dataTypeName(dt);
    std::swap_ranges(out.begin(), out.begin() + count * es, out.begin() + count * es);
    fillValue(dt, out.data() + (2 * count + 7) * es, 1, 0.0);
    EXPECT_EQ(wrong(), 1u) << dataTypeName(dt);
  }
}

// Alltoall: rank r receives block r of every rank's input, in source order.
TEST(CheckData, AlltoallReference) {
  const DataType dt = DataType::kFloat32;
  const int n = 3;
  const uint64_t count = 20;
  std::vector<std::vector<float>> send(n, std::vector<float>(n * count));
  for (int s = 0; s < n; ++s) {
    for (int d = 0; d < n; ++d) fillMoved(dt, s, d, send[s].data() + d * count, count);
  }
  for (int r = 0; r < n; ++r) {
    std::vector<float> recv(n * count);
    for (int s = 0; s < n; ++s) {
      std::copy_n(send[s].begin() + r * count, count, recv.begin() + s * count);
    }
    for (int s = 0; s < n; ++s) {
      EXPECT_EQ(countWrongMoved(dt, s, r, recv.data() + s * count, count), 0u);
      // What s sent to the next rank is not what r had to receive.
      EXPECT_EQ(countWrongMoved(dt, s, (r + 1) % n, recv.data() + s * count, count), count);
    }
  }
}

TEST(CheckData, NanIsWrong) {
  CheckPattern p = CheckPattern::make(DataType::kFloat32, ReduceOp::kSum, 2);
  std::vector<float> out(10);
  for (int i = 0; i < 10; ++i) out[i] = static_cast<float>(p.expected(i));
  EXPECT_EQ(countWrong(p, out.data(), 10), 0u);
  out[3] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(countWrong(p, out.data(), 10), 1u);
}

TEST(CoordLoadStats, PercentilesByNearestRank) {
  std::vector<double> v;
  for (int i = 1; i <= 100; ++i) v.push_back(i);
  EXPECT_EQ(percentile(v, 50), 50);
  EXPECT_EQ(percentile(v, 99), 99);
  EXPECT_EQ(percentile({7}, 99), 7);
  EXPECT_EQ(percentile({}, 50), 0);
  Samples s;
  s.add(2);
  s.add(1);
  s.add(3);
  Summary sum = s.summary();
  EXPECT_EQ(sum.count, 3u);
  EXPECT_EQ(sum.p50, 2);
  EXPECT_EQ(sum.max, 3);
}

TEST(CoordLoadStats, RowHasOneColumnPerHeaderField) {
  CaseRow row;
  row.agents = 4096;
  row.jobs = 512;
  row.lease_ms = 5000;
  row.seal = {10, 1.5, 20.25, 30};
  std::string line = formatCaseRow(row);
  EXPECT_NE(line.find("4096"), std::string::npos);
  EXPECT_NE(line.find("20.2"), std::string::npos);
  EXPECT_NE(line.find(" yes"), std::string::npos);
  row.failure = "x";
  EXPECT_NE(formatCaseRow(row).find(" NO"), std::string::npos);
}

}  // namespace
}  // namespace kolo::bench
