// Scheduler::Row, a request's place in the scheduler, shared by the scheduler's source files (engine-internal).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cache/cache_identity.h"
#include "engine/scheduler.h"
#include "lora/forward_context.h"

namespace lathe {

struct Scheduler::Row {
  uint64_t order = 0;  // arrival: FIFO admission, and the newest running row is preempted first
  std::unique_ptr<SequenceState> seq;
  std::shared_ptr<SequenceSink> sink;
  CacheList cache;
  bool has_cache = false;
  int64_t fed = 0;  // history tokens the cache holds
  bool admitted_before = false, prefilled = false, preempted = false;
  Clock::time_point arrived, admitted, first_token;
  int64_t planned = 0;  // tokens this step
  // How the row's input was fed since `base` (the prefix reused at first admission): a resumed row replays the
  // same forwards, so its cache — and its output — are what they would have been without the preemption.
  int64_t base = 0;
  std::vector<int64_t> segments;
  size_t replayed = 0;  // segments re-run since the last resume
  bool replaying() const { return replayed < segments.size(); }

  int64_t input_end() const { return static_cast<int64_t>(seq->history().size()); }
  const lora::ForwardContext* adapters() const { return seq->options().adapters.get(); }
  // The prompt-cache namespace, the same in RAM and on the SSD: the content hash of the adapter set (weights
  // and scales in stacking order, never mount ids) and the salt. "" = the base model without a salt.
  std::string cache_ns() const {
    return cache_namespace(adapters() ? adapters()->key : std::string(), seq->options().cache_salt);
  }
};

}  // namespace lathe
