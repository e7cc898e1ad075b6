// What a model's caches hold after one token: per cache its kind, fixed metadata (window, quantization) and
// every tensor's name, dtype and shape. A KV file is checked against it before any byte is restored, so a
// file that parses but does not fit this model (another head count, window or dtype) is refused up front.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "cache/layer_cache.h"

namespace lathe {

class Model;

struct CacheLayout {
  struct TensorShape {
    std::string name;
    DType dtype = DType::F32;
    Shape shape;  // for kv kinds dim 0 is the token count (1 here); ssm shapes are fixed
  };
  struct Layer {
    std::string kind;  // state kind: kv, rotating, quantized, rotating_quantized, ssm
    std::map<std::string, int64_t> meta;
    std::vector<TensorShape> tensors;
  };
  std::vector<Layer> layers;
  Device device = Device::CPU;
};

// Runs token 0 through fresh caches of `options` once and records what they hold.
CacheLayout probe_cache_layout(Model& model, const CacheOptions& options);

}  // namespace lathe
