#include "lora/adapter_file.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/os_error.h"
#include "io/finite_check.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lora/linear_sites.h"

namespace lathe::lora {
namespace {

// Whether p is a regular file (its size in *size). Only a missing one (ENOENT; ENOTDIR: a component of the path is
// a file) is false: any other failure of stat (a folder that may not be searched, EACCES; a symlink loop; an I/O
// error) is an OsError naming p with its errno (a permission error, not "not found": server/api_error.h).
bool is_file(const std::string& p, size_t* size = nullptr) {
  struct stat st {};
  if (::stat(p.c_str(), &st) != 0) {
    const int e = errno;
    if (e == ENOENT || e == ENOTDIR) return false;
    throw OsError(p, e);
  }
  if (!S_ISREG(st.st_mode)) return false;
  if (size) *size = static_cast<size_t>(st.st_size);
  return true;
}

std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// PEFT matches a pattern key against the end of a module path at a '.' boundary.
bool pattern_matches(const std::string& module, const std::string& key) {
  if (module.size() < key.size() || module.compare(module.size() - key.size(), key.size(), key) != 0) return false;
  return module.size() == key.size() || module[module.size() - key.size() - 1] == '.';
}

// A [rows, cols] tensor as F32, transposed when asked, in its own memory (the file mapping is not kept). An
// aligned F32 source is read in place (one pass); the transpose goes in 32×32 tiles (both sides stay in cache).
Tensor to_f32(const Tensor& t, bool transpose) {
  const int64_t R = t.dim(0), C = t.dim(1);
  std::vector<float> converted;
  const float* src = nullptr;
  if (t.dtype() == DType::F32 && t.is_contiguous() && t.device() == Device::CPU &&
      reinterpret_cast<uintptr_t>(t.raw()) % alignof(float) == 0) {
    src = static_cast<const float*>(t.raw());
  } else {
    converted = t.to_floats();
    src = converted.data();
  }
  Tensor out = Tensor::empty(transpose ? Shape{C, R} : Shape{R, C}, DType::F32);
  float* dst = out.data<float>();
  if (!transpose) {
    std::memcpy(dst, src, static_cast<size_t>(R * C) * sizeof(float));
    return out;
  }
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < R; r0 += kTile)
    for (int64_t c0 = 0; c0 < C; c0 += kTile)
      for (int64_t r = r0; r < std::min(R, r0 + kTile); ++r)
        for (int64_t c = c0; c < std::min(C, c0 + kTile); ++c) dst[c * R + r] = src[r * C + c];
  return out;
}

}  // namespace

std::string base_model_name(const std::string& s) {
  const size_t m = s.find("models--");
  if (m == std::string::npos) return s;
  size_t end = s.find('/', m);
  std::string repo = s.substr(m + 8, end == std::string::npos ? std::string::npos : end - m - 8);
  const size_t sep = repo.find("--");
  if (sep == std::string::npos || sep == 0 || sep + 2 >= repo.size()) return s;
  return repo.substr(0, sep) + "/" + repo.substr(sep + 2);
}

AdapterConfig read_adapter_config(const std::string& dir) {
  AdapterConfig c;
  c.dir = dir;
  const std::string cfg_path = dir + "/adapter_config.json";
  size_t cfg_size = 0;
  if (!is_file(cfg_path, &cfg_size))
    throw Error(ErrorKind::NotFound, dir + ": no adapter_config.json (not an adapter)");
  if (cfg_size > kMaxAdapterConfigBytes)
    throw Error(ErrorKind::Corrupt, cfg_path + ": " + std::to_string(cfg_size) + " bytes is over the " +
                                        std::to_string(kMaxAdapterConfigBytes) + "-byte limit");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(cfg_path));
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::Corrupt, cfg_path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) throw Error(ErrorKind::Corrupt, cfg_path + ": not a JSON object");
  auto num = [&](const nlohmann::json& o, const char* key) -> double {
    if (!o.contains(key) || !o[key].is_number())
      throw Error(ErrorKind::Corrupt, cfg_path + ": '" + key + "' is missing or not a number");
    return o[key].get<double>();
  };
  try {
    if (j.contains("lora_parameters")) {
      c.format = "mlx-lm";
      const std::string type = j.value("fine_tune_type", std::string("lora"));
      if (type != "lora")
        throw Error(ErrorKind::Unsupported, cfg_path + ": fine_tune_type '" + type + "' (only lora adapters)");
      const auto& p = j["lora_parameters"];
      if (!p.is_object()) throw Error(ErrorKind::Corrupt, cfg_path + ": lora_parameters is not an object");
      c.rank = static_cast<int64_t>(num(p, "rank"));
      c.scale = static_cast<float>(p.contains("scale") ? num(p, "scale") : 20.0);  // mlx-lm's default
      if (j.contains("model") && j["model"].is_string()) c.base_model = j["model"].get<std::string>();
      c.weights_path = dir + "/adapters.safetensors";
    } else if (j.contains("r") || j.value("peft_type", std::string()) == "LORA") {
      c.format = "peft";
      const std::string type = j.value("peft_type", std::string("LORA"));
      if (type != "LORA") throw Error(ErrorKind::Unsupported, cfg_path + ": peft_type '" + type + "' (only LORA)");
      if (j.value("use_dora", false)) throw Error(ErrorKind::Unsupported, cfg_path + ": DoRA adapters");
      c.rank = static_cast<int64_t>(num(j, "r"));
      c.alpha = j.contains("lora_alpha") ? num(j, "lora_alpha") : static_cast<double>(c.rank);
      c.rslora = j.value("use_rslora", false);
      for (const char* key : {"rank_pattern", "alpha_pattern"}) {
        if (!j.contains(key) || j[key].is_null()) continue;
        if (!j[key].is_object()) throw Error(ErrorKind::Corrupt, cfg_path + ": " + key + " is not an object");
        for (const auto& [k, v] : j[key].items()) {
          if (!v.is_number()) throw Error(ErrorKind::Corrupt, cfg_path + ": " + key + "." + k + " is not a number");
          if (key[0] == 'r')
            c.rank_pattern.emplace_back(k, v.get<int64_t>());
          else
            c.alpha_pattern.emplace_back(k, v.get<double>());
        }
      }
      if (c.rank > 0)
        c.scale = static_cast<float>(c.rslora ? c.alpha / std::sqrt(static_cast<double>(c.rank)) : c.alpha / c.rank);
      if (j.contains("base_model_name_or_path") && j["base_model_name_or_path"].is_string())
        c.base_model = j["base_model_name_or_path"].get<std::string>();
      c.weights_path = dir + "/adapter_model.safetensors";
    } else {
      throw Error(ErrorKind::Unsupported,
                  cfg_path + ": neither an mlx-lm (lora_parameters) nor a PEFT (r, lora_alpha) LoRA config");
    }
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::Corrupt, cfg_path + ": " + e.what());
  }
  if (c.rank <= 0 || c.rank > kMaxAdapterRank)
    throw Error(ErrorKind::Corrupt,
                cfg_path + ": rank " + std::to_string(c.rank) + " is outside 1.." + std::to_string(kMaxAdapterRank));
  if (!std::isfinite(c.scale)) throw Error(ErrorKind::Corrupt, cfg_path + ": the scale is not finite");
  if (!is_file(c.weights_path, &c.weights_bytes))
    throw Error(ErrorKind::NotFound,
                dir + ": adapter_config.json is " + c.format + " but " + c.weights_path + " is missing");
  return c;
}

AdapterWeights read_adapter(const std::string& dir) {
  AdapterWeights out;
  out.config = read_adapter_config(dir);
  const AdapterConfig& c = out.config;
  const auto file = SafetensorsFile::open(c.weights_path);
  const std::string& path = c.weights_path;
  if (file->tensors().size() > kMaxAdapterTensors)
    throw Error(ErrorKind::Corrupt, path + ": " + std::to_string(file->tensors().size()) + " tensors (limit " +
                                        std::to_string(kMaxAdapterTensors) + ")");
  // module -> (a name, b name); the suffix says the layout.
  struct Pair {
    std::string a, b;
    bool peft = false;
  };
  std::map<std::string, Pair> pairs;
  bool saw_mlx = false, saw_peft = false;
  for (const auto& [tensor_name, info] : file->tensors()) {
    const std::string& name = tensor_name;  // clang before 16 cannot capture a structured binding
    auto ends = [&](const std::string& suf) {
      return name.size() > suf.size() && name.compare(name.size() - suf.size(), suf.size(), suf) == 0;
    };
    auto strip = [&](const std::string& suf) { return canonical_module(name.substr(0, name.size() - suf.size())); };
    if (name.find("lora_magnitude_vector") != std::string::npos || name.find("lora_embedding_") != std::string::npos)
      throw Error(ErrorKind::Unsupported, path + ": tensor '" + name + "' (DoRA and embedding LoRA are not supported)");
    if (ends(".lora_a")) {
      pairs[strip(".lora_a")].a = name;
      saw_mlx = true;
    } else if (ends(".lora_b")) {
      pairs[strip(".lora_b")].b = name;
      saw_mlx = true;
    } else if (ends(".lora_A.weight") || ends(".lora_A.default.weight")) {
      auto& p = pairs[strip(ends(".lora_A.weight") ? ".lora_A.weight" : ".lora_A.default.weight")];
      p.a = name;
      p.peft = saw_peft = true;
    } else if (ends(".lora_B.weight") || ends(".lora_B.default.weight")) {
      auto& p = pairs[strip(ends(".lora_B.weight") ? ".lora_B.weight" : ".lora_B.default.weight")];
      p.b = name;
      p.peft = saw_peft = true;
    } else {
      ++out.skipped;
    }
  }
  if (saw_mlx && saw_peft)
    throw Error(ErrorKind::Corrupt, path + ": mixes mlx-lm (lora_a/lora_b) and PEFT (lora_A/lora_B) tensor names");
  if (pairs.empty()) throw Error(ErrorKind::Corrupt, path + ": no LoRA tensors (lora_a/lora_b or lora_A/lora_B)");
  for (const auto& [module, p] : pairs) {
    if (p.a.empty() || p.b.empty())
      throw Error(ErrorKind::Corrupt, path + ": module '" + module + "' has " + (p.a.empty() ? p.b : p.a) +
                                          " but not its " + (p.a.empty() ? "A (down)" : "B (up)") +
                                          " half: a LoRA pair needs both");
    const Tensor a = file->get(p.a), b = file->get(p.b);
    if (a.ndim() != 2 || b.ndim() != 2)
      throw Error(ErrorKind::Corrupt, path + ": module '" + module + "': LoRA factors must be 2-D, got " +
                                          shape_str(a.shape()) + " and " + shape_str(b.shape()));
    if (!is_float(a.dtype()) || !is_float(b.dtype()))
      throw Error(ErrorKind::Corrupt, path + ": module '" + module + "': LoRA factors must be float tensors");
    // A NaN or infinity mounts fine and then turns every output of the adapter into NaN (empty text), as a
    // damaged base weight would: refused by name, as model loading does.
    for (const auto& [name, t] : {std::pair{&p.a, &a}, std::pair{&p.b, &b}})
      if (const int64_t bad = first_non_finite(*t); bad >= 0)
        throw Error(ErrorKind::Corrupt, path + ": tensor '" + *name + "' holds a NaN or infinite value (element " +
                                            std::to_string(bad) + "): the adapter is damaged");
    // mlx-lm: a [in, r], b [r, out]; PEFT: A [r, in], B [out, r]. The shared dimension is the rank.
    const int64_t r_a = p.peft ? a.dim(0) : a.dim(1), r_b = p.peft ? b.dim(1) : b.dim(0);
    if (r_a != r_b) {
      const std::string want = p.peft ? "PEFT layout is lora_A.weight [r, in], lora_B.weight [out, r]"
                                      : "mlx-lm layout is lora_a [in, r], lora_b [r, out]";
      throw Error(ErrorKind::Corrupt, path + ": module '" + module + "': " + p.a + " " + shape_str(a.shape()) +
                                          " and " + p.b + " " + shape_str(b.shape()) +
                                          " do not share a rank dimension (" + want + "; is a factor transposed?)");
    }
    int64_t rank = c.rank;
    double alpha = c.alpha;
    for (const auto& [k, v] : c.rank_pattern)
      if (pattern_matches(module, k)) rank = v;
    for (const auto& [k, v] : c.alpha_pattern)
      if (pattern_matches(module, k)) alpha = v;
    if (r_a != rank)
      throw Error(ErrorKind::Corrupt, path + ": module '" + module + "' has rank " + std::to_string(r_a) +
                                          " but adapter_config.json says " + std::to_string(rank) +
                                          (p.peft ? "" : " (a factor may be transposed)"));
    LoraFactor f;
    f.module = module;
    f.a = to_f32(a, !p.peft);
    f.b = to_f32(b, !p.peft);
    f.scale = c.format == "peft" ? static_cast<float>(c.rslora ? alpha / std::sqrt(static_cast<double>(rank))
                                                               : alpha / static_cast<double>(rank))
                                 : c.scale;
    out.factors.push_back(std::move(f));
  }
  return out;
}

}  // namespace lathe::lora
