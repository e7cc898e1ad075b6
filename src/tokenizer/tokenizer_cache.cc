#include "tokenizer/tokenizer_cache.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "common/log.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
constexpr char kMagic[8] = {'L', 'A', 'T', 'H', 'E', 'T', 'O', 'K'};
constexpr uint32_t kVersion = 1;

// What identifies the source file: an image made from anything else is stale.
struct Identity {
  uint64_t size = 0, mtime_ns = 0, inode = 0;
  std::string path;
};

std::optional<Identity> identify(const fs::path& file) {
  struct stat st {};
  std::error_code ec;
  const fs::path abs = fs::absolute(file, ec);
  if (ec || ::stat(abs.c_str(), &st) != 0) return std::nullopt;
  Identity id;
  id.size = static_cast<uint64_t>(st.st_size);
  id.mtime_ns = static_cast<uint64_t>(st.st_mtim.tv_sec) * 1000000000ull + static_cast<uint64_t>(st.st_mtim.tv_nsec);
  id.inode = static_cast<uint64_t>(st.st_ino);
  id.path = abs.lexically_normal().string();
  return id;
}

std::optional<fs::path> cache_dir() {
  if (const char* d = std::getenv("LATHE_CACHE_DIR")) {
    if (std::string(d) == "off" || !*d) return std::nullopt;
    return fs::path(d) / "tokenizers";
  }
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return fs::path(x) / "lathe/tokenizers";
  if (const char* h = std::getenv("HOME"); h && *h) return fs::path(h) / ".cache/lathe/tokenizers";
  return std::nullopt;
}

std::optional<fs::path> image_path(const Identity& id) {
  auto dir = cache_dir();
  if (!dir) return std::nullopt;
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a of the path: one image per tokenizer file
  for (unsigned char c : id.path) h = (h ^ c) * 0x100000001b3ull;
  char name[40];
  std::snprintf(name, sizeof name, "%016llx.bin", static_cast<unsigned long long>(h));
  return *dir / name;
}

void put_u64(std::string& out, uint64_t v) { out.append(reinterpret_cast<const char*>(&v), sizeof v); }
bool take_u64(std::string_view& in, uint64_t& v) {
  if (in.size() < sizeof v) return false;
  std::memcpy(&v, in.data(), sizeof v);
  in.remove_prefix(sizeof v);
  return true;
}
bool take_string(std::string_view& in, std::string& s) {
  uint64_t n = 0;
  if (!take_u64(in, n) || n > in.size()) return false;
  s.assign(in.data(), n);
  in.remove_prefix(n);
  return true;
}

std::string header(const Identity& id) {
  std::string h(kMagic, sizeof kMagic);
  put_u64(h, kVersion);
  put_u64(h, id.size);
  put_u64(h, id.mtime_ns);
  put_u64(h, id.inode);
  put_u64(h, id.path.size());
  h += id.path;
  return h;
}

}  // namespace

std::optional<CachedTokenizer> read_tokenizer_cache(const fs::path& tokenizer_json) {
  const auto id = identify(tokenizer_json);
  if (!id || id->size < kTokenizerCacheMinBytes) return std::nullopt;
  const auto path = image_path(*id);
  std::error_code ec;
  if (!path || !fs::exists(*path, ec)) return std::nullopt;
  try {
    const auto mapped = MappedFile::open(path->string());
    std::string_view in(reinterpret_cast<const char*>(mapped->data()), mapped->size());
    const std::string expect = header(*id);
    if (in.substr(0, expect.size()) != expect) {
      log::debug("tokenizer cache " + path->string() + " is for another file or version: rebuilding it");
      return std::nullopt;
    }
    in.remove_prefix(expect.size());
    CachedTokenizer c;
    if (!take_string(in, c.rest_json) || !c.index.vocab.load(in) || !c.index.merges.load(in) || !in.empty()) {
      log::debug("tokenizer cache " + path->string() + " is damaged: rebuilding it");
      return std::nullopt;
    }
    return c;
  } catch (const std::exception& e) {
    log::debug(std::string("tokenizer cache unreadable: ") + e.what());
    return std::nullopt;
  }
}

void write_tokenizer_cache(const fs::path& tokenizer_json, const std::string& rest_json,
                           const std::string& index_image) {
  const auto id = identify(tokenizer_json);
  if (!id || id->size < kTokenizerCacheMinBytes) return;
  const auto path = image_path(*id);
  if (!path) return;
  try {
    std::error_code ec;
    fs::create_directories(path->parent_path(), ec);
    std::string image = header(*id);
    put_u64(image, rest_json.size());
    image += rest_json;
    image += index_image;
    write_file_atomic(path->string(), image.data(), image.size());
  } catch (const std::exception& e) {
    log::debug(std::string("tokenizer cache not written: ") + e.what());
  }
}

}  // namespace lathe
