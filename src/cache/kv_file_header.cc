// KV file v2: the prefix and JSON header — strict parsing with explicit limits, and the checks against a
// model's cache layout. The writer and the loader are in kv_file.cc.
#include <algorithm>
#include <cstring>
#include <set>

#include <nlohmann/json.hpp>

#include "cache/content_hash.h"
#include "cache/kv_file.h"
#include "cache/kv_file_json.h"
#include "common/error.h"

namespace lathe {
namespace {

using json = nlohmann::json;
using L = KvFileLimits;

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorKind::Corrupt, "KV file header: " + what); }

uint32_t read_u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
uint64_t read_u64(const uint8_t* p) { return read_u32(p) | static_cast<uint64_t>(read_u32(p + 4)) << 32; }

// Only these keys (a file lathe did not write is refused, not half-understood).
void only_keys(const json& o, const std::string& where, std::initializer_list<const char*> keys) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (!known) bad(where + ": unknown field '" + it.key().substr(0, 64) + "'");
  }
}

const json& field(const json& o, const std::string& where, const char* key) {
  auto it = o.find(key);
  if (it == o.end()) bad(where + ": missing field '" + key + "'");
  return *it;
}

int64_t int_in(const json& v, const std::string& where, int64_t lo, int64_t hi) {
  if (!v.is_number_integer()) bad("'" + where + "' must be an integer");
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(hi))
    bad("'" + where + "' is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    bad("'" + where + "' is " + std::to_string(x) + ", out of range [" + std::to_string(lo) + ", " +
        std::to_string(hi) + "]");
  return x;
}

std::string str_of(const json& v, const std::string& where) {
  if (!v.is_string()) bad("'" + where + "' must be a string");
  const std::string& s = v.get_ref<const std::string&>();
  if (s.size() > L::kMaxStringBytes) bad("'" + where + "' is longer than " + std::to_string(L::kMaxStringBytes));
  return s;
}

size_t tensors_of_kind(const std::string& file_kind) {
  return file_kind == "qkv" || file_kind == "rotating-qkv" ? 6 : 2;
}
bool is_rotating(const std::string& k) { return k == "rotating" || k == "rotating-qkv"; }
bool is_quantized(const std::string& k) { return k == "qkv" || k == "rotating-qkv"; }

KvTensorSlot parse_slot(const json& t, const std::string& where, uint64_t data_bytes) {
  if (!t.is_object()) bad("'" + where + "' must be an object");
  only_keys(t, where, {"off", "bytes", "shape", "dtype", "hash"});
  KvTensorSlot s;
  s.off = static_cast<uint64_t>(int_in(field(t, where, "off"), where + ".off", 0, INT64_MAX));
  s.bytes = static_cast<uint64_t>(int_in(field(t, where, "bytes"), where + ".bytes", 1, INT64_MAX));
  if (s.off % kKvFileAlign != 0) bad("'" + where + ".off' " + std::to_string(s.off) + " is not 16 KiB-aligned");
  const json& shape = field(t, where, "shape");
  if (!shape.is_array() || shape.empty() || shape.size() > L::kMaxDims)
    bad("'" + where + ".shape' must be an array of 1 to " + std::to_string(L::kMaxDims) + " dimensions");
  for (size_t i = 0; i < shape.size(); ++i)
    s.shape.push_back(int_in(shape[i], where + ".shape[" + std::to_string(i) + "]", 1, L::kMaxDim));
  const std::string dt = str_of(field(t, where, "dtype"), where + ".dtype");
  if (!dtype_from_name(dt, &s.dtype)) bad("'" + where + ".dtype' '" + dt + "' is not a dtype");
  if (!parse_hex64(str_of(field(t, where, "hash"), where + ".hash"), &s.hash))
    bad("'" + where + ".hash' must be 16 lowercase hex digits");
  // numel × size with every factor ≤ 2^31 and at most 4 of them: check as we go so nothing overflows.
  uint64_t n = dtype_size(s.dtype);
  for (int64_t d : s.shape) {
    if (n > data_bytes / static_cast<uint64_t>(d) + 1) bad("'" + where + "' is larger than the file");
    n *= static_cast<uint64_t>(d);
  }
  if (n != s.bytes)
    bad("'" + where + ".bytes' is " + std::to_string(s.bytes) + " but shape " + shape_str(s.shape) + " of " + dt +
        " needs " + std::to_string(n));
  if (s.off > data_bytes || s.bytes > data_bytes - s.off)
    bad("'" + where + "' [" + std::to_string(s.off) + ", +" + std::to_string(s.bytes) +
        ") runs past the end of the file");
  return s;
}

// The rules each kind's tensors follow (what restore() and attention rely on).
void check_entry(const KvCacheEntry& e, const std::string& where) {
  const std::string& k = e.kind;
  const int64_t rows = is_rotating(k) ? std::min(e.offset, *e.max_size) : e.offset;
  for (size_t i = 0; i < e.tensors.size(); ++i) {
    const KvTensorSlot& t = e.tensors[i];
    const std::string tw = where + ".tensors[" + std::to_string(i) + "]";
    if (k == "ssm") {
      if (t.dtype != DType::F32) bad("'" + tw + "' must be F32");
      if (t.shape.size() != (i == 0 ? 2u : 3u)) bad("'" + tw + ".shape' has the wrong number of dimensions");
      continue;
    }
    if (t.shape.size() != 3) bad("'" + tw + ".shape' must have 3 dimensions [tokens, heads, width]");
    if (t.shape[0] != rows)
      bad("'" + tw + ".shape[0]' is " + std::to_string(t.shape[0]) + ", the cache holds " + std::to_string(rows) +
          " tokens");
    const bool codes = is_quantized(k) && i % 3 == 0;
    if (codes ? t.dtype != DType::U32 : !is_float(t.dtype))
      bad("'" + tw + ".dtype' " + dtype_name(t.dtype) + " does not fit a " + k + " cache");
  }
  if (is_rotating(k) && e.offset < *e.max_size && *e.idx != e.offset)
    bad("'" + where + ".idx' is " + std::to_string(*e.idx) + " in a ring that has not wrapped (offset " +
        std::to_string(e.offset) + ")");
}

KvCacheEntry parse_entry(const json& c, const std::string& where, uint64_t data_bytes, int64_t tokens) {
  if (!c.is_object()) bad("'" + where + "' must be an object");
  only_keys(c, where, {"kind", "offset", "idx", "maxSize", "groupSize", "bits", "tensors"});
  KvCacheEntry e;
  e.kind = str_of(field(c, where, "kind"), where + ".kind");
  if (e.kind != "kv" && e.kind != "rotating" && e.kind != "qkv" && e.kind != "rotating-qkv" && e.kind != "ssm")
    bad("'" + where + ".kind' '" + e.kind + "' is not kv, rotating, qkv, rotating-qkv or ssm");
  e.offset = int_in(field(c, where, "offset"), where + ".offset", 0, INT64_MAX);
  if (e.offset != tokens)
    bad("'" + where + ".offset' is " + std::to_string(e.offset) + " but the file holds " + std::to_string(tokens) +
        " tokens");
  const bool rot = is_rotating(e.kind), quant = is_quantized(e.kind);
  for (const char* k : {"idx", "maxSize"})
    if (c.contains(k) != rot)
      bad("'" + where + "." + k + "' is " + (rot ? "required" : "not allowed") + " for " + e.kind);
  for (const char* k : {"groupSize", "bits"})
    if (c.contains(k) != quant)
      bad("'" + where + "." + k + "' is " + (quant ? "required" : "not allowed") + " for " + e.kind);
  if (rot) {
    e.max_size = int_in(c["maxSize"], where + ".maxSize", 1, L::kMaxDim);
    e.idx = int_in(c["idx"], where + ".idx", 0, *e.max_size - 1);
  }
  if (quant) {
    e.bits = int_in(c["bits"], where + ".bits", 4, 8);
    e.group_size = int_in(c["groupSize"], where + ".groupSize", 32, 64);
    if ((*e.bits != 4 && *e.bits != 8) || (*e.group_size != 32 && *e.group_size != 64))
      bad("'" + where + "' bits/groupSize must be 4 or 8 / 32 or 64");
  }
  const json& ts = field(c, where, "tensors");
  if (!ts.is_array() || ts.size() != tensors_of_kind(e.kind))
    bad("'" + where + ".tensors' must list " + std::to_string(tensors_of_kind(e.kind)) + " tensors for " + e.kind);
  for (size_t i = 0; i < ts.size(); ++i)
    e.tensors.push_back(parse_slot(ts[i], where + ".tensors[" + std::to_string(i) + "]", data_bytes));
  check_entry(e, where);
  return e;
}

}  // namespace

std::string file_kind_of(const std::string& k) {
  if (k == "kv" || k == "rotating" || k == "ssm") return k;
  if (k == "quantized") return "qkv";
  if (k == "rotating_quantized") return "rotating-qkv";
  throw Error(ErrorKind::Unsupported, "KV file: cannot persist a '" + k + "' cache");
}

std::string state_kind_of(const std::string& k) {
  if (k == "qkv") return "quantized";
  if (k == "rotating-qkv") return "rotating_quantized";
  return k;
}

bool KvFileHeader::trimmable() const {
  for (const KvCacheEntry& e : caches) {
    if (e.kind == "ssm") return false;
    if (is_rotating(e.kind) && e.offset > *e.max_size) return false;
  }
  return true;
}

nlohmann::ordered_json kv_header_json(const KvFileHeader& h) {
  nlohmann::ordered_json j;
  j["formatVersion"] = h.format_version;
  j["modelId"] = h.meta.model_id;
  j["configFingerprint"] = h.meta.config_fingerprint;
  j["weightsHash"] = h.meta.weights_hash;
  j["tokenizerHash"] = h.meta.tokenizer_hash;
  j["templateHash"] = h.meta.template_hash;
  j["ns"] = h.meta.ns;
  j["createdAt"] = h.created_at_ms;
  j["tokens"] = h.tokens;
  nlohmann::ordered_json caches = nlohmann::ordered_json::array();
  for (const KvCacheEntry& e : h.caches) {
    nlohmann::ordered_json c;
    c["kind"] = e.kind;
    c["offset"] = e.offset;
    if (e.idx) c["idx"] = *e.idx;
    if (e.max_size) c["maxSize"] = *e.max_size;
    if (e.group_size) c["groupSize"] = *e.group_size;
    if (e.bits) c["bits"] = *e.bits;
    nlohmann::ordered_json ts = nlohmann::ordered_json::array();
    for (const KvTensorSlot& t : e.tensors)
      ts.push_back({{"off", t.off},
                    {"bytes", t.bytes},
                    {"shape", t.shape},
                    {"dtype", dtype_name(t.dtype)},
                    {"hash", hex64(t.hash)}});
    c["tensors"] = std::move(ts);
    caches.push_back(std::move(c));
  }
  j["caches"] = std::move(caches);
  return j;
}

KvFileHeader parse_kv_header(const uint8_t* data, size_t size, uint64_t file_size) {
  if (size > file_size) size = static_cast<size_t>(file_size);
  if (size < kKvFilePrefixBytes) bad("the file is " + std::to_string(file_size) + " bytes, shorter than the prefix");
  if (std::memcmp(data, kKvFileMagic, 7) != 0) bad("not a lathe KV file (magic)");
  if (data[7] != kKvFileMagic[7])
    throw Error(ErrorKind::Unsupported, std::string("KV file format '") + static_cast<char>(data[7]) +
                                            "' is not supported (this lathe reads v2)");
  KvFileHeader h;
  h.header_bytes = read_u32(data + 8);
  h.data_start = read_u32(data + 12);
  h.file_size = file_size;
  const uint64_t want_hash = read_u64(data + 16);
  if (h.header_bytes == 0 || h.header_bytes > L::kMaxHeaderBytes)
    bad("header length " + std::to_string(h.header_bytes) + " is outside (0, " + std::to_string(L::kMaxHeaderBytes) +
        "]");
  if (h.data_start % kKvFileAlign != 0 || h.data_start < kKvFilePrefixBytes + uint64_t{h.header_bytes} ||
      h.data_start > file_size)
    bad("data start " + std::to_string(h.data_start) + " is not a 16 KiB boundary after the header inside the file");
  if (kKvFilePrefixBytes + uint64_t{h.header_bytes} > size) bad("truncated: the header runs past the bytes read");
  const uint8_t* body = data + kKvFilePrefixBytes;
  if (hash64_concat(data + 8, 8, body, h.header_bytes) != want_hash)
    bad("header hash mismatch (the file is corrupt or truncated)");

  json j;
  try {
    j = json::parse(body, body + h.header_bytes, [](int depth, json::parse_event_t, json&) {
      if (depth > L::kMaxJsonDepth) bad("JSON nested deeper than " + std::to_string(L::kMaxJsonDepth));
      return true;
    });
  } catch (const json::exception& e) {
    bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("not a JSON object");
  only_keys(j, "header",
            {"formatVersion", "modelId", "configFingerprint", "weightsHash", "tokenizerHash", "templateHash", "ns",
             "createdAt", "tokens", "caches"});
  const int64_t version = int_in(field(j, "header", "formatVersion"), "formatVersion", 0, INT32_MAX);
  if (version != kKvFormatVersion)
    throw Error(ErrorKind::Unsupported, "KV file formatVersion " + std::to_string(version) + " is not supported (2)");
  h.format_version = static_cast<int>(version);
  h.meta.model_id = str_of(field(j, "header", "modelId"), "modelId");
  h.meta.config_fingerprint = str_of(field(j, "header", "configFingerprint"), "configFingerprint");
  h.meta.weights_hash = str_of(field(j, "header", "weightsHash"), "weightsHash");
  h.meta.tokenizer_hash = str_of(field(j, "header", "tokenizerHash"), "tokenizerHash");
  h.meta.template_hash = str_of(field(j, "header", "templateHash"), "templateHash");
  h.meta.ns = str_of(field(j, "header", "ns"), "ns");
  h.created_at_ms = int_in(field(j, "header", "createdAt"), "createdAt", 0, INT64_MAX);
  const json& tokens = field(j, "header", "tokens");
  if (!tokens.is_array() || tokens.empty() || tokens.size() > L::kMaxTokens)
    bad("'tokens' must be an array of 1 to " + std::to_string(L::kMaxTokens) + " token ids");
  h.tokens.reserve(tokens.size());
  for (const json& t : tokens) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX ||
        (t.is_number_unsigned() && t.get<uint64_t>() > INT32_MAX))
      bad("'tokens' holds something that is not a token id");
    h.tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  const json& caches = field(j, "header", "caches");
  if (!caches.is_array() || caches.empty() || caches.size() > L::kMaxCaches)
    bad("'caches' must be an array of 1 to " + std::to_string(L::kMaxCaches) + " caches");
  const uint64_t data_bytes = file_size - h.data_start;
  for (size_t i = 0; i < caches.size(); ++i)
    h.caches.push_back(
        parse_entry(caches[i], "caches[" + std::to_string(i) + "]", data_bytes, static_cast<int64_t>(h.tokens.size())));
  // No two tensors may share bytes.
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const KvCacheEntry& e : h.caches)
    for (const KvTensorSlot& t : e.tensors) ranges.emplace_back(t.off, t.off + t.bytes);
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) bad("two tensors overlap at offset " + std::to_string(ranges[i].first));
  return h;
}

std::string kv_meta_mismatch(const KvFileMeta& file, const KvFileMeta& expect) {
  const std::pair<const char*, std::pair<const std::string*, const std::string*>> fields[] = {
      {"modelId", {&file.model_id, &expect.model_id}},
      {"configFingerprint", {&file.config_fingerprint, &expect.config_fingerprint}},
      {"weightsHash", {&file.weights_hash, &expect.weights_hash}},
      {"tokenizerHash", {&file.tokenizer_hash, &expect.tokenizer_hash}},
      {"templateHash", {&file.template_hash, &expect.template_hash}},
      {"ns", {&file.ns, &expect.ns}}};
  for (const auto& [name, v] : fields)
    if (*v.first != *v.second) return std::string(name) + ": file has '" + *v.first + "', expected '" + *v.second + "'";
  return "";
}

void check_kv_layout(const KvFileHeader& h, const CacheLayout& layout) {
  auto refuse = [](const std::string& what) { throw Error(ErrorKind::InvalidArgument, "KV file: " + what); };
  if (h.caches.size() != layout.layers.size())
    refuse("holds " + std::to_string(h.caches.size()) + " caches, this model has " +
           std::to_string(layout.layers.size()));
  for (size_t i = 0; i < h.caches.size(); ++i) {
    const KvCacheEntry& e = h.caches[i];
    const CacheLayout::Layer& l = layout.layers[i];
    const std::string where = "caches[" + std::to_string(i) + "]";
    if (state_kind_of(e.kind) != l.kind)
      refuse(where + ".kind is " + e.kind + ", this model's cache is " + file_kind_of(l.kind));
    auto meta = [&](const char* key) { return l.meta.count(key) ? l.meta.at(key) : -1; };
    if (e.max_size && *e.max_size != meta("max_size"))
      refuse(where + ".maxSize is " + std::to_string(*e.max_size) + ", this model's window is " +
             std::to_string(meta("max_size")));
    if (e.bits && (*e.bits != meta("bits") || *e.group_size != meta("group_size")))
      refuse(where + " is quantized " + std::to_string(*e.bits) + "-bit group " + std::to_string(*e.group_size) +
             ", this model's cache " + std::to_string(meta("bits")) + "-bit group " +
             std::to_string(meta("group_size")));
    if (e.tensors.size() != l.tensors.size())
      refuse(where + " has " + std::to_string(e.tensors.size()) + " tensors, this model's cache " +
             std::to_string(l.tensors.size()));
    for (size_t t = 0; t < e.tensors.size(); ++t) {
      const KvTensorSlot& s = e.tensors[t];
      const CacheLayout::TensorShape& want = l.tensors[t];
      bool fits = s.dtype == want.dtype && s.shape.size() == want.shape.size();
      for (size_t d = e.kind == "ssm" ? 0 : 1; fits && d < s.shape.size(); ++d) fits = s.shape[d] == want.shape[d];
      if (!fits)
        refuse(where + ".tensors[" + std::to_string(t) + "] (" + want.name + ") is " + dtype_name(s.dtype) +
               shape_str(s.shape) + ", this model's is " + dtype_name(want.dtype) + shape_str(want.shape));
    }
  }
}

}  // namespace lathe
