#include "tf_waiter.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <list>
#include <mutex>
#include <thread>
#include <utility>

namespace kolo::tf {
namespace {

struct Entry {
  std::vector<kolo_handle_t> handles;
  bool keep_results = false;
  WaitCallback cb;
};

class Waiter {
 public:
  static Waiter& Get() {
    // Never destroyed: kernels may still complete while the process exits.
    static Waiter* w = new Waiter();
    return *w;
  }

  void Add(Entry e) {
    {
      std::lock_guard<std::mutex> l(mu_);
      incoming_.push_back(std::move(e));
    }
    cv_.notify_one();
  }

 private:
  Waiter() {
    std::thread([this] { Loop(); }).detach();
  }

  static bool Finished(const Entry& e) {
    return std::all_of(e.handles.begin(), e.handles.end(),
                       [](kolo_handle_t h) { return kolo_poll(h) != KOLO_IN_PROGRESS; });
  }

  static void Complete(Entry& e) {
    kolo_status_t first = KOLO_OK;
    std::string error;
    for (kolo_handle_t h : e.handles) {
      kolo_status_t st = kolo_synchronize(h, -1);
      if (st != KOLO_OK && first == KOLO_OK) {
        first = st;
        error = LastError(st);
      }
    }
    if (first != KOLO_OK && e.keep_results) {
      for (kolo_handle_t h : e.handles) kolo_release(h);
    }
    e.cb(first, error);
  }

  void Loop() {
    std::list<Entry> pending;
    auto nap = std::chrono::microseconds(20);
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        if (pending.empty()) cv_.wait(l, [this] { return !incoming_.empty(); });
        if (!incoming_.empty()) nap = std::chrono::microseconds(20);
        pending.splice(pending.end(), incoming_);
      }
      bool progressed = false;
      for (auto it = pending.begin(); it != pending.end();) {
        if (Finished(*it)) {
          Complete(*it);
          it = pending.erase(it);
          progressed = true;
        } else {
          ++it;
        }
      }
      if (pending.empty()) continue;
      if (progressed) {
        nap = std::chrono::microseconds(20);
      } else {
        nap = std::min(nap * 2, std::chrono::microseconds(1000));
      }
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait_for(l, nap, [this] { return !incoming_.empty(); });
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::list<Entry> incoming_;
};

}  // namespace

void WatchHandles(std::vector<kolo_handle_t> handles, bool keep_results, WaitCallback cb) {
  Waiter::Get().Add(Entry{std::move(handles), keep_results, std::move(cb)});
}

void RunDetached(std::function<void()> fn) { std::thread(std::move(fn)).detach(); }

std::string LastError(kolo_status_t status) {
  const char* e = kolo_last_error();
  if (e != nullptr && e[0] != '\0') return e;
  const char* s = kolo_status_string(status);
  return s != nullptr ? s : "unknown kolo error";
}

}  // namespace kolo::tf
