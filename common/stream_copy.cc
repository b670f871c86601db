#include "common/stream_copy.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define KOLO_STREAM_COPY_SSE2 1
#endif

namespace kolo {

namespace {

// The L3 of cpu0 as sysfs gives it ("32768K"); sysconf's figure comes from
// CPUID, which a VM may pass through from the host (320 MiB on the AMD VM
// whose sysfs says 32 MiB), so it is only the fallback.
size_t lastLevelCacheBytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  std::string v;
  if (in >> v && !v.empty()) {
    size_t n = 0;
    try {
      n = std::stoull(v);
    } catch (...) {
      n = 0;
    }
    if (v.back() == 'K') n <<= 10;
    if (v.back() == 'M') n <<= 20;
    if (n > 0) return n;
  }
#ifdef _SC_LEVEL3_CACHE_SIZE
  long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  if (l3 > 0) return static_cast<size_t>(l3);
#endif
  return 0;
}

// Non-temporal stores (x86-64; memcpy elsewhere). Callers copy at least
// kStreamCopyMinBytes, so the head below never passes `bytes`.
void nonTemporalCopy(void* dst, const void* src, size_t bytes) {
#ifdef KOLO_STREAM_COPY_SSE2
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Head: up to the destination's next 16-byte boundary.
  size_t head = (16 - (reinterpret_cast<uintptr_t>(d) & 15)) & 15;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  size_t n = bytes - head;
  // Body: 64 bytes (one cache line) per iteration, unaligned loads,
  // aligned non-temporal stores.
  for (; n >= 64; n -= 64, d += 64, s += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  std::memcpy(d, s, n);  // tail
  _mm_sfence();          // non-temporal stores are weakly ordered
#else
  std::memcpy(dst, src, bytes);
#endif
}

}  // namespace

size_t streamCopyCacheBudget() {
  static const size_t budget =
      std::clamp(lastLevelCacheBytes() / 4, kStreamCopyMinBytes, kStreamCopyMaxBudget);
  return budget;
}

void arenaCopy(void* dst, const void* src, size_t bytes, size_t node_bytes) {
  if (bytes >= kStreamCopyMinBytes && node_bytes > streamCopyCacheBudget()) {
    nonTemporalCopy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

void streamCopy(void* dst, const void* src, size_t bytes) {
  if (bytes >= kStreamCopyMinBytes) {
    nonTemporalCopy(dst, src, bytes);
  } else {
    std::memcpy(dst, src, bytes);
  }
}

}  // namespace kolo
