// Binds checkpoint tensors to layers, checking each against the shape the config implies. A module is
// quantized exactly when its `.scales` tensor exists; bits and group size come from the config's
// quantization dict. Every error names the file and the tensor.
#pragma once
#include <set>
#include <string>

#include "io/checkpoint.h"
#include "model/config.h"
#include "tensor/ops.h"

namespace lathe {

class WeightBinder {
 public:
  WeightBinder(const Checkpoint& ckpt, const ModelConfig& config) : ckpt_(ckpt), config_(config) {}

  // `module` is a path like "model.layers.0.self_attn.q_proj"; expects module.weight [out, in].
  Weight linear(const std::string& module, int64_t out, int64_t in);
  // An embedding table [vocab, dim], dense or quantized (module.weight + module.scales).
  Weight embedding(const std::string& module, int64_t vocab, int64_t dim) { return linear(module, vocab, dim); }
  // A dense float vector/matrix of the given shape (norm weights, biases).
  Tensor tensor(const std::string& name, const Shape& shape);
  Tensor optional_tensor(const std::string& name, const Shape& shape);
  bool has(const std::string& name) const { return ckpt_.has(name); }

  const std::set<std::string>& used() const { return used_; }

 private:
  Tensor checked(const std::string& name, const Shape& shape);  // validated, still where the file has it
  std::string where(const std::string& name) const { return ckpt_.file_of(name) + ": tensor '" + name + "'"; }
  const Checkpoint& ckpt_;
  const ModelConfig& config_;
  std::set<std::string> used_;
};

}  // namespace lathe
