# The CUDA language for the device path (agent/gpu, tests/gpu, bench/gpu).
# Included by KoloDependencies only when KOLO_HAVE_CUDA.
#
# Default targets: Hopper SASS (sm_90) plus compute_90 PTX, which the driver
# JIT-compiles for newer GPUs. Override with -DCMAKE_CUDA_ARCHITECTURES=...
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES OR CMAKE_CUDA_ARCHITECTURES STREQUAL "")
  set(CMAKE_CUDA_ARCHITECTURES "90-real;90-virtual" CACHE STRING "CUDA targets (SASS and PTX)")
endif()
if(NOT CMAKE_CUDA_HOST_COMPILER)
  set(CMAKE_CUDA_HOST_COMPILER ${CMAKE_CXX_COMPILER} CACHE FILEPATH "Host compiler for nvcc")
endif()
enable_language(CUDA)
# .cu files are C++17: CMake 3.25 does not know nvcc 13's C++20 flag (and
# would otherwise take CXX_STANDARD=20 for CUDA too and fail to configure).
# Plain .cc files of the GPU libraries stay C++20.
set(CMAKE_CUDA_STANDARD 17)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(CMAKE_CUDA_EXTENSIONS OFF)

# The top-level add_compile_options(-Wall ...) are GCC flags that nvcc
# refuses; a folder with .cu files calls this to keep them for C/C++ only and
# hand the same warnings to the host compiler through -Xcompiler.
function(kolo_cuda_folder_flags)
  get_directory_property(_opts COMPILE_OPTIONS)
  set(_fixed)
  foreach(_o IN LISTS _opts)
    if(_o MATCHES "^-W")
      list(APPEND _fixed "$<$<COMPILE_LANGUAGE:C,CXX>:${_o}>" "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_o}>")
    else()
      list(APPEND _fixed "${_o}")
    endif()
  endforeach()
  set_directory_properties(PROPERTIES COMPILE_OPTIONS "${_fixed}")
endfunction()
