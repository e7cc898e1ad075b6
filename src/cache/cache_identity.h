// Who may reuse a stored KV cache. Two caches are interchangeable only when every input that shapes the KV
// values matches: the graph-shaping config (all of config.json but its provenance keys, plus the parsed
// fields), the KV scheme (bits, group size), the cache dtype and device, the weights (safetensors headers,
// sizes and sampled data pages), the tokenizer files, and the chat template. Adapters and a per-request salt
// are the namespace: entries of one namespace are never seen from another.
#pragma once
#include <string>
#include <vector>

#include "cache/kv_file.h"

namespace lathe {

class Model;

struct CacheIdentity {
  KvFileMeta meta;  // ns left empty: the namespace is per request
  // The store's directory name: a 128-bit digest of every field of meta (32 hex digits).
  std::string key() const;
};

// template_source: a chat template that replaces the checkpoint's (serve --chat-template), or "".
CacheIdentity cache_identity(const Model& model, const CacheOptions& options, const std::string& template_source = "");

// Pieces of the identity, exposed for tests and tools.
std::string config_fingerprint(const Model& model, const CacheOptions& options);
std::string weights_hash(const Model& model);
std::string tokenizer_hash(const std::string& model_dir);
std::string template_hash(const std::string& model_dir, const std::string& template_source = "");

// One adapter as the cache sees it: what its weights are (a content hash, never a name) and how strongly
// it is applied. The adapter manager fills these in; with no adapters the set is empty.
struct AdapterIdentity {
  std::string content_hash;
  double scale = 1.0;
};
// "" for the empty set; otherwise 32 hex digits over the ordered (content, scale) pairs.
std::string adapter_set_hash(const std::vector<AdapterIdentity>& adapters);
// The namespace of a request: "" (base) without adapters or salt, else 32 hex digits. The salt itself is
// never stored, only this digest.
std::string cache_namespace(const std::string& adapter_set_hash, const std::string& cache_salt);

}  // namespace lathe
