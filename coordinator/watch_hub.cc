#include "coordinator/watch_hub.h"

#include <algorithm>

#include "common/worker_pool.h"
#include "coordinator/membership/job.h"

namespace kolo::coordinator {

namespace {

grpc::Slice serialize(const coord::World& w) {
  std::string bytes = w.SerializeAsString();
  return grpc::Slice(std::move(bytes));
}

}  // namespace

PublishedWorld::PublishedWorld(coord::World w)
    : world(std::move(w)), bytes(serialize(world)), terminal(isTerminal(world)) {}

PublishedWorld::PublishedWorld(coord::World w, std::unordered_map<std::string, grpc::Slice> s)
    : PublishedWorld(std::move(w)) {
  selves = std::move(s);
}

void WatchQueue::push(coord::World world) {
  push(std::make_shared<const PublishedWorld>(std::move(world)));
}

void WatchQueue::push(std::shared_ptr<const PublishedWorld> world) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    worlds_.push_back(std::move(world));
  }
  cv_.notify_all();
  wake();
}

void WatchQueue::close(grpc::Status why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    close_status_ = std::move(why);
  }
  cv_.notify_all();
  wake();
}

void WatchQueue::wake() {
  if (writers_ == nullptr) {
    notify();
    return;
  }
  writers_->submit([self = shared_from_this()] { self->notify(); });
}

void WatchQueue::notify() {
  std::lock_guard<std::mutex> lock(listener_mu_);
  if (listener_) listener_();
}

void WatchQueue::setListener(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(listener_mu_);
  listener_ = std::move(fn);
}

WatchQueue::Next WatchQueue::next(coord::World* out, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !worlds_.empty() || closed_; });
  if (!worlds_.empty()) {
    *out = worlds_.front()->world;
    worlds_.pop_front();
    return Next::kWorld;
  }
  return closed_ ? Next::kClosed : Next::kTimeout;
}

WatchQueue::Next WatchQueue::take(std::shared_ptr<const PublishedWorld>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!worlds_.empty()) {
    *out = std::move(worlds_.front());
    worlds_.pop_front();
    return Next::kWorld;
  }
  return closed_ ? Next::kClosed : Next::kTimeout;
}

grpc::Status WatchQueue::closeStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  return close_status_;
}

void WatchHub::add(const std::string& job_id, std::shared_ptr<WatchQueue> queue, bool brief,
                   bool runs) {
  watchers_[job_id].push_back({std::move(queue), brief, brief && runs});
  ++total_;
}

void WatchHub::remove(const std::string& job_id, const WatchQueue* queue) {
  auto it = watchers_.find(job_id);
  if (it == watchers_.end()) return;
  total_ -= std::erase_if(it->second, [&](const Watcher& w) { return w.queue.get() == queue; });
  if (it->second.empty()) watchers_.erase(it);
}

void WatchHub::publish(const coord::World& world) {
  auto it = watchers_.find(world.job_id());
  if (it == watchers_.end()) return;
  // Built on first use: the full form, and the brief one with local_sizes
  // or local_size_runs (both only while agents of two versions watch).
  std::shared_ptr<const PublishedWorld> full, brief[2];
  for (Watcher& w : it->second) {
    if (!w.brief) {
      if (full == nullptr) full = std::make_shared<const PublishedWorld>(world);
      w.queue->push(full);
      continue;
    }
    std::shared_ptr<const PublishedWorld>& form = brief[w.runs ? 1 : 0];
    if (form == nullptr) {
      coord::World b = briefWorld(world, brief_world_slots_, w.runs);
      std::unordered_map<std::string, grpc::Slice> selves;
      if (isCompactWorld(b)) {
        selves.reserve(static_cast<size_t>(world.agents_size()));
        for (const coord::AgentSlot& s : world.agents()) {
          selves.emplace(s.agent().agent_id(), grpc::Slice(selfSuffix(s)));
        }
      }
      form = std::make_shared<const PublishedWorld>(std::move(b), std::move(selves));
    }
    w.queue->push(form);
  }
}

void WatchHub::closeJob(const std::string& job_id, const grpc::Status& why) {
  auto it = watchers_.find(job_id);
  if (it == watchers_.end()) return;
  for (Watcher& w : it->second) w.queue->close(why);
  total_ -= it->second.size();
  watchers_.erase(it);
}

void WatchHub::closeAll(const grpc::Status& why) {
  for (auto& [job, watchers] : watchers_) {
    for (Watcher& w : watchers) w.queue->close(why);
  }
  watchers_.clear();
  total_ = 0;
}

size_t WatchHub::watcherCount(const std::string& job_id) const {
  auto it = watchers_.find(job_id);
  return it == watchers_.end() ? 0 : it->second.size();
}

bool isTerminal(const coord::World& world) {
  return world.state() == coord::FAILED || world.state() == coord::FINISHED;
}

}  // namespace kolo::coordinator
