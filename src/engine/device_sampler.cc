#include "engine/device_sampler.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/error.h"
#include "engine/logits_processors.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

// LATHE_DEVICE_SAMPLING=0 sends sampled rows (and greedy rows that want their logprob) back to the host Sampler,
// as before the sampling kernel existed. Read each step, so a test or a running server's environment decides.
bool device_sampling_on() {
  const char* e = std::getenv("LATHE_DEVICE_SAMPLING");
  return !e || std::strcmp(e, "0") != 0;
}

// A row the device serves: any temperature, top-p, min-p and top-k; XTC on a step where its draw leaves it off;
// any logits processors (logit_bias, penalties); a grammar whose live state it was given; its token's logprob but
// no top-logprob lists.
bool device_row(const DeviceSampleRow& r) {
  const SamplingParams* p = r.params;
  if (!p || (p->constraint && !r.constraint) || r.top_logprobs != 0) return false;
  if ((p->temperature != 0.0f || r.logprob) && !device_sampling_on()) return false;
  return p->temperature == 0.0f || p->xtc_probability == 0.0f || xtc_draw(r.seed, r.step) >= p->xtc_probability;
}

// Greedy with nothing but the id wanted: the argmax of the (edited, masked) logits.
bool plain_greedy(const DeviceSampleRow& r) { return r.params->temperature == 0.0f && !r.logprob; }

bool has_processors(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f ||
         !p.logit_bias.empty();
}

// The row's settings as the host Sampler computes them for this step (engine/sampler.cc).
RowSampling row_sampling(const DeviceSampleRow& r) {
  const SamplingParams& p = *r.params;
  RowSampling s;
  if (p.temperature == 0.0f) return s;  // greedy: the argmax, and its logprob
  s.u = categorical_draw(r.seed, r.step);
  s.inv_temperature = 1.0f / p.temperature;
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.log_min_p = p.min_p > 0.0f ? std::log(p.min_p) : 0.0f;
  s.top_k = p.top_k;
  return s;
}

}  // namespace

bool sample_on_device(const Tensor& logits, std::span<const DeviceSampleRow> rows, std::vector<SampleResult>& out) {
  if (!logits.defined() || logits.device() == Device::CPU || logits.ndim() != 2 ||
      logits.dim(0) != static_cast<int64_t>(rows.size()) || rows.empty())
    return false;
  bool all_plain = true;
  for (const DeviceSampleRow& r : rows) {
    if (!device_row(r)) return false;
    all_plain = all_plain && plain_greedy(r);
  }
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
  // The edit, mask and sampling kernels are f32 (as the model's logits).
  if ((!edits.empty() || !masked.empty() || !all_plain) && logits.dtype() != DType::F32) return false;
  Tensor edited;
  if (!edits.empty() || !masked.empty()) {
    edited = logits.clone();
    apply_logit_edits(edited, edits);
    apply_token_masks(edited, masked, bits);
  }
  const Tensor& final_logits = edited.defined() ? edited : logits;
  out.assign(rows.size(), SampleResult());
  if (all_plain) {
    const std::vector<int32_t> ids = argmax_rows(final_logits);  // one launch; only the ids come back
    for (size_t i = 0; i < rows.size(); ++i) out[i].token = ids[i];
    return true;
  }
  // Sampled rows (and greedy ones that want their logprob): one block a row draws as the host Sampler would.
  std::vector<RowSampling> settings;
  settings.reserve(rows.size());
  for (const DeviceSampleRow& r : rows) settings.push_back(row_sampling(r));
  std::vector<float> logprobs;
  const std::vector<int32_t> ids = sample_rows(final_logits.contiguous(), settings, logprobs);
  for (size_t i = 0; i < rows.size(); ++i) {
    out[i].token = ids[i];
    if (rows[i].logprob) out[i].logprob = logprobs[i];
  }
  return true;
}

// Penalties read the history, whose last token an overlapped step has not read back yet; a logit_bias does not.
bool history_free(const SamplingParams& p) {
  return p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f;
}

bool async_sampling_row(const SamplingParams& p, int top_logprobs, bool logprob) {
  if (p.constraint || top_logprobs != 0 || !history_free(p)) return false;
  // XTC turns itself on by a draw per step; sampled rows (and a greedy one's logprob) need the sampling kernel.
  if (p.temperature == 0.0f && !logprob) return true;
  return p.xtc_probability == 0.0f && device_sampling_on();
}

bool sample_on_device_async(const Tensor& logits, std::span<const DeviceSampleRow> rows, DeviceReadback& readback,
                            PendingSample& out) {
  if (!logits.defined() || logits.device() == Device::CPU || logits.ndim() != 2 ||
      logits.dim(0) != static_cast<int64_t>(rows.size()) || rows.empty())
    return false;
  bool all_plain = true;
  for (const DeviceSampleRow& r : rows) {
    if (!r.params || !async_sampling_row(*r.params, r.top_logprobs, r.logprob) || !device_row(r)) return false;
    all_plain = all_plain && plain_greedy(r);
  }
  // Each row's logit_bias, in one launch on a copy (as sample_on_device edits).
  const size_t vocab = static_cast<size_t>(logits.dim(1));
  std::vector<LogitEdit> edits;
  for (size_t i = 0; i < rows.size(); ++i)
    if (!rows[i].params->logit_bias.empty()) {
      const std::vector<LogitEdit> e = logit_edits(*rows[i].params, {}, vocab, static_cast<int64_t>(i * vocab));
      edits.insert(edits.end(), e.begin(), e.end());
    }
  if ((!all_plain || !edits.empty()) && logits.dtype() != DType::F32) return false;
  Tensor edited;
  if (!edits.empty()) {
    edited = logits.clone();
    apply_logit_edits(edited, edits);
  }
  const Tensor& final_logits = edited.defined() ? edited : logits;
  out = PendingSample();
  out.rows = rows.size();
  out.logprob.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) out.logprob[i] = rows[i].logprob;
  if (all_plain) {
    out.picked = argmax_rows_device(final_logits);
  } else {
    std::vector<RowSampling> settings;
    settings.reserve(rows.size());
    for (const DeviceSampleRow& r : rows) settings.push_back(row_sampling(r));
    out.picked = sample_rows_device(final_logits.contiguous(), settings);
  }
  out.readback = &readback;
  readback.start(out.picked);
  return true;
}

void collect_samples(PendingSample& p, std::vector<SampleResult>& out) {
  LATHE_CHECK(p.readback, "collect_samples: nothing was launched");
  const auto* h = static_cast<const int32_t*>(p.readback->wait());
  const bool with_logprobs = p.picked.numel() == static_cast<int64_t>(2 * p.rows);
  out.assign(p.rows, SampleResult());
  for (size_t i = 0; i < p.rows; ++i) {
    out[i].token = h[i];
    if (with_logprobs && p.logprob[i]) std::memcpy(&out[i].logprob, h + p.rows + i, sizeof(float));
  }
  p.readback = nullptr;
}

}  // namespace lathe
