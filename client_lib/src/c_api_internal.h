// Shared by the C ABI's translation units (c_api.cc: lifecycle, handles,
// errors and the global-set collectives; c_api_sets.cc: process sets and
// the collectives on them). Nothing here is exported.
#pragma once

#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client.h"
#include "kolo/kolo_c.h"

namespace kolo::capi {

// Process-global state, guarded by mu(). The Client objects are
// shared_ptrs: each call takes a reference and works without the mutex, so
// a slow wait never blocks other threads and kolo_shutdown() never frees a
// Client another thread is still inside.
std::mutex& mu();
std::shared_ptr<Client>& globalClient();  // mu()
uint64_t& sessionGeneration();            // mu(): bumped by each successful kolo_init
// The job id this process's `session`-th kolo_init attempt (1, 2, ...; a
// call while initialized is none) joins: the first joins KOLO_JOB_ID itself,
// later ones (init after shutdown) a fresh incarnation "<job>.i<session>".
std::string incarnationJobId(const std::string& job_id, uint64_t session);

struct ProcessSetEntry {
  std::vector<int> ranks;          // global ranks, ascending
  std::shared_ptr<Client> client;  // this rank's connection for the set; null when not a member
};
std::map<int32_t, ProcessSetEntry>& processSets();  // mu()
int32_t& nextProcessSetId();                        // mu()

// A handle carries its process set in its top 16 bits (0: the global set);
// Client handles stay far below 2^48.
constexpr int kSetShift = 48;
constexpr uint64_t kRawMask = (uint64_t{1} << kSetShift) - 1;
inline uint64_t tagHandle(int32_t ps, uint64_t raw) { return raw | (static_cast<uint64_t>(ps) << kSetShift); }

std::shared_ptr<Client> current();  // the global set's client (null: not initialized)

kolo_status_t fail(const Status& s);
kolo_status_t fail(Code c, std::string message);
Status notInitializedStatus();
kolo_status_t notInitialized();
kolo_status_t report(const Status& s);
kolo_status_t internal(const char* where, const std::exception* e);

// How every asynchronous wrapper ends: the submitted op's handle, tagged
// with its set, goes to the caller (the blocking forms wait on it: waitOne
// in c_api.cc).
kolo_status_t handOut(const StatusOr<uint64_t>& h, int32_t ps, kolo_handle_t* handle);
kolo_status_t handOutAll(const StatusOr<std::vector<uint64_t>>& hs, int32_t ps, int count, kolo_handle_t* handles);

// The client that runs collectives on set `ps` (0: the global set), and the
// set's ranks (empty for the global set). Errors: not initialized, an
// unknown set, this rank not a member.
struct Target {
  std::shared_ptr<Client> client;
  std::vector<int> ranks;
};
StatusOr<Target> target(int32_t ps);

// Member lists of the grouped calls as AllreduceArgs (validated pointers).
StatusOr<std::vector<AllreduceArgs>> groupMembers(const char* what, int count, const char* const* names,
                                                  const void* const* inputs, void* const* outputs, const int* ndims,
                                                  const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                                  kolo_op_t op, double prescale, double postscale);

}  // namespace kolo::capi

#define KOLO_C_GUARD(where, ...)                      \
  try {                                               \
    __VA_ARGS__                                       \
  } catch (const std::exception& e) {                 \
    return ::kolo::capi::internal(where, &e);         \
  } catch (...) {                                     \
    return ::kolo::capi::internal(where, nullptr);    \
  }
