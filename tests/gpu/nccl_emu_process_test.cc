// The NCCL backend with one rank per process (kolo_gpu_nccl_rank) over the
// host emulation of the device and of NCCL (KOLO_DEVICE=host-emulated;
// docs/gpu.md "The NCCL emulation"), on CPU machines: the real backend code
// (non-blocking init, progress thread, watchdog, abort) with 2 and 3 ranks,
// every collective bit-exact, and the failure cases with their texts and
// bounds: a SIGKILLed peer (the async error, before the timeout), a
// SIGSTOPped one (the collective's deadline), an injected NCCL async error,
// a peer that never joins (init's deadline).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <string>

#include "tests/backend/peer_processes.h"

namespace kolo {
namespace {

using Clock = PeerProcesses::Clock;
using namespace std::chrono_literals;

bool startRanks(PeerProcesses& peers, int size, int started, const char* scenario, int timeout_ms,
                const std::map<int, std::string>& faults = {}) {
  for (int r = 0; r < started; ++r) {
    std::map<std::string, std::string> env{{"KOLO_DEVICE", "host-emulated"}};
    auto f = faults.find(r);
    if (f != faults.end()) env["KOLO_NCCL_EMU_FAULTS"] = f->second;
    if (!peers.spawn({KOLO_GPU_NCCL_RANK, peers.dir(), std::to_string(r), std::to_string(size),
                      scenario, std::to_string(timeout_ms)},
                     env)) {
      return false;
    }
  }
  return true;
}

void everyCollective(int size) {
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, size, size, "check", 30000));
  for (int r = 0; r < size; ++r) {
    int code = -1;
    ASSERT_TRUE(peers.waitExit(r, Clock::now() + 100s, &code)) << "rank " << r << ":\n"
                                                               << peers.output(r);
    EXPECT_EQ(code, 0) << "rank " << r << ":\n" << peers.output(r);
    EXPECT_NE(peers.output(r).find("OK\n"), std::string::npos) << peers.output(r);
    EXPECT_NE(peers.output(r).find("THE NCCL BACKEND IS HOST-EMULATED"), std::string::npos)
        << peers.output(r);
  }
}

TEST(NcclEmuProcesses, TwoRanksEveryCollectiveExact) { everyCollective(2); }
TEST(NcclEmuProcesses, ThreeRanksEveryCollectiveExact) { everyCollective(3); }

// Rank 0's result once rank 1 got `signal` mid-stream, within `bound`.
void peerFault(int signal, int timeout_ms, std::chrono::milliseconds bound, const char* text) {
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, 2, 2, "loop", timeout_ms));
  ASSERT_TRUE(peers.waitFor(1, "iter 3\n", Clock::now() + 60s)) << peers.output(1);
  ASSERT_EQ(::kill(peers.pid(1), signal), 0);
  const auto t0 = Clock::now();
  EXPECT_TRUE(peers.waitFor(0, "RESULT", t0 + bound))
      << "rank 0 did not fail within " << bound.count() << " ms:\n"
      << peers.output(0);
  int code = -1;
  ASSERT_TRUE(peers.waitExit(0, Clock::now() + 15s, &code)) << peers.output(0);
  EXPECT_EQ(code, 2) << peers.output(0);
  EXPECT_NE(peers.output(0).find("nccl allreduce"), std::string::npos) << peers.output(0);
  EXPECT_NE(peers.output(0).find(text), std::string::npos) << peers.output(0);
  ::kill(peers.pid(1), SIGKILL);
}

// The emulation sees the closed connection: NCCL's remote error, well
// before the 20 s collective deadline.
TEST(NcclEmuProcesses, AKilledPeerFailsTheOtherWithTheRemoteErrorBeforeTheTimeout) {
  peerFault(SIGKILL, 20000, 5000ms, "remote process exited or there was a network error");
}

TEST(NcclEmuProcesses, AStoppedPeerFailsTheOtherAtTheTimeout) {
  peerFault(SIGSTOP, 2000, 2000ms + 5000ms, "(a peer is missing or stuck)");
}

// An async error on rank 0 (injected after 5 collectives): rank 0 fails
// with it; its abort closes the connections, so rank 1 fails with the
// remote error; neither waits for the 20 s deadline.
TEST(NcclEmuProcesses, AnAsyncErrorAbortsTheCommunicatorOnEveryRank) {
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, 2, 2, "loop", 20000, {{0, "async-error-after=5"}}));
  const auto bound = Clock::now() + 30s;
  for (int r = 0; r < 2; ++r) {
    int code = -1;
    ASSERT_TRUE(peers.waitExit(r, bound, &code)) << "rank " << r << ":\n" << peers.output(r);
    EXPECT_EQ(code, 2) << peers.output(r);
  }
  EXPECT_NE(peers.output(0).find("iter 5\n"), std::string::npos) << peers.output(0);
  EXPECT_EQ(peers.output(0).find("iter 6\n"), std::string::npos) << peers.output(0);
  // Seen at the group's end or while polling the collective, whichever comes first.
  EXPECT_NE(peers.output(0).find("nccl allreduce: "), std::string::npos) << peers.output(0);
  EXPECT_NE(peers.output(0).find("injected fault (KOLO_NCCL_EMU_FAULTS"), std::string::npos)
      << peers.output(0);
  EXPECT_NE(peers.output(1).find("remote process exited or there was a network error"),
            std::string::npos)
      << peers.output(1);
}

TEST(NcclEmuProcesses, APeerThatNeverJoinsFailsCreationAtTheTimeout) {
  PeerProcesses peers;
  ASSERT_FALSE(peers.dir().empty());
  ASSERT_TRUE(startRanks(peers, 2, 1, "check", 1500));
  int code = -1;
  ASSERT_TRUE(peers.waitExit(0, Clock::now() + 1500ms + 5s, &code)) << peers.output(0);
  EXPECT_EQ(code, 1) << peers.output(0);
  EXPECT_NE(peers.output(0).find("FAIL create"), std::string::npos) << peers.output(0);
  EXPECT_NE(
      peers.output(0).find("communicator of 2 ranks not up after 1500 ms (a peer did not join)"),
      std::string::npos)
      << peers.output(0);
}

}  // namespace
}  // namespace kolo
