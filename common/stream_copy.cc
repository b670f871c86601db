#include "common/stream_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__SSE2__)
#include <emmintrin.h>
#define KOLO_STREAM_COPY_SSE2 1
#endif

namespace kolo {

void streamCopy(void* dst, const void* src, size_t bytes) {
#ifdef KOLO_STREAM_COPY_SSE2
  if (bytes >= kStreamCopyMinBytes) {
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
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

}  // namespace kolo
