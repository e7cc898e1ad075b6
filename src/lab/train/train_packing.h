// Sequence packing (`pack: true`, `lathe train --pack`): SFT examples laid back to back into rows of at most
// max_seq tokens, so a micro-batch of short examples is a few long rows instead of many short ones (and a padded
// backend would pad far less). Each row records its examples' lengths (TrainSequence::segments): the engine keeps
// attention inside each example and restarts its positions, so a packed row's summed log-prob and gradients are
// those of its examples run one by one.
#pragma once
#include <cstdint>
#include <vector>

#include "lab/train/train_data.h"

namespace lathe::train {

// Best-fit decreasing: longest example first, each into the fullest row it still fits (a new row when none).
// Deterministic (ties keep file order). SFT examples only (InvalidArgument for a preference row or one longer
// than max_seq).
std::vector<Example> pack_examples(const std::vector<Example>& examples, int64_t max_seq);

// What a batch of rows costs as a padded rectangle: over one epoch of BatchPlan(rows, batch_size, seed), the
// rows, the real tokens and the pad tokens (each batch padded to its longest row).
struct PaddingStats {
  int64_t rows = 0, tokens = 0, pad_tokens = 0;
};
PaddingStats padding_stats(const std::vector<Example>& rows, int64_t batch_size, uint64_t seed);

}  // namespace lathe::train
