find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

find_package(Protobuf REQUIRED)
if(NOT Protobuf_PROTOC_EXECUTABLE)
  message(FATAL_ERROR "protoc not found: apt-get install protobuf-compiler libprotobuf-dev")
endif()
find_package(gRPC CONFIG QUIET)
if(NOT gRPC_FOUND)
  message(FATAL_ERROR "gRPC not found: apt-get install libgrpc++-dev protobuf-compiler-grpc")
endif()
find_program(KOLO_GRPC_CPP_PLUGIN grpc_cpp_plugin REQUIRED)

find_package(spdlog CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
find_package(nlohmann_json CONFIG REQUIRED)

# UCX (agent-to-agent host transport).
find_package(ucx CONFIG QUIET)
kolo_resolve_option(UCX ucx_FOUND "Install it with: apt-get install libucx-dev")

# CUDA toolkit and NCCL (device path), from /usr/local/cuda on our machines.
set(_kolo_cuda_found OFF)
string(TOUPPER "${KOLO_WITH_CUDA}" _kolo_cuda_req)
if(NOT _kolo_cuda_req STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  if(NOT CUDAToolkit_ROOT AND NOT DEFINED ENV{CUDAToolkit_ROOT} AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CUDAToolkit_ROOT /usr/local/cuda)
  endif()
  find_package(CUDAToolkit QUIET)
  if(CUDAToolkit_FOUND)
    set(_kolo_cuda_found ON)
  endif()
endif()
kolo_resolve_option(CUDA _kolo_cuda_found "Install the CUDA toolkit under /usr/local/cuda (or set CUDAToolkit_ROOT)")
if(KOLO_HAVE_CUDA)
  include(KoloCuda)  # enable_language(CUDA), sm_90 SASS + compute_90 PTX by default
endif()

set(_kolo_nccl_found OFF)
if(KOLO_HAVE_CUDA)
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS /usr/local/cuda/include ${CUDAToolkit_INCLUDE_DIRS})
  find_library(NCCL_LIBRARY nccl HINTS /usr/local/cuda/lib64 ${CUDAToolkit_LIBRARY_DIR})
  if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY)
    set(_kolo_nccl_found ON)
  endif()
endif()
kolo_resolve_option(NCCL _kolo_nccl_found "NCCL needs CUDA; install NCCL under /usr/local/cuda (libnccl-dev)")

# cpp-httplib (the metrics endpoint's tests use its client, tests/metrics) as
# httplib::httplib. Upstream installs a CMake package; Debian's
# libcpp-httplib-dev ships a compiled library and only a pkg-config file,
# whose Cflags (CPPHTTPLIB_OPENSSL_SUPPORT...) must match how it was built.
find_package(httplib CONFIG QUIET)
if(NOT TARGET httplib::httplib)
  pkg_check_modules(KOLO_HTTPLIB QUIET IMPORTED_TARGET GLOBAL cpp-httplib)
  if(KOLO_HTTPLIB_FOUND)
    add_library(httplib::httplib ALIAS PkgConfig::KOLO_HTTPLIB)
  else()
    message(FATAL_ERROR "cpp-httplib not found: apt-get install libcpp-httplib-dev")
  endif()
endif()
