#include "lab/train/adapter_writer.h"

#include <cmath>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace lathe::train {
namespace {

// src [rows, cols] F32 -> dst [cols, rows].
void transpose_into(const Tensor& src, float* dst) {
  const int64_t rows = src.dim(0), cols = src.dim(1);
  const float* s = src.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = s[r * cols + c];
}

void transpose_from(const Tensor& src, Tensor& dst) {  // src [cols, rows] -> dst [rows, cols]
  const Tensor s = src.contiguous();
  const int64_t rows = dst.dim(0), cols = dst.dim(1);
  if (s.dtype() != DType::F32 || s.ndim() != 2 || s.dim(0) != cols || s.dim(1) != rows)
    throw Error(ErrorKind::Corrupt, "a checkpointed LoRA factor does not have the shape this run trains");
  const float* sp = s.data<float>();
  float* d = dst.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) d[r * cols + c] = sp[c * rows + r];
}

}  // namespace

void write_adapter_weights(const std::string& path, const LoraParams& params) {
  SafetensorsWriter w;
  for (const auto& p : params.params) {
    const Tensor a = p.a, b = p.b;
    w.add(p.module + ".lora_a", DType::F32, {a.dim(1), a.dim(0)},
          [a](void* dst) { transpose_into(a, static_cast<float*>(dst)); });
    w.add(p.module + ".lora_b", DType::F32, {b.dim(1), b.dim(0)},
          [b](void* dst) { transpose_into(b, static_cast<float*>(dst)); });
  }
  w.set_metadata("format", "mlx");
  w.write(path);
}

void read_adapter_weights(const std::string& path, LoraParams& params) {
  const auto f = SafetensorsFile::open(path);
  for (auto& p : params.params) {
    if (!f->has(p.module + ".lora_a") || !f->has(p.module + ".lora_b"))
      throw Error(ErrorKind::Corrupt, path + " has no LoRA pair for " + p.module);
    transpose_from(f->get(p.module + ".lora_a"), p.a);
    transpose_from(f->get(p.module + ".lora_b"), p.b);
  }
}

nlohmann::ordered_json adapter_config_json(const TrainConfig& config, const LoraParams& params) {
  nlohmann::ordered_json j;
  const double scale = effective_scale(config.lora);
  j["fine_tune_type"] = "lora";
  j["model"] = config.model_dir;
  j["base_model"] = config.model_dir;
  j["base_model_name_or_path"] = config.model_dir;
  j["num_layers"] = config.lora.num_layers;
  // scale is the one the residual uses (rsLoRA already applied), so mlx-lm-style loaders need no flag.
  j["lora_parameters"] = {
      {"rank", config.lora.rank}, {"scale", scale}, {"dropout", config.lora_dropout}, {"keys", nullptr}};
  // PEFT's fields give the same scale: alpha / r, or with use_rslora alpha / sqrt(r) (alpha = the unscaled scale).
  const double r = static_cast<double>(config.lora.rank);
  const double alpha = config.lora.rs_lora ? static_cast<double>(config.lora.scale) : r * scale;
  j["r"] = config.lora.rank;
  if (alpha == std::round(alpha) && std::abs(alpha) < 1e15)
    j["lora_alpha"] = static_cast<int64_t>(alpha);  // PEFT types it int; keep that when it is one
  else
    j["lora_alpha"] = alpha;
  j["use_rslora"] = config.lora.rs_lora;
  j["lora_dropout"] = config.lora_dropout;  // training only: a served adapter never drops
  j["target_modules"] = config.lora.target_modules;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["trained_modules"] = params.params.size();
  j["training"] = config.to_json();
  return j;
}

void write_adapter(const std::string& dir, const TrainConfig& config, const LoraParams& params) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw OsError("cannot create the adapter directory " + dir, ec.value());
  write_adapter_weights(dir + "/adapters.safetensors", params);
  const std::string text = adapter_config_json(config, params).dump(2) + "\n";
  write_file_atomic(dir + "/adapter_config.json", text.data(), text.size());
}

}  // namespace lathe::train
