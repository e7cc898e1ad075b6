// The quality number of a quantize summary: the KL divergence KL(source || quantized) of next-token
// distributions, averaged over every position of a few fixed prompts (tokenized with the checkpoint's own
// tokenizer), with the top-1 agreement. Both models run on the CPU in f32.
#pragma once
#include <string>

#include "jobs/job_types.h"

namespace lathe::lab {

// {mean_kl, max_kl, top1_agreement, positions, prompts}; {error} when a model cannot be loaded for it.
jobs::json next_token_kl(const std::string& source_dir, const std::string& quantized_dir, int max_tokens);

}  // namespace lathe::lab
