#include "coordinator/watch_hub.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#include "common/worker_pool.h"

namespace kolo::coordinator {
namespace {

using std::chrono::milliseconds;

coord::World world(const std::string& job, coord::JobState state, uint64_t gen) {
  coord::World w;
  w.set_job_id(job);
  w.set_state(state);
  w.set_generation(gen);
  return w;
}

TEST(WatchHub, DeliversEveryChangeToEveryWatcherInOrder) {
  WatchHub hub;
  auto q1 = std::make_shared<WatchQueue>();
  auto q2 = std::make_shared<WatchQueue>();
  auto other = std::make_shared<WatchQueue>();
  hub.add("j", q1);
  hub.add("j", q2);
  hub.add("k", other);
  hub.publish(world("j", coord::RUNNING, 1));
  hub.publish(world("j", coord::FAILED, 1));
  for (auto& q : {q1, q2}) {
    coord::World w;
    ASSERT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kWorld);
    EXPECT_EQ(w.state(), coord::RUNNING);
    ASSERT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kWorld);
    EXPECT_EQ(w.state(), coord::FAILED);
    EXPECT_TRUE(isTerminal(w));
    EXPECT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kTimeout);
  }
  coord::World w;
  EXPECT_EQ(other->next(&w, milliseconds(0)), WatchQueue::Next::kTimeout);
  hub.remove("j", q1.get());
  EXPECT_EQ(hub.watcherCount("j"), 1u);
}

TEST(WatchHub, CloseDrainsQueuedWorldsFirstAndWakesAWaiter) {
  WatchHub hub;
  auto q = std::make_shared<WatchQueue>();
  hub.add("j", q);
  hub.publish(world("j", coord::RUNNING, 1));
  hub.closeJob("j", grpc::Status(grpc::StatusCode::ABORTED, "job j was removed"));
  EXPECT_EQ(hub.watcherCount("j"), 0u);
  coord::World w;
  EXPECT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kWorld);
  EXPECT_EQ(q->next(&w, milliseconds(0)), WatchQueue::Next::kClosed);
  EXPECT_EQ(q->closeStatus().error_code(), grpc::StatusCode::ABORTED);

  // A consumer blocked in next() wakes up when the queue is closed.
  auto q2 = std::make_shared<WatchQueue>();
  hub.add("k", q2);
  WatchQueue::Next got = WatchQueue::Next::kTimeout;
  std::thread consumer([&] { got = q2->next(&w, milliseconds(10000)); });
  hub.closeAll(grpc::Status(grpc::StatusCode::UNAVAILABLE, "shutting down"));
  consumer.join();
  EXPECT_EQ(got, WatchQueue::Next::kClosed);
}

TEST(WatchHub, PublishSerializesOnceAndSharesTheBytes) {
  WatchHub hub;
  auto q1 = std::make_shared<WatchQueue>();
  auto q2 = std::make_shared<WatchQueue>();
  hub.add("j", q1);
  hub.add("j", q2);
  hub.publish(world("j", coord::RUNNING, 3));
  std::shared_ptr<const PublishedWorld> a, b;
  ASSERT_EQ(q1->take(&a), WatchQueue::Next::kWorld);
  ASSERT_EQ(q2->take(&b), WatchQueue::Next::kWorld);
  EXPECT_EQ(a.get(), b.get());  // one World, one serialization, for every watcher
  coord::World parsed;
  ASSERT_TRUE(parsed.ParseFromString(
      std::string(reinterpret_cast<const char*>(a->bytes.begin()), a->bytes.size())));
  EXPECT_EQ(parsed.generation(), 3u);
  EXPECT_FALSE(a->terminal);
  EXPECT_EQ(q1->take(&a), WatchQueue::Next::kTimeout);
}

TEST(WatchHub, BriefWatchersGetTheSlotsWithoutAddressesAndOnlyWhileRunning) {
  WatchHub hub;
  auto full = std::make_shared<WatchQueue>();
  auto brief1 = std::make_shared<WatchQueue>();
  auto brief2 = std::make_shared<WatchQueue>();
  hub.add("j", full);
  hub.add("j", brief1, /*brief=*/true);
  hub.add("j", brief2, /*brief=*/true);
  coord::World w = world("j", coord::RUNNING, 2);
  coord::AgentSlot* slot = w.add_agents();
  slot->mutable_agent()->set_agent_id("a");
  slot->mutable_agent()->set_hostname("h");
  slot->mutable_agent()->set_rpc_address("h:7471");
  slot->mutable_agent()->set_data_address("ucx-address");
  slot->set_local_size(4);
  slot->set_rank_offset(8);
  slot->set_cross_rank(2);
  hub.publish(w);
  w.set_state(coord::FINISHED);
  hub.publish(w);
  std::shared_ptr<const PublishedWorld> f, b1, b2;
  ASSERT_EQ(full->take(&f), WatchQueue::Next::kWorld);
  ASSERT_EQ(brief1->take(&b1), WatchQueue::Next::kWorld);
  ASSERT_EQ(brief2->take(&b2), WatchQueue::Next::kWorld);
  EXPECT_EQ(b1.get(), b2.get());  // the brief form is built once too
  EXPECT_EQ(f->world.agents(0).agent().data_address(), "ucx-address");
  const coord::AgentSlot& s = b1->world.agents(0);
  EXPECT_EQ(s.agent().agent_id(), "a");
  EXPECT_EQ(s.agent().hostname(), "h");
  EXPECT_EQ(s.local_size(), 4);
  EXPECT_EQ(s.rank_offset(), 8);
  EXPECT_EQ(s.cross_rank(), 2);
  EXPECT_TRUE(s.agent().rpc_address().empty());
  EXPECT_TRUE(s.agent().data_address().empty());
  EXPECT_LT(b1->bytes.size(), f->bytes.size());
  ASSERT_EQ(brief1->take(&b1), WatchQueue::Next::kWorld);
  EXPECT_EQ(b1->world.state(), coord::FINISHED);
  EXPECT_EQ(b1->world.agents_size(), 0);  // agents ignore the list of a terminal World
  ASSERT_EQ(full->take(&f), WatchQueue::Next::kWorld);
  EXPECT_EQ(f->world.agents_size(), 1);
}

// A job of more agents than brief_world_slots: the brief form lists only
// the local sizes, once for everyone, and each watcher's bytes are those
// plus its own slot, which parse back to the compact World with its self.
TEST(WatchHub, LargeJobsGetCompactBriefWorldsWithEachWatchersOwnSlot) {
  WatchHub hub(/*brief_world_slots=*/2);
  auto full = std::make_shared<WatchQueue>();
  auto brief = std::make_shared<WatchQueue>();
  hub.add("j", full);
  hub.add("j", brief, /*brief=*/true);
  coord::World w = world("j", coord::RUNNING, 7);
  w.set_world_size(6);
  for (int k = 0; k < 3; ++k) {
    coord::AgentSlot* slot = w.add_agents();
    slot->mutable_agent()->set_agent_id("agent-" + std::to_string(k));
    slot->mutable_agent()->set_hostname("host-" + std::to_string(k));
    slot->mutable_agent()->set_data_address(std::string(200, 'x'));
    slot->set_local_size(k + 1);  // 1, 2, 3 ranks: offsets 0, 1, 3
    slot->set_rank_offset(k == 0 ? 0 : (k == 1 ? 1 : 3));
    slot->set_cross_rank(k);
  }
  hub.publish(w);
  std::shared_ptr<const PublishedWorld> f, b;
  ASSERT_EQ(full->take(&f), WatchQueue::Next::kWorld);
  ASSERT_EQ(brief->take(&b), WatchQueue::Next::kWorld);
  EXPECT_EQ(f->world.agents_size(), 3);  // full watchers (kolo jobs) keep the slots
  EXPECT_TRUE(f->selves.empty());
  EXPECT_TRUE(isCompactWorld(b->world));
  EXPECT_EQ(b->world.agents_size(), 0);
  ASSERT_EQ(b->world.local_sizes_size(), 3);
  EXPECT_EQ(b->world.local_sizes(2), 3);
  EXPECT_FALSE(b->world.has_self());
  ASSERT_EQ(b->selves.size(), 3u);
  // What WatchJob writes to an agent: the shared bytes, then its suffix.
  auto wireFor = [&](const std::string& agent_id) {
    std::string wire(reinterpret_cast<const char*>(b->bytes.begin()), b->bytes.size());
    const grpc::Slice& self = b->selves.at(agent_id);
    wire.append(reinterpret_cast<const char*>(self.begin()), self.size());
    coord::World got;
    EXPECT_TRUE(got.ParseFromString(wire));
    return got;
  };
  coord::World got = wireFor("agent-1");
  EXPECT_EQ(got.generation(), 7u);
  EXPECT_EQ(got.local_sizes_size(), 3);
  ASSERT_TRUE(got.has_self());
  EXPECT_EQ(got.self().agent().agent_id(), "agent-1");
  EXPECT_EQ(got.self().agent().hostname(), "host-1");
  EXPECT_TRUE(got.self().agent().data_address().empty());
  EXPECT_EQ(got.self().local_size(), 2);
  EXPECT_EQ(got.self().rank_offset(), 1);
  EXPECT_EQ(got.self().cross_rank(), 1);
  EXPECT_EQ(wireFor("agent-2").self().cross_rank(), 2);
  EXPECT_EQ(b->selves.count("someone-else"), 0u);  // not in the job: the shared bytes alone
  // At the threshold the slots are listed as before.
  WatchHub small(/*brief_world_slots=*/3);
  auto q = std::make_shared<WatchQueue>();
  small.add("j", q, /*brief=*/true);
  small.publish(w);
  ASSERT_EQ(q->take(&b), WatchQueue::Next::kWorld);
  EXPECT_EQ(b->world.agents_size(), 3);
  EXPECT_EQ(b->world.local_sizes_size(), 0);
  EXPECT_TRUE(b->selves.empty());
}

// A watcher that asked for local_size_runs gets the compact World with the
// runs (built once for all such watchers) and an older one the list, in the
// same change; each with its own slot.
TEST(WatchHub, CompactWorldsCarryRunsForWatchersThatReadThem) {
  WatchHub hub(/*brief_world_slots=*/2);
  auto runs1 = std::make_shared<WatchQueue>();
  auto runs2 = std::make_shared<WatchQueue>();
  auto list = std::make_shared<WatchQueue>();
  hub.add("j", runs1, /*brief=*/true, /*runs=*/true);
  hub.add("j", runs2, /*brief=*/true, /*runs=*/true);
  hub.add("j", list, /*brief=*/true);
  coord::World w = world("j", coord::RUNNING, 4);
  const std::vector<int> sizes = {8, 8, 8, 4, 8, 8};
  int offset = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    coord::AgentSlot* slot = w.add_agents();
    slot->mutable_agent()->set_agent_id("agent-" + std::to_string(k));
    slot->set_local_size(sizes[k]);
    slot->set_rank_offset(offset);
    slot->set_cross_rank(static_cast<int>(k));
    offset += sizes[k];
  }
  w.set_world_size(offset);
  hub.publish(w);
  std::shared_ptr<const PublishedWorld> a, b, l;
  ASSERT_EQ(runs1->take(&a), WatchQueue::Next::kWorld);
  ASSERT_EQ(runs2->take(&b), WatchQueue::Next::kWorld);
  ASSERT_EQ(list->take(&l), WatchQueue::Next::kWorld);
  EXPECT_EQ(a.get(), b.get());
  EXPECT_NE(a.get(), l.get());
  EXPECT_TRUE(isCompactWorld(a->world));
  EXPECT_EQ(a->world.local_sizes_size(), 0);
  EXPECT_EQ(std::vector<int>(a->world.local_size_runs().begin(), a->world.local_size_runs().end()),
            (std::vector<int>{3, 8, 1, 4, 2, 8}));
  EXPECT_EQ(l->world.local_size_runs_size(), 0);
  EXPECT_EQ(std::vector<int>(l->world.local_sizes().begin(), l->world.local_sizes().end()), sizes);
  ASSERT_EQ(a->selves.size(), sizes.size());
  ASSERT_EQ(l->selves.size(), sizes.size());
  std::string wire(reinterpret_cast<const char*>(a->bytes.begin()), a->bytes.size());
  const grpc::Slice& self = a->selves.at("agent-3");
  wire.append(reinterpret_cast<const char*>(self.begin()), self.size());
  coord::World got;
  ASSERT_TRUE(got.ParseFromString(wire));
  EXPECT_EQ(got.self().rank_offset(), 24);
  EXPECT_EQ(got.self().local_size(), 4);
  EXPECT_EQ(got.local_size_runs_size(), 6);
}

// With writers, the listener runs on a writer's thread, not the producer's,
// once per push and close, and never after it is cleared.
TEST(WatchQueue, WithWritersTheListenerRunsOnAWriterThread) {
  WorkerPool writers("test-watch", 2);
  auto q = std::make_shared<WatchQueue>();
  q->setWriters(&writers);
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::thread::id> ran;
  q->setListener([&] {
    std::lock_guard<std::mutex> lock(mu);
    ran.push_back(std::this_thread::get_id());
    cv.notify_all();
  });
  q->push(world("j", coord::RUNNING, 1));
  q->close(grpc::Status(grpc::StatusCode::ABORTED, "gone"));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return ran.size() == 2; }));
    for (const auto& id : ran) EXPECT_NE(id, std::this_thread::get_id());
  }
  q->setListener(nullptr);
  q->push(world("j", coord::RUNNING, 2));  // closed: dropped, and no listener
  std::shared_ptr<const PublishedWorld> w;
  EXPECT_EQ(q->take(&w), WatchQueue::Next::kWorld);
  EXPECT_EQ(w->world.generation(), 1u);
  EXPECT_EQ(q->take(&w), WatchQueue::Next::kClosed);
}

TEST(WatchQueue, ListenerRunsOnPushAndCloseUntilCleared) {
  WatchQueue q;
  int calls = 0;
  q.setListener([&] { ++calls; });
  q.push(world("j", coord::RUNNING, 1));
  EXPECT_EQ(calls, 1);
  q.close(grpc::Status(grpc::StatusCode::ABORTED, "gone"));
  EXPECT_EQ(calls, 2);
  q.setListener(nullptr);
  q.push(world("j", coord::RUNNING, 2));  // closed, and no listener
  EXPECT_EQ(calls, 2);
  std::shared_ptr<const PublishedWorld> w;
  EXPECT_EQ(q.take(&w), WatchQueue::Next::kWorld);
  EXPECT_TRUE(w->world.generation() == 1);
  EXPECT_EQ(q.take(&w), WatchQueue::Next::kClosed);
}

}  // namespace
}  // namespace kolo::coordinator
