// The tensor table of one job on one agent (pure logic, no I/O).
//
// Each local rank submits named collectives. A name becomes node-ready when
// every local rank has submitted it. Submissions must agree on collective,
// dtype, shape, reduce op, scale factors and root; a disagreement is
// reported to every rank once all have submitted (so nobody is left
// waiting), with a message naming both sides and their ranks.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/dtype.h"
#include "common/ipc_layout.h"
#include "common/status.h"

namespace kolo {

using SteadyTime = std::chrono::steady_clock::time_point;

struct ReadyOp {
  std::string name;
  std::vector<SubmitDesc> descs;  // indexed by local rank
  // The metadata each rank left in shared memory (allgather sizes, alltoall
  // split matrix), copied once at submission (agent/core/shm_meta.h);
  // indexed by local rank, empty for an absent rank or an op without any.
  std::vector<std::vector<int64_t>> metas;
  Status error;                   // set when the ranks disagreed
  SteadyTime first_arrival;
  SteadyTime ready_at;
  std::vector<SteadyTime> arrivals;  // indexed by local rank
  // Join: absent[r] is true for a local rank that had joined (kolo_join)
  // without submitting this name. Its descs[r] is a copy of a present rank's
  // with handle 0 and offsets 0: it has no slots (it contributes zeros /
  // zero rows), but descs[0] always carries the op's parameters and sizes.
  std::vector<bool> absent;
  bool anyAbsent() const {
    for (bool a : absent) {
      if (a) return true;
    }
    return false;
  }
};

struct PendingInfo {
  std::string name;
  SubmitDesc first;
  std::vector<int> submitted;  // local ranks
  std::vector<int> waiting;    // local ranks
  SteadyTime first_arrival;
  std::vector<SteadyTime> arrivals;  // per submitted rank, same order as `submitted`
};

class TensorTable {
 public:
  explicit TensorTable(int local_size) : local_size_(local_size) {}

  void setRankOffset(int offset) { rank_offset_ = offset; }
  int rankOffset() const { return rank_offset_; }

  // Records a submission. An error return concerns this submission only
  // (e.g. the name is already in flight on that rank). When the name becomes
  // node-ready, *ready is filled and the entry leaves the table.
  // `meta`: the rank's private copy of its shared-memory metadata, if any.
  Status submit(int local_rank, const SubmitDesc& desc, SteadyTime now,
                std::optional<ReadyOp>* ready, std::vector<int64_t> meta = {});

  // Join: marks `local_rank` as joined. From now on a name is node-ready
  // once every rank that has not joined submitted it; returns the names that
  // became ready through this call. Only allreduce and allgather may run
  // with absent ranks; any other collective is ready with an error.
  std::vector<ReadyOp> join(int local_rank, SteadyTime now);
  bool joined(int local_rank) const { return joined_[local_rank]; }
  int joinedCount() const { return joined_count_; }
  void resetJoined();

  // Grouped allreduce whose group failed: removes every pending name that
  // some local rank submitted as a member of `group_id`, as ReadyOps (the
  // ranks that did not submit it marked absent) for the caller to fail.
  std::vector<ReadyOp> takeGroup(uint64_t group_id, SteadyTime now);

  // Removes and returns everything pending (used when the job fails).
  std::vector<std::pair<int, uint64_t>> drainAll();
  // The pending names, oldest first; at most `max` of them (status replies
  // stay bounded), with how many were left out in *omitted.
  std::vector<PendingInfo> snapshot(size_t max = SIZE_MAX, size_t* omitted = nullptr) const;
  size_t pendingCount() const { return pending_.size(); }

  // Compares two submissions; returns a message naming both sides, or "".
  static std::string describeMismatch(const std::string& name, const SubmitDesc& a, int rank_a,
                                      const SubmitDesc& b, int rank_b);
  static std::string shapeString(const SubmitDesc& d);
  // The error of a collective other than allreduce/allgather while `ranks`
  // (global) have joined.
  static std::string joinedRefusal(CollectiveType coll, const std::string& name, const std::vector<int>& ranks);

 private:
  struct Entry {
    // By local rank; null until that rank submits (one pointer per rank, so
    // a name one rank floods costs little more than its own descriptor).
    std::vector<std::unique_ptr<SubmitDesc>> descs;
    std::vector<std::vector<int64_t>> metas;  // by local rank: copies of shared-memory metadata
    std::vector<SteadyTime> arrivals;
    int count = 0;
    int first_rank = -1;
    SteadyTime first_arrival;
    std::string mismatch;
  };
  bool readyLocked(const Entry& e) const;
  ReadyOp takeReady(std::unordered_map<std::string, Entry>::iterator it, SteadyTime now);

  int local_size_;
  int rank_offset_ = 0;
  std::vector<bool> joined_ = std::vector<bool>(static_cast<size_t>(local_size_), false);
  int joined_count_ = 0;
  std::unordered_map<std::string, Entry> pending_;
};

}  // namespace kolo
