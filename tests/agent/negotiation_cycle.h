// Test helpers for NegotiationState: a request, and one cycle over every
// agent's state stepped as CrossJob::cycle runs it (Min-reduce of the cache
// vectors, then the announcements gathered when some agent has any).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "agent/cross/negotiation_state.h"
#include "common/dtype.h"

namespace kolo::testing_negotiation {

inline CrossRequest request(const std::string& name,
                            CollectiveType coll = CollectiveType::kAllreduce, int64_t n = 4) {
  CrossRequest r;
  r.name = name;
  r.params.collective = static_cast<uint8_t>(coll);
  r.params.dtype = static_cast<uint8_t>(DataType::kFloat32);
  r.params.reduce_op = static_cast<uint8_t>(ReduceOp::kSum);
  r.params.ndim = 1;
  r.params.shape[0] = n;
  r.params.data_bytes = static_cast<uint64_t>(n) * 4;
  r.params.prescale = r.params.postscale = 1.0;
  r.params.name_len = static_cast<uint32_t>(name.size());
  std::memcpy(r.params.name, name.data(), name.size());
  return r;
}

// One cycle over every agent's state, as CrossJob::cycle does it.
inline std::vector<std::vector<CrossResponse>> cycle(std::vector<NegotiationState*> agents) {
  std::vector<std::vector<uint8_t>> vecs;
  for (auto* a : agents) {
    a->standInForJoined();
    vecs.push_back(a->cacheVector());
  }
  std::vector<uint8_t> reduced = vecs[0];
  for (auto& v : vecs) {
    EXPECT_EQ(v.size(), reduced.size());
    for (size_t i = 0; i < reduced.size() && i < v.size(); ++i)
      reduced[i] = std::min(reduced[i], v[i]);
  }
  std::vector<std::string> gathered;
  bool gather = reduced[0] == 0;
  if (gather) {
    for (auto* a : agents) gathered.push_back(a->takeAnnouncements());
  }
  std::vector<std::vector<CrossResponse>> out;
  for (auto* a : agents) out.push_back(a->complete(reduced, gather ? &gathered : nullptr));
  return out;
}

}  // namespace kolo::testing_negotiation
