// KV file v2: writing (atomic, one cache state in memory at a time) and loading (checks before restore, then
// large reads one cache ahead: kv_file_reader.h). The header's parsing and checks are in kv_file_header.cc.
#include "cache/kv_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "cache/content_hash.h"
#include "cache/kv_file_json.h"
#include "cache/kv_file_reader.h"
#include "common/error.h"
#include "common/os_error.h"
#include "io/atomic_file.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

const std::vector<const char*>& tensor_names(const std::string& file_kind) {
  static const std::vector<const char*> kv = {"keys", "values"};
  static const std::vector<const char*> qkv = {"keys",   "keys_scales",   "keys_biases",
                                               "values", "values_scales", "values_biases"};
  static const std::vector<const char*> ssm = {"conv", "recurrent"};
  if (file_kind == "qkv" || file_kind == "rotating-qkv") return qkv;
  if (file_kind == "ssm") return ssm;
  return kv;
}

uint64_t align_up(uint64_t n) { return (n + kKvFileAlign - 1) / kKvFileAlign * kKvFileAlign; }

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}

size_t json_string_bound(const std::string& s) { return 6 * s.size() + 32; }  // \u00XX escapes at worst

uint64_t header_bound(const std::vector<int32_t>& tokens, size_t caches, const KvFileMeta& m) {
  uint64_t n = 512;
  for (const std::string* s :
       {&m.model_id, &m.config_fingerprint, &m.weights_hash, &m.tokenizer_hash, &m.template_hash, &m.ns})
    n += json_string_bound(*s);
  for (int32_t t : tokens) n += std::to_string(t).size() + 1;
  return n + caches * (256 + 6 * 256);
}

const Tensor& state_tensor(const CacheState& s, const char* name) {
  for (const auto& [n, t] : s.tensors)
    if (n == name) return t;
  throw Error(ErrorKind::Internal, "cache state of kind '" + s.kind + "' lacks tensor '" + name + "'");
}

void check_saveable(const std::vector<int32_t>& tokens, const CacheList& caches) {
  if (tokens.empty()) throw Error(ErrorKind::InvalidArgument, "KV file: nothing to save (no tokens)");
  if (tokens.size() > KvFileLimits::kMaxTokens)
    throw Error(ErrorKind::InvalidArgument,
                "KV file: more than " + std::to_string(KvFileLimits::kMaxTokens) + " tokens");
  if (caches.empty() || caches.size() > KvFileLimits::kMaxCaches)
    throw Error(ErrorKind::InvalidArgument, "KV file: " + std::to_string(caches.size()) + " caches");
  for (size_t i = 0; i < caches.size(); ++i)
    if (caches[i]->offset() != static_cast<int64_t>(tokens.size()))
      throw Error(ErrorKind::InvalidArgument, "KV file: cache " + std::to_string(i) + " holds " +
                                                  std::to_string(caches[i]->offset()) + " tokens, not the " +
                                                  std::to_string(tokens.size()) + " given");
}

// An open file descriptor, closed when it goes.
class KvFd {
 public:
  explicit KvFd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) {
      const int e = errno;
      if (e == ENOENT) throw Error(ErrorKind::NotFound, std::strerror(e));
      throw OsError(e, std::strerror(e));
    }
  }
  ~KvFd() { ::close(fd_); }
  KvFd(const KvFd&) = delete;
  KvFd& operator=(const KvFd&) = delete;
  int get() const { return fd_; }
  uint64_t size() const {
    struct stat st {};
    if (::fstat(fd_, &st) != 0) {
      const int e = errno;
      throw OsError(e, std::strerror(e));
    }
    if (!S_ISREG(st.st_mode)) throw Error(ErrorKind::Io, "not a regular file");
    return static_cast<uint64_t>(st.st_size);
  }

 private:
  int fd_;
};

bool kv_read_all_at(int fd, uint8_t* p, size_t n, off_t off) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, off);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
    off += r;
  }
  return true;
}

// Reads and parses the prefix and header of an open file of `size` bytes (the header hash is checked).
KvFileHeader read_header_fd(int fd, uint64_t size) {
  std::vector<uint8_t> buf(kKvFilePrefixBytes);
  if (size >= kKvFilePrefixBytes && kv_read_all_at(fd, buf.data(), kKvFilePrefixBytes, 0)) {
    uint32_t len = 0;
    for (int i = 0; i < 4; ++i) len |= static_cast<uint32_t>(buf[8 + static_cast<size_t>(i)]) << (8 * i);
    const uint64_t want = kKvFilePrefixBytes + std::min<uint64_t>(len, KvFileLimits::kMaxHeaderBytes);
    if (want <= size) {
      buf.resize(static_cast<size_t>(want));
      if (!kv_read_all_at(fd, buf.data() + kKvFilePrefixBytes, buf.size() - kKvFilePrefixBytes, kKvFilePrefixBytes))
        buf.resize(kKvFilePrefixBytes);
    }
  }
  return parse_kv_header(buf.data(), size < kKvFilePrefixBytes ? static_cast<size_t>(size) : buf.size(), size);
}

// Runs f, prefixing any lathe::Error with the path (an OsError keeps its errno).
template <class F>
auto with_path(const std::string& path, F&& f) {
  try {
    return f();
  } catch (const OsError& e) {
    throw OsError(e.os_errno(), path + ": " + e.what());
  } catch (const Error& e) {
    throw Error(e.kind(), path + ": " + e.what());
  }
}

void check_tensor_hashes(const KvFileHeader& h, const uint8_t* base) {
  for (size_t i = 0; i < h.caches.size(); ++i)
    for (size_t t = 0; t < h.caches[i].tensors.size(); ++t) {
      const KvTensorSlot& s = h.caches[i].tensors[t];
      if (hash64(base + h.data_start + s.off, s.bytes) != s.hash)
        throw Error(ErrorKind::Corrupt, "caches[" + std::to_string(i) + "].tensors[" + std::to_string(t) +
                                            "]: tensor hash mismatch (the data is corrupt)");
    }
}

}  // namespace

uint64_t kv_file_size_bound(const std::vector<int32_t>& tokens, const CacheList& caches, const KvFileMeta& meta) {
  uint64_t n = align_up(kKvFilePrefixBytes + header_bound(tokens, caches.size(), meta));
  for (const auto& c : caches) n += c->bytes() + 6 * kKvFileAlign;
  return n;
}

uint64_t save_kv_file(const std::string& path, const std::vector<int32_t>& tokens, const CacheList& caches,
                      const KvFileMeta& meta) {
  check_saveable(tokens, caches);
  KvFileHeader h;
  h.meta = meta;
  h.created_at_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  h.tokens = tokens;
  const uint64_t data_start = align_up(kKvFilePrefixBytes + header_bound(tokens, caches.size(), meta));
  if (data_start > UINT32_MAX) throw Error(ErrorKind::InvalidArgument, "KV file: header too large");
  h.data_start = static_cast<uint32_t>(data_start);

  AtomicFile file(path);
  uint64_t cursor = 0;
  for (const auto& c : caches) {  // one cache's state in memory at a time
    const CacheState s = c->state();
    KvCacheEntry e;
    e.kind = file_kind_of(s.kind);
    e.offset = c->offset();
    auto meta_of = [&](const char* k) { return s.meta.at(k); };
    if (e.kind == "rotating" || e.kind == "rotating-qkv") {
      e.idx = meta_of("idx");
      e.max_size = meta_of("max_size");
    }
    if (e.kind == "qkv" || e.kind == "rotating-qkv") {
      e.bits = meta_of("bits");
      e.group_size = meta_of("group_size");
    }
    for (const char* name : tensor_names(e.kind)) {
      const Tensor& t = state_tensor(s, name);
      const Tensor host = t.device() == Device::CPU ? t.contiguous() : t.to(Device::CPU).contiguous();
      KvTensorSlot slot;
      slot.off = align_up(cursor);
      slot.bytes = host.nbytes();
      slot.shape = host.shape();
      slot.dtype = host.dtype();
      slot.hash = hash64(host.raw(), slot.bytes);
      file.write_at(h.data_start + slot.off, host.raw(), slot.bytes);
      cursor = slot.off + slot.bytes;
      e.tensors.push_back(std::move(slot));
    }
    h.caches.push_back(std::move(e));
  }
  const std::string body = kv_header_json(h).dump();
  LATHE_CHECK(kKvFilePrefixBytes + body.size() <= h.data_start, "KV file header outgrew its bound");
  std::vector<uint8_t> head(h.data_start, 0);
  std::memcpy(head.data(), kKvFileMagic, sizeof kKvFileMagic);
  put_u32(head.data() + 8, static_cast<uint32_t>(body.size()));
  put_u32(head.data() + 12, h.data_start);
  std::memcpy(head.data() + kKvFilePrefixBytes, body.data(), body.size());
  put_u64(head.data() + 16, hash64_concat(head.data() + 8, 8, body.data(), body.size()));
  file.write_at(0, head.data(), head.size());
  const uint64_t size = h.data_start + cursor;
  file.commit(size);
  return size;
}

KvFileHeader read_kv_header(const std::string& path) {
  return with_path(path, [&] {
    const KvFd fd(path);
    return read_header_fd(fd.get(), fd.size());
  });
}

KvFileHeader load_kv_file(const std::string& path, const CacheLayout& layout, CacheList& caches,
                          const KvLoadOptions& options) {
  return with_path(path, [&] {
    const KvFd fd(path);
    KvFileHeader h = read_header_fd(fd.get(), fd.size());
    if (options.expect) {
      const std::string why = kv_meta_mismatch(h.meta, *options.expect);
      if (!why.empty()) throw Error(ErrorKind::InvalidArgument, "KV file belongs elsewhere: " + why);
    }
    check_kv_layout(h, layout);
    if (caches.size() != layout.layers.size())
      throw Error(ErrorKind::InvalidArgument, "KV file: restoring into " + std::to_string(caches.size()) +
                                                  " caches, the layout has " + std::to_string(layout.layers.size()));
    const int64_t stored = static_cast<int64_t>(h.tokens.size());
    const int64_t rows = options.tokens < 0 ? stored : options.tokens;
    if (rows < 1 || rows > stored)
      throw Error(ErrorKind::InvalidArgument,
                  "KV file: cannot restore " + std::to_string(rows) + " of its " + std::to_string(stored) + " tokens");
    if (rows < stored && !h.trimmable())
      throw Error(ErrorKind::InvalidArgument, "KV file: holds a wrapped ring or SSM state, so only all of its " +
                                                  std::to_string(stored) + " tokens restore, not " +
                                                  std::to_string(rows));
    // Tell the kernel the data is read once, in order (a larger readahead window). Advice only.
    (void)::posix_fadvise(fd.get(), h.data_start, 0, POSIX_FADV_SEQUENTIAL);
    KvFileReader reader(fd.get(), h, rows, options.verify);
    using Clock = std::chrono::steady_clock;
    double wait_ms = 0, copy_ms = 0;
    for (size_t i = 0; i < h.caches.size(); ++i) {
      const KvCacheEntry& e = h.caches[i];
      const auto t0 = Clock::now();
      const std::vector<Tensor>& read = reader.next();
      const auto t1 = Clock::now();
      wait_ms += std::chrono::duration<double, std::milli>(t1 - t0).count();
      CacheState s;
      s.kind = state_kind_of(e.kind);
      const bool by_rows = e.kind == "kv" || e.kind == "qkv";  // the reader read only the rows restored
      s.meta["offset"] = by_rows ? rows : e.offset;
      if (e.idx) {
        s.meta["idx"] = *e.idx;
        s.meta["max_size"] = *e.max_size;
        s.meta["keep"] = 0;
      }
      if (e.bits) {
        s.meta["bits"] = *e.bits;
        s.meta["group_size"] = *e.group_size;
      }
      const auto& names = tensor_names(e.kind);
      for (size_t t = 0; t < read.size(); ++t)
        s.tensors.emplace_back(names[t], layout.device == Device::CPU ? read[t] : read[t].to(layout.device));
      caches[i]->restore(s);
      if (!by_rows && e.offset > rows) caches[i]->trim(e.offset - rows);  // a ring that has not wrapped
      copy_ms += std::chrono::duration<double, std::milli>(Clock::now() - t1).count();
    }
    if (options.stats) {
      options.stats->bytes_read = reader.bytes_read();
      options.stats->wait_ms = wait_ms;
      options.stats->copy_ms = copy_ms;
    }
    return h;
  });
}

KvFileHeader verify_kv_file(const std::string& path) {
  const std::shared_ptr<MappedFile> f = MappedFile::open(path);
  return with_path(path, [&] {
    KvFileHeader h = parse_kv_header(f->data(), f->size(), f->size());
    check_tensor_hashes(h, f->data());
    return h;
  });
}

}  // namespace lathe
