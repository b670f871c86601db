// The batched copy kernel (see batched_copy.h): block b copies items[b].
// The per-item body is __host__ __device__ so that testing::
// batchedCopyOnHost runs the same code on the CPU (tests without a GPU).
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "agent/gpu/batched_copy.h"
#include "agent/gpu/cuda_status.h"

namespace kolo::gpu {
namespace {

struct CopyBatch {
  CopyItem items[kMaxCopyItemsPerLaunch];
};
static_assert(sizeof(CopyBatch) <= 4000, "kernel parameters must stay under 4 KiB");

// Thread `t` of `nt` threads copying one item.
__host__ __device__ __forceinline__ void copyItem(const CopyItem& it, unsigned t, unsigned nt) {
  const char* src = reinterpret_cast<const char*>(it.src);
  char* dst = reinterpret_cast<char*>(it.dst);
  const uint64_t n = it.bytes;
  if (((it.src ^ it.dst) & (kVectorBytes - 1)) == 0) {
    // Same misalignment: bytes up to the 16-byte boundary, vectors, bytes.
    uint64_t head = (kVectorBytes - (it.src & (kVectorBytes - 1))) & (kVectorBytes - 1);
    if (head > n) head = n;
    const uint64_t vecs = (n - head) / kVectorBytes;
    const uint64_t tail_start = head + vecs * kVectorBytes;
    const uint4* vs = reinterpret_cast<const uint4*>(src + head);
    uint4* vd = reinterpret_cast<uint4*>(dst + head);
    for (uint64_t i = t; i < vecs; i += nt) vd[i] = vs[i];
    if (t < head) dst[t] = src[t];
    for (uint64_t i = tail_start + t; i < n; i += nt) dst[i] = src[i];
  } else if (((it.src ^ it.dst) & 3) == 0) {
    // Same offset modulo 4: 32-bit words.
    uint64_t head = (4 - (it.src & 3)) & 3;
    if (head > n) head = n;
    const uint64_t words = (n - head) / 4;
    const uint64_t tail_start = head + words * 4;
    const uint32_t* ws = reinterpret_cast<const uint32_t*>(src + head);
    uint32_t* wd = reinterpret_cast<uint32_t*>(dst + head);
    for (uint64_t i = t; i < words; i += nt) wd[i] = ws[i];
    if (t < head) dst[t] = src[t];
    for (uint64_t i = tail_start + t; i < n; i += nt) dst[i] = src[i];
  } else {
    for (uint64_t i = t; i < n; i += nt) dst[i] = src[i];
  }
}

constexpr unsigned kCopyThreads = 256;

__global__ void __launch_bounds__(kCopyThreads) batchedCopyKernel(const CopyBatch batch) {
  copyItem(batch.items[blockIdx.x], threadIdx.x, blockDim.x);
}

}  // namespace

StatusOr<int> batchedCopy(const std::vector<CopySegment>& segments, cudaStream_t stream,
                          size_t chunk_bytes) {
  ASSIGN_OR_RETURN(auto launches, planBatchedCopy(segments, chunk_bytes, kMaxCopyItemsPerLaunch));
  for (const CopyLaunch& l : launches) {
    CopyBatch batch = {};
    for (size_t i = 0; i < l.items.size(); ++i) batch.items[i] = l.items[i];
    batchedCopyKernel<<<static_cast<unsigned>(l.items.size()), kCopyThreads, 0, stream>>>(batch);
    KOLO_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return static_cast<int>(launches.size());
}

namespace testing {

StatusOr<int> batchedCopyOnHost(const std::vector<CopySegment>& segments, size_t chunk_bytes) {
  ASSIGN_OR_RETURN(auto launches, planBatchedCopy(segments, chunk_bytes, kMaxCopyItemsPerLaunch));
  for (const CopyLaunch& l : launches) {
    for (const CopyItem& it : l.items) {
      for (unsigned t = 0; t < kCopyThreads; ++t) copyItem(it, t, kCopyThreads);
    }
  }
  return static_cast<int>(launches.size());
}

}  // namespace testing
}  // namespace kolo::gpu
