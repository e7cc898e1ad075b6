// Sampling on the logits' device ([core]): many rows at once, only token ids (and the logprobs a row asked for)
// come back to the host. The host Sampler (engine/sampler.h) stays the definition of each method; a row this
// path cannot serve makes sample_on_device decline, and the caller samples the whole step on the host.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampler.h"
#include "engine/token_constraint.h"
#include "tensor/device_readback.h"
#include "tensor/tensor.h"

namespace lathe {

struct DeviceSampleRow {
  const SamplingParams* params = nullptr;
  uint64_t seed = 0;  // the row's own random stream: (seed, step) as the host Sampler draws
  uint64_t step = 0;
  std::span<const int32_t> history;  // prompt + generated ids (penalties)
  int top_logprobs = 0;
  bool logprob = false;  // the chosen token's logprob is wanted (else SampleResult::logprob is left 0)
  // The row's live grammar state when params->constraint is set (its Sampler's): its allowed-token bits mask
  // the row on the device. Not advanced here: the caller's SequenceState::accept moves it with the token.
  ConstraintState* constraint = nullptr;
};

// logits: f32 [rows.size(), vocab]. Fills out (one result per row) and returns true, or returns false (out
// untouched) when the logits are on the CPU or a row needs something the device path does not do: top-logprob
// lists, XTC on a step whose draw turns it on, a grammar without its live state.
// Every row's logit_bias and repetition / presence / frequency penalties are applied in one launch (the host's
// edits, tensor/logit_edit.h), grammar rows' allowed-token bitsets in another (as the host masks after its
// processors). A step of plain greedy rows then takes one argmax launch (only ids come back; the host takes the
// argmax of the log-softmax, the device of the logits: the same token unless two logits a row apart round to one
// log-probability). Any other step takes one sampling launch (tensor/cuda/sample_rows.cu): each row drawn as its
// host Sampler would at (seed, step) — log-softmax, top-p → min-p → top-k, categorical over softmax(f / T) with
// the same draw — and its token's logprob when the row asks for it.
bool sample_on_device(const Tensor& logits, std::span<const DeviceSampleRow> rows, std::vector<SampleResult>& out);

// A step's sampling launched without waiting for it, so the next step can be queued first: the ids stay on the
// device (`ids`, which a batched graph replay can read as its input tokens) and come back behind them.
struct PendingSample {
  Tensor picked;              // I32: the ids [n], then (sampled steps) the logprobs' f32 bits [n]
  std::vector<bool> logprob;  // rows that asked for their token's logprob
  DeviceReadback* readback = nullptr;
  size_t rows = 0;
  const int32_t* ids() const { return picked.data<int32_t>(); }
};
// Launches sampling for rows that need nothing of the host's state between steps: no penalties (they read the
// history), no grammar, no top-logprob lists (a logit_bias is applied); the same draw as sample_on_device. Returns
// false (nothing launched) for any other step, or logits on the CPU.
bool sample_on_device_async(const Tensor& logits, std::span<const DeviceSampleRow> rows, DeviceReadback& readback,
                            PendingSample& out);
// Waits for the launched step's ids and fills one result per row.
void collect_samples(PendingSample& pending, std::vector<SampleResult>& out);
// Whether a row with these settings can be sampled by sample_on_device_async at any step.
bool async_sampling_row(const SamplingParams& p, int top_logprobs, bool logprob);

}  // namespace lathe
