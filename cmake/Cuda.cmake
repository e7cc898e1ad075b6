# The CUDA backend builds whenever nvcc is found; it is chosen at run time with --device cuda.
set(LATHE_HAVE_CUDA OFF)
# Device code: native sm_90 (H100/H200) plus compute_80 PTX, which the driver compiles once at first load for
# sm_80/86/89 (A100, A10/3090, L4/4090). Measured on the 2-core build machine (gemv_mma.cu): 34 s for sm_90 alone,
# 50 s with the compute_80 PTX, 127 s for all four native targets + PTX — the latter is too slow for CI, which
# compiles the tree twice; release builds for those GPUs can ask for it:
#   -DLATHE_CUDA_ARCHS="80-real;86-real;89-real;90-real;90-virtual"
# Hopper-only paths (programmatic dependent launch) are chosen at run time from the device.
set(LATHE_CUDA_ARCHS "90-real;80-virtual" CACHE STRING "CUDA architectures of the device code (CMake CUDA_ARCHITECTURES syntax)")
if(LATHE_CUDA)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(LATHE_CUDA_SOURCES)
      enable_language(CUDA)
      set(CMAKE_CUDA_ARCHITECTURES 90)
      find_package(CUDAToolkit REQUIRED)
      set(LATHE_HAVE_CUDA ON)
    endif()
  endif()
endif()
message(STATUS "lathe: CUDA backend ${LATHE_HAVE_CUDA}")

function(lathe_attach_cuda target)
  if(LATHE_HAVE_CUDA)
    add_library(lathe_cuda STATIC ${LATHE_CUDA_SOURCES})
    set_target_properties(lathe_cuda PROPERTIES CUDA_ARCHITECTURES "${LATHE_CUDA_ARCHS}" CUDA_SEPARABLE_COMPILATION OFF CUDA_STANDARD 17 CUDA_STANDARD_REQUIRED ON
      POSITION_INDEPENDENT_CODE ON)
    target_include_directories(lathe_cuda PUBLIC ${PROJECT_SOURCE_DIR}/src)
    target_compile_options(lathe_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -O3>)
    # cuBLAS is opened at run time on first use (tensor/cuda/cublas_api.cc), not linked: --device cpu never maps it.
    target_link_libraries(lathe_cuda PUBLIC CUDA::cudart_static nlohmann_json::nlohmann_json ${CMAKE_DL_LIBS})
    target_compile_definitions(lathe_cuda PRIVATE LATHE_CUDA_LIB_DIR="${CUDAToolkit_LIBRARY_DIR}")
    target_compile_definitions(lathe_cuda PUBLIC LATHE_HAVE_CUDA=1)
    target_link_libraries(${target} PUBLIC lathe_cuda)
    # The device half calls back into the core (tensors, the dense-weight budget): two static libraries that
    # need each other, which CMake links as a repeated group.
    target_link_libraries(lathe_cuda PRIVATE ${target})
  endif()
endfunction()
