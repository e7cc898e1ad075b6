# -DLATHE_KERNELS_ONLY=ON: the CPU tensor kernels (src/tensor, src/tensor/cpu and the little they use) and their
# unit tests, nothing that needs the server's libraries. What a cross build for another CPU architecture builds
# (cmake/toolchains/aarch64-linux-gnu.cmake: an Arm build, tests run under qemu-user): the target's libraries of
# PCRE2, ICU, SQLite and the rest are not installed, and the kernels are what differs per architecture.
find_package(Threads REQUIRED)
# LATHE_KERNEL_SOURCES (cmake/sources.cmake): src/common, src/tensor and src/tensor/cpu but the CUDA ops.
list(APPEND LATHE_KERNEL_SOURCES ${PROJECT_SOURCE_DIR}/src/quant/affine.cc ${PROJECT_SOURCE_DIR}/src/model/layers/rope.cc)
add_library(lathe_kernels STATIC ${LATHE_KERNEL_SOURCES})
target_include_directories(lathe_kernels PUBLIC ${PROJECT_SOURCE_DIR}/src)
target_link_libraries(lathe_kernels PUBLIC lathe_warnings Threads::Threads)

if(LATHE_TESTS)
  enable_testing()
  include(GoogleTest)
  # GoogleTest from the distribution's sources (libgtest-dev ships them): a cross build has no library of the
  # target's architecture to link.
  set(_gtest_src /usr/src/googletest)
  if(NOT EXISTS ${_gtest_src}/CMakeLists.txt)
    message(FATAL_ERROR "LATHE_KERNELS_ONLY needs GoogleTest's sources in ${_gtest_src} (Debian: googletest)")
  endif()
  set(INSTALL_GTEST OFF CACHE BOOL "" FORCE)
  set(BUILD_GMOCK OFF CACHE BOOL "" FORCE)
  add_subdirectory(${_gtest_src} ${CMAKE_BINARY_DIR}/googletest EXCLUDE_FROM_ALL)
  set(_tests cpu_attention_pairs_test cpu_attention_prefill_test cpu_attention_quantized_test cpu_int8_matmul_test
             quantized_ops_test attention_ops_test thread_pool_test cpu_ssm_test)
  set(_src)
  foreach(t ${_tests})
    list(APPEND _src ${PROJECT_SOURCE_DIR}/tests/unit/${t}.cc)
  endforeach()
  add_executable(lathe_kernel_tests ${_src})
  target_link_libraries(lathe_kernel_tests PRIVATE lathe_kernels gtest gtest_main)
  target_include_directories(lathe_kernel_tests PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  # Under an emulator a test runs tens of times slower than natively.
  gtest_discover_tests(lathe_kernel_tests PROPERTIES LABELS kernels TIMEOUT 1200 DISCOVERY_TIMEOUT 300)
endif()
