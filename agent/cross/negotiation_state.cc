#include "agent/cross/negotiation_state.h"

#include <cstring>

#include "agent/core/tensor_table.h"

namespace kolo {

std::string encodeRequests(const std::vector<CrossRequest>& reqs) {
  std::string out;
  uint32_t n = static_cast<uint32_t>(reqs.size());
  out.append(reinterpret_cast<const char*>(&n), 4);
  for (const auto& r : reqs) {
    uint32_t len = static_cast<uint32_t>(r.name.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out.append(r.name);
    out.append(reinterpret_cast<const char*>(&r.params), sizeof(SubmitDesc));
    int32_t fr = r.first_rank;
    out.append(reinterpret_cast<const char*>(&fr), 4);
    const std::string_view err = std::string_view(r.error).substr(0, kMaxRequestErrorBytes);
    uint32_t elen = static_cast<uint32_t>(err.size());
    out.append(reinterpret_cast<const char*>(&elen), 4);
    out.append(err);
  }
  return out;
}

StatusOr<std::vector<CrossRequest>> decodeRequests(const std::string& bytes) {
  std::vector<CrossRequest> out;
  size_t p = 0;
  auto take = [&](void* dst, size_t n) {
    if (bytes.size() - p < n) return false;
    std::memcpy(dst, bytes.data() + p, n);
    p += n;
    return true;
  };
  if (bytes.empty()) return out;
  uint32_t n = 0;
  if (!take(&n, 4)) return internalError("truncated request list");
  // Each request takes at least its fixed part: a count beyond what the
  // bytes can hold is refused before anything is sized by it.
  constexpr size_t kMinRequestBytes = 4 + 1 + sizeof(SubmitDesc) + 4 + 4;
  if (n > (bytes.size() - p) / kMinRequestBytes) {
    return invalidArgument("request list: count " + std::to_string(n) + " does not fit in " +
                           std::to_string(bytes.size() - p) + " bytes (at most " +
                           std::to_string((bytes.size() - p) / kMinRequestBytes) + ")");
  }
  out.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    CrossRequest r;
    uint32_t len = 0;
    if (!take(&len, 4) || len == 0 || len > kMaxNameBytes || bytes.size() - p < len) {
      return internalError("bad request name");
    }
    r.name.assign(bytes.data() + p, len);
    p += len;
    int32_t fr = 0;
    if (!take(&r.params, sizeof(SubmitDesc)) || !take(&fr, 4)) return internalError("truncated request");
    r.first_rank = fr;
    uint32_t elen = 0;
    if (!take(&elen, 4) || bytes.size() - p < elen) return internalError("truncated request error");
    if (elen > kMaxRequestErrorBytes) {
      return invalidArgument("request error text of " + std::to_string(elen) + " bytes (limit " +
                             std::to_string(kMaxRequestErrorBytes) + ")");
    }
    r.error.assign(bytes.data() + p, elen);
    p += elen;
    out.push_back(std::move(r));
  }
  return out;
}

bool NegotiationState::sameParams(const SubmitDesc& a, const SubmitDesc& b) {
  return TensorTable::describeMismatch("", a, 0, b, 0).empty();
}

bool NegotiationState::isHit(const CrossRequest& req) const {
  return req.error.empty() && cache_.lookup(req.name, req.params) == negotiation::CacheState::kHit;
}

void NegotiationState::addLocal(const CrossRequest& req) {
  pending_[req.name] = req;
  if (isHit(req)) return;
  unannounced_.push_back(req.name);
}

std::vector<uint8_t> NegotiationState::cacheVector() const {
  std::vector<uint8_t> v(cacheVectorSize(), 0);
  v[0] = unannounced_.empty() ? 1 : 0;
  v[1] = joined_ ? 0 : 1;
  v[2] = joined_ ? 1 : 0;
  const bool inv = inverted();
  if (joined_ && joined_cycles_ > 0 && !inv) {  // standing in: ready for every cached name
    for (uint32_t b = 0; b < cache_.numBits(); ++b) v[kHeaderBytes + b] = cache_.peek(b) ? 1 : 0;
    return v;
  }
  if (inv) {
    for (uint32_t b = 0; b < cache_.numBits(); ++b) v[kHeaderBytes + b] = 1;
  }
  for (const auto& [name, req] : pending_) {
    if (isHit(req)) v[kHeaderBytes + *cache_.bitOf(name)] = inv ? 0 : 1;
  }
  return v;
}

std::vector<NegotiationState::InlineSlot> NegotiationState::inlineSlots(uint64_t max_tensor_bytes,
                                                                       uint64_t max_total_bytes) const {
  std::vector<InlineSlot> out;
  size_t end = 0;
  for (uint32_t b = 0; b < cache_.numBits(); ++b) {
    const negotiation::CacheEntry* e = cache_.peek(b);
    // An allgather's "<name>.__sizes" allreduce never goes inline: an agent
    // standing in for joined ranks keeps its result to size the zero rows
    // of the gather that follows (CrossJob::zeroContribution).
    if (e == nullptr || isAllgatherSizesName(e->name)) continue;
    const SubmitDesc& p = e->params;
    // Nor does a device tensor (it crosses over NCCL: CrossWork::device_post).
    if (static_cast<CollectiveType>(p.collective) != CollectiveType::kAllreduce ||
        p.group_id != 0 || (p.flags & kSubmitFlagDevice) != 0 || p.data_bytes == 0 ||
        p.data_bytes > max_tensor_bytes) {
      continue;
    }
    const size_t offset = (end + 7) / 8 * 8;
    if (offset + p.data_bytes > max_total_bytes) break;
    out.push_back({b, e->name, offset, static_cast<size_t>(p.data_bytes)});
    end = offset + p.data_bytes;
  }
  return out;
}

void NegotiationState::standInForJoined() {
  if (!joined_) return;
  for (const auto& [name, r] : remote_) {
    if (r.by_agent.empty() || r.by_agent[rank_] || pending_.count(name)) continue;
    for (const auto& other : r.by_agent) {
      if (!other) continue;
      CrossRequest copy = *other;
      copy.error.clear();
      addLocal(copy);
      break;
    }
  }
}

void NegotiationState::forgetGroup(uint64_t group_id) {
  for (auto it = remote_.begin(); it != remote_.end();) {
    bool member = false;
    for (const auto& o : it->second.by_agent) member |= o && o->params.group_id == group_id;
    it = member ? remote_.erase(it) : std::next(it);
  }
  for (auto it = pending_.begin(); it != pending_.end();) {
    if (it->second.params.group_id == group_id) {
      std::erase(unannounced_, it->first);
      it = pending_.erase(it);
    } else {
      ++it;
    }
  }
}

namespace {
// While some agent stands in for joined ranks, only allreduce goes on (Horovod refuses allgather).
void refuseWhileJoined(CrossResponse& resp) {
  auto coll = static_cast<CollectiveType>(resp.params.collective);
  if (!resp.error.isOk() || coll == CollectiveType::kAllreduce) return;
  resp.error = invalidArgument(std::string(collectiveName(coll)) + " of tensor '" + resp.name +
                               "' cannot run while every rank of a node has joined (kolo_join): until every rank "
                               "has joined, only allreduce goes on (the joined ranks contribute zeros); allgather is "
                               "not supported with join, as in Horovod (DistributedOptimizer: sparse_as_dense=True).");
}
}  // namespace

std::string NegotiationState::takeAnnouncements() {
  std::vector<CrossRequest> reqs;
  for (const auto& name : unannounced_) {
    auto it = pending_.find(name);
    if (it != pending_.end()) reqs.push_back(it->second);
  }
  unannounced_.clear();
  return encodeRequests(reqs);
}

void NegotiationState::assignBit(const std::string& name, const SubmitDesc& params) {
  std::optional<negotiation::CacheEntry> evicted;
  cache_.put(name, params, &evicted);
  if (!evicted) return;
  // Every agent evicts the same entry at the same point. A copy pending here
  // that waited on its bit (a hit, so never announced) is announced now and
  // completes as an uncached name.
  auto it = pending_.find(evicted->name);
  if (it != pending_.end() && it->second.error.empty() &&
      sameParams(evicted->params, it->second.params)) {
    unannounced_.push_back(evicted->name);
  }
}

void NegotiationState::eraseBit(const std::string& name) {
  if (auto bit = cache_.bitOf(name)) cache_.erase(*bit);
}

std::vector<CrossResponse> NegotiationState::complete(const std::vector<uint8_t>& reduced,
                                                      const std::vector<std::string>* gathered) {
  std::vector<CrossResponse> out;
  const bool someone_joined = reduced.size() > 1 && reduced[1] == 0;
  const uint8_t hit = inverted() ? 0 : 1;
  if (joined_) ++joined_cycles_;
  all_joined_last_ = reduced.size() > 2 && reduced[2] == 1;
  for (uint32_t b = 0; b + kHeaderBytes < reduced.size() && b < cache_.numBits(); ++b) {
    if (reduced[kHeaderBytes + b] != hit || cache_.peek(b) == nullptr) continue;
    const negotiation::CacheEntry* e = cache_.get(b);  // a common hit: most recently used
    const std::string name = e->name;
    CrossResponse resp{name, okStatus(), e->params};
    if (someone_joined) refuseWhileJoined(resp);
    out.push_back(std::move(resp));
    pending_.erase(name);
  }
  if (gathered == nullptr) return out;
  for (int a = 0; a < size_ && a < static_cast<int>(gathered->size()); ++a) {
    auto reqs = decodeRequests((*gathered)[a]);
    if (!reqs.isOk()) continue;  // cannot happen between agents of one build
    for (CrossRequest& req : *reqs) {
      if (cache_.bitOf(req.name)) {
        // Someone announced a cached name: its parameters changed somewhere.
        // Every agent drops the bit, and re-announces its own pending copy.
        eraseBit(req.name);
        if (pending_.count(req.name) && a != rank_) unannounced_.push_back(req.name);
      }
      Remote& r = remote_[req.name];
      if (r.by_agent.empty()) r.by_agent.resize(size_);
      if (!r.by_agent[a]) {
        r.by_agent[a] = req;
        r.count++;
      }
      if (r.count < size_) continue;
      const CrossRequest& first = *r.by_agent[0];
      CrossResponse resp{req.name, okStatus(), first.params};
      for (int o = 0; o < size_ && resp.error.isOk(); ++o) {
        if (!r.by_agent[o]->error.empty())
          resp.error = statusFromText(r.by_agent[o]->error, Code::kInvalidArgument);
      }
      for (int o = 1; o < size_ && resp.error.isOk(); ++o) {
        std::string m = TensorTable::describeMismatch(req.name, first.params, first.first_rank,
                                                      r.by_agent[o]->params, r.by_agent[o]->first_rank);
        if (!m.empty()) resp.error = invalidArgument(m);
      }
      if (someone_joined) refuseWhileJoined(resp);
      if (resp.error.isOk()) assignBit(req.name, first.params);
      remote_.erase(req.name);
      pending_.erase(req.name);
      // A re-announcement queued above is moot once the name has completed.
      std::erase(unannounced_, req.name);
      out.push_back(std::move(resp));
    }
  }
  return out;
}

}  // namespace kolo
