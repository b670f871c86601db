#include "agent/core/local_executor.h"

#include <atomic>

#include "common/reduce.h"

namespace kolo {

void reduceRange(const LocalReduce& r, size_t begin, size_t n) {
  if (n == 0) return;
  const size_t es = dataTypeSize(r.dtype);
  const std::vector<void*>& dsts = r.dsts.empty() ? r.slots : r.dsts;
  std::vector<const void*> s(r.slots.size());
  std::vector<void*> d(dsts.size());
  for (size_t j = 0; j < s.size(); ++j) s[j] = static_cast<const char*>(r.slots[j]) + begin * es;
  for (size_t j = 0; j < d.size(); ++j) d[j] = static_cast<char*>(dsts[j]) + begin * es;
  reduceBlocks(r.dtype, r.op, s.data(), static_cast<int>(s.size()), d.data(), static_cast<int>(d.size()), n,
               r.prescale, r.postscale);
}

void LocalExecutor::reduceOnLoop(LocalReduce r, std::function<void()> done) {
  const size_t es = dataTypeSize(r.dtype);
  const size_t bytes = r.count * es;
  if (r.dsts.empty()) r.dsts = r.slots;
  const int k = static_cast<int>(r.slots.size());
  const int nd = static_cast<int>(r.dsts.size());
  if (bytes <= inline_bytes_) {
    reduceBlocks(r.dtype, r.op, const_cast<const void* const*>(r.slots.data()), k, r.dsts.data(),
                 nd, r.count, r.prescale, r.postscale);
    done();
    return;
  }
  // Split into parts of whole cache lines; the last part to finish posts `done`.
  int parts = pool_.size();
  size_t per = (r.count + parts - 1) / parts;
  size_t align_elems = 64 / es;
  per = (per + align_elems - 1) / align_elems * align_elems;
  auto shared = std::make_shared<LocalReduce>(std::move(r));
  auto remaining = std::make_shared<std::atomic<int>>(0);
  std::vector<std::pair<size_t, size_t>> ranges;
  for (size_t b = 0; b < shared->count; b += per) ranges.emplace_back(b, std::min(per, shared->count - b));
  remaining->store(static_cast<int>(ranges.size()));
  auto done_shared = std::make_shared<std::function<void()>>(std::move(done));
  for (auto [begin, n] : ranges) {
    pool_.submit([this, shared, remaining, done_shared, begin, n, es, k, nd] {
      std::vector<void*> s(k), d(nd);
      for (int j = 0; j < k; ++j) s[j] = static_cast<char*>(shared->slots[j]) + begin * es;
      for (int j = 0; j < nd; ++j) d[j] = static_cast<char*>(shared->dsts[j]) + begin * es;
      reduceBlocks(shared->dtype, shared->op, const_cast<const void* const*>(s.data()), k, d.data(),
                   nd, n, shared->prescale, shared->postscale);
      if (remaining->fetch_sub(1) == 1) {
        loop_.post([shared, done_shared] { (*done_shared)(); });
      }
    });
  }
}

}  // namespace kolo
