#include "coordinator/kv_store.h"

#include <algorithm>

namespace kolo::coordinator {

KvStore::Usage KvStore::usage(const std::string& job_id) const {
  auto it = usage_.find(job_id);
  return it == usage_.end() ? Usage{} : it->second;
}

void KvStore::dropWaiterUsage(const std::string& job_id) {
  auto it = usage_.find(job_id);
  if (it == usage_.end() || it->second.waiters == 0) return;
  if (--it->second.waiters == 0 && it->second.keys == 0) usage_.erase(it);
}

void KvStore::put(const std::string& job_id, const std::string& key, std::string value) {
  Slot slot{job_id, key};
  Usage& u = usage_[job_id];
  auto [at, added] = values_.try_emplace(slot);
  if (added) {
    ++u.keys;
    u.bytes += key.size();
    total_bytes_ += key.size();
  }
  u.bytes = u.bytes - at->second.size() + value.size();
  total_bytes_ = total_bytes_ - at->second.size() + value.size();
  at->second = value;
  auto it = waiters_.find(slot);
  if (it == waiters_.end()) return;
  auto ready = std::move(it->second);
  waiters_.erase(it);
  for (auto& [id, fn] : ready) {
    waiter_keys_.erase(id);
    dropWaiterUsage(job_id);
    fn(value);
  }
}

std::optional<std::string> KvStore::get(const std::string& job_id, const std::string& key) const {
  auto it = values_.find(Slot{job_id, key});
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

KvStore::WaiterId KvStore::addWaiter(const std::string& job_id, const std::string& key, Waiter fn) {
  WaiterId id = next_waiter_++;
  Slot slot{job_id, key};
  ++usage_[job_id].waiters;
  waiters_[slot].emplace_back(id, std::move(fn));
  waiter_keys_.emplace(id, std::move(slot));
  return id;
}

void KvStore::expireWaiter(WaiterId id) {
  auto k = waiter_keys_.find(id);
  if (k == waiter_keys_.end()) return;
  auto it = waiters_.find(k->second);
  dropWaiterUsage(k->second.first);
  waiter_keys_.erase(k);
  if (it == waiters_.end()) return;
  auto& list = it->second;
  auto w = std::find_if(list.begin(), list.end(), [&](const auto& p) { return p.first == id; });
  if (w == list.end()) return;
  Waiter fn = std::move(w->second);
  list.erase(w);
  if (list.empty()) waiters_.erase(it);
  fn(std::nullopt);
}

void KvStore::eraseJob(const std::string& job_id) {
  auto first = Slot{job_id, std::string()};
  for (auto it = values_.lower_bound(first); it != values_.end() && it->first.first == job_id;) {
    it = values_.erase(it);
  }
  std::vector<Waiter> released;
  for (auto it = waiters_.lower_bound(first); it != waiters_.end() && it->first.first == job_id;) {
    for (auto& [id, fn] : it->second) {
      waiter_keys_.erase(id);
      released.push_back(std::move(fn));
    }
    it = waiters_.erase(it);
  }
  if (auto u = usage_.find(job_id); u != usage_.end()) {
    total_bytes_ -= u->second.bytes;
    usage_.erase(u);
  }
  for (auto& fn : released) fn(std::nullopt);
}

void KvStore::failAllWaiters() {
  auto all = std::move(waiters_);
  waiters_.clear();
  waiter_keys_.clear();
  for (auto it = usage_.begin(); it != usage_.end();) {
    it->second.waiters = 0;
    it = it->second.keys == 0 ? usage_.erase(it) : std::next(it);
  }
  for (auto& [slot, list] : all) {
    for (auto& [id, fn] : list) fn(std::nullopt);
  }
}

size_t KvStore::keyCount(const std::string& job_id) const {
  size_t n = 0;
  for (auto it = values_.lower_bound(Slot{job_id, std::string()});
       it != values_.end() && it->first.first == job_id; ++it) {
    ++n;
  }
  return n;
}

}  // namespace kolo::coordinator
