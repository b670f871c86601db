// Several kolo-coordinator addresses (`--coordinator host:port,host:port`):
// the list, the address in use, and where to go when a call there fails
// with UNAVAILABLE (connection refused, a standby, a shutdown). Pure logic,
// no gRPC: the agent's CoordClient and the `kolo` CLI drive it. Thread-safe
// (the agent's heartbeat, watch and one-shot threads share one).
//
// After a failure at the address in use it moves to the leader a standby
// named (`standby: ... the leader is at HOST:PORT`) when that address is in
// the list, else to the next one (round robin). Each full round of failures
// without a success waits longer before the next try: `initial` doubled per
// round, at most `max` (bounded backoff); a success resets it. Callers keep
// their own deadline: a wait is never longer than `max`. See
// docs/coordinator.md "Several coordinator addresses".
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kolo {

// Splits and checks a `host:port[,host:port...]` list ("[v6]:port" too).
// `what` names the setting in the error ("--coordinator"), which names the
// bad entry: `--coordinator "a:1,b": entry 2 ("b") is not host:port`.
StatusOr<std::vector<std::string>> parseCoordinatorList(std::string_view list,
                                                        std::string_view what);

// The HOST:PORT after "leader is at " in a standby's answer, if any.
std::optional<std::string> leaderHint(std::string_view message);

// Whether a gRPC UNAVAILABLE message says the call never reached a leader:
// a standby's answer or a connection that could not be opened. Such a call
// changed nothing, so even a call that is not idempotent may go again.
bool neverReachedLeader(std::string_view message);

// The wait after each full round of failures: `initial`, doubled per
// round, at most `max`.
struct CoordBackoff {
  std::chrono::milliseconds initial{50};
  std::chrono::milliseconds max{1000};
};

class CoordEndpoints {
 public:
  using Backoff = CoordBackoff;
  // What `failed` decided: the address to use next and how long to wait first.
  struct Next {
    std::string address;
    std::chrono::milliseconds wait{0};
    bool switched = false;  // `address` differs from the one that failed
    bool hinted = false;    // chosen from a standby's leader hint
  };

  // `addresses` non-empty (from parseCoordinatorList).
  explicit CoordEndpoints(std::vector<std::string> addresses, Backoff backoff = {});

  const std::vector<std::string>& all() const { return addresses_; }
  size_t size() const { return addresses_.size(); }
  // "a:1" or "a:1, b:2": for messages naming every address.
  std::string joined() const;
  std::string current() const;

  // A call to `address` failed with UNAVAILABLE (`message`: its text). A
  // failure at an address no longer in use (another thread moved on
  // already) does not move again and waits nothing.
  Next failed(const std::string& address, std::string_view message);
  // A call to `address` worked: it stays in use and the backoff resets.
  void succeeded(const std::string& address);

 private:
  const std::vector<std::string> addresses_;
  const Backoff backoff_;
  mutable std::mutex mu_;
  size_t current_ = 0;     // under mu_
  uint64_t failures_ = 0;  // in a row since the last success, under mu_
};

}  // namespace kolo
