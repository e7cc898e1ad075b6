// Loads the fixture tokenizers once per test binary. The real ones are stored gzip-compressed and are
// decompressed in memory.
#pragma once
#include <zlib.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/tokenizer.h"

namespace lathe::test {

inline std::filesystem::path tokenizer_fixture_dir(const std::string& name) {
  return std::filesystem::path(LATHE_FIXTURES_DIR) / "tokenizers" / name;
}

// Reads `path`, or `path`.gz decompressed.
inline std::string read_maybe_gzipped(const std::filesystem::path& path) {
  if (std::filesystem::exists(path)) {
    std::ifstream f(path, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  const std::string gz = path.string() + ".gz";
  gzFile f = gzopen(gz.c_str(), "rb");
  if (!f) throw std::runtime_error("fixture missing: " + path.string() + "(.gz)");
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  gzclose(f);
  if (n < 0) throw std::runtime_error("corrupt gzip: " + gz);
  return out;
}

inline const Tokenizer& fixture_tokenizer(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  std::lock_guard lock(mutex);
  auto& slot = loaded[name];
  if (!slot) {
    const auto dir = tokenizer_fixture_dir(name);
    slot = Tokenizer::from_json(read_maybe_gzipped(dir / "tokenizer.json"),
                                read_maybe_gzipped(dir / "tokenizer_config.json"));
  }
  return *slot;
}

inline nlohmann::json encode_oracle(const std::string& name) {
  std::ifstream f(std::filesystem::path(LATHE_FIXTURES_DIR) / "oracles" / (name + ".encode.json"));
  return nlohmann::json::parse(f);
}

}  // namespace lathe::test
