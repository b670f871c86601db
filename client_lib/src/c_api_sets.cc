// The C ABI's process sets (kolo_add_process_set & co.) and the collectives
// on a set (kolo_ps_*); the global set's asynchronous collectives are these
// with set 0. A set is a job of its own on the agents (process_sets.h): this
// rank's Client for it is kept in processSets() while the set exists.

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#pragma GCC visibility push(default)
#include "kolo/kolo_c.h"
#pragma GCC visibility pop

#include "c_api_internal.h"
#include "client.h"
#include "process_sets.h"

namespace kolo::capi {

StatusOr<Target> target(int32_t ps) {
  std::lock_guard<std::mutex> lock(mu());
  if (!globalClient()) return notInitializedStatus();
  if (ps == 0) return Target{globalClient(), {}};
  auto it = processSets().find(ps);
  if (it == processSets().end()) {
    return invalidArgument("unknown process set " + std::to_string(ps) +
                           " (ids come from kolo_add_process_set; a removed set is gone)");
  }
  if (!it->second.client) {
    return invalidArgument("rank " + std::to_string(globalClient()->world().rank) + " is not in process set " +
                           std::to_string(ps) + " (ranks " + process_sets::describe(it->second.ranks) +
                           "); only its members run collectives on it");
  }
  return Target{it->second.client, it->second.ranks};
}

}  // namespace kolo::capi

namespace {

using kolo::Client;
using kolo::Code;
using kolo::Status;
using namespace kolo::capi;  // NOLINT

// Serializes kolo_add_process_set / kolo_remove_process_set: a set's id is
// its place in the sequence of adds, which must be the same on every rank.
std::mutex& setsMu() {
  static std::mutex& m = *new std::mutex;
  return m;
}

// Every rank of the job contributes `digest` (62 bits) to an allreduce
// (Max of {d, M - d}) named `name`; true when all contributed the same.
kolo::StatusOr<bool> agree(Client& c, const std::string& name, uint64_t digest) {
  constexpr int64_t kM = (int64_t{1} << 62) - 1;
  const int64_t d = static_cast<int64_t>(digest & static_cast<uint64_t>(kM));
  int64_t v[2] = {d, kM - d};
  int64_t shape[1] = {2};
  kolo::AllreduceArgs a;
  a.name = name.c_str();
  a.input = v;
  a.output = v;
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(kolo::DataType::kInt64);
  a.op = static_cast<int>(kolo::ReduceOp::kMax);
  auto h = c.allreduceAsync(a);
  if (!h.isOk()) return h.status();
  Status st = c.wait(*h, std::chrono::milliseconds(-1));
  if (st.code() == Code::kTimedOut) c.release(*h);
  if (!st.isOk()) return st;
  return v[0] == d && kM - v[1] == d;
}

kolo::AllreduceArgs allreduceArgs(const char* name, const void* input, void* output, int ndim, const int64_t* shape,
                                  kolo_dtype_t dtype, kolo_op_t op, double prescale, double postscale) {
  kolo::AllreduceArgs a;
  a.name = name;
  a.input = input;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = static_cast<int>(dtype);
  a.op = static_cast<int>(op);
  a.prescale = prescale;
  a.postscale = postscale;
  return a;
}

// The broadcast root (a global rank) as a rank of the set.
kolo::StatusOr<int> setRoot(const Target& t, int32_t ps, int root) {
  if (ps == 0) return root;
  int r = kolo::process_sets::rankInSet(t.ranks, root);
  if (r < 0) {
    return kolo::invalidArgument("broadcast root rank " + std::to_string(root) + " is not in process set " +
                                 std::to_string(ps) + " (ranks " + kolo::process_sets::describe(t.ranks) +
                                 "); the root is a global rank of the set");
  }
  return r;
}

}  // namespace

extern "C" {

kolo_status_t kolo_add_process_set(const int* ranks, int count, int32_t* id) {
  KOLO_C_GUARD("kolo_add_process_set", {
    if (id == nullptr) return fail(Code::kInvalidArgument, "kolo_add_process_set: id is NULL");
    *id = -1;
    std::lock_guard<std::mutex> serial(setsMu());
    auto c = current();
    if (!c) return notInitialized();
    const kolo::WorldView w = c->world();
    std::vector<int> rs;
    if (ranks != nullptr && count > 0) rs.assign(ranks, ranks + count);
    Status valid = ranks == nullptr && count > 0 ? kolo::invalidArgument("ranks is NULL")
                                                 : kolo::process_sets::normalize(&rs, w.size);
    int32_t nid = 0;
    {
      std::lock_guard<std::mutex> lock(mu());
      nid = nextProcessSetId()++;
      if (valid.isOk()) {
        if (rs.size() == static_cast<size_t>(w.size)) {
          valid = kolo::invalidArgument("ranks " + kolo::process_sets::describe(rs) +
                                        " are every rank of the job: that is the global process set (0)");
        }
        for (const auto& [other, e] : processSets()) {
          if (valid.isOk() && e.ranks == rs) {
            valid = kolo::invalidArgument("ranks " + kolo::process_sets::describe(rs) +
                                          " already exist as process set " + std::to_string(other));
          }
        }
      }
    }
    // Every rank takes part in the agreement, even with a list it refuses,
    // so that no rank waits for another that gave up.
    const uint64_t digest = valid.isOk() ? kolo::process_sets::digest(nid, rs) : 1;
    const std::string what = "kolo_add_process_set (process set " + std::to_string(nid) + ")";
    auto same = agree(*c, "__kolo.ps.add." + std::to_string(nid), digest);
    if (!same.isOk()) return fail(same.status().withContext(what + ": agreeing on the ranks"));
    if (!*same) {
      return fail(Code::kInvalidArgument,
                  what + ": the ranks disagree: rank " + std::to_string(w.rank) + " passed ranks " +
                      kolo::process_sets::describe(rs) +
                      ", another rank a different list (or the ranks have added a different number of sets); "
                      "every rank must add the same sets in the same order" +
                      (valid.isOk() ? std::string() : " (this rank's list is also refused: " + valid.message() + ")"));
    }
    if (!valid.isOk()) return fail(valid.withContext(what));
    kolo::capi::ProcessSetEntry entry;
    entry.ranks = rs;
    if (kolo::process_sets::rankInSet(rs, w.rank) >= 0) {
      auto opts = kolo::process_sets::memberOptions(c->options(), w, nid, rs);
      if (!opts.isOk()) return fail(opts.status().withContext(what));
      auto sub = Client::connect(*opts);
      if (!sub.isOk()) return fail(sub.status().withContext(what + ": connecting its members"));
      entry.client = std::shared_ptr<Client>(std::move(sub).value());
    }
    {
      std::lock_guard<std::mutex> lock(mu());
      processSets()[nid] = std::move(entry);
    }
    *id = nid;
    return KOLO_OK;
  })
}

kolo_status_t kolo_remove_process_set(int32_t id) {
  KOLO_C_GUARD("kolo_remove_process_set", {
    std::lock_guard<std::mutex> serial(setsMu());
    auto c = current();
    if (!c) return notInitialized();
    if (id == 0) return fail(Code::kInvalidArgument, "kolo_remove_process_set: the global process set (0) cannot be removed");
    std::vector<int> rs;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = processSets().find(id);
      if (it == processSets().end()) {
        return fail(Code::kInvalidArgument, "kolo_remove_process_set: unknown process set " + std::to_string(id));
      }
      rs = it->second.ranks;
    }
    const std::string what = "kolo_remove_process_set (process set " + std::to_string(id) + ")";
    auto same = agree(*c, "__kolo.ps.remove." + std::to_string(id), kolo::process_sets::digest(id, rs));
    if (!same.isOk()) return fail(same.status().withContext(what));
    if (!*same) {
      return fail(Code::kInvalidArgument, what + ": the ranks disagree on which set to remove; every rank must "
                                                 "remove the same sets in the same order");
    }
    std::shared_ptr<Client> sub;
    {
      std::lock_guard<std::mutex> lock(mu());
      auto it = processSets().find(id);
      if (it != processSets().end()) {
        sub = std::move(it->second.client);
        processSets().erase(it);
      }
    }
    if (sub) sub->shutdown();
    return KOLO_OK;
  })
}

int kolo_process_set_rank(int32_t id) {
  try {
    std::lock_guard<std::mutex> lock(mu());
    if (!globalClient()) return -1;
    const int rank = globalClient()->world().rank;
    if (id == 0) return rank;
    auto it = processSets().find(id);
    return it == processSets().end() ? -1 : kolo::process_sets::rankInSet(it->second.ranks, rank);
  } catch (...) {
    return -1;
  }
}

int kolo_process_set_size(int32_t id) {
  try {
    std::lock_guard<std::mutex> lock(mu());
    if (!globalClient()) return -1;
    if (id == 0) return globalClient()->world().size;
    auto it = processSets().find(id);
    return it == processSets().end() ? -1 : static_cast<int>(it->second.ranks.size());
  } catch (...) {
    return -1;
  }
}

kolo_status_t kolo_process_set_ranks(int32_t id, int* ranks, int capacity, int* count) {
  KOLO_C_GUARD("kolo_process_set_ranks", {
    if (count == nullptr) return fail(Code::kInvalidArgument, "kolo_process_set_ranks: count is NULL");
    *count = 0;
    std::vector<int> rs;
    {
      std::lock_guard<std::mutex> lock(mu());
      if (!globalClient()) return notInitialized();
      if (id == 0) {
        for (int r = 0; r < globalClient()->world().size; ++r) rs.push_back(r);
      } else {
        auto it = processSets().find(id);
        if (it == processSets().end()) {
          return fail(Code::kInvalidArgument, "kolo_process_set_ranks: unknown process set " + std::to_string(id));
        }
        rs = it->second.ranks;
      }
    }
    *count = static_cast<int>(rs.size());
    for (int i = 0; i < capacity && i < *count && ranks != nullptr; ++i) ranks[i] = rs[static_cast<size_t>(i)];
    return KOLO_OK;
  })
}

kolo_status_t kolo_ps_allreduce_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                      const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op, double prescale,
                                      double postscale, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allreduce_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allreduce_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    return handOut(t->client->allreduceAsync(
                       allreduceArgs(name, input, output, ndim, shape, dtype, op, prescale, postscale)),
                   ps, handle);
  })
}

kolo_status_t kolo_ps_allreduce_compressed_async(int32_t ps, const char* name, const float* input, float* output,
                                                 int ndim, const int64_t* shape, kolo_op_t op, double prescale,
                                                 double postscale, kolo_compression_t compression,
                                                 kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allreduce_compressed_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allreduce_compressed_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    const kolo::AllreduceArgs a =
        allreduceArgs(name, input, output, ndim, shape, KOLO_FLOAT32, op, prescale, postscale);
    Client& c = *t->client;
    switch (compression) {
      case KOLO_COMPRESS_NONE: return handOut(c.allreduceAsync(a), ps, handle);
      case KOLO_COMPRESS_FP16: return handOut(c.compressedAllreduceAsync(a, kolo::DataType::kFloat16), ps, handle);
      case KOLO_COMPRESS_BF16: return handOut(c.compressedAllreduceAsync(a, kolo::DataType::kBFloat16), ps, handle);
    }
    return fail(Code::kInvalidArgument, "compressed allreduce of tensor '" + std::string(name != nullptr ? name : "") +
                                            "': unknown compression " + std::to_string(static_cast<int>(compression)));
  })
}

kolo_status_t kolo_ps_grouped_allreduce_async(int32_t ps, int count, const char* const* names,
                                              const void* const* inputs, void* const* outputs, const int* ndims,
                                              const int64_t* const* shapes, const kolo_dtype_t* dtypes, kolo_op_t op,
                                              double prescale, double postscale, kolo_handle_t* handles) {
  KOLO_C_GUARD("kolo_grouped_allreduce_async", {
    if (handles == nullptr) return fail(Code::kInvalidArgument, "kolo_grouped_allreduce_async: handles is NULL");
    for (int i = 0; i < count; ++i) handles[i] = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    if (outputs == nullptr) return fail(Code::kInvalidArgument, "grouped allreduce: outputs must not be NULL");
    auto members = groupMembers("grouped allreduce", count, names, inputs, outputs, ndims, shapes, dtypes, op,
                                prescale, postscale);
    if (!members.isOk()) return fail(members.status());
    return handOutAll(t->client->groupedAllreduceAsync(std::move(members).value()), ps, count, handles);
  })
}

kolo_status_t kolo_ps_broadcast_async(int32_t ps, const char* name, void* buffer, int ndim, const int64_t* shape,
                                      kolo_dtype_t dtype, int root, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_broadcast_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_broadcast_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    auto r = setRoot(*t, ps, root);
    if (!r.isOk()) return fail(r.status());
    return handOut(t->client->broadcastAsync(name, buffer, ndim, shape, static_cast<int>(dtype), *r), ps, handle);
  })
}

kolo_status_t kolo_ps_broadcast_oop_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                          const int64_t* shape, kolo_dtype_t dtype, int root,
                                          kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_broadcast_oop_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_broadcast_oop_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    auto r = setRoot(*t, ps, root);
    if (!r.isOk()) return fail(r.status());
    return handOut(t->client->broadcastOopAsync(name, input, output, ndim, shape, static_cast<int>(dtype), *r), ps,
                   handle);
  })
}

kolo_status_t kolo_ps_allgather_async(int32_t ps, const char* name, const void* input, int ndim,
                                      const int64_t* shape, kolo_dtype_t dtype, kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_allgather_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_allgather_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    return handOut(t->client->allgatherAsync(name, input, ndim, shape, static_cast<int>(dtype)), ps, handle);
  })
}

kolo_status_t kolo_ps_grouped_allgather_async(int32_t ps, int count, const char* const* names,
                                              const void* const* inputs, const int* ndims,
                                              const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                              kolo_handle_t* handles) {
  KOLO_C_GUARD("kolo_grouped_allgather_async", {
    if (handles == nullptr) return fail(Code::kInvalidArgument, "kolo_grouped_allgather_async: handles is NULL");
    for (int i = 0; i < count; ++i) handles[i] = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    auto members = groupMembers("grouped allgather", count, names, inputs, nullptr, ndims, shapes, dtypes,
                                KOLO_SUM, 1.0, 1.0);
    if (!members.isOk()) return fail(members.status());
    return handOutAll(t->client->groupedAllgatherAsync(std::move(members).value()), ps, count, handles);
  })
}

kolo_status_t kolo_ps_reducescatter_async(int32_t ps, const char* name, const void* input, void* output, int ndim,
                                          const int64_t* shape, kolo_dtype_t dtype, kolo_op_t op,
                                          kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_reducescatter_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_reducescatter_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    return handOut(t->client->reducescatterAsync(name, input, output, ndim, shape, static_cast<int>(dtype),
                                                 static_cast<int>(op)),
                   ps, handle);
  })
}

kolo_status_t kolo_ps_grouped_reducescatter_async(int32_t ps, int count, const char* const* names,
                                                  const void* const* inputs, void* const* outputs, const int* ndims,
                                                  const int64_t* const* shapes, const kolo_dtype_t* dtypes,
                                                  kolo_op_t op, kolo_handle_t* handles) {
  KOLO_C_GUARD("kolo_grouped_reducescatter_async", {
    if (handles == nullptr) return fail(Code::kInvalidArgument, "kolo_grouped_reducescatter_async: handles is NULL");
    for (int i = 0; i < count; ++i) handles[i] = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    auto members = groupMembers("grouped reducescatter", count, names, inputs, outputs, ndims, shapes, dtypes, op,
                                1.0, 1.0);
    if (!members.isOk()) return fail(members.status());
    return handOutAll(t->client->groupedReducescatterAsync(std::move(members).value()), ps, count, handles);
  })
}

kolo_status_t kolo_ps_alltoall_async(int32_t ps, const char* name, const void* input, int ndim,
                                     const int64_t* shape, kolo_dtype_t dtype, const int64_t* splits,
                                     kolo_handle_t* handle) {
  KOLO_C_GUARD("kolo_alltoall_async", {
    if (handle == nullptr) return fail(Code::kInvalidArgument, "kolo_alltoall_async: handle is NULL");
    *handle = 0;
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    return handOut(t->client->alltoallAsync(name, input, ndim, shape, static_cast<int>(dtype), splits), ps, handle);
  })
}

kolo_status_t kolo_ps_barrier(int32_t ps, int64_t timeout_ms) {
  KOLO_C_GUARD("kolo_barrier", {
    auto t = target(ps);
    if (!t.isOk()) return fail(t.status());
    if (timeout_ms > int64_t{1} << 40) timeout_ms = int64_t{1} << 40;
    return report(t->client->barrier(std::chrono::milliseconds(timeout_ms)));
  })
}

}  // extern "C"
