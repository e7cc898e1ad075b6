// Sampling flags shared by generate and chat: a flag left unset falls back to generation_config.json.
#pragma once
#include <optional>

#include <CLI/CLI.hpp>

#include "engine/sampling_params.h"

namespace lathe::cli {

struct SamplingFlags {
  std::optional<float> temp, top_p, min_p;
  std::optional<int> top_k;
  std::optional<uint64_t> seed;

  void add_to(CLI::App* cmd) {
    cmd->add_option("--temp", temp, "sampling temperature (0 = greedy)");
    cmd->add_option("--top-p", top_p, "nucleus sampling mass");
    cmd->add_option("--top-k", top_k, "keep the k most likely tokens");
    cmd->add_option("--min-p", min_p, "keep tokens with p ≥ min_p · p_max");
    cmd->add_option("--seed", seed, "random seed");
  }
  SamplingParams resolve(SamplingParams defaults) const {
    if (temp) defaults.temperature = *temp;
    if (top_p) defaults.top_p = *top_p;
    if (top_k) defaults.top_k = *top_k;
    if (min_p) defaults.min_p = *min_p;
    if (seed) defaults.seed = *seed;
    defaults.validate();
    return defaults;
  }
};

}  // namespace lathe::cli
