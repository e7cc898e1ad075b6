#include "cache/ssd_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "common/error.h"
#include "common/log.h"
#include "common/os_error.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
constexpr const char* kExt = ".lkv";

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_ns_dir_name(const std::string& n) {
  if (n == "base") return true;
  if (n.size() != 32) return false;
  return std::all_of(n.begin(), n.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

int64_t mtime_ns(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string new_uuid() {
  static thread_local std::mt19937_64 rng{std::random_device{}() ^ static_cast<uint64_t>(now_ns())};
  const uint64_t a = rng(), b = rng();
  char buf[40];
  std::snprintf(buf, sizeof buf, "%08llx-%04llx-4%03llx-%04llx-%012llx", static_cast<unsigned long long>(a >> 32),
                static_cast<unsigned long long>((a >> 16) & 0xffff), static_cast<unsigned long long>(a & 0xfff),
                static_cast<unsigned long long>(0x8000 | ((b >> 48) & 0x3fff)),
                static_cast<unsigned long long>(b & 0xffffffffffffull));
  return buf;
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  const size_t n = std::min(a.size(), b.size());
  size_t i = 0;
  while (i < n && a[i] == b[i]) ++i;
  return i;
}

double ms_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

uint64_t disk_bytes_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return 0;
  return std::max(static_cast<uint64_t>(st.st_size), static_cast<uint64_t>(st.st_blocks) * 512);
}

SsdStore::SsdStore(SsdStoreOptions options, CacheIdentity identity, CacheLayout layout, CacheFactory make_caches)
    : options_(std::move(options)),
      identity_(std::move(identity)),
      layout_(std::move(layout)),
      make_caches_(std::move(make_caches)) {
  root_ = (fs::path(options_.dir) / identity_.key()).string();
}

std::string SsdStore::ns_dir(const std::string& ns) const {
  return (fs::path(root_) / (ns.empty() ? "base" : ns)).string();
}

void SsdStore::warn_once(const std::string& what) {
  if (!warned_.exchange(true))
    log::warn("ssd cache: " + what + " (the cache goes on without it; later failures are logged at debug level)");
  else
    log::debug("ssd cache: " + what);
}

void SsdStore::prune_ns_dir_locked(const std::string& dir) {
  // The save in progress registers its folder under mu_ before creating it and clears it once its file is
  // indexed, so a folder it is about to write into is never taken from under it. rmdir itself refuses a
  // folder that still holds anything (a file or another writer's .tmp).
  if (dir.empty() || dir == writing_dir_) return;
  const fs::path d(dir);
  if (d.parent_path() != fs::path(root_) || !is_ns_dir_name(d.filename().string())) return;
  ::rmdir(dir.c_str());
}

void SsdStore::remove_locked(const std::string& path) {
  std::error_code ec;
  fs::remove(path, ec);
  prune_ns_dir_locked(fs::path(path).parent_path().string());
  auto it = index_.find(path);
  if (it == index_.end()) return;
  bytes_ -= std::min(bytes_, it->second.disk_bytes);
  index_.erase(it);
}

size_t SsdStore::evict_locked(uint64_t need) {
  size_t n = 0;
  while (!index_.empty() && bytes_ + reserved_ + need > options_.max_bytes) {
    auto oldest = std::min_element(index_.begin(), index_.end(), [](const auto& a, const auto& b) {
      return a.second.last_used < b.second.last_used;
    });
    log::debug("ssd cache: evicting " + oldest->first);
    remove_locked(oldest->first);
    ++n;
  }
  return n;
}

SsdScanReport SsdStore::scan() {
  SsdScanReport r;
  std::lock_guard<std::mutex> lock(mu_);
  index_.clear();
  bytes_ = 0;
  std::error_code ec;
  fs::create_directories(root_, ec);
  if (ec) {
    warn_once("cannot create " + root_ + ": " + ec.message());
    return r;
  }
  std::vector<std::string> ns_dirs;
  for (fs::directory_iterator d(root_, ec), end; !ec && d != end; d.increment(ec)) {
    const std::string name = d->path().filename().string();
    if (!d->is_directory() || !is_ns_dir_name(name)) continue;
    ns_dirs.push_back(d->path().string());
    const std::string ns = name == "base" ? "" : name;
    std::error_code ec2;
    for (fs::directory_iterator f(d->path(), ec2), fend; !ec2 && f != fend; f.increment(ec2)) {
      const std::string path = f->path().string();
      if (ends_with(path, ".tmp")) {  // a write that never finished (its name is a uuid: nobody else's)
        fs::remove(path, ec);
        ++r.removed_tmp;
        continue;
      }
      if (!ends_with(path, kExt)) continue;
      try {
        const KvFileHeader h = read_kv_header(path);
        KvFileMeta want = identity_.meta;
        want.ns = ns;
        const std::string why = kv_meta_mismatch(h.meta, want);
        if (!why.empty()) throw Error(ErrorKind::InvalidArgument, path + ": " + why);
        check_kv_layout(h, layout_);
        Entry e;
        e.ns = ns;
        e.tokens = h.tokens;
        e.disk_bytes = disk_bytes_of(path);
        e.last_used = mtime_ns(path);
        e.trimmable = h.trimmable();
        bytes_ += e.disk_bytes;
        index_[path] = std::move(e);
      } catch (const std::exception& e) {
        log::info(std::string("ssd cache: removing an unusable file: ") + e.what());
        fs::remove(path, ec);
        ++r.removed_invalid;
      }
    }
  }
  // Folders that hold nothing now (left by versions that never removed them, or emptied above).
  for (const std::string& d : ns_dirs) prune_ns_dir_locked(d);
  r.evicted = evict_locked(0);
  r.entries = index_.size();
  r.bytes = bytes_;
  stats_.removed_invalid += r.removed_invalid;
  stats_.removed_tmp += r.removed_tmp;
  return r;
}

bool SsdStore::save(const std::vector<int32_t>& tokens, const CacheList& caches, const std::string& ns) {
  std::lock_guard<std::mutex> one_at_a_time(save_mu_);
  try {
    if (tokens.empty() || caches.empty()) return false;
    if (!ns.empty() && (ns == "base" || !is_ns_dir_name(ns)))
      throw Error(ErrorKind::InvalidArgument, "namespace '" + ns + "' is not one of cache_namespace()'s");
    KvFileMeta meta = identity_.meta;
    meta.ns = ns;
    const uint64_t estimate = kv_file_size_bound(tokens, caches, meta);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (estimate > options_.max_bytes) {
        log::debug("ssd cache: a " + std::to_string(estimate) + "-byte entry exceeds the cap; not stored");
        return false;
      }
      for (auto& [path, e] : index_) {
        if (e.ns != ns) continue;
        // Already here, or served by a stored extension that can be trimmed back to it.
        if (e.tokens == tokens ||
            (e.trimmable && e.tokens.size() > tokens.size() && common_prefix(e.tokens, tokens) == tokens.size())) {
          e.last_used = now_ns();
          return true;
        }
      }
      evict_locked(estimate);
      if (bytes_ + estimate > options_.max_bytes) return false;
      reserved_ = estimate;  // counted while the file is written, so the cap holds throughout
      writing_dir_ = ns_dir(ns);
    }
    const std::string dir = ns_dir(ns);
    const std::string path = (fs::path(dir) / (new_uuid() + kExt)).string();
    bool trimmable = true;
    try {
      std::error_code ec;
      fs::create_directories(dir, ec);
      if (ec) throw OsError("cannot create " + dir, ec.value());
      save_kv_file(path, tokens, caches, meta);
      for (const auto& c : caches) trimmable = trimmable && c->can_trim(static_cast<int64_t>(tokens.size()));
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      reserved_ = 0;
      writing_dir_.clear();
      prune_ns_dir_locked(dir);  // a failed first write into a namespace leaves no folder behind
      throw;
    }
    std::lock_guard<std::mutex> lock(mu_);
    reserved_ = 0;
    writing_dir_.clear();
    Entry e;
    e.ns = ns;
    e.tokens = tokens;
    e.disk_bytes = disk_bytes_of(path);
    e.last_used = now_ns();
    e.trimmable = trimmable;
    // One growing file per conversation: a trimmable entry serves every prefix of itself.
    std::vector<std::string> ancestors;
    for (const auto& [p, old] : index_)
      if (old.ns == ns && old.tokens.size() <= tokens.size() &&
          common_prefix(old.tokens, tokens) == old.tokens.size() && (trimmable || old.tokens.size() == tokens.size()))
        ancestors.push_back(p);
    for (const std::string& p : ancestors) remove_locked(p);
    bytes_ += e.disk_bytes;
    index_[path] = std::move(e);
    ++stats_.spills;
    evict_locked(0);  // the estimate bounds the file, so this finds nothing to do unless the disk disagrees
    return true;
  } catch (const std::exception& e) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.write_failures;
    }
    warn_once(std::string("not stored: ") + e.what());
    return false;
  }
}

SsdStore::Match SsdStore::lookup_locked(const std::vector<int32_t>& tokens, const std::string& ns) const {
  Match best;
  int64_t best_used = 0;
  if (tokens.size() < 2) return best;
  for (const auto& [path, e] : index_) {
    if (e.ns != ns) continue;
    const int64_t usable = std::min<int64_t>(static_cast<int64_t>(common_prefix(e.tokens, tokens)),
                                             static_cast<int64_t>(tokens.size()) - 1);
    if (usable <= 0) continue;
    if (static_cast<int64_t>(e.tokens.size()) > usable && !e.trimmable) continue;  // would need an impossible trim
    if (usable > best.reused || (usable == best.reused && e.last_used > best_used)) {
      best.path = path;
      best.reused = usable;
      best.stored = static_cast<int64_t>(e.tokens.size());
      // A trimmable file is read only as far as the reused tokens (kv rows are laid out token by token).
      best.read_bytes = e.trimmable ? e.disk_bytes / static_cast<uint64_t>(best.stored) * static_cast<uint64_t>(usable)
                                    : e.disk_bytes;
      best_used = e.last_used;
    }
  }
  return best;
}

SsdStore::Match SsdStore::lookup(const std::vector<int32_t>& tokens, const std::string& ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  return lookup_locked(tokens, ns);
}

SsdStore::Restored SsdStore::restore(const std::vector<int32_t>& tokens, const std::string& ns) {
  Restored r;
  const Match m = lookup(tokens, ns);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    r.caches = make_caches_();
    if (m.reused == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      ++stats_.misses;
      return r;
    }
    KvFileMeta want = identity_.meta;
    want.ns = ns;
    KvLoadOptions o;
    o.expect = &want;
    o.verify = options_.verify;
    o.tokens = m.reused;  // only the rows the request reuses are read
    KvLoadStats ls;
    o.stats = &ls;
    const KvFileHeader h = load_kv_file(m.path, layout_, r.caches, o);
    if (static_cast<int64_t>(h.tokens.size()) < m.reused ||
        !std::equal(tokens.begin(), tokens.begin() + m.reused, h.tokens.begin()))
      throw Error(ErrorKind::Corrupt, m.path + ": holds other tokens than its index entry");
    for (const auto& c : r.caches)
      if (c->offset() != m.reused) throw Error(ErrorKind::Corrupt, m.path + ": restored to the wrong length");
    const double ms = ms_since(t0);
    ::utimensat(AT_FDCWD, m.path.c_str(), nullptr, 0);  // the LRU time survives restarts as the mtime
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(m.path);
    if (it != index_.end()) it->second.last_used = now_ns();
    ++stats_.hits;
    stats_.restore_ms_last = ms;
    stats_.restore_bytes_last = ls.bytes_read;
    stats_.restore_mb_s_last = ms > 0 ? static_cast<double>(ls.bytes_read) / 1e6 / (ms / 1000.0) : 0;
    stats_.restore_wait_ms_last = ls.wait_ms;
    stats_.restore_copy_ms_last = ls.copy_ms;
    r.reused = m.reused;
    r.bytes_read = ls.bytes_read;
    r.ms = ms;
    return r;
  } catch (const std::exception& e) {
    log::warn(std::string("ssd cache: dropping an entry that did not restore: ") + e.what());
    Restored miss;
    try {
      miss.caches = make_caches_();
    } catch (const std::exception&) {
    }
    std::lock_guard<std::mutex> lock(mu_);
    remove_locked(m.path);
    ++stats_.misses;
    ++stats_.removed_invalid;
    return miss;
  }
}

SsdStoreStats SsdStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  SsdStoreStats s = stats_;
  s.entries = index_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace lathe
