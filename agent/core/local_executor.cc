#include "agent/core/local_executor.h"

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "common/reduce.h"

namespace kolo {

namespace {

bool isRemote(const std::vector<RemoteSpan>& v, size_t j) {
  return j < v.size() && v[j].proc != nullptr;
}

// The direct path: per chunk, every remote source is read into its own
// buffer, the chunk is reduced into `acc` (and the local destinations), and
// `acc` is written to every remote destination. Sources are read before
// any destination of the same chunk is written, so in place is fine.
void reduceRangeDirect(const LocalReduce& r, size_t begin, size_t n) {
  const size_t es = dataTypeSize(r.dtype);
  const std::vector<void*>& dsts = r.dsts.empty() ? r.slots : r.dsts;
  const size_t nsrc = r.slots.size();
  const size_t chunk = std::max<size_t>(1, kDirectChunkBytes / es);
  // One 64-byte aligned block per source and one for the result.
  thread_local std::vector<char> scratch;
  const size_t stride = (chunk * es + 63) / 64 * 64;
  if (scratch.size() < stride * (nsrc + 1) + 64) scratch.resize(stride * (nsrc + 1) + 64);
  char* base = reinterpret_cast<char*>((reinterpret_cast<uintptr_t>(scratch.data()) + 63) & ~uintptr_t{63});
  char* acc = base + stride * nsrc;
  std::vector<const void*> s(nsrc);
  std::vector<void*> d;
  d.reserve(dsts.size() + 1);
  for (size_t b = begin; b < begin + n; b += chunk) {
    if (r.error && r.error->failed()) return;  // another part failed: the op is lost anyway
    const size_t m = std::min(chunk, begin + n - b);
    const size_t off = b * es;
    for (size_t j = 0; j < nsrc; ++j) {
      if (isRemote(r.remote_slots, j)) {
        char* buf = base + stride * j;
        Status st = r.remote_slots[j].proc->read(r.remote_slots[j].addr + off, buf, m * es);
        if (!st.isOk()) {
          if (r.error) r.error->set(std::move(st));
          return;
        }
        s[j] = buf;
      } else {
        s[j] = static_cast<const char*>(r.slots[j]) + off;
      }
    }
    d.clear();
    bool any_remote = false;
    for (size_t k = 0; k < dsts.size(); ++k) {
      if (isRemote(r.remote_dsts, k)) {
        any_remote = true;
      } else {
        d.push_back(static_cast<char*>(dsts[k]) + off);
      }
    }
    if (any_remote) d.push_back(acc);
    reduceBlocks(r.dtype, r.op, s.data(), static_cast<int>(nsrc), d.data(), static_cast<int>(d.size()), m,
                 r.prescale, r.postscale);
    for (size_t k = 0; k < dsts.size(); ++k) {
      if (!isRemote(r.remote_dsts, k)) continue;
      Status st = r.remote_dsts[k].proc->write(r.remote_dsts[k].addr + off, acc, m * es);
      if (!st.isOk()) {
        if (r.error) r.error->set(std::move(st));
        return;
      }
    }
  }
}

}  // namespace

void reduceRange(const LocalReduce& r, size_t begin, size_t n) {
  if (n == 0) return;
  if (!r.remote_slots.empty() || !r.remote_dsts.empty()) return reduceRangeDirect(r, begin, n);
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
