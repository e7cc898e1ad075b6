# ThreadSanitizer (LATHE_TSAN) and the libFuzzer build (LATHE_FUZZ): flags on every lathe target through
# lathe_warnings, like LATHE_SANITIZE's ASan/UBSan in Warnings.cmake.
if(LATHE_TSAN)
  if(LATHE_SANITIZE OR LATHE_FUZZ)
    message(FATAL_ERROR "LATHE_TSAN cannot be combined with LATHE_SANITIZE or LATHE_FUZZ (use separate build trees)")
  endif()
  target_compile_options(lathe_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=thread -fno-omit-frame-pointer>)
  target_link_options(lathe_warnings INTERFACE -fsanitize=thread)
  # GCC warns (-Wtsan) that TSan does not model the atomic_thread_fence in Boost.Asio's handler completion; the
  # reactor's own mutexes order the handlers TSan sees, so the warning is silenced rather than made an error.
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    target_compile_options(lathe_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Wno-tsan>)
  endif()
endif()

if(LATHE_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "LATHE_FUZZ needs clang (libFuzzer): configure with -DCMAKE_CXX_COMPILER=clang++")
  endif()
  # Coverage instrumentation everywhere; the fuzzer's main is linked into the fuzz targets only.
  target_compile_options(lathe_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer>)
  target_link_options(lathe_warnings INTERFACE -fsanitize=address,undefined)
endif()
