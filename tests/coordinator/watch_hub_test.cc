#include "coordinator/watch_hub.h"

#include <gtest/gtest.h>

#include <thread>

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
