#include "engine/device_sampler.h"

#include "engine/logits_processors.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

// A row the device serves exactly: greedy, with any logits processors (logit_bias, penalties) and a grammar
// whose live state it was given, and nothing but the id wanted.
bool device_greedy(const DeviceSampleRow& r) {
  const SamplingParams* p = r.params;
  return p && p->temperature == 0.0f && (!p->constraint || r.constraint) && r.top_logprobs == 0 && !r.logprob;
}

bool has_processors(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         !p.logit_bias.empty();
}

}  // namespace

bool sample_on_device(const Tensor& logits, std::span<const DeviceSampleRow> rows, std::vector<SampleResult>& out) {
  if (!logits.defined() || logits.device() == Device::CPU || logits.ndim() != 2 ||
      logits.dim(0) != static_cast<int64_t>(rows.size()) || rows.empty())
    return false;
  for (const DeviceSampleRow& r : rows)
    if (!device_greedy(r)) return false;
  // The processors' edits of every row, at flat indices of the step's logits: a few hundred floats uploaded and
  // changed in one launch on a copy (the caller's logits stay as the model gave them).
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  std::vector<LogitEdit> edits;
  for (size_t i = 0; i < rows.size(); ++i)
    if (has_processors(*rows[i].params)) {
      const std::vector<LogitEdit> e =
          logit_edits(*rows[i].params, rows[i].history, vocab, static_cast<int64_t>(i * vocab));
      edits.insert(edits.end(), e.begin(), e.end());
    }
  // The grammar rows' allowed tokens: a grammar keeps its masks by state, so this is a lookup and a copy a row.
  std::vector<int32_t> masked;
  std::vector<uint64_t> bits, row_bits;
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].params->constraint) {
      rows[i].constraint->allowed_bits(vocab, row_bits);
      masked.push_back(static_cast<int32_t>(i));
      bits.insert(bits.end(), row_bits.begin(), row_bits.end());
    }
  // The edit and mask kernels are f32 (as the model's logits).
  if ((!edits.empty() || !masked.empty()) && logits.dtype() != DType::F32) return false;
  std::vector<int32_t> ids;
  if (edits.empty() && masked.empty()) {
    ids = argmax_rows(logits);  // one launch; only the ids come back
  } else {
    Tensor edited = logits.clone();
    apply_logit_edits(edited, edits);
    apply_token_masks(edited, masked, bits);
    ids = argmax_rows(edited);
  }
  out.assign(rows.size(), SampleResult());
  for (size_t i = 0; i < rows.size(); ++i) out[i].token = ids[i];
  return true;
}

}  // namespace lathe
