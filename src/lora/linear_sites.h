// The linear layers of a loaded model that a LoRA adapter may attach to, recorded by the weight binder: each
// site's module path (as the checkpoint names it, without a `language_model.` prefix) and its [out, in] shape.
// A Linear carries its site index; adapters are validated against this table before they are attached.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lathe::lora {

struct LinearSite {
  std::string module;  // e.g. "model.layers.0.self_attn.q_proj"
  int64_t out = 0, in = 0;
};

class LinearSites {
 public:
  // Registers a site (or returns the existing index of the same module) and returns its index.
  int add(const std::string& module, int64_t out, int64_t in);
  // -1 when the model has no linear layer of that name.
  int find(const std::string& module) const;
  const LinearSite& at(int i) const { return sites_[static_cast<size_t>(i)]; }
  int size() const { return static_cast<int>(sites_.size()); }
  int64_t num_layers() const { return num_layers_; }

 private:
  std::vector<LinearSite> sites_;
  std::map<std::string, int> index_;
  int64_t num_layers_ = 0;  // 1 + the largest N of a "…layers.N." site
};

// "language_model.model.layers.0.mlp.down_proj" -> "model.layers.0.mlp.down_proj"; also strips PEFT's
// "base_model.model.".
std::string canonical_module(std::string name);
// N of the first ".layers.N." (or "layers.N." at the start) in a module path; -1 when none.
int64_t layer_index(const std::string& module);

}  // namespace lathe::lora
