// CrossJob over a real (one-agent) UCX backend: what happens to work handed
// to a negotiation that has ended.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <vector>
#include <thread>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "agent/cross/cross_job.h"
#include "common/event_loop.h"

namespace kolo {
namespace {

using namespace std::chrono_literals;

// Work submitted after the job's negotiation was aborted fails at once, with
// the abort's status, instead of waiting for its deadline (nothing would
// pick it up).
TEST(CrossJob, WorkSubmittedAfterAnAbortFailsAtOnceWithTheAbortsStatus) {
#if defined(__SANITIZE_THREAD__)
  // UCX is not instrumented: its threads would give TSan false reports (the
  // backend tests are left out of the TSan run for the same reason).
  GTEST_SKIP() << "runs a UCX backend in-process; not under TSan";
#endif
  InMemoryKvStore kv;
  BackendOptions bo;
  bo.name = "crossjob-test";
  auto backend = createBackend("ucx", bo, kv);
  if (!backend.isOk()) GTEST_SKIP() << "no UCX backend here: " << backend.status().toString();
  EventLoop loop("crossjob-test");
  loop.start();
  auto done = std::make_shared<std::promise<std::pair<std::string, Status>>>();
  auto fut = done->get_future();
  {
    CrossJob job("crossjob-test", std::move(backend).value(), CrossJobOptions{}, loop,
                 [done](const std::string& name, Status st, const CrossResult&) { done->set_value({name, std::move(st)}); });
    job.abort(peerFailure("agent node1 lost (test)"));
    // Let the negotiation thread see the abort and end (it fails what it
    // holds as it goes; the case here is work that arrives after that).
    std::this_thread::sleep_for(300ms);
    CrossWork w;
    w.req.name = "late";
    w.count = 4;
    auto t0 = std::chrono::steady_clock::now();
    job.submit(std::move(w));
    ASSERT_EQ(fut.wait_for(5s), std::future_status::ready) << "the late work was never completed";
    EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
    auto [name, st] = fut.get();
    EXPECT_EQ(name, "late");
    EXPECT_EQ(st.code(), Code::kPeerFailure);
    EXPECT_NE(st.message().find("agent node1 lost (test)"), std::string::npos) << st.toString();
  }
  loop.stop();
}

// The parameters every agent must share travel in 24 bytes: the leader's
// values (KiB-rounded where the wire is in KiB), and all 0xFF from the
// others so that a bytewise Min yields the leader's.
TEST(AgreedParams, TheLeadersValuesRoundTripAndOthersSendAllOnes) {
  AgreedParams a;
  a.fusion_threshold_bytes = 64ull << 20;
  a.small_message_bytes = 65536;
  a.fusion_chunk_bytes = 8ull << 20;
  a.fusion_max_tensor_bytes = 1 << 20;
  a.inline_bytes = 256;
  a.pipeline_bytes = 2ull << 20;
  uint8_t wire[AgreedParams::kWireBytes];
  a.encode(true, wire);
  AgreedParams b = AgreedParams::decode(wire);
  EXPECT_EQ(b.fusion_threshold_bytes, a.fusion_threshold_bytes);
  EXPECT_EQ(b.small_message_bytes, a.small_message_bytes);
  EXPECT_EQ(b.fusion_chunk_bytes, a.fusion_chunk_bytes);
  EXPECT_EQ(b.fusion_max_tensor_bytes, a.fusion_max_tensor_bytes);
  EXPECT_EQ(b.inline_bytes, a.inline_bytes);
  EXPECT_EQ(b.pipeline_bytes, a.pipeline_bytes);
  a.encode(false, wire);
  for (uint8_t byte : wire) EXPECT_EQ(byte, 0xFF);
}

// One agent (the ring is the identity), a float32 sum allreduce with
// fill/drain (as the agent builds them for a large one): returns the fill
// and drain ranges in call order and whether the result said `drained`;
// `out` must equal `in` afterwards either way.
struct PipelineRun {
  std::vector<std::pair<size_t, size_t>> fills, drains;
  // Streamed copy-out: each `published` end, with how far the drains
  // reached (contiguously) when it came; and how far publishing had reached
  // when the op completed.
  std::vector<std::pair<size_t, size_t>> published;
  size_t published_at_done = 0;
  bool drained = false;
  Status status;
};
PipelineRun runPipelined(size_t count, uint64_t pipeline_bytes, uint64_t chunk_bytes, std::vector<float>& in,
                         std::vector<float>& out) {
  PipelineRun run;
  InMemoryKvStore kv;
  BackendOptions bo;
  bo.name = "crossjob-pipeline";
  auto backend = createBackend("ucx", bo, kv);
  if (!backend.isOk()) {
    run.status = backend.status();
    return run;
  }
  EventLoop loop("crossjob-pipeline");
  loop.start();
  auto done = std::make_shared<std::promise<std::pair<Status, bool>>>();
  auto fut = done->get_future();
  std::vector<float> staging(count, -1.0f);
  std::mutex mu;
  {
    CrossJobOptions co;
    co.pipeline_bytes = pipeline_bytes;
    co.fusion_chunk_bytes = chunk_bytes;
    CrossJob job("crossjob-pipeline", std::move(backend).value(), co, loop,
                 [done, &run, &mu](const std::string&, Status st, const CrossResult& r) {
                   {
                     std::lock_guard<std::mutex> lk(mu);
                     run.published_at_done = run.published.empty() ? 0 : run.published.back().first;
                   }
                   done->set_value({st, r.drained});
                 });
    CrossWork w;
    w.req.name = "big";
    w.req.params.collective = static_cast<uint8_t>(CollectiveType::kAllreduce);
    w.req.params.dtype = static_cast<uint8_t>(DataType::kFloat32);
    w.req.params.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
    w.req.params.ndim = 1;
    w.req.params.shape[0] = static_cast<int64_t>(count);
    w.req.params.data_bytes = count * sizeof(float);
    w.req.params.prescale = w.req.params.postscale = 1.0;
    w.staging = staging.data();
    w.count = count;
    w.fill = [&](size_t b, size_t e) {
      std::copy(in.begin() + b, in.begin() + e, staging.begin() + b);
      std::lock_guard<std::mutex> lk(mu);
      run.fills.emplace_back(b, e);
    };
    w.drain = [&](size_t b, size_t e) {
      std::copy(staging.begin() + b, staging.begin() + e, out.begin() + b);
      std::lock_guard<std::mutex> lk(mu);
      run.drains.emplace_back(b, e);
    };
    w.published = [&](size_t end) {
      std::lock_guard<std::mutex> lk(mu);
      size_t reached = 0;  // the drains' contiguous prefix
      for (bool moved = true; moved;) {
        moved = false;
        for (auto [b, e] : run.drains) {
          if (b == reached) {
            reached = e;
            moved = true;
          }
        }
      }
      run.published.emplace_back(end, reached);
    };
    job.submit(std::move(w));
    if (fut.wait_for(20s) != std::future_status::ready) {
      run.status = timedOut("the allreduce never completed");
    } else {
      auto [st, drained] = fut.get();
      run.status = st;
      run.drained = drained;
    }
  }
  loop.stop();
  if (!run.drained && run.status.isOk()) std::copy(staging.begin(), staging.end(), out.begin());  // as the agent would
  return run;
}

// Ranges that tile [0, count) in order.
bool tiles(const std::vector<std::pair<size_t, size_t>>& r, size_t count) {
  size_t at = 0;
  for (auto [b, e] : r) {
    if (b != at || e <= b) return false;
    at = e;
  }
  return at == count;
}

TEST(CrossJobPipeline, ALargeAllreduceIsFilledAndDrainedChunkByChunk) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "runs a UCX backend in-process; not under TSan";
#endif
  const size_t count = (3u << 20) / sizeof(float) + 5;  // 3 MiB + 20 bytes: chunks of 1 MiB and a ragged tail
  std::vector<float> in(count), out(count, 0.0f);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 1000) * 0.5f;
  PipelineRun run = runPipelined(count, 2u << 20, 8u << 20, in, out);
  if (run.status.code() == Code::kUnavailable) GTEST_SKIP() << "no UCX backend here: " << run.status.toString();
  ASSERT_TRUE(run.status.isOk()) << run.status.toString();
  EXPECT_TRUE(run.drained);
  // 3 MiB / 4 < 1 MiB: the chunks are 1 MiB (the 8 MiB fusion chunk would
  // leave one), so 4 of them, the last 20 bytes.
  ASSERT_EQ(run.fills.size(), 4u);
  EXPECT_TRUE(tiles(run.fills, count));
  EXPECT_EQ(run.fills[0].second, (1u << 20) / sizeof(float));
  EXPECT_TRUE(tiles(run.drains, count));
  EXPECT_EQ(run.drains, run.fills);
  EXPECT_EQ(out, in);
  // Streamed copy-out: the result is published in order, never past what
  // was drained, the whole of it before the op completes.
  ASSERT_FALSE(run.published.empty());
  size_t last = 0;
  for (auto [end, reached] : run.published) {
    EXPECT_GT(end, last);
    EXPECT_LE(end, reached) << "published past the drained chunks";
    last = end;
  }
  EXPECT_EQ(last, count);
  EXPECT_EQ(run.published_at_done, count);
}

TEST(CrossJobPipeline, BelowTheAgreedSizeItIsFilledWholeAndNotDrained) {
#if defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "runs a UCX backend in-process; not under TSan";
#endif
  const size_t count = (3u << 20) / sizeof(float) + 5;
  std::vector<float> in(count), out(count, 0.0f);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>(i % 777) - 3.0f;
  // Pipelining off for the job (0), and above this tensor's size: either way
  // one whole fill, no drain, and the agent copies the result out.
  for (uint64_t pipeline : {uint64_t{0}, uint64_t{4} << 20}) {
    std::fill(out.begin(), out.end(), 0.0f);
    PipelineRun run = runPipelined(count, pipeline, 8u << 20, in, out);
    if (run.status.code() == Code::kUnavailable) GTEST_SKIP() << "no UCX backend here: " << run.status.toString();
    ASSERT_TRUE(run.status.isOk()) << run.status.toString();
    EXPECT_FALSE(run.drained) << pipeline;
    ASSERT_EQ(run.fills.size(), 1u) << pipeline;
    EXPECT_EQ(run.fills[0], std::make_pair(size_t{0}, count));
    EXPECT_TRUE(run.drains.empty()) << pipeline;
    EXPECT_TRUE(run.published.empty()) << pipeline;  // (the agent copies it out at the end)
    EXPECT_EQ(out, in) << pipeline;
  }
}

}  // namespace
}  // namespace kolo
