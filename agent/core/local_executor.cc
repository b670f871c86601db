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
  if (bytes <= inline_bytes_) {
    reduceRange(r, 0, r.count);
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
    pool_.submit([this, shared, remaining, done_shared, begin, n] {
      reduceRange(*shared, begin, n);
      if (remaining->fetch_sub(1) == 1) {
        loop_.post([shared, done_shared] { (*done_shared)(); });
      }
    });
  }
}

}  // namespace kolo
