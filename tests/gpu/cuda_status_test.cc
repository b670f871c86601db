// CUDA/NCCL error handling that needs no device: these run (not skip) on
// the CPU-only CI machine of a CUDA build.
#include <gtest/gtest.h>

#include "agent/backends/backend.h"
#include "agent/backends/kv_store.h"
#include "agent/backends/nccl/factory.h"
#include "agent/gpu/cuda_status.h"
#include "agent/gpu/driver_api.h"

namespace kolo::gpu {
namespace {

TEST(CudaStatus, NamesTheApiAndTheCudaError) {
  Status s = cudaStatus(cudaErrorInvalidValue, "cudaMemcpyAsync");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), std::string("cudaMemcpyAsync: cudaErrorInvalidValue: ") +
                             cudaGetErrorString(cudaErrorInvalidValue));
  EXPECT_EQ(cudaStatus(cudaErrorNoDevice, "x").code(), Code::kUnavailable);
  EXPECT_EQ(cudaStatus(cudaErrorMemoryAllocation, "x").code(), Code::kUnavailable);
  EXPECT_EQ(cudaStatus(cudaErrorIllegalAddress, "x").code(), Code::kInternal);
  EXPECT_TRUE(cudaStatus(cudaSuccess, "x").isOk());
}

TEST(CudaStatus, DriverResultsKeepTheirNumber) {
  Status s = cuStatus(CUDA_ERROR_OUT_OF_MEMORY, "cuMemCreate");
  EXPECT_EQ(s.code(), Code::kUnavailable);
  EXPECT_EQ(s.message().rfind("cuMemCreate: CUresult 2", 0), 0u) << s.message();
}

TEST(CudaStatus, MacroReturnsTheFailure) {
  auto f = []() -> Status {
    KOLO_CUDA_RETURN_IF_ERROR(cudaErrorInvalidDevice);
    return okStatus();
  };
  Status s = f();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message().rfind("cudaErrorInvalidDevice: cudaErrorInvalidDevice", 0), 0u) << s.message();
}

TEST(CudaStatus, DeviceCountAndDriverAgree) {
  // Either there is a GPU (and the driver entry points resolve) or both say
  // why not, as Unavailable.
  auto n = deviceCount();
  auto d = driverApi();
  if (n.isOk()) {
    EXPECT_GE(*n, 1);
    EXPECT_TRUE(d.isOk()) << d.status().toString();
  } else {
    EXPECT_EQ(n.status().code(), Code::kUnavailable);
    EXPECT_EQ(n.status().message().rfind("no CUDA device: ", 0), 0u) << n.status().message();
  }
}

TEST(NcclBackendFactory, WithoutAGpuItIsNotViable) {
  if (deviceCount().isOk()) GTEST_SKIP() << "a GPU is present (nccl_test.cc covers it)";
  InMemoryKvStore kv;
  auto b = createBackend("nccl", BackendOptions{}, kv);
  ASSERT_FALSE(b.isOk());
  EXPECT_EQ(b.status().code(), Code::kUnavailable);
  EXPECT_EQ(b.status().message().rfind("not viable: no CUDA device: ", 0), 0u)
      << b.status().toString();
  EXPECT_EQ(ncclBackendCompiled(),
#ifdef KOLO_TEST_HAVE_NCCL
            true
#else
            false
#endif
  );
}

}  // namespace
}  // namespace kolo::gpu
