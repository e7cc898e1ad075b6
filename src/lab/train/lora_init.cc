#include "lab/train/lora_init.h"

#include <cmath>

#include "common/error.h"
#include "lab/train/train_data.h"

namespace lathe::train {
namespace {

bool ends_with_module(const std::string& path, const std::string& suffix) {
  if (path.size() < suffix.size() || path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0)
    return false;
  return path.size() == suffix.size() || path[path.size() - suffix.size() - 1] == '.';
}

}  // namespace

float effective_scale(const LoraSpec& spec) {
  return spec.rs_lora ? static_cast<float>(spec.scale / std::sqrt(static_cast<double>(spec.rank))) : spec.scale;
}

LoraParams init_lora(const lora::LinearSites& sites, const LoraSpec& spec) {
  if (spec.rank < 1) throw Error(ErrorKind::InvalidArgument, "rank must be at least 1");
  const int64_t layers = sites.num_layers();
  const int64_t first = spec.num_layers < 0 ? 0 : std::max<int64_t>(0, layers - spec.num_layers);
  LoraParams out;
  for (int i = 0; i < sites.size(); ++i) {
    const auto& site = sites.at(i);
    const int64_t layer = lora::layer_index(site.module);
    if (layer < first) continue;  // also drops sites outside the blocks (an lm_head) unless all layers
    if (layer < 0) continue;
    bool hit = false;
    for (const auto& t : spec.target_modules) hit = hit || ends_with_module(site.module, t);
    if (!hit) continue;
    LoraParam p;
    p.module = site.module;
    p.scale = effective_scale(spec);
    p.a = Tensor::zeros({spec.rank, site.in}, DType::F32);
    p.b = Tensor::zeros({site.out, spec.rank}, DType::F32);
    p.grad_a = Tensor::zeros({spec.rank, site.in}, DType::F32);
    p.grad_b = Tensor::zeros({site.out, spec.rank}, DType::F32);
    // One stream per target, split from the seed by the site's position, so adding a target leaves the others.
    SplitMix64 rng(spec.seed ^ (0xA24BAED4963EE407ull * static_cast<uint64_t>(out.params.size() + 1)));
    const double bound = 1.0 / std::sqrt(static_cast<double>(site.in));
    float* a = p.a.data<float>();
    for (int64_t k = 0; k < p.a.numel(); ++k) a[k] = static_cast<float>((2.0 * rng.uniform() - 1.0) * bound);
    out.params.push_back(std::move(p));
  }
  if (out.params.empty()) {
    std::string targets, some;
    for (const auto& t : spec.target_modules) targets += (targets.empty() ? "" : ", ") + t;
    for (int i = 0; i < sites.size() && i < 4; ++i) some += (some.empty() ? "" : ", ") + sites.at(i).module;
    throw Error(ErrorKind::InvalidArgument,
                "no linear layer matches target_modules [" + targets + "] (the model has e.g. " + some + ")");
  }
  return out;
}

}  // namespace lathe::train
