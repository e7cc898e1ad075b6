// KV cache files, format v2 (docs/formats.md specifies every byte): what the SSD tier and `lathe run
// --save-kv/--load-kv` persist. A 24-byte prefix (magic "LATHEKV2", u32 header length, u32 data start, u64
// XXH3 of bytes 8..16 and the JSON header), the JSON header, then each tensor of every cache's exact state
// (LayerCache::state()) at a 16 KiB-aligned offset from the data start.
//
// Writes are atomic (path.tmp, fsync, rename, directory fsync). Reads are strict: every limit is explicit, the
// header hash is always checked, tensor hashes when asked (that reads every byte), and a file is checked
// against the model's cache layout before anything is restored, so a hostile file gives Error(Corrupt) or
// Error(InvalidArgument) naming what is wrong, never a crash.
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cache/cache_layout.h"
#include "cache/layer_cache.h"

namespace lathe {

inline constexpr char kKvFileMagic[8] = {'L', 'A', 'T', 'H', 'E', 'K', 'V', '2'};
inline constexpr size_t kKvFilePrefixBytes = 24;
inline constexpr uint64_t kKvFileAlign = 16384;
inline constexpr int kKvFormatVersion = 2;

// What a KV file may declare before it is refused.
struct KvFileLimits {
  static constexpr uint32_t kMaxHeaderBytes = 64u << 20;
  static constexpr size_t kMaxTokens = 4u << 20;
  static constexpr size_t kMaxCaches = 4096;
  static constexpr size_t kMaxDims = 4;
  static constexpr int64_t kMaxDim = int64_t{1} << 31;
  static constexpr int kMaxJsonDepth = 6;
  static constexpr size_t kMaxStringBytes = 512;
};

// Whose caches a file holds. Every field is compared on load; a mismatch names the field (header spelling).
struct KvFileMeta {
  std::string model_id;            // modelId
  std::string config_fingerprint;  // configFingerprint: graph-shaping config + KV scheme + dtype + device
  std::string weights_hash;        // weightsHash
  std::string tokenizer_hash;      // tokenizerHash
  std::string template_hash;       // templateHash
  std::string ns;                  // ns: adapter set + cache salt namespace ("" = base)
};

struct KvTensorSlot {
  uint64_t off = 0, bytes = 0;  // off: from the data start, a multiple of kKvFileAlign
  Shape shape;
  DType dtype = DType::F32;
  uint64_t hash = 0;  // XXH3-64 of the bytes
};

struct KvCacheEntry {
  std::string kind;  // file spelling: kv, rotating, qkv, rotating-qkv, ssm
  int64_t offset = 0;
  std::optional<int64_t> idx, max_size, group_size, bits;
  std::vector<KvTensorSlot> tensors;
};

struct KvFileHeader {
  int format_version = kKvFormatVersion;
  KvFileMeta meta;
  int64_t created_at_ms = 0;
  std::vector<int32_t> tokens;
  std::vector<KvCacheEntry> caches;
  uint32_t header_bytes = 0, data_start = 0;
  uint64_t file_size = 0;
  // Whether every cache can drop tokens from its end (no SSM state, no ring that has wrapped).
  bool trimmable() const;
};

// The file kind of a cache state kind ("quantized" -> "qkv", ...) and back; throws Unsupported on others.
std::string file_kind_of(const std::string& state_kind);
std::string state_kind_of(const std::string& file_kind);

// Writes tokens + caches atomically; returns the file's size. Every cache's offset must equal tokens.size()
// (InvalidArgument otherwise). A disk that refuses gives Error(Io) and leaves neither path nor path.tmp.
uint64_t save_kv_file(const std::string& path, const std::vector<int32_t>& tokens, const CacheList& caches,
                      const KvFileMeta& meta);
// An upper bound on the size save_kv_file would write (cache capacities + alignment + header), for caps.
uint64_t kv_file_size_bound(const std::vector<int32_t>& tokens, const CacheList& caches, const KvFileMeta& meta);

// Parses and checks the prefix and header held in data[0, size) of a file of file_size bytes (size may be less
// than file_size: only the prefix and header are needed). Throws Error(Corrupt/Unsupported) naming the field.
KvFileHeader parse_kv_header(const uint8_t* data, size_t size, uint64_t file_size);
// Reads only the prefix and header (cheap: for indexes); the header hash is checked.
KvFileHeader read_kv_header(const std::string& path);
// "" when file matches expect, else "<field>: file has X, expected Y" for the first differing field.
std::string kv_meta_mismatch(const KvFileMeta& file, const KvFileMeta& expect);
// Checks a header against a model's cache layout (count, kinds, shapes, dtypes, windows, quantization).
void check_kv_layout(const KvFileHeader& h, const CacheLayout& layout);

// Where a load's time went (restore phases): waiting for the disk vs copying into the caches.
struct KvLoadStats {
  uint64_t bytes_read = 0;  // tensor bytes read (less than the file when only some tokens are restored)
  double wait_ms = 0;       // the restore waited for reads (what overlapping with the copies did not hide)
  double copy_ms = 0;       // restore() into the caches (on the CPU mostly the fresh pages' first touch)
};

struct KvLoadOptions {
  const KvFileMeta* expect = nullptr;  // compare the file's metadata with this (mismatch: InvalidArgument)
  bool verify = false;                 // check every tensor hash (each before its cache is restored)
  // Restore only the file's first `tokens` tokens (-1: all). Full-attention caches then read only those rows
  // (the rest of the file is never read); a file holding a wrapped ring or SSM state refuses (InvalidArgument).
  int64_t tokens = -1;
  KvLoadStats* stats = nullptr;  // filled when given
};
// Restores a file into fresh caches (model.make_cache(), matching layout) and returns its header (whose
// `tokens` are all the file holds). Everything is checked before a byte of tensor data is read; the tensors are
// then read with large pread()s into two host buffers, one cache ahead of its restore (on CUDA copied from
// there to the device). On an exception the caches may hold part of the file: discard them.
KvFileHeader load_kv_file(const std::string& path, const CacheLayout& layout, CacheList& caches,
                          const KvLoadOptions& options = {});
// Checks the header and every tensor hash without a model (`lathe cache verify`); throws on the first fault.
KvFileHeader verify_kv_file(const std::string& path);

}  // namespace lathe
