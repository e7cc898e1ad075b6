// Binds checkpoint tensors to layers, checking each against the shape the config implies. A module is
// quantized exactly when its `.scales` tensor exists; bits and group size come from the config's
// quantization dict. Every error names the file and the tensor.
#pragma once
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "io/checkpoint.h"
#include "lora/linear_sites.h"
#include "model/config.h"
#include "tensor/ops.h"

namespace lathe {

class WeightBinder {
 public:
  WeightBinder(const Checkpoint& ckpt, const ModelConfig& config) : ckpt_(ckpt), config_(config) {}

  // `module` is a path like "model.layers.0.self_attn.q_proj"; expects module.weight [out, in].
  Weight linear(const std::string& module, int64_t out, int64_t in) { return linear_on(module, out, in, config_.load); }
  // Modules that read the same input (q/k/v, gate/up), stacked by rows on the host and uploaded as one weight
  // [Σ outs, in], so decode runs one GEMV launch instead of several. Nullopt on the CPU (weights stay zero-copy
  // views of the file) or when the modules differ in format (dense vs quantized, bits, group, dtypes).
  std::optional<Weight> fused_linear(const std::vector<std::string>& modules, const std::vector<int64_t>& outs,
                                     int64_t in);
  // Rows [begin, end) of a weight as a view (one module's part of a fused weight).
  static Weight row_slice(const Weight& w, int64_t begin, int64_t end);
  // An embedding table [vocab, dim], dense or quantized (module.weight + module.scales).
  Weight embedding(const std::string& module, int64_t vocab, int64_t dim) { return linear(module, vocab, dim); }
  // A stack of E matrices [E, out, in] (MoE experts) stored as one 3-D tensor named `module` or
  // `module.weight`, dense or quantized (`module.scales`/`.biases` present); one Weight view per matrix.
  std::vector<Weight> stacked_linear(const std::string& module, int64_t experts, int64_t out, int64_t in);
  // A dense float vector/matrix of the given shape (norm weights, biases).
  Tensor tensor(const std::string& name, const Shape& shape);
  Tensor optional_tensor(const std::string& name, const Shape& shape);
  bool has(const std::string& name) const { return ckpt_.has(name); }
  Shape shape_of(const std::string& name) const { return ckpt_.get(name).shape(); }  // throws NotFound

  const std::set<std::string>& used() const { return used_; }
  // Linear layers a LoRA adapter may attach to ([lora]): Linear records its index here when bound.
  int lora_site(const std::string& module, int64_t out, int64_t in) { return sites_->add(module, out, in); }
  std::shared_ptr<const lora::LinearSites> lora_sites() const { return sites_; }

 private:
  // The quantization spec of a module whose .scales exist, validated against its input size.
  QuantSpec quant_spec(const std::string& module, int64_t in) const;
  void check_quantized(const std::string& module, const std::string& wname, const Shape& wshape,
                       const Shape& sshape) const;
  Tensor checked(const std::string& name, const Shape& shape);  // validated, still where the file has it
  Weight linear_on(const std::string& module, int64_t out, int64_t in, const LoadOptions& o);
  std::string where(const std::string& name) const { return ckpt_.file_of(name) + ": tensor '" + name + "'"; }
  const Checkpoint& ckpt_;
  const ModelConfig& config_;
  std::set<std::string> used_;
  std::shared_ptr<lora::LinearSites> sites_ = std::make_shared<lora::LinearSites>();
};

}  // namespace lathe
