// Broadcast, allgather, reducescatter, alltoall, barrier (and mismatch errors) end to end: real
// kolo-coordinator and kolo-agent binaries, rank processes running
// kolo_check, on one agent (N = 1, 2, 4) and over several agents (each agent
// acts as a node; K = 2, 3 with 1-2 local ranks each).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.h"

namespace kolo::testing {
namespace {

std::string checkBin() { return binDir() + "/kolo_check"; }

// Runs this suite's check program on every rank of a job (harness.h).
void runJob(const std::vector<int>& sizes, const std::string& job, const std::vector<std::string>& args,
            const std::string& needle, std::chrono::seconds timeout = std::chrono::seconds(180)) {
  runCheckJob(checkBin(), sizes, job, args, needle, timeout);
}

class Collectives : public ::testing::TestWithParam<std::vector<int>> {};

TEST_P(Collectives, BroadcastEveryDtypeRootAndSizeMatchesTheRoot) {
  const auto& sizes = GetParam();
  std::vector<std::string> args = {"broadcast"};
  // The 1M-element cases on one layout of each kind (they take a while on 2 cores).
  if (sizes == std::vector<int>{2} || sizes == std::vector<int>{2, 1}) args.push_back("--big");
  runJob(sizes, "bc" + layoutName(sizes), args, "broadcast checks passed");
}

TEST_P(Collectives, AllgatherConcatenatesDifferentFirstDimsInRankOrder) {
  const auto& sizes = GetParam();
  std::vector<std::string> args = {"allgather"};
  if (sizes == std::vector<int>{2} || sizes == std::vector<int>{2, 1}) args.push_back("--big");
  runJob(sizes, "ag" + layoutName(sizes), args, "allgather checks passed");
}

TEST_P(Collectives, ReducescatterEveryDtypeOpAndSplitMatchesReference) {
  const auto& sizes = GetParam();
  runJob(sizes, "rs" + layoutName(sizes), {"reducescatter"}, "reducescatter checks passed");
}

TEST_P(Collectives, AlltoallUnevenSplitsDeliverEveryBlock) {
  const auto& sizes = GetParam();
  runJob(sizes, "a2a" + layoutName(sizes), {"alltoall"}, "alltoall checks passed");
}

TEST_P(Collectives, BarrierNoRankLeavesBeforeTheLastArrives) {
  const auto& sizes = GetParam();
  runJob(sizes, "bar" + layoutName(sizes), {"barrier"}, "OK barrier never left early");
}

TEST_P(Collectives, MismatchesNameBothSidesAndJobRecovers) {
  const auto& sizes = GetParam();
  runJob(sizes, "cmm" + layoutName(sizes), {"coll-mismatch"}, "OK collective mismatch errors reported");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Collectives,
                         ::testing::Values(std::vector<int>{1}, std::vector<int>{2}, std::vector<int>{4},
                                           std::vector<int>{1, 1}, std::vector<int>{2, 1},
                                           std::vector<int>{1, 2, 1}),
                         [](const ::testing::TestParamInfo<std::vector<int>>& info) {
                           return "agents_" + layoutName(info.param);
                         });

}  // namespace
}  // namespace kolo::testing
