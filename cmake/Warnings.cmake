add_library(lathe_warnings INTERFACE)
target_compile_options(lathe_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wno-unused-parameter>)
if(LATHE_WERROR)
  target_compile_options(lathe_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

# x86-64-v3 (AVX2 + FMA + F16C): the CPU kernels have AVX2 paths and scalar fallbacks.
if(LATHE_X86_V3 AND CMAKE_SYSTEM_PROCESSOR MATCHES "x86_64|AMD64")
  if(EXISTS /proc/cpuinfo)
    file(READ /proc/cpuinfo _cpuinfo)
    if(_cpuinfo MATCHES " avx2 " AND _cpuinfo MATCHES " fma ")
      target_compile_options(lathe_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-march=x86-64-v3 -mtune=generic>)
    endif()
  endif()
endif()

if(LATHE_SANITIZE)
  target_compile_options(lathe_warnings INTERFACE
    $<$<COMPILE_LANGUAGE:CXX>:-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined>)
  target_link_options(lathe_warnings INTERFACE -fsanitize=address,undefined)
endif()
