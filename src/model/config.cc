#include "model/config.h"

#include <cmath>

#include "common/error.h"
#include "common/limits.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"

namespace lathe {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const ModelConfig& c, const std::string& what) {
  throw Error(ErrorKind::Corrupt, c.dir + "/config.json: " + what);
}

RopeParams parse_rope(const json& d, RopeParams r) {
  if (!d.is_object()) return r;
  if (d.contains("rope_type") && d["rope_type"].is_string())
    r.type = d["rope_type"].get<std::string>();
  else if (d.contains("type") && d["type"].is_string())
    r.type = d["type"].get<std::string>();
  auto num = [&](const char* k, double& out) {
    if (d.contains(k) && d[k].is_number()) out = d[k].get<double>();
  };
  num("rope_theta", r.theta);
  num("factor", r.factor);
  num("low_freq_factor", r.low_freq_factor);
  num("high_freq_factor", r.high_freq_factor);
  num("partial_rotary_factor", r.partial_rotary_factor);
  if (d.contains("original_max_position_embeddings") && d["original_max_position_embeddings"].is_number())
    r.original_max_position_embeddings = d["original_max_position_embeddings"].get<int64_t>();
  return r;
}

bool is_layer_type_name(const std::string& k) {
  return k == "full_attention" || k == "sliding_attention" || k == "linear_attention" || k == "chunked_attention";
}

std::optional<QuantSpec> parse_quant(const ModelConfig& c, const json& q, const std::string& where, QuantSpec base) {
  if (q.is_boolean()) {
    if (!q.get<bool>()) return std::nullopt;
    return base;
  }
  if (!q.is_object()) bad(c, where + " must be an object or false");
  QuantSpec s = base;
  if (q.contains("bits")) {
    if (!q["bits"].is_number_integer()) bad(c, where + ".bits must be an integer");
    s.bits = q["bits"].get<int>();
  }
  if (q.contains("group_size")) {
    if (!q["group_size"].is_number_integer()) bad(c, where + ".group_size must be an integer");
    s.group_size = q["group_size"].get<int>();
  }
  if (q.contains("mode") && q["mode"].is_string() && q["mode"].get<std::string>() != "affine")
    throw Error(ErrorKind::Unsupported, c.dir + "/config.json: quantization mode '" + q["mode"].get<std::string>() +
                                            "' in " + where + " (lathe reads MLX affine quantization)");
  return s;
}

// Sizes become allocations and loop bounds: out-of-range values are refused here, with the key named, rather
// than failing later as a crash or a huge allocation.
void check_ranges(const ModelConfig& c) {
  auto within = [&](const char* key, int64_t v, int64_t lo, int64_t hi) {
    if (v < lo || v > hi)
      bad(c, std::string("'") + key + "' is " + std::to_string(v) + "; it must be between " + std::to_string(lo) +
                 " and " + std::to_string(hi));
  };
  within("hidden_size", c.hidden_size, 1, limits::kConfigMaxDim);
  within("num_hidden_layers", c.num_layers, 1, 4096);
  within("num_attention_heads", c.num_heads, 1, 4096);
  within("num_key_value_heads", c.num_kv_heads, 1, c.num_heads);
  within("vocab_size", c.vocab_size, 1, limits::kTokenizerMaxId);
  within("head_dim", c.head_dim, 1, 4096);
  within("intermediate_size", c.intermediate_size, 0, limits::kConfigMaxDim);
  within("sliding_window", c.sliding_window, 0, limits::kConfigMaxPositions);
  // Absent means unknown (0); given, a context must hold at least one token.
  if (c.has("max_position_embeddings"))
    within("max_position_embeddings", c.max_position_embeddings, 1, limits::kConfigMaxPositions);
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps) || c.rms_norm_eps >= 1)
    bad(c, "'rms_norm_eps' must be a small positive number, got " + std::to_string(c.rms_norm_eps));
}

}  // namespace

int64_t ModelConfig::get_int(const std::string& key, int64_t dflt) const {
  if (!has(key)) return dflt;
  if (!text[key].is_number_integer()) bad(*this, "'" + key + "' must be an integer");
  return text[key].get<int64_t>();
}
double ModelConfig::get_double(const std::string& key, double dflt) const {
  if (!has(key)) return dflt;
  if (!text[key].is_number()) bad(*this, "'" + key + "' must be a number");
  return text[key].get<double>();
}
bool ModelConfig::get_bool(const std::string& key, bool dflt) const {
  if (!has(key)) return dflt;
  if (!text[key].is_boolean()) bad(*this, "'" + key + "' must be true or false");
  return text[key].get<bool>();
}
std::string ModelConfig::get_string(const std::string& key, const std::string& dflt) const {
  if (!has(key)) return dflt;
  if (!text[key].is_string()) bad(*this, "'" + key + "' must be a string");
  return text[key].get<std::string>();
}

std::optional<QuantSpec> ModelConfig::quant_for(const std::string& module) const {
  static const std::string kPrefix = "language_model.";
  for (const std::string& key : {module, kPrefix + module}) {
    auto it = quant_overrides.find(key);
    if (it != quant_overrides.end()) return it->second;
  }
  return quant_default;
}

const RopeParams& ModelConfig::rope_for_layer(int64_t layer) const {
  const std::string& type = layer_types[static_cast<size_t>(layer)];
  auto it = rope.find(type);
  if (it != rope.end()) return it->second;
  return rope.at("full_attention");
}

ModelConfig parse_model_config(const json& root, const std::string& dir) {
  ModelConfig c;
  c.dir = dir;
  c.root = root;
  if (!root.is_object()) bad(c, "is not a JSON object");
  c.text = root.contains("text_config") && root["text_config"].is_object() ? root["text_config"] : root;

  // Multimodal configs name the model at the top level; a wrong type there is an error, not a throw from json.
  auto root_typed = [&](const char* key, json::value_t t) {
    if (!root.contains(key)) return false;
    if (root[key].type() != t) bad(c, std::string("'") + key + "' has the wrong type");
    return true;
  };
  const std::string root_type =
      root_typed("model_type", json::value_t::string) ? root["model_type"].get<std::string>() : std::string();
  c.model_type = c.get_string("model_type", root_type);
  if (c.model_type.empty()) bad(c, "has no model_type");
  auto required = [&](const char* key) {
    int64_t v = c.get_int(key, -1);
    if (v <= 0) bad(c, std::string("missing or invalid '") + key + "'");
    return v;
  };
  c.hidden_size = required("hidden_size");
  c.num_layers = required("num_hidden_layers");
  c.num_heads = required("num_attention_heads");
  c.vocab_size = required("vocab_size");
  c.intermediate_size = c.get_int("intermediate_size", 0);
  c.num_kv_heads = c.get_int("num_key_value_heads", c.num_heads);
  c.head_dim = c.get_int("head_dim", c.hidden_size / c.num_heads);
  c.max_position_embeddings = c.get_int("max_position_embeddings", 0);
  c.rms_norm_eps = c.get_double("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = c.has("tie_word_embeddings") ? c.get_bool("tie_word_embeddings", false)
                                                       : root_typed("tie_word_embeddings", json::value_t::boolean) &&
                                                             root["tie_word_embeddings"].get<bool>();
  c.hidden_act = c.get_string("hidden_activation", c.get_string("hidden_act", "silu"));
  c.sliding_window = c.has("sliding_window") ? c.get_int("sliding_window", 0) : 0;
  if (c.num_kv_heads <= 0 || c.num_heads % c.num_kv_heads != 0)
    bad(c, "num_attention_heads must be a multiple of num_key_value_heads");
  check_ranges(c);

  // Layer types: explicit list, else a sliding pattern (Gemma legacy), else an interval (Qwen3.5), else all full.
  if (c.has("layer_types")) {
    if (!c.text["layer_types"].is_array()) bad(c, "'layer_types' must be an array");
    for (const auto& t : c.text["layer_types"]) {
      if (!t.is_string()) bad(c, "'layer_types' entries must be strings");
      c.layer_types.push_back(t.get<std::string>());
    }
    if (static_cast<int64_t>(c.layer_types.size()) != c.num_layers)
      bad(c, "'layer_types' has " + std::to_string(c.layer_types.size()) + " entries for " +
                 std::to_string(c.num_layers) + " layers");
  } else {
    int64_t pattern = c.get_int("sliding_window_pattern", c.get_int("_sliding_window_pattern", 0));
    if (pattern == 0 && c.model_type.rfind("gemma3", 0) == 0) pattern = 6;
    const int64_t interval = c.get_int("full_attention_interval", 0);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      if (pattern > 0)
        c.layer_types.push_back((i + 1) % pattern == 0 ? "full_attention" : "sliding_attention");
      else if (interval > 0)
        c.layer_types.push_back((i + 1) % interval == 0 ? "full_attention" : "linear_attention");
      else
        c.layer_types.push_back("full_attention");
    }
  }

  // RoPE: transformers-5 rope_parameters (flat or per layer type), else legacy keys.
  RopeParams base;
  base.theta = c.get_double("rope_theta", base.theta);
  base.partial_rotary_factor = c.get_double("partial_rotary_factor", 1.0);
  if (c.has("rope_parameters") && c.text["rope_parameters"].is_object()) {
    const json& rp = c.text["rope_parameters"];
    bool per_type = false;
    for (auto it = rp.begin(); it != rp.end(); ++it)
      if (is_layer_type_name(it.key()) && it.value().is_object()) per_type = true;
    if (per_type) {
      for (auto it = rp.begin(); it != rp.end(); ++it)
        if (it.value().is_object()) c.rope[it.key()] = parse_rope(it.value(), base);
    } else {
      c.rope["full_attention"] = parse_rope(rp, base);
    }
  } else {
    c.rope["full_attention"] = parse_rope(c.has("rope_scaling") ? c.text["rope_scaling"] : json(), base);
    if (c.has("rope_local_base_freq")) {
      RopeParams local = base;
      local.theta = c.get_double("rope_local_base_freq", 10000.0);
      c.rope["sliding_attention"] = local;
    }
  }
  if (!c.rope.count("full_attention")) c.rope["full_attention"] = c.rope.begin()->second;
  for (const auto& [type, r] : c.rope)
    if (!(r.theta > 0) || !std::isfinite(r.theta) || !(r.factor > 0) || !std::isfinite(r.factor))
      bad(c, "RoPE parameters for " + type + " need rope_theta > 0 and factor > 0");

  // Special token ids.
  auto ids_of = [](const json& v, std::vector<int>& out) {
    if (v.is_number_integer()) out.push_back(v.get<int>());
    if (v.is_array())
      for (const auto& x : v)
        if (x.is_number_integer()) out.push_back(x.get<int>());
  };
  if (c.text.contains("eos_token_id")) ids_of(c.text["eos_token_id"], c.eos_token_ids);
  if (c.eos_token_ids.empty() && root.contains("eos_token_id")) ids_of(root["eos_token_id"], c.eos_token_ids);
  for (const json* j : std::initializer_list<const json*>{&c.text, &root})
    if (!c.bos_token_id && j->contains("bos_token_id") && (*j)["bos_token_id"].is_number_integer())
      c.bos_token_id = (*j)["bos_token_id"].get<int>();

  // Quantization: the MLX dict (top level, or nested), per-module entries override the default.
  const json* q = nullptr;
  for (const json* j : std::initializer_list<const json*>{&root, &c.text})
    for (const char* key : {"quantization", "quantization_config"})
      if (!q && j->contains(key) && (*j)[key].is_object()) q = &(*j)[key];
  if (q) {
    QuantSpec d = parse_quant(c, *q, "quantization", QuantSpec{}).value();
    c.quant_default = d;
    for (auto it = q->begin(); it != q->end(); ++it)
      if (it.value().is_object() || it.value().is_boolean())
        c.quant_overrides[it.key()] = parse_quant(c, it.value(), "quantization['" + it.key() + "']", d);
  }
  return c;
}

ModelConfig load_model_config(const std::string& dir) {
  const std::string path = dir + "/config.json";
  const json root = io::parse_json_checked(read_text_file(path), io::file_json_limits(), ErrorKind::Corrupt,
                                           path + ": not valid JSON");
  return parse_model_config(root, dir);
}

}  // namespace lathe
