#include "common/staging_pool.h"

#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace kolo::staging {

namespace {

constexpr size_t kHeader = 64;              // keeps the user pointer 64-byte aligned
constexpr size_t kPoolFrom = size_t{1} << 20;  // smaller buffers are not pooled

// Size class: the smallest of {4,5,6,7} * 2^k / 4 at or above `bytes`.
size_t sizeClass(size_t bytes) {
  if (bytes < kPoolFrom) return (bytes + 63) / 64 * 64;
  size_t p = kPoolFrom;
  while (p * 2 <= bytes) p *= 2;
  for (size_t q = 4; q <= 8; ++q) {
    size_t c = p / 4 * q;
    if (c >= bytes) return c;
  }
  return p * 2;
}

struct Pool {
  std::mutex mu;
  std::map<size_t, std::vector<char*>> free;  // class -> blocks (header included)
  size_t cached = 0;
  size_t cap = 0;
  size_t hits = 0, misses = 0;

  Pool() {
    const char* env = std::getenv("KOLO_STAGING_CACHE_MB");
    long long mb = env != nullptr ? std::atoll(env) : 1024;
    cap = mb > 0 ? static_cast<size_t>(mb) << 20 : 0;
  }
};

Pool& pool() {
  static Pool* p = new Pool();  // never destroyed: buffers may be released during exit
  return *p;
}

size_t& headerOf(char* block) { return *reinterpret_cast<size_t*>(block); }

void release(char* user) {
  if (user == nullptr) return;
  char* block = user - kHeader;
  const size_t cls = headerOf(block);
  if (cls >= kPoolFrom) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lk(p.mu);
    if (p.cached + cls <= p.cap) {
      p.free[cls].push_back(block);
      p.cached += cls;
      return;
    }
  }
  std::free(block);
}

char* take(size_t bytes) {
  const size_t cls = sizeClass(bytes == 0 ? 64 : bytes);
  if (cls >= kPoolFrom) {
    Pool& p = pool();
    std::lock_guard<std::mutex> lk(p.mu);
    auto it = p.free.find(cls);
    if (it != p.free.end() && !it->second.empty()) {
      char* block = it->second.back();
      it->second.pop_back();
      p.cached -= cls;
      ++p.hits;
      return block + kHeader;
    }
    ++p.misses;
  }
  char* block = static_cast<char*>(std::aligned_alloc(64, cls + kHeader));
  if (block == nullptr) {
    std::fprintf(stderr, "kolo: out of memory allocating a %zu-byte staging buffer\n", cls);
    std::abort();
  }
  headerOf(block) = cls;
  return block + kHeader;
}

}  // namespace

Buffer acquire(size_t bytes) { return Buffer(take(bytes), &release); }

std::shared_ptr<char> acquireShared(size_t bytes) { return std::shared_ptr<char>(take(bytes), &release); }

Stats stats() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lk(p.mu);
  return {p.cached, p.hits, p.misses};
}

void trim() {
  Pool& p = pool();
  std::lock_guard<std::mutex> lk(p.mu);
  for (auto& [cls, blocks] : p.free) {
    for (char* b : blocks) std::free(b);
  }
  p.free.clear();
  p.cached = 0;
}

}  // namespace kolo::staging
