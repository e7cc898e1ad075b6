// Where a verb runs its model (--device, --dtype) and how it stores the KV cache (--kv-bits, --kv-group-size),
// and whether CPU matmuls run exact (--exact), shared by generate, chat and serve.
#pragma once
#include <string>

#include <CLI/CLI.hpp>

#include "cache/layer_cache.h"
#include "model/config.h"

namespace lathe::cli {

inline constexpr const char* kExactHelp =
    "cpu: exact f32 quantized matmuls (the reference path) instead of int8-activation integer dots";

struct DeviceFlags {
  std::string device = "cpu", dtype = "f32";
  int kv_bits = 0, kv_group_size = 64;
  bool exact = false;

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
    cmd->add_flag("--exact", exact, kExactHelp);
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
    return c;
  }
};

}  // namespace lathe::cli
