// Step overlap (CUDA): a step whose rows need nothing from the host between steps launches its sampling
// without waiting, and the next step() queues the following decode step before it reads those ids.
#include <chrono>

#include "common/error.h"
#include "engine/device_sampler.h"
#include "engine/scheduler.h"
#include "engine/scheduler_row.h"

namespace lathe {

bool Scheduler::launch_async_sample(const Tensor& logits, const std::vector<Row*>& rows, uint64_t steps_ahead,
                                    InFlight& into) {
  if (!overlap_ || rows.empty() || logits.device() == Device::CPU) return false;  // the CPU samples on the host
  const auto t0 = Clock::now();
  DeviceReadback& rb = readbacks_[next_readback_];
  if (!sample_on_device_async(logits, device_rows(rows, steps_ahead), rb, into.sample)) return false;
  next_readback_ ^= 1;
  into.rows = rows;
  into.active = true;
  stats_.sample_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  return true;
}

// The next decode step may be queued before the in-flight step's ids are read when nothing but those rows'
// next tokens is to do: every running row was sampled by it, none ends by its length there, none was cancelled,
// none needs the host between steps (penalties, grammar, top-logprob lists, adapters), admission has nothing it
// could add, and the KV budget holds every row one token further.
bool Scheduler::overlap_ready() const {
  if (!overlap_ || !inflight_.active || inflight_.rows.size() != running_.size() || running_.size() < 2) return false;
  if (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_batch) return false;
  int64_t used = idle_bytes();
  for (size_t i = 0; i < running_.size(); ++i) {
    const Row* r = running_[i].get();
    if (inflight_.rows[i] != r || r->replaying() || r->adapters() || r->seq->cancel_requested()) return false;
    const GenerateOptions& o = r->seq->options();
    if (!async_sampling_row(o.sampling, o.top_logprobs, o.logprob)) return false;
    if (static_cast<int64_t>(r->seq->steps()) + 1 >= o.max_tokens) return false;
    used += claim(*r, 1);
  }
  return used <= options_.kv_cache_bytes;
}

bool Scheduler::launch_overlapped(InFlight& next) {
  Batch batch;
  batch.device_ids = inflight_.sample.ids();
  for (Row* r : inflight_.rows) {
    BatchRow br;
    br.ids = {0};  // one token: its value is the in-flight step's sampled id, read on the device
    br.caches = &r->cache;
    batch.rows.push_back(std::move(br));
  }
  if (!bundle_.model().replays_decode(batch)) return false;
  const auto forward_start = Clock::now();
  const Tensor logits = bundle_.model().forward(batch);
  stats_.forward_seconds += std::chrono::duration<double>(Clock::now() - forward_start).count();
  for (Row* r : inflight_.rows) {  // as a planned decode token: the sampled id joins the history when it is read
    r->fed += 1;
    r->segments.push_back(1);
    r->replayed = r->segments.size();
  }
  // The draw is each row's step after the in-flight one, which is not accepted yet.
  LATHE_CHECK(launch_async_sample(logits, inflight_.rows, 1, next), "scheduler: an overlapped step could not sample");
  stats_.batch_rows = static_cast<int64_t>(batch.rows.size());
  stats_.batch_tokens = stats_.batch_rows;
  ++stats_.steps;
  ++stats_.overlapped_steps;
  return true;
}

// Reads the in-flight step's ids, hands each row its token, and ends the rows that ended; those also leave
// `next` (the step queued meanwhile), whose token for them is dropped: their caches then hold one token past
// what they would without the overlap, which is their history's last token.
void Scheduler::complete_inflight(InFlight* next) {
  const auto t0 = Clock::now();
  std::vector<SampleResult> sampled;
  collect_samples(inflight_.sample, sampled);
  stats_.sample_seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<Row*> rows;
  std::vector<SampleResult> taken;
  for (size_t i = 0; i < inflight_.rows.size(); ++i)
    if (inflight_.rows[i]) {
      rows.push_back(inflight_.rows[i]);
      taken.push_back(sampled[i]);
    }
  inflight_ = InFlight();
  emit_sampled(rows, taken);
  for (size_t i = 0; i < running_.size();) {
    Row* r = running_[i].get();
    if (!r->seq->done()) {
      ++i;
      continue;
    }
    if (next)
      for (Row*& n : next->rows)
        if (n == r) n = nullptr;
    auto row = std::move(running_[i]);
    running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
    finish(std::move(row), "length");
  }
}

}  // namespace lathe
