// A rank program for the elastic tests: a training loop in Horovod's
// elastic shape over the C ABI.
//
//   kolo_elastic_check STEPS STEP_MS
//
// State: `step` and a model w[kLen] (float64). Every step allreduces (Sum) a
// gradient in which rank r contributes (r + 1) * (i + 1) and checks the
// result exactly against the current world size: sum_r (r+1) * (i+1) =
// size * (size + 1) / 2 * (i + 1); then w[i] += i + 1, so a consistent
// state always has w[i] == step * (i + 1). On KOLO_ERR_MEMBERSHIP_CHANGED
// the rank keeps its state (the failed step changed nothing) and syncs:
// step and w are broadcast from rank 0 (a newcomer starts from zeros and
// adopts rank 0's). Any other error ends the rank with exit 3 and the
// error text. At the end: "elastic ok rank R size S step N" (w checked),
// and one "recovered ... ms" line per membership change seen. Every 10
// steps it "commits": a one-element allreduce named __kolo.elastic.commit,
// where agents waiting to join the job are admitted.
//
// ELASTIC_CRASH_ONCE=FILE (with ELASTIC_CRASH_RANK=R, default 1): rank R
// removes FILE and aborts at step 30 if FILE exists (a trainer crash that
// a restart does not repeat).
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "kolo/kolo_c.h"

namespace {

using Clock = std::chrono::steady_clock;
constexpr int kLen = 1000;

[[noreturn]] void die(const char* what, kolo_status_t st) {
  std::printf("elastic failed: %s: %s: %s\n", what, kolo_status_string(st), kolo_last_error());
  std::fflush(stdout);
  std::_Exit(3);
}

double msSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

long long wallMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: kolo_elastic_check STEPS STEP_MS\n");
    return 2;
  }
  const int64_t steps = std::atoll(argv[1]);
  const int step_ms = std::atoi(argv[2]);
  kolo_status_t st = kolo_init();
  if (st != KOLO_OK) die("init", st);
  std::printf("started rank %d size %d\n", kolo_rank(), kolo_size());
  std::fflush(stdout);

  int64_t step = 0;
  std::vector<double> w(kLen, 0.0), grad(kLen), out(kLen);
  const int64_t shape[1] = {kLen};
  const int64_t one[1] = {1};
  bool need_sync = true;
  Clock::time_point changed_at{};
  bool changed = false;
  const auto give_up = Clock::now() + std::chrono::seconds(120);

  while (true) {
    if (Clock::now() > give_up) die("deadline", KOLO_ERR_TIMED_OUT);
    if (need_sync) {
      // Horovod's state.sync(): everyone takes rank 0's state.
      st = kolo_broadcast("elastic.sync.step", &step, 1, one, KOLO_INT64, 0);
      if (st == KOLO_OK) st = kolo_broadcast("elastic.sync.w", w.data(), 1, shape, KOLO_FLOAT64, 0);
      if (st == KOLO_ERR_MEMBERSHIP_CHANGED) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        continue;
      }
      if (st != KOLO_OK) die("sync", st);
      for (int i = 0; i < kLen; ++i) {
        if (w[i] != static_cast<double>(step) * (i + 1)) {
          std::printf("elastic failed: synced state inconsistent at step %lld: w[%d] = %g\n",
                      static_cast<long long>(step), i, w[i]);
          return 3;
        }
      }
      need_sync = false;
    }
    if (step >= steps) break;
    const int rank = kolo_rank(), size = kolo_size();
    if (const char* crash = std::getenv("ELASTIC_CRASH_ONCE"); crash != nullptr && step == 30) {
      const char* cr = std::getenv("ELASTIC_CRASH_RANK");
      if (rank == (cr != nullptr ? std::atoi(cr) : 1) && ::unlink(crash) == 0) {
        std::printf("crashing at step 30 (rank %d)\n", rank);
        std::fflush(stdout);
        std::abort();
      }
    }
    for (int i = 0; i < kLen; ++i) grad[i] = static_cast<double>(rank + 1) * (i + 1);
    st = kolo_allreduce("elastic.grad", grad.data(), out.data(), 1, shape, KOLO_FLOAT64, KOLO_SUM, 1.0, 1.0);
    if (st == KOLO_ERR_MEMBERSHIP_CHANGED) {
      if (!changed) changed_at = Clock::now();
      changed = true;
      std::printf("membership changed at step %lld (wall_ms %lld): %s\n", static_cast<long long>(step), wallMs(),
                  kolo_last_error());
      std::fflush(stdout);
      need_sync = true;
      continue;
    }
    if (st != KOLO_OK) die("allreduce", st);
    // An op that succeeded ran in the generation it was submitted in: the
    // world read before it (a newer World fails the submission itself).
    for (int i = 0; i < kLen; ++i) {
      double want = static_cast<double>(size) * (size + 1) / 2 * (i + 1);
      if (out[i] != want) {
        std::printf("elastic failed: step %lld: out[%d] = %g, want %g (size %d)\n", static_cast<long long>(step), i,
                    out[i], want, size);
        return 3;
      }
    }
    if (changed) {
      std::printf("recovered in %.0f ms: size %d at step %lld (wall_ms %lld)\n", msSince(changed_at), size,
                  static_cast<long long>(step), wallMs());
      changed = false;
    }
    for (int i = 0; i < kLen; ++i) w[i] += i + 1;
    ++step;
    if (step % 10 == 0) {
      // A commit point (kolo.torch.elastic's convention): agents waiting
      // to join are admitted here, between steps.
      float one_f = 0;
      st = kolo_allreduce("__kolo.elastic.commit", &one_f, &one_f, 1, one, KOLO_FLOAT32, KOLO_SUM, 1.0, 1.0);
      if (st == KOLO_ERR_MEMBERSHIP_CHANGED) {
        if (!changed) changed_at = Clock::now();
        changed = true;
        std::printf("membership changed at commit %lld (wall_ms %lld): %s\n", static_cast<long long>(step), wallMs(),
                    kolo_last_error());
        std::fflush(stdout);
        need_sync = true;
        continue;
      }
      if (st != KOLO_OK) die("commit", st);
    }
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
  std::printf("elastic ok rank %d size %d step %lld\n", kolo_rank(), kolo_size(), static_cast<long long>(step));
  std::fflush(stdout);
  kolo_shutdown();
  return 0;
}
