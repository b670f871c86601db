// The NCCL backend with one rank per process (kolo_gpu_nccl_rank), as kolo's
// agents and trainers run it: two processes on one GPU (each with its own
// NCCL_HOSTID, which NCCL needs to let two ranks of one communicator share
// a device; the trainers run under CUDA MPS), every collective bit-exact,
// and the failure cases: a peer SIGKILLed or SIGSTOPped mid-stream fails
// the other within the backend timeout, and two processes on one GPU
// without their own NCCL_HOSTID are refused with the way out. Skips
// without a GPU.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <string>

#include "agent/gpu/cuda_status.h"
#include "agent/gpu/device.h"
#include "tests/backend/peer_processes.h"
#include "tests/gpu/gpu_test_util.h"

namespace kolo {
namespace {

using Clock = PeerProcesses::Clock;
using namespace std::chrono_literals;

constexpr int kSize = 2;

bool startRanks(PeerProcesses& peers, const char* scenario, int timeout_ms, bool own_host_ids) {
  for (int r = 0; r < kSize; ++r) {
    std::map<std::string, std::string> env;
    env["NCCL_HOSTID"] = own_host_ids ? "kolo-nccl-test-" + std::to_string(r) : "kolo-nccl-test";
    if (!peers.spawn({KOLO_GPU_NCCL_RANK, peers.dir(), std::to_string(r), std::to_string(kSize),
                      scenario, std::to_string(timeout_ms)},
                     env)) {
      return false;
    }
  }
  return true;
}

TEST(NcclProcesses, TwoProcessesOnTheirGpusEveryCollectiveExact) {
  KOLO_REQUIRE_GPU();
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, "check", 60000, true));
  for (int r = 0; r < kSize; ++r) {
    int code = -1;
    ASSERT_TRUE(peers.waitExit(r, Clock::now() + 120s, &code)) << "rank " << r << ":\n"
                                                               << peers.output(r);
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << peers.output(r);
    EXPECT_NE(peers.output(r).find("OK\n"), std::string::npos) << peers.output(r);
  }
}

// A peer gone (SIGKILL: its sockets close) or stuck (SIGSTOP: they stay
// open) mid-stream: the other rank's allreduce fails with the backend's
// text within the timeout plus the poll and teardown slack, never hangs.
void peerFault(int signal, const char* text) {
  constexpr int kTimeoutMs = 3000;
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, "loop", kTimeoutMs, true));
  ASSERT_TRUE(peers.waitFor(1, "iter 3\n", Clock::now() + 60s)) << peers.output(1);
  ASSERT_EQ(::kill(peers.pid(1), signal), 0);
  const auto bound = Clock::now() + std::chrono::milliseconds(kTimeoutMs) + 5s;
  EXPECT_TRUE(peers.waitFor(0, "RESULT", bound)) << "rank 0 did not fail within timeout + 5 s:\n"
                                                 << peers.output(0);
  int code = -1;
  ASSERT_TRUE(peers.waitExit(0, Clock::now() + 15s, &code)) << peers.output(0);
  EXPECT_EQ(code, 2) << peers.output(0);
  EXPECT_NE(peers.output(0).find("nccl allreduce"), std::string::npos) << peers.output(0);
  if (text != nullptr) EXPECT_NE(peers.output(0).find(text), std::string::npos) << peers.output(0);
  ::kill(peers.pid(1), SIGKILL);
}

TEST(NcclProcesses, AKilledPeerFailsTheOtherWithinTheTimeout) {
  KOLO_REQUIRE_GPU();
  peerFault(SIGKILL, nullptr);  // NCCL's remote error or the timeout, whichever comes first
}

TEST(NcclProcesses, AStoppedPeerFailsTheOtherAtTheTimeout) {
  KOLO_REQUIRE_GPU();
  peerFault(SIGSTOP, "(a peer is missing or stuck)");
}

TEST(NcclProcesses, OneGpuWithoutTheirOwnHostIdsIsRefusedWithTheWayOut) {
  KOLO_REQUIRE_GPU();
  if (gpu::deviceCount().value() > 1) GTEST_SKIP() << "skipped: the ranks take different GPUs here";
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, "check", 20000, false));
  for (int r = 0; r < kSize; ++r) {
    int code = -1;
    ASSERT_TRUE(peers.waitExit(r, Clock::now() + 60s, &code)) << peers.output(r);
    EXPECT_EQ(code, 1) << peers.output(r);
    EXPECT_NE(peers.output(r).find("FAIL create"), std::string::npos) << peers.output(r);
  }
  // At least the rank that saw the duplicate names the way out.
  EXPECT_TRUE(peers.output(0).find("NCCL_HOSTID") != std::string::npos ||
              peers.output(1).find("NCCL_HOSTID") != std::string::npos)
      << peers.output(0) << peers.output(1);
}

}  // namespace
}  // namespace kolo
