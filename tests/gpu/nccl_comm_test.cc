// One job generation's device-cross choice and NCCL communicator
// (agent/core/nccl_comm.h), agents as threads of this process over one
// in-memory job KV, on the host emulation of the device and of NCCL
// (docs/gpu.md, "The NCCL emulation"): the same choice on every agent, the
// communicator working bit-exact, the staged fallback and its reason, the
// forced-NCCL failures with their texts within the timeout, and a
// generation change (the old communicator aborted with the cause, the next
// one created under the new generation's keys).
#include "agent/core/nccl_comm.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "agent/gpu/device_api.h"
#include "tests/backend/test_util.h"

namespace kolo {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
using gpu::DeviceCrossChoiceKind;
using testing_backend::Completions;

class NcclComm : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(gpu::selectDeviceApi(gpu::DeviceKind::kHostEmulated).isOk());
  }

  // Runs setUpDeviceCross on `agents` of `size` agents at once.
  std::vector<StatusOr<DeviceCrossSetup>> setUp(
      int size, const std::vector<int>& agents, uint64_t gen, gpu::DeviceCrossMode mode,
      std::chrono::milliseconds timeout,
      const std::map<int, gpu::DeviceCrossCapability>& caps = {}) {
    std::vector<StatusOr<DeviceCrossSetup>> out;
    for (size_t i = 0; i < agents.size(); ++i) out.emplace_back(internalError("not run"));
    std::vector<std::thread> ts;
    for (size_t i = 0; i < agents.size(); ++i) {
      ts.emplace_back([&, i] {
        DeviceCrossRequest req;
        req.job = "j";
        req.generation = gen;
        req.cross_rank = agents[i];
        req.cross_size = size;
        req.mode = mode;
        req.timeout = timeout;
        auto c = caps.find(agents[i]);
        req.mine = c != caps.end() ? c->second : gpu::DeviceCrossCapability{true, 0, ""};
        out[i] = setUpDeviceCross(req, kv_);
      });
    }
    for (auto& t : ts) t.join();
    return out;
  }

  InMemoryKvStore kv_;
};

// Allreduce (float32 sum of 1000 elements) over every agent's communicator.
void allreduceExact(std::vector<StatusOr<DeviceCrossSetup>>& s) {
  const int n = static_cast<int>(s.size());
  std::vector<testing_backend::Bytes> bufs;
  for (int r = 0; r < n; ++r)
    bufs.push_back(testing_backend::makeInput(DataType::kFloat32, ReduceOp::kSum, r, 1000));
  auto c = std::make_shared<Completions>(n);
  for (int r = 0; r < n; ++r)
    s[r]->nccl->allreduce(bufs[r].data(), 1000, DataType::kFloat32, ReduceOp::kSum, c->slot(r, c));
  for (const Status& st : c->wait(20s)) ASSERT_TRUE(st.isOk()) << st.toString();
  const auto want = testing_backend::makeReference(DataType::kFloat32, ReduceOp::kSum, n, 1000);
  for (int r = 0; r < n; ++r)
    EXPECT_TRUE(testing_backend::sameBytes(bufs[r].data(), want.data(), want.size()));
}

TEST_F(NcclComm, FourAgentsChooseNcclAlikeAndReduceExactlyOverTheCommunicator) {
  auto s = setUp(4, {0, 1, 2, 3}, 1, gpu::DeviceCrossMode::kAuto, 10s);
  for (auto& r : s) {
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->choice.kind, DeviceCrossChoiceKind::kNccl) << r->choice.why;
    EXPECT_EQ(r->choice.why, s[0]->choice.why);
    ASSERT_NE(r->nccl, nullptr);
    EXPECT_EQ(r->nccl->name(), "nccl");
  }
  EXPECT_NE(s[0]->choice.why.find("over NCCL: every one of the 4 agents has NCCL and a GPU"),
            std::string::npos)
      << s[0]->choice.why;
  allreduceExact(s);
}

TEST_F(NcclComm, AnAgentWithoutAGpuMakesEveryAgentStageWithTheReason) {
  auto s = setUp(3, {0, 1, 2}, 1, gpu::DeviceCrossMode::kAuto, 10s,
                 {{1, gpu::DeviceCrossCapability{true, -1, "no CUDA device"}}});
  for (auto& r : s) {
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->choice.kind, DeviceCrossChoiceKind::kStaged);
    EXPECT_EQ(r->nccl, nullptr);
    EXPECT_EQ(r->choice.why,
              "device tensors cross agents by host staging: agent 1 has no GPU for the job (no "
              "CUDA device)");
  }
}

TEST_F(NcclComm, ForcedNcclWithAnAgentMissingFailsWithinTheTimeout) {
  const auto t0 = Clock::now();
  auto s = setUp(3, {0, 1}, 1, gpu::DeviceCrossMode::kNccl, 800ms);
  EXPECT_LT(Clock::now() - t0, 800ms + 2s);
  for (auto& r : s) {
    ASSERT_TRUE(r.isOk()) << r.status().toString();
    EXPECT_EQ(r->choice.kind, DeviceCrossChoiceKind::kFail);
    EXPECT_EQ(r->nccl, nullptr);
    EXPECT_NE(
        r->choice.why.find(
            "--device-cross=nccl but NCCL is not viable for this job: agent 2 did not publish"),
        std::string::npos)
        << r->choice.why;
  }
}

// Agent 1 publishes that it can, but never joins the communicator: agent 0
// fails with NCCL's init timeout instead of routing alone.
TEST_F(NcclComm, APeerThatNeverJoinsTheCommunicatorFailsTheChoiceWithTheCause) {
  ASSERT_TRUE(kv_.put(gpu::deviceCapabilityKey(1, 1), gpu::encodeCapability({true, 0, ""})).isOk());
  const auto t0 = Clock::now();
  auto s = setUp(2, {0}, 1, gpu::DeviceCrossMode::kAuto, 800ms);
  EXPECT_LT(Clock::now() - t0, 800ms + 3s);
  ASSERT_TRUE(s[0].isOk());
  EXPECT_EQ(s[0]->choice.kind, DeviceCrossChoiceKind::kFail);
  EXPECT_NE(s[0]->choice.why.find(
                "NCCL communicator of job j generation 1 not created: PEER_FAILURE: nccl: "
                "communicator of 2 ranks not up after 800 ms (a peer did not join)"),
            std::string::npos)
      << s[0]->choice.why;
}

// Generation 1's collective is in flight on agent 0 only (agent 1 left):
// the generation change aborts it with the cause, and generation 2 gets a
// new communicator under its own keys that works.
TEST_F(NcclComm, AGenerationChangeAbortsTheOldCommunicatorAndTheNextOneWorks) {
  auto g1 = setUp(2, {0, 1}, 1, gpu::DeviceCrossMode::kAuto, 10s);
  ASSERT_TRUE(g1[0].isOk() && g1[1].isOk());
  ASSERT_NE(g1[0]->nccl, nullptr);
  std::vector<float> x(100, 1.0f);
  auto c = std::make_shared<Completions>(1);
  g1[0]->nccl->allreduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum, c->slot(0, c));
  std::this_thread::sleep_for(100ms);
  const auto t0 = Clock::now();
  g1[0]->nccl->abort(aborted("generation 2 replaces generation 1 of job j"));
  auto st = c->wait(5s);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(st[0].code(), Code::kAborted) << st[0].toString();
  EXPECT_NE(st[0].message().find("generation 2 replaces generation 1 of job j"), std::string::npos)
      << st[0].toString();
  g1[0]->nccl.reset();
  g1[1]->nccl.reset();
  auto g2 = setUp(2, {0, 1}, 2, gpu::DeviceCrossMode::kAuto, 10s);
  for (auto& r : g2) {
    ASSERT_TRUE(r.isOk());
    ASSERT_EQ(r->choice.kind, DeviceCrossChoiceKind::kNccl) << r->choice.why;
  }
  allreduceExact(g2);
}

}  // namespace
}  // namespace kolo
