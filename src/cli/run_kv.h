// `lathe run --load-kv FILE / --save-kv FILE`: the KV file round trip from the command line. A load restores
// the file's caches (checked against this model's identity and cache layout) and reuses the longest prefix
// they share with the prompt; a save writes the caches after the prompt's prefill. ns: the namespace of the
// run's adapter set (cache_namespace of its content hash; "" without adapters): a file saved under one adapter
// set loads only under the same content.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/model.h"

namespace lathe::cli {

struct KvRestoreResult {
  int64_t reused = 0;  // prompt tokens the caches now hold
  double ms = 0;
  uint64_t file_bytes = 0;
};
// Throws InvalidArgument when the file shares no prefix with the prompt or cannot be trimmed to it.
KvRestoreResult restore_kv_for_prompt(Model& model, const CacheOptions& options, const std::string& path, bool verify,
                                      const std::vector<int32_t>& prompt, CacheList& caches, const std::string& ns);

struct KvSaveResult {
  double ms = 0;
  uint64_t file_bytes = 0;
};
KvSaveResult save_kv_for_prompt(const Model& model, const CacheOptions& options, const std::string& path,
                                const std::vector<int32_t>& tokens, const CacheList& caches, const std::string& ns);

}  // namespace lathe::cli
