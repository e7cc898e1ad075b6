#include "engine/device_sampler.h"

#include "tensor/ops.h"

namespace lathe {
namespace {

// A row the device argmax serves exactly: greedy with no logits processor and nothing but the id wanted.
bool plain_greedy(const DeviceSampleRow& r) {
  const SamplingParams* p = r.params;
  return p && p->temperature == 0.0f && p->repetition_penalty == 1.0f && p->presence_penalty == 0.0f &&
         p->frequency_penalty == 0.0f && p->logit_bias.empty() && !p->constraint && r.top_logprobs == 0 && !r.logprob;
}

}  // namespace

bool sample_on_device(const Tensor& logits, std::span<const DeviceSampleRow> rows, std::vector<SampleResult>& out) {
  if (!logits.defined() || logits.device() == Device::CPU || logits.ndim() != 2 ||
      logits.dim(0) != static_cast<int64_t>(rows.size()) || rows.empty())
    return false;
  for (const DeviceSampleRow& r : rows)
    if (!plain_greedy(r)) return false;
  const std::vector<int32_t> ids = argmax_rows(logits);  // one launch; only the ids come back
  out.assign(rows.size(), SampleResult());
  for (size_t i = 0; i < rows.size(); ++i) out[i].token = ids[i];
  return true;
}

}  // namespace lathe
