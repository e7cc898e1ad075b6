// The SSD tier of the prompt cache: KV files under DIR/<identity key>/<namespace>/<uuid>.lkv ("base" is the
// empty namespace). The files are the database: at start scan() removes .tmp orphans and files of this
// identity that do not check out (other identities' folders are never touched) and rebuilds the index from
// the headers. Lookups read only the index. A restore that fails for any reason deletes the file and counts
// a miss. The cap counts the bytes the files occupy on disk and is never exceeded, even while a file is being
// written. A full disk or an I/O error is logged once and reported as "not stored": nothing here throws into
// serving. One conversation keeps one growing file: storing a prefix's extension replaces the prefix.
// A namespace folder is removed once its last file goes (each cache_salt has its own folder: they would
// otherwise pile up without end), and scan() removes empty ones left by older versions.
//
// Thread safety: save() may run on a background thread (it is meant to run off the decode path) while
// lookup()/restore() run on the engine thread; saves run one at a time.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cache/cache_identity.h"
#include "cache/cache_layout.h"
#include "cache/kv_file.h"

namespace lathe {

struct SsdStoreOptions {
  std::string dir;
  uint64_t max_bytes = 0;  // the cap on the bytes this identity's files occupy (--ssd-cache-max)
  bool verify = false;     // check every tensor hash on restore (--ssd-cache-verify)
};

struct SsdStoreStats {
  size_t entries = 0;
  uint64_t bytes = 0;
  uint64_t hits = 0, misses = 0, spills = 0, write_failures = 0, removed_invalid = 0;
  uint64_t removed_tmp = 0;  // unfinished writes (a crash mid-spill) deleted by scans
  double restore_ms_last = 0;
  double restore_mb_s_last = 0;     // tensor bytes read / restore time (the file's reused rows only)
  uint64_t restore_bytes_last = 0;  // tensor bytes the last restore read
  double restore_wait_ms_last = 0;  // of restore_ms_last: waiting for the disk (reads overlap the copies)
  double restore_copy_ms_last = 0;  // of restore_ms_last: copying into the caches
};

struct SsdScanReport {
  size_t entries = 0, removed_tmp = 0, removed_invalid = 0, evicted = 0;
  uint64_t bytes = 0;
};

class SsdStore {
 public:
  using CacheFactory = std::function<CacheList()>;  // fresh, empty caches of the model (make_cache)
  SsdStore(SsdStoreOptions options, CacheIdentity identity, CacheLayout layout, CacheFactory make_caches);

  // Rebuilds the index from this identity's folder; call once before use. Never throws for file problems.
  SsdScanReport scan();

  // Stores caches holding exactly `tokens` under namespace ns ("" or a cache_namespace() digest). Returns whether a
  // file now holds them (false: too large for the cap, or the disk refused — logged once). Never throws.
  bool save(const std::vector<int32_t>& tokens, const CacheList& caches, const std::string& ns = "");

  struct Match {
    std::string path;
    int64_t reused = 0;       // tokens of the request the entry serves (at most tokens.size() - 1)
    int64_t stored = 0;       // tokens the file holds (more than reused: only the reused rows are read)
    uint64_t read_bytes = 0;  // about what restoring `reused` tokens reads (for the cost of a restore)
  };
  // The entry with the longest usable prefix of tokens in ns (index only, no I/O); reused 0 when none.
  Match lookup(const std::vector<int32_t>& tokens, const std::string& ns = "") const;

  struct Restored {
    int64_t reused = 0;  // 0: a miss (caches are fresh and empty)
    CacheList caches;    // holding tokens[0, reused)
    uint64_t bytes_read = 0;
    double ms = 0;  // the restore's time (lookup, checks, reads and copies)
  };
  // lookup + load of the usable prefix (only its rows are read where the file allows). A hit bumps the entry's LRU
  // time; a file that fails to restore is deleted and counted as a miss. Never throws for file problems.
  Restored restore(const std::vector<int32_t>& tokens, const std::string& ns = "");

  SsdStoreStats stats() const;
  const std::string& root() const { return root_; }  // DIR/<identity key>
  const CacheIdentity& identity() const { return identity_; }

 private:
  struct Entry {
    std::string ns;
    std::vector<int32_t> tokens;
    uint64_t disk_bytes = 0;
    int64_t last_used = 0;  // ns since the epoch (the file's mtime; bumped on a hit)
    bool trimmable = false;
  };
  std::string ns_dir(const std::string& ns) const;
  void remove_locked(const std::string& path);  // deletes the file and its index entry (and an emptied folder)
  // Removes the namespace folder `dir` when it holds nothing, unless the save in progress writes into it.
  void prune_ns_dir_locked(const std::string& dir);
  size_t evict_locked(uint64_t need);  // oldest first until bytes_ + need <= cap
  void warn_once(const std::string& what);
  Match lookup_locked(const std::vector<int32_t>& tokens, const std::string& ns) const;

  SsdStoreOptions options_;
  CacheIdentity identity_;
  CacheLayout layout_;
  CacheFactory make_caches_;
  std::string root_;

  mutable std::mutex mu_;  // index_, bytes_, stats_
  std::mutex save_mu_;     // one save at a time
  std::map<std::string, Entry> index_;
  uint64_t bytes_ = 0, reserved_ = 0;
  std::string writing_dir_;  // the namespace folder the save in progress writes into (under mu_; "" = none)
  SsdStoreStats stats_;
  std::atomic<bool> warned_{false};
};

// The bytes a file occupies on disk: its allocated blocks, at least its length.
uint64_t disk_bytes_of(const std::string& path);

}  // namespace lathe
