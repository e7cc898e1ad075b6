#include "engine/device_sampler.h"

#include <cmath>
#include <cstring>

#include "common/env.h"
#include "common/error.h"
#include "engine/logits_processors.h"
#include "tensor/ops.h"

namespace lathe {
namespace {

// LATHE_DEVICE_SAMPLING=0 sends sampled rows (and greedy rows that want their logprob) back to the host Sampler,
// as before the sampling kernel existed. Read each step, so a test or a running server's environment decides.
bool device_sampling_on() { return env_switch("LATHE_DEVICE_SAMPLING"); }

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

// The rows' draws launched on the device: ids [n], or ids then their logprobs' bits [2n] when any row is sampled
// or wants its logprob; undefined when the device cannot serve every row.
Tensor launch_draws(const Tensor& logits, std::span<const DeviceSampleRow> rows) {
  if (!logits.defined() || logits.device() == Device::CPU || logits.ndim() != 2 ||
      logits.dim(0) != static_cast<int64_t>(rows.size()) || rows.empty())
    return Tensor();
  bool all_plain = true;
  for (const DeviceSampleRow& r : rows) {
    if (!device_row(r)) return Tensor();
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
  if ((!edits.empty() || !masked.empty() || !all_plain) && logits.dtype() != DType::F32) return Tensor();
  Tensor edited;
  if (!edits.empty() || !masked.empty()) {
    edited = logits.clone();
    apply_logit_edits(edited, edits);
    apply_token_masks(edited, masked, bits);
  }
  const Tensor& final_logits = edited.defined() ? edited : logits;
  if (all_plain) return argmax_rows_device(final_logits);  // one launch; only the ids come back
  // Sampled rows (and greedy ones that want their logprob): one block a row draws as the host Sampler would.
  std::vector<RowSampling> settings;
  settings.reserve(rows.size());
  for (const DeviceSampleRow& r : rows) settings.push_back(row_sampling(r));
  return sample_rows_device(final_logits.contiguous(), settings);
}

// What launch_draws picked, read back: each row's id, and its logprob where the row asked for it.
void read_draws(const int32_t* h, size_t n, bool with_logprobs, const std::vector<bool>& logprob,
                std::vector<SampleResult>& out) {
  out.assign(n, SampleResult());
  for (size_t i = 0; i < n; ++i) {
    out[i].token = h[i];
    if (with_logprobs && logprob[i]) std::memcpy(&out[i].logprob, h + n + i, sizeof(float));
  }
}

std::vector<bool> logprob_flags(std::span<const DeviceSampleRow> rows) {
  std::vector<bool> f(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) f[i] = rows[i].logprob;
  return f;
}

}  // namespace

bool sample_on_device(const Tensor& logits, std::span<const DeviceSampleRow> rows, std::vector<SampleResult>& out) {
  const Tensor picked = launch_draws(logits, rows);
  if (!picked.defined()) return false;
  const Tensor host = picked.to(Device::CPU);
  read_draws(host.data<int32_t>(), rows.size(), host.numel() == static_cast<int64_t>(2 * rows.size()),
             logprob_flags(rows), out);
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
  for (const DeviceSampleRow& r : rows)
    if (!r.params || !async_sampling_row(*r.params, r.top_logprobs, r.logprob)) return false;
  Tensor picked = launch_draws(logits, rows);  // no penalties or grammar: nothing here reads the history
  if (!picked.defined()) return false;
  out = PendingSample();
  out.rows = rows.size();
  out.logprob = logprob_flags(rows);
  out.picked = std::move(picked);
  out.readback = &readback;
  readback.start(out.picked);
  return true;
}

void collect_samples(PendingSample& p, std::vector<SampleResult>& out) {
  LATHE_CHECK(p.readback, "collect_samples: nothing was launched");
  const auto* h = static_cast<const int32_t*>(p.readback->wait());
  read_draws(h, p.rows, p.picked.numel() == static_cast<int64_t>(2 * p.rows), p.logprob, out);
  p.readback = nullptr;
}

}  // namespace lathe
