// Where a verb runs its model (--device, --dtype) and how it stores the KV cache (--kv-bits, --kv-group-size),
// whether CPU matmuls run exact (--exact), and how much device memory dense copies of quantized weights may take
// (--cuda-dense-weights), shared by generate, chat and serve.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "cache/layer_cache.h"
#include "engine/dense_weights_budget.h"
#include "engine/kv_budget.h"
#include "model/config.h"
#include "tensor/dense_weights.h"

namespace lathe::cli {

inline constexpr const char* kDenseWeightsHelp =
    "cuda: dense copies of quantized weights for matmuls over more than 8 rows (prefill, wide batches), which "
    "skip a dequantize per call at ~4x the weights' memory: auto (when they fit in a quarter of the free device "
    "memory), on, off, or a byte cap such as 8G; never more than what the KV cache budget leaves";
inline constexpr const char* kExactHelp =
    "cpu: exact f32 quantized matmuls and an f32 KV cache (the reference path) instead of int8-activation "
    "integer dots and a bf16 cache";
inline constexpr const char* kKvDtypeHelp =
    "cpu: the full-precision KV cache's type: bf16 (half the bytes; the default), f32 (the default with --exact), "
    "or auto";

// Whether the CPU's full-precision KV cache is bf16: the default path's choice, f32 with --exact.
inline bool cpu_kv_bf16(const std::string& kv_dtype, bool exact) {
  return kv_dtype == "bf16" || (kv_dtype == "auto" && !exact);
}

struct DeviceFlags {
  std::string device = "cpu", dtype = "f32";
  int kv_bits = 0, kv_group_size = 64;
  std::string kv_dtype = "auto";
  bool exact = false;
  std::string cuda_dense_weights = "auto";

  void add_to(CLI::App* cmd) {
    cmd->add_option("--device", device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
    cmd->add_option("--dtype", dtype, "activation type on cuda: f32 or bf16")
        ->capture_default_str()
        ->check(CLI::IsMember({"f32", "bf16"}));
    cmd->add_option("--kv-bits", kv_bits, "store the KV cache quantized to 4 or 8 bits (default: full precision)")
        ->check(CLI::IsMember({0, 4, 8}));
    cmd->add_option("--kv-group-size", kv_group_size, "group size of the quantized KV cache")
        ->capture_default_str()
        ->check(CLI::IsMember({32, 64}));
    cmd->add_option("--kv-dtype", kv_dtype, kKvDtypeHelp)
        ->capture_default_str()
        ->check(CLI::IsMember({"auto", "f32", "bf16"}));
    cmd->add_flag("--exact", exact, kExactHelp);
    cmd->add_option("--cuda-dense-weights", cuda_dense_weights, kDenseWeightsHelp)
        ->capture_default_str()
        ->check([](const std::string& v) {
          try {
            parse_dense_weights(v);
            return std::string();
          } catch (const std::exception& e) {
            return std::string(e.what());
          }
        });
  }
  // After the model is loaded (its weights are on the device): the dense-copy budget from the free device memory,
  // less the KV cache budget the caller will fill.
  void apply_dense_weights(int64_t kv_cache_bytes) const {
    if (device != "cuda") return;
    set_dense_weight_budget(
        dense_weights_budget(parse_dense_weights(cuda_dense_weights), device_free_bytes(), kv_cache_bytes));
  }
  // The same for one sequence (generate, chat): its KV cache at the model's full context at most.
  void apply_dense_weights_one_sequence(const ModelConfig& cfg) const {
    apply_dense_weights(KvBudget(cfg, cache()).bytes_for(cfg.max_position_embeddings));
  }
  LoadOptions load() const {
    LoadOptions l;
    l.device = device == "cuda" ? Device::CUDA : Device::CPU;
    l.dtype = dtype == "bf16" ? DType::BF16 : DType::F32;
    l.exact = exact;
    return l;
  }
  CacheOptions cache() const {
    CacheOptions c;
    c.kv_bits = kv_bits;
    c.kv_group_size = kv_group_size;
    c.cpu_kv_bf16 = device == "cpu" && cpu_kv_bf16(kv_dtype, exact);
    return c;
  }
};

}  // namespace lathe::cli
