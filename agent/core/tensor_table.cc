#include "agent/core/tensor_table.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "common/dtype.h"

namespace kolo {

std::string TensorTable::shapeString(const SubmitDesc& d) {
  std::ostringstream o;
  o << "[";
  for (int i = 0; i < d.ndim && i < kMaxDims; ++i) o << (i ? ", " : "") << d.shape[i];
  o << "]";
  return o.str();
}

namespace {
bool firstDimMayDiffer(const SubmitDesc& d) {
  return d.collective == static_cast<uint8_t>(CollectiveType::kAllgather) ||
         d.collective == static_cast<uint8_t>(CollectiveType::kAlltoall);
}
}  // namespace

std::string TensorTable::describeMismatch(const std::string& name, const SubmitDesc& a, int ra,
                                          const SubmitDesc& b, int rb) {
  std::ostringstream o;
  auto coll = [](const SubmitDesc& d) {
    return std::string(collectiveName(static_cast<CollectiveType>(d.collective)));
  };
  auto group = [&coll](const SubmitDesc& d) {
    if (d.group_id == 0) return "on its own (not in a grouped " + coll(d) + ")";
    return "in grouped " + coll(d) + " #" + std::to_string(d.group_id) + " of " + std::to_string(d.group_size) +
           " tensors";
  };
  if (a.collective != b.collective) {
    o << "Mismatched operations for tensor '" << name << "': rank " << ra << " did an "
      << coll(a) << ", but rank " << rb << " did an " << coll(b) << ".";
  } else if (a.group_id != b.group_id || a.group_size != b.group_size) {
    o << "Mismatched group membership for tensor '" << name << "': rank " << ra << " submitted it " << group(a)
      << ", but rank " << rb << " " << group(b) << ".";
  } else if (a.group_hash != b.group_hash) {
    o << "Mismatched group membership for tensor '" << name << "': ranks " << ra << " and " << rb
      << " grouped it (" << group(a).substr(3) << ") with different tensors.";
  } else if (a.dtype != b.dtype) {
    o << "Mismatched data types for tensor '" << name << "': rank " << ra << " sent "
      << dataTypeName(static_cast<DataType>(a.dtype)) << ", but rank " << rb << " sent "
      << dataTypeName(static_cast<DataType>(b.dtype)) << ".";
  } else if (firstDimMayDiffer(a) &&
             (a.ndim != b.ndim || a.ndim < 1 ||
              std::memcmp(a.shape + 1, b.shape + 1, sizeof(int64_t) * std::min<int>(a.ndim - 1, kMaxDims - 1)) != 0)) {
    // Allgather, alltoall: the first dimension may differ per rank, the others must match.
    o << "Mismatched " << coll(a) << " tensor shapes for tensor '" << name << "': rank " << ra << " sent shape "
      << shapeString(a) << ", but rank " << rb << " sent shape " << shapeString(b)
      << " (all dimensions but the first must match).";
  } else if (!firstDimMayDiffer(a) &&
             (a.ndim != b.ndim ||
              std::memcmp(a.shape, b.shape, sizeof(int64_t) * std::min<int>(a.ndim, kMaxDims)) != 0)) {
    o << "Mismatched " << coll(a) << " tensor shapes for tensor '" << name << "': rank " << ra
      << " sent shape " << shapeString(a) << ", but rank " << rb << " sent shape "
      << shapeString(b) << ".";
  } else if (a.reduce_op != b.reduce_op) {
    o << "Mismatched reduction operations for tensor '" << name << "': rank " << ra << " sent "
      << reduceOpName(static_cast<ReduceOp>(a.reduce_op)) << ", but rank " << rb << " sent "
      << reduceOpName(static_cast<ReduceOp>(b.reduce_op)) << ".";
  } else if (a.prescale != b.prescale || a.postscale != b.postscale) {
    o << "Mismatched prescale and/or postscale factors for tensor '" << name << "': rank " << ra
      << " sent (" << a.prescale << ", " << a.postscale << "), but rank " << rb << " sent ("
      << b.prescale << ", " << b.postscale << ").";
  } else if (a.root != b.root) {
    o << "Mismatched " << coll(a) << " root ranks for tensor '" << name << "': rank " << ra
      << " specified root " << a.root << ", but rank " << rb << " specified root " << b.root
      << ".";
  }
  return o.str();
}

Status TensorTable::submit(int local_rank, const SubmitDesc& desc, SteadyTime now,
                           std::optional<ReadyOp>* ready, std::vector<int64_t> meta) {
  ready->reset();
  if (local_rank < 0 || local_rank >= local_size_) {
    return internalError("local rank " + std::to_string(local_rank) + " out of range");
  }
  std::string name(desc.name, std::min<size_t>(desc.name_len, kMaxNameBytes));
  auto [it, inserted] = pending_.try_emplace(name);
  Entry& e = it->second;
  if (inserted) {
    e.descs.resize(local_size_);
    e.metas.resize(local_size_);
    e.arrivals.resize(local_size_);
    e.first_rank = local_rank;
    e.first_arrival = now;
  }
  if (e.descs[local_rank] != nullptr) {
    return invalidArgument("Requested " +
                           std::string(collectiveName(static_cast<CollectiveType>(desc.collective))) +
                           " of a tensor named '" + name + "' while rank " +
                           std::to_string(rank_offset_ + local_rank) +
                           " already has a tensor of that name in flight. Use a different name, "
                           "or wait for the first one to finish.");
  }
  if (e.mismatch.empty() && !inserted) {
    e.mismatch = describeMismatch(name, *e.descs[e.first_rank], rank_offset_ + e.first_rank, desc,
                                  rank_offset_ + local_rank);
  }
  e.descs[local_rank] = std::make_unique<SubmitDesc>(desc);
  e.metas[local_rank] = std::move(meta);
  e.arrivals[local_rank] = now;
  e.count++;
  if (!readyLocked(e)) return okStatus();
  *ready = takeReady(it, now);
  return okStatus();
}

bool TensorTable::readyLocked(const Entry& e) const {
  for (int r = 0; r < local_size_; ++r) {
    if (e.descs[r] == nullptr && !joined_[r]) return false;
  }
  return true;
}

ReadyOp TensorTable::takeReady(std::unordered_map<std::string, Entry>::iterator it, SteadyTime now) {
  Entry& e = it->second;
  ReadyOp op;
  op.name = it->first;
  op.first_arrival = e.first_arrival;
  op.ready_at = now;
  op.arrivals = e.arrivals;
  op.metas = std::move(e.metas);
  op.descs.reserve(local_size_);
  op.absent.assign(local_size_, false);
  const SubmitDesc& present = *e.descs[e.first_rank];
  std::vector<int> absent_ranks;
  for (int r = 0; r < local_size_; ++r) {
    if (e.descs[r] != nullptr) {
      op.descs.push_back(*e.descs[r]);
      continue;
    }
    SubmitDesc d = present;  // a joined rank: same parameters (and sizes), no slots
    d.handle = 0;
    d.data_offset = d.out_offset = 0;
    op.descs.push_back(d);
    op.absent[r] = true;
    absent_ranks.push_back(rank_offset_ + r);
  }
  if (!e.mismatch.empty()) {
    op.error = invalidArgument(e.mismatch);
  } else if (!absent_ranks.empty()) {
    auto coll = static_cast<CollectiveType>(present.collective);
    if (coll != CollectiveType::kAllreduce) {  // allgather too: Horovod refuses it with join
      op.error = invalidArgument(joinedRefusal(coll, op.name, absent_ranks));
    }
  }
  pending_.erase(it);
  return op;
}

std::string TensorTable::joinedRefusal(CollectiveType coll, const std::string& name, const std::vector<int>& ranks) {
  std::string list;
  for (int r : ranks) list += (list.empty() ? "" : ", ") + std::to_string(r);
  return std::string(collectiveName(coll)) + " of tensor '" + name + "' cannot run while rank" +
         (ranks.size() > 1 ? "s " : " ") + list + (ranks.size() > 1 ? " have" : " has") +
         " joined (kolo_join): until every rank has joined, only allreduce goes on (the joined ranks "
         "contribute zeros); allgather is not supported with join, as in Horovod (DistributedOptimizer: "
         "sparse_as_dense=True).";
}

std::vector<ReadyOp> TensorTable::join(int local_rank, SteadyTime now) {
  std::vector<ReadyOp> out;
  if (local_rank < 0 || local_rank >= local_size_ || joined_[local_rank]) return out;
  joined_[local_rank] = true;
  ++joined_count_;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    if (readyLocked(it->second)) out.push_back(takeReady(it, now));
    it = next;
  }
  return out;
}

std::vector<ReadyOp> TensorTable::takeGroup(uint64_t group_id, SteadyTime now) {
  std::vector<ReadyOp> out;
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    bool member = false;
    for (const auto& d : it->second.descs) member |= d != nullptr && d->group_id == group_id;
    if (member) out.push_back(takeReady(it, now));
    it = next;
  }
  return out;
}

void TensorTable::resetJoined() {
  joined_.assign(static_cast<size_t>(local_size_), false);
  joined_count_ = 0;
}

std::vector<std::pair<int, uint64_t>> TensorTable::drainAll() {
  std::vector<std::pair<int, uint64_t>> out;
  for (auto& [name, e] : pending_) {
    for (int r = 0; r < local_size_; ++r) {
      if (e.descs[r] != nullptr) out.emplace_back(r, e.descs[r]->handle);
    }
  }
  pending_.clear();
  return out;
}

std::vector<PendingInfo> TensorTable::snapshot(size_t max, size_t* omitted) const {
  std::vector<const std::pair<const std::string, Entry>*> order;
  order.reserve(pending_.size());
  for (const auto& kv : pending_) order.push_back(&kv);
  const size_t keep = std::min(max, order.size());
  auto older = [](const auto* a, const auto* b) {
    return a->second.first_arrival != b->second.first_arrival
               ? a->second.first_arrival < b->second.first_arrival
               : a->first < b->first;
  };
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(keep), order.end(),
                    older);
  if (omitted != nullptr) *omitted = order.size() - keep;
  std::vector<PendingInfo> out;
  out.reserve(keep);
  for (size_t i = 0; i < keep; ++i) {
    const auto& [name, e] = *order[i];
    PendingInfo p;
    p.name = name;
    p.first = *e.descs[e.first_rank];
    p.first_arrival = e.first_arrival;
    for (int r = 0; r < local_size_; ++r) {
      if (e.descs[r] != nullptr) {
        p.submitted.push_back(r);
        p.arrivals.push_back(e.arrivals[r]);
      } else {
        p.waiting.push_back(r);
      }
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kolo
