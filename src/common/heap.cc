#include "common/heap.h"

#include <cstdlib>  // (first: it defines __GLIBC__ where glibc is the C library)
#include <string_view>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace lathe {

void tune_heap_for_tensors() {
#if defined(__GLIBC__)
  if (const char* t = std::getenv("GLIBC_TUNABLES")) {
    const std::string_view s(t);
    if (s.find("mmap_threshold") != std::string_view::npos || s.find("trim_threshold") != std::string_view::npos)
      return;
  }
  // Both are needed: setting either turns off glibc's adaptive thresholds, and a trim threshold alone leaves
  // every buffer over 128 KiB to its own mmap (worse than the defaults).
  ::mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's upper bound for it on 64-bit
  ::mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace lathe
