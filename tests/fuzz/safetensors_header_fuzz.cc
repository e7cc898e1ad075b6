// safetensors files (8-byte length, JSON header, data): open, then read every tensor the header declares.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "common/error.h"
#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The reader maps a file, so the input becomes one (in memory-backed /dev/shm when there is one).
  static const std::string path = (access("/dev/shm", W_OK) == 0 ? std::string("/dev/shm") : std::string("/tmp")) +
                                  "/lathe-fuzz-" + std::to_string(getpid()) + ".safetensors";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  LATHE_FUZZ_EXPECTED_ERRORS({
    auto f = lathe::SafetensorsFile::open(path);
    for (const auto& [name, info] : f->tensors()) (void)f->get(name).numel();
  });
  return 0;
}
