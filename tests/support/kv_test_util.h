// Test helpers for KV files and the SSD store: a temporary directory, raw file bytes, re-framing a file with
// another JSON header (valid prefix and hash), a file-size limit that makes writes fail, bitwise comparison.
#pragma once
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cache/cache_identity.h"
#include "cache/cache_layout.h"
#include "cache/content_hash.h"
#include "cache/kv_file.h"
#include "cache/ssd_store.h"
#include "engine/model_bundle.h"
#include "tensor/tensor.h"

namespace lathe::kvtest {

struct TempDir {
  std::string path;
  TempDir() {
    std::mt19937_64 rng(std::random_device{}());
    path = (std::filesystem::temp_directory_path() / ("lathe-kv-" + std::to_string(::getpid()) + "-" + hex64(rng())))
               .string();
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

// An SSD store over `dir` for the bundle's model and cache options (1 GiB cap), scanned like a server start.
inline std::unique_ptr<SsdStore> open_ssd_store(ModelBundle& bundle, const std::string& dir) {
  SsdStoreOptions o;
  o.dir = dir;
  o.max_bytes = 1ull << 30;
  auto s = std::make_unique<SsdStore>(o, cache_identity(bundle.model(), bundle.cache_options()),
                                      probe_cache_layout(bundle.model(), bundle.cache_options()),
                                      [&bundle] { return bundle.make_cache(); });
  s->scan();
  return s;
}

inline std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The file with its JSON header replaced by `json` (which must fit before data_start), hash recomputed.
inline std::vector<uint8_t> with_header(std::vector<uint8_t> file, uint32_t data_start, const std::string& json) {
  std::fill(file.begin() + static_cast<std::ptrdiff_t>(kKvFilePrefixBytes),
            file.begin() + static_cast<std::ptrdiff_t>(data_start), 0);
  const uint32_t n = static_cast<uint32_t>(json.size());
  for (int i = 0; i < 4; ++i) file[8 + static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(file.data() + kKvFilePrefixBytes, json.data(), json.size());
  const uint64_t h = hash64_concat(file.data() + 8, 8, json.data(), json.size());
  for (int i = 0; i < 8; ++i) file[16 + static_cast<size_t>(i)] = static_cast<uint8_t>(h >> (8 * i));
  return file;
}

// While alive, writing a file past `bytes` fails with EFBIG (SIGXFSZ ignored), like a disk that is full.
struct FileSizeLimit {
  rlimit saved{};
  explicit FileSizeLimit(rlim_t bytes) {
    ::signal(SIGXFSZ, SIG_IGN);
    ::getrlimit(RLIMIT_FSIZE, &saved);
    rlimit r = saved;
    r.rlim_cur = bytes;
    ::setrlimit(RLIMIT_FSIZE, &r);
  }
  ~FileSizeLimit() { ::setrlimit(RLIMIT_FSIZE, &saved); }
};

inline bool bit_identical(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && x.dtype() == y.dtype() && std::memcmp(x.raw(), y.raw(), x.nbytes()) == 0;
}

}  // namespace lathe::kvtest
