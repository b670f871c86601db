// Client: the public collectives. Each fills an OpArgs and hands it to the
// one submit path (client_submit.cc); allgather and alltoall first exchange
// the ranks' first dimensions or split matrix with an allreduce of their own.
#include <cstring>
#include <set>

#include "client.h"
#include "client_text.h"

namespace kolo {

namespace {

using client_text::fmtSeconds;
using client_text::quoteName;
using std::chrono::milliseconds;

}  // namespace

StatusOr<uint64_t> Client::allreduceAsync(const AllreduceArgs& a) { return submit(a); }

StatusOr<uint64_t> Client::broadcastAsync(const char* name, void* buf, int ndim,
                                          const int64_t* shape, int dtype, int root) {
  OpArgs a;
  a.name = name;
  a.input = buf;
  a.output = buf;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);  // unused; the same on every rank
  a.collective = static_cast<int>(CollectiveType::kBroadcast);
  a.root = root;
  return submit(a);
}

StatusOr<uint64_t> Client::broadcastOopAsync(const char* name, const void* input, void* output,
                                             int ndim, const int64_t* shape, int dtype, int root) {
  OpArgs a;
  a.name = name;
  // The other ranks' input is not read: without one, the output's memory
  // stands in (its bytes are overwritten by the root's anyway).
  a.input = input != nullptr || world().rank == root ? input : output;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);  // unused; the same on every rank
  a.collective = static_cast<int>(CollectiveType::kBroadcast);
  a.root = root;
  a.out_of_place = true;
  return submit(a);
}

StatusOr<uint64_t> Client::compressedAllreduceAsync(OpArgs a, DataType wire) {
  const std::string what =
      "compressed allreduce of tensor " + quoteName(a.name != nullptr ? a.name : "");
  if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
    return invalidArgument(what + ": compression must be KOLO_COMPRESS_FP16 or KOLO_COMPRESS_BF16");
  }
  if (a.dtype != static_cast<int>(DataType::kFloat32)) {
    return invalidArgument(what + ": the tensor must be float32 (it is " +
                           (isValidDataType(a.dtype)
                                ? std::string(dataTypeName(static_cast<DataType>(a.dtype)))
                                : std::to_string(a.dtype)) +
                           ")");
  }
  a.dtype = static_cast<int>(wire);
  a.compressed = true;
  a.collective = static_cast<int>(CollectiveType::kAllreduce);
  return submit(a);
}

Status Client::barrier(milliseconds timeout) {
  std::string name = "__kolo.barrier." + std::to_string(barriers_.fetch_add(1) + 1);
  int64_t shape[1] = {0};
  OpArgs a;
  a.name = name.c_str();
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kUint8);
  a.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, submit(a));
  Status st = wait(h, timeout);
  if (st.code() == Code::kTimedOut) {
    release(h);
    return timedOut("kolo_barrier: not every rank reached barrier " + name.substr(15) + " within " +
                    fmtSeconds(timeout.count() < 0 ? opts_.op_timeout : timeout) + " s");
  }
  return st;
}

StatusOr<std::vector<uint64_t>> Client::groupedAllreduceAsync(std::vector<OpArgs> members) {
  return groupedAsync(std::move(members), "grouped allreduce");
}

StatusOr<std::vector<uint64_t>> Client::groupedAsync(std::vector<OpArgs> members,
                                                     const char* what) {
  const std::string kind(what);
  if (members.empty()) return invalidArgument(kind + ": the group has no tensors");
  if (members.size() > 1024) {
    return invalidArgument(kind + ": " + std::to_string(members.size()) +
                           " tensors; a group holds at most 1024 (the in-flight limit)");
  }
  // Check every member first: a group that is half submitted would leave
  // the other ranks waiting for the rest.
  std::set<std::string, std::less<>> seen;
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the names, in order
  for (const OpArgs& a : members) {
    uint64_t bytes = 0;
    RETURN_IF_ERROR(validate(a, &bytes).withContext(kind));
    if (a.collective != members[0].collective) {
      return internalError(kind + ": the members are not all the same collective");
    }
    if (!seen.insert(a.name).second) {
      return invalidArgument(kind + ": tensor " + quoteName(a.name) +
                             " appears twice in the group");
    }
    for (const char* p = a.name; *p != '\0'; ++p)
      hash = (hash ^ static_cast<unsigned char>(*p)) * 1099511628211ull;
    hash = (hash ^ 0xffu) * 1099511628211ull;  // separator
  }
  hash = (hash ^ static_cast<uint64_t>(members[0].collective)) * 1099511628211ull;
  {
    // A member already in flight would be refused after the others went out.
    progressUntil([] { return false; }, Clock::now(),
                  milliseconds(0));  // collect finished completions
    std::lock_guard<std::mutex> lock(mu_);
    RETURN_IF_ERROR(usableLocked());
    for (const OpArgs& a : members) {
      if (names_in_flight_.count(std::string_view(a.name)) != 0) {
        return invalidArgument(
            kind + ": tensor " + quoteName(a.name) +
            " is still in flight from an earlier call; wait for it first (nothing of this group "
            "was submitted)");
      }
    }
  }
  const uint64_t gid = groups_.fetch_add(1) + 1;
  std::vector<uint64_t> handles;
  handles.reserve(members.size());
  // Device tensors on one stream: one copy-in launch for the group.
  const bool batched = beginDeviceGroup(members);
  struct EndBatch {
    Client* c;
    bool on;
    size_t n;
    ~EndBatch() {
      if (on) c->endDeviceGroup(n);
    }
  } end_batch{this, batched, members.size()};
  for (OpArgs& a : members) {
    a.group_id = gid;
    a.group_hash = hash;
    a.group_size = static_cast<uint32_t>(members.size());
    auto h = submit(a);
    if (!h.isOk()) {
      for (uint64_t done : handles) release(done);
      return Status(
          h.status().code(),
          kind + " #" + std::to_string(gid) + ": submitting tensor " + quoteName(a.name) +
              " failed after " + std::to_string(handles.size()) + " of its " +
              std::to_string(members.size()) +
              " tensors were submitted (the others will wait for it): " + h.status().message());
    }
    handles.push_back(*h);
  }
  return handles;
}

StatusOr<std::vector<uint64_t>> Client::groupedReducescatterAsync(std::vector<OpArgs> members) {
  for (OpArgs& a : members) a.collective = static_cast<int>(CollectiveType::kReducescatter);
  return groupedAsync(std::move(members), "grouped reducescatter");
}

StatusOr<std::vector<uint64_t>> Client::groupedAllgatherAsync(std::vector<OpArgs> members) {
  const WorldView w = world();
  for (OpArgs& a : members) {
    a.output = const_cast<void*>(a.input);  // unused: the result is library-owned
    a.op = static_cast<int>(ReduceOp::kSum);
    a.collective = static_cast<int>(CollectiveType::kAllgather);
    uint64_t bytes = 0;
    RETURN_IF_ERROR(validate(a, &bytes).withContext("grouped allgather"));
    if (std::strlen(a.name) + kAllgatherSizesSuffix.size() > kMaxNameBytes) {
      return invalidArgument(
          "grouped allgather: tensor name " + quoteName(a.name) + " is longer than " +
          std::to_string(kMaxNameBytes - kAllgatherSizesSuffix.size()) + " bytes");
    }
  }
  if (members.empty()) return invalidArgument("grouped allgather: the group has no tensors");
  // Phase 1, one grouped allreduce: every member's first dimension on every
  // rank (Sum of vectors that are zero but for one's own slot).
  const size_t n = static_cast<size_t>(w.size);
  std::vector<std::vector<int64_t>> dims(members.size(), std::vector<int64_t>(n, 0));
  std::vector<std::string> sizes_names(members.size());
  int64_t dims_shape[1] = {w.size};
  std::vector<OpArgs> sizes(members.size());
  for (size_t i = 0; i < members.size(); ++i) {
    dims[i][static_cast<size_t>(w.rank)] = members[i].shape[0];
    sizes_names[i] = std::string(members[i].name) + std::string(kAllgatherSizesSuffix);
    OpArgs& s = sizes[i];
    s.name = sizes_names[i].c_str();
    s.input = dims[i].data();
    s.output = dims[i].data();
    s.ndim = 1;
    s.shape = dims_shape;
    s.dtype = static_cast<int>(DataType::kInt64);
    s.op = static_cast<int>(ReduceOp::kSum);
  }
  ASSIGN_OR_RETURN(std::vector<uint64_t> hs, groupedAsync(std::move(sizes), "grouped allgather"));
  Status first;
  for (uint64_t h : hs) {
    Status st = wait(h, milliseconds(-1));
    if (st.code() == Code::kTimedOut) release(h);
    if (first.isOk() && !st.isOk()) first = st;
  }
  if (!first.isOk()) {
    return Status(first.code(),
                  "grouped allgather of " + std::to_string(members.size()) + " tensors (first " +
                      quoteName(members[0].name) +
                      "): exchanging the ranks' first dimensions failed: " + first.message());
  }
  // Phase 2: the gathers, as one group.
  for (size_t i = 0; i < members.size(); ++i) members[i].gather_dims = dims[i].data();
  return groupedAsync(std::move(members), "grouped allgather");
}

StatusOr<int> Client::join(milliseconds timeout) {
  int64_t shape[1] = {0};
  OpArgs a;
  a.name = "__kolo.join";
  a.ndim = 1;
  a.shape = shape;
  a.dtype = static_cast<int>(DataType::kUint8);
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kJoin);
  ASSIGN_OR_RETURN(uint64_t h, submit(a));
  int64_t last = -1;
  Status st = wait(h, timeout, &last);
  if (st.code() == Code::kTimedOut) {
    release(h);
    return timedOut("kolo_join: not every rank joined within " +
                    fmtSeconds(timeout.count() < 0 ? opts_.op_timeout : timeout) +
                    " s; this rank stays joined, so treat the job as broken");
  }
  RETURN_IF_ERROR(st);
  return static_cast<int>(last);
}

StatusOr<uint64_t> Client::allgatherAsync(const char* name, const void* input, int ndim,
                                          const int64_t* shape, int dtype) {
  OpArgs a;
  a.name = name;
  a.input = input;
  a.output = const_cast<void*>(input);  // unused: the result is library-owned
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kAllgather);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  std::string sizes_name = std::string(name) + std::string(kAllgatherSizesSuffix);
  if (sizes_name.size() > kMaxNameBytes) {
    return invalidArgument("allgather: tensor name " + quoteName(name) + " is longer than " +
                           std::to_string(kMaxNameBytes - kAllgatherSizesSuffix.size()) + " bytes");
  }
  WorldView w = world();
  // Phase 1: every rank's first dimension (Sum of vectors that are zero but
  // for one's own slot).
  std::vector<int64_t> dims(static_cast<size_t>(w.size), 0);
  dims[static_cast<size_t>(w.rank)] = shape[0];
  int64_t dims_shape[1] = {w.size};
  OpArgs s;
  s.name = sizes_name.c_str();
  s.input = dims.data();
  s.output = dims.data();
  s.ndim = 1;
  s.shape = dims_shape;
  s.dtype = static_cast<int>(DataType::kInt64);
  s.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, submit(s));
  Status st = wait(h, milliseconds(-1));
  if (st.code() == Code::kTimedOut) release(h);
  if (!st.isOk()) {
    return Status(st.code(),
                  "allgather of tensor " + quoteName(name) +
                      ": exchanging the ranks' first dimensions failed: " + st.message());
  }
  for (int64_t d : dims) {
    if (d < 0)
      return internalError("allgather of tensor " + quoteName(name) +
                           ": a rank reported first dimension " + std::to_string(d));
  }
  // Phase 2: the gather itself.
  a.gather_dims = dims.data();
  return submit(a);
}

StatusOr<uint64_t> Client::reducescatterAsync(const char* name, const void* input, void* output,
                                              int ndim, const int64_t* shape, int dtype, int op) {
  OpArgs a;
  a.name = name;
  a.input = input;
  a.output = output;
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = op;
  a.collective = static_cast<int>(CollectiveType::kReducescatter);
  return submit(a);
}

StatusOr<uint64_t> Client::alltoallAsync(const char* name, const void* input, int ndim,
                                         const int64_t* shape, int dtype, const int64_t* splits) {
  OpArgs a;
  a.name = name;
  a.input = input;
  a.output = const_cast<void*>(input);  // unused: the result is library-owned
  a.ndim = ndim;
  a.shape = shape;
  a.dtype = dtype;
  a.op = static_cast<int>(ReduceOp::kSum);
  a.collective = static_cast<int>(CollectiveType::kAlltoall);
  uint64_t bytes = 0;
  RETURN_IF_ERROR(validate(a, &bytes));
  static constexpr std::string_view kSuffix = ".__splits";
  std::string splits_name = std::string(name) + std::string(kSuffix);
  if (splits_name.size() > kMaxNameBytes) {
    return invalidArgument("alltoall: tensor name " + quoteName(name) + " is longer than " +
                           std::to_string(kMaxNameBytes - kSuffix.size()) + " bytes");
  }
  const WorldView w = world();
  const size_t n = static_cast<size_t>(w.size);
  std::vector<int64_t> m(n * n, 0);
  int64_t sum = 0;
  for (size_t d = 0; d < n; ++d) {
    int64_t v = splits != nullptr ? splits[d] : shape[0] / w.size;
    if (v < 0)
      return invalidArgument("alltoall of tensor " + quoteName(name) + ": splits[" +
                             std::to_string(d) + "] is negative");
    m[static_cast<size_t>(w.rank) * n + d] = v;
    sum += v;
  }
  if (sum != shape[0]) {
    return invalidArgument(
        "alltoall of tensor " + quoteName(name) + ": " +
        (splits != nullptr ? "the splits add up to " + std::to_string(sum) + " rows"
                           : "without splits the first dimension must divide by the job size " +
                                 std::to_string(w.size)) +
        ", but the first dimension is " + std::to_string(shape[0]));
  }
  int64_t m_shape[1] = {static_cast<int64_t>(n * n)};
  OpArgs s;
  s.name = splits_name.c_str();
  s.input = m.data();
  s.output = m.data();
  s.ndim = 1;
  s.shape = m_shape;
  s.dtype = static_cast<int>(DataType::kInt64);
  s.op = static_cast<int>(ReduceOp::kSum);
  ASSIGN_OR_RETURN(uint64_t h, submit(s));
  Status st = wait(h, milliseconds(-1));
  if (st.code() == Code::kTimedOut) release(h);
  if (!st.isOk()) {
    return Status(st.code(), "alltoall of tensor " + quoteName(name) +
                                 ": exchanging the ranks' splits failed: " + st.message());
  }
  a.splits_matrix = m.data();
  return submit(a);
}

}  // namespace kolo
