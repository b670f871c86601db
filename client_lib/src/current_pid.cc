#include "current_pid.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace kolo {

namespace {

std::atomic<pid_t> g_pid{0};

void refreshInChild() { g_pid.store(::getpid(), std::memory_order_relaxed); }

struct PidCache {
  PidCache() {
    g_pid.store(::getpid(), std::memory_order_relaxed);
    ::pthread_atfork(nullptr, nullptr, &refreshInChild);
  }
};

}  // namespace

pid_t currentPid() {
  static PidCache cache;  // first use, in whichever process that is
  return g_pid.load(std::memory_order_relaxed);
}

}  // namespace kolo
