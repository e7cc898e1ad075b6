// How many bytes of dense (bf16/f16) device copies of quantized weights the CUDA matmul path may keep
// (--cuda-dense-weights). Above the batched GEMV's row limit a quantized linear layer dequantizes its whole
// weight into scratch on every call and then runs cuBLAS; a persistent copy skips that dequantize, which at
// a 64-row decode step is most of the GPU time. Those copies take about four times the quantized bytes, so they
// come after the KV cache: the budget is only what is left once the KV budget and a headroom are set aside.
#pragma once
#include <cstdint>
#include <string>

namespace lathe {

struct DenseWeightsSetting {
  enum class Mode { Auto, On, Off, Bytes };
  Mode mode = Mode::Auto;
  int64_t bytes = 0;  // Mode::Bytes only
};

// "auto", "on", "off", or a byte count with an optional K/M/G/T suffix (powers of 1024: "8G"). Throws
// InvalidArgument on anything else.
DenseWeightsSetting parse_dense_weights(const std::string& text);

// Device memory kept free for activations, cuBLAS workspaces and graph pools: 1 GiB or 1/16 of the free memory,
// whichever is larger.
int64_t dense_weights_headroom(int64_t device_free);

// The byte budget for dense weight copies, given the device memory free now (after the model is loaded) and the
// KV cache budget that will be allocated later. Never more than device_free - kv_bytes - headroom, so the KV pool
// is never starved by the copies. Off: 0. On: all of that. Bytes: at most the given bytes. Auto: at most a quarter
// of the free memory, so the copies only go where they fit comfortably.
int64_t dense_weights_budget(const DenseWeightsSetting& s, int64_t device_free, int64_t kv_bytes);

}  // namespace lathe
