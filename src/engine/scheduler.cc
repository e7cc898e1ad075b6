#include "engine/scheduler.h"

#include <algorithm>

#include "cache/kv_block_pool.h"
#include "common/env.h"
#include "common/error.h"
#include "common/log.h"
#include "engine/device_sampler.h"
#include "engine/scheduler_row.h"
#include "lora/forward_context.h"
#include "tensor/thread_pool.h"

namespace lathe {

void SchedulerOptions::validate() const {
  auto bad = [](const std::string& why) { throw Error(ErrorKind::InvalidArgument, why); };
  if (max_batch < 1) bad("--max-batch must be ≥ 1");
  if (max_batch_tokens < max_batch) bad("--max-batch-tokens must be ≥ --max-batch (each row takes a token)");
  if (prefill_chunk < 1) bad("--prefill-chunk must be ≥ 1");
  if (kv_cache_bytes < 0) bad("--kv-cache-bytes must be ≥ 0");
  if (reuse_slots < 0) bad("the number of reuse slots must be ≥ 0");
}

Scheduler::Scheduler(ModelBundle& bundle, SchedulerOptions options)
    : bundle_(bundle), options_(options), budget_(bundle.model().config(), bundle.cache_options()) {
  options_.validate();
  if (options_.kv_cache_bytes == 0) options_.kv_cache_bytes = default_kv_cache_bytes();
  // One prefill chunk always fits beside a decode token for every other row, so prompts always progress.
  chunk_ = std::min<int64_t>(options_.prefill_chunk, options_.max_batch_tokens - (options_.max_batch - 1));
  stats_.kv_bytes_budget = options_.kv_cache_bytes;
  // Rings and SSM states fork only at their own length, and a donor row has fed past the shared prefix by then.
  const CacheList probe = bundle_.make_cache();
  overlap_ = env_switch("LATHE_STEP_OVERLAP", overlap_);
  forks_any_prefix_ = !probe.empty();
  for (const auto& c : probe) {
    const std::string kind = c->kind();
    forks_any_prefix_ = forks_any_prefix_ && (kind == "kv" || kind == "quantized");
  }
}

Scheduler::~Scheduler() = default;

void Scheduler::add(std::vector<int32_t> prompt, GenerateOptions options, std::shared_ptr<SequenceSink> sink) {
  auto row = std::make_unique<Row>();
  row->sink = std::move(sink);
  row->arrived = Clock::now();
  try {
    row->seq = std::make_unique<SequenceState>(bundle_, std::move(prompt), std::move(options));
    const int64_t need = budget_.bytes_for(row->input_end());
    if (need > options_.kv_cache_bytes)
      throw Error(ErrorKind::InvalidArgument,
                  "the prompt (" + std::to_string(row->input_end()) + " tokens) needs " + std::to_string(need) +
                      " bytes of KV cache; the server's whole budget (--kv-cache-bytes) is " +
                      std::to_string(options_.kv_cache_bytes));
  } catch (...) {
    row->sink->on_error(std::current_exception());
    return;
  }
  row->order = next_order_++;
  waiting_.push_back(std::move(row));
  stats_.waiting = static_cast<int64_t>(waiting_.size());
}

int64_t Scheduler::claim(const Row& row, int64_t extra) const {
  return budget_.bytes_for(std::max(row.fed + extra, row.input_end()));
}

int64_t Scheduler::kv_bytes_used() const {
  int64_t used = idle_bytes();
  for (const auto& r : running_) used += budget_.bytes_for(r->fed);
  return used;
}

int64_t Scheduler::idle_bytes() const {
  int64_t b = 0;
  for (const Idle& i : idle_) b += budget_.bytes_for(static_cast<int64_t>(i.tokens.size()));
  return b;
}

bool Scheduler::evict_idle() {
  if (idle_.empty()) return false;
  drop_idle(std::prev(idle_.end()));  // least recently finished
  return true;
}

namespace {
// The learned restore and prefill rates, beside the identity's namespace folders (scan() leaves files alone).
std::string restore_rates_path(const SsdStore& store) { return store.root() + "/restore_rates.json"; }
}  // namespace

void Scheduler::enable_ssd(SsdStore& store, SsdTierOptions options) {
  ssd_ = &store;
  ssd_options_ = options;
  cost_ = std::make_unique<RestoreCostModel>(options.restore, options.device);
  cost_->load(restore_rates_path(store));
  cache_stats_.prefill_tok_s = cost_->prefill_tok_s();
  cache_stats_.restore_mb_s = cost_->restore_mb_s();
  writer_ = std::make_unique<SsdSpillWriter>(store);
}

void Scheduler::spill(Idle& idle) {
  if (!ssd_ || idle.spilled || static_cast<int64_t>(idle.tokens.size()) < ssd_options_.min_tokens) return;
  idle.spilled = true;
  SpillJob job;
  job.tokens = idle.tokens;
  job.ns = idle.ns;
  if (ssd_options_.host_snapshot) {  // the writer thread never touches the device: it gets host copies
    auto host = std::make_shared<CacheList>(bundle_.make_cache());
    for (size_t i = 0; i < host->size(); ++i) {
      CacheState st = (*idle.cache)[i]->state();
      for (auto& t : st.tensors) t.second = t.second.to(Device::CPU);
      (*host)[i]->restore(st);
    }
    job.caches = std::move(host);
  } else {  // CPU: shared read-only; busy tells take_idle to copy rather than reuse in place
    job.caches = idle.cache;
    job.busy = idle.busy;
  }
  ++cache_stats_.spills_queued;
  writer_->enqueue(std::move(job));
}

void Scheduler::drop_idle(std::list<Idle>::iterator it) {
  spill(*it);
  idle_.erase(it);
}

CacheList Scheduler::take_idle(Idle& idle) {
  if (!idle.busy->load(std::memory_order_acquire)) return std::move(*idle.cache);
  CacheList copy = bundle_.make_cache();  // the writer still reads these buffers: they must not change
  for (size_t i = 0; i < copy.size(); ++i) copy[i]->restore((*idle.cache)[i]->state());
  return copy;
}

// Restores from the SSD tier when a file serves more of the row's input than RAM (ram_best tokens) does, and
// the cost model predicts reading it faster than prefilling the tokens it would add.
bool Scheduler::try_ssd(Row& row, int64_t ram_best) {
  if (!ssd_) return false;
  const std::vector<int32_t>& h = row.seq->history();
  const std::string ns = row.cache_ns();
  const SsdStore::Match m = ssd_->lookup(h, ns);
  if (m.reused <= ram_best) return false;
  const RestoreDecision d = cost_->decide(m.read_bytes, m.reused - ram_best);
  cache_stats_.last_restore_est_s = d.restore_s;
  cache_stats_.last_recompute_est_s = d.recompute_s;
  cache_stats_.last_decision_restore = d.restore;
  if (cost_->policy() == RestorePolicy::Auto) log::info("ssd cache: " + d.describe(m.reused - ram_best, m.read_bytes));
  if (!d.restore) {
    ++cache_stats_.ssd_skipped;
    return false;
  }
  const auto t0 = Clock::now();
  SsdStore::Restored r = ssd_->restore(h, ns);
  if (r.reused <= ram_best) return false;  // the file failed (deleted, counted) or served less
  cache_stats_.ssd_restore_ms_total += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  cost_->observe_restore(r.bytes_read, r.ms / 1000.0);
  cache_stats_.restore_mb_s = cost_->restore_mb_s();
  row.cache = std::move(r.caches);
  row.fed = r.reused;
  return true;
}

double Scheduler::housekeeping() {
  cache_stats_.ram_entries = static_cast<int64_t>(idle_.size());
  cache_stats_.ram_bytes = idle_bytes();
  if (!ssd_) return -1;
  const auto now = Clock::now();
  double next = -1;
  auto consider = [&](double s) { next = next < 0 ? s : std::min(next, s); };
  for (auto it = idle_.begin(); it != idle_.end();) {
    const double idle_s = std::chrono::duration<double>(now - it->since).count();
    if (ssd_options_.demote_idle_s > 0 && idle_s >= ssd_options_.demote_idle_s) {
      auto gone = it++;
      drop_idle(gone);
      continue;
    }
    if (!it->spilled) {
      if (idle_s >= ssd_options_.write_behind_s)
        spill(*it);
      else
        consider(ssd_options_.write_behind_s - idle_s);
    }
    if (ssd_options_.demote_idle_s > 0) consider(ssd_options_.demote_idle_s - idle_s);
    ++it;
  }
  cache_stats_.ram_entries = static_cast<int64_t>(idle_.size());  // after demotions
  cache_stats_.ram_bytes = idle_bytes();
  return next;
}

void Scheduler::flush_ssd() {
  if (!ssd_) return;
  for (Idle& i : idle_) spill(i);
  writer_->drain();
  cost_->save(restore_rates_path(*ssd_));
}

void Scheduler::drop_cancelled() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if ((*it)->seq->cancel_requested()) {
      auto row = std::move(*it);
      it = waiting_.erase(it);
      finish(std::move(row), "cancelled");
    } else {
      ++it;
    }
  }
  for (size_t i = 0; i < running_.size();) {
    if (running_[i]->seq->cancel_requested()) {
      auto row = std::move(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      finish(std::move(row), "cancelled");
    } else {
      ++i;
    }
  }
}

// Serves the row's input from the cache sharing the longest prefix with it (at least one input token is left
// to run, so the row gets logits): a kept finished sequence's or a running row's. Caches are forked — paged ones (the
// CPU's PagedKVCache and QuantizedKVCache) map the prefix's blocks, stored once, copy-on-write; device caches, rings
// and SSM states are copied — and a kept one stays for the next request; caches that cannot fork at that prefix are
// taken (trimmed to it; running rows' only when they can be shared). The SSD tier serves instead when a file holds
// more. Else a fresh cache.
void Scheduler::attach_cache(Row& row) {
  const auto attach_start = Clock::now();
  const std::vector<int32_t>& h = row.seq->history();
  auto common_prefix = [&](const std::vector<int32_t>& tokens, size_t n) {
    size_t c = 0;
    while (c < n && c + 1 < h.size() && tokens[c] == h[c]) ++c;
    return c;
  };
  auto best = idle_.end();
  size_t best_common = 0;
  // A resumed row that started from nothing replays from nothing: that recomputation is exact.
  const bool exact_replay = row.admitted_before && row.base == 0;
  const std::string ns = row.cache_ns();
  for (auto it = idle_.begin(); it != idle_.end() && !exact_replay; ++it) {
    if (it->ns != ns) continue;  // KV computed under another adapter set, or another tenant's salt
    const size_t common = common_prefix(it->tokens, it->tokens.size());
    const int64_t drop = static_cast<int64_t>(it->tokens.size() - common);
    bool trimmable = true;
    for (const auto& c : *it->cache) trimmable = trimmable && c->can_trim(drop);
    if (trimmable && common > best_common) {
      best = it;
      best_common = common;
    }
  }
  const Row* donor = nullptr;  // a running row whose cache holds more of the input than any kept one
  size_t donor_common = 0;
  for (const auto& r : running_) {
    if (exact_replay || !r->has_cache || r->cache_ns() != ns) continue;
    const size_t common = common_prefix(r->seq->history(), static_cast<size_t>(r->fed));
    if (common > std::max(best_common, donor_common)) {
      donor = r.get();
      donor_common = common;
    }
  }
  std::optional<CacheList> shared;
  if (donor) shared = fork_cache_list(donor->cache, static_cast<int64_t>(donor_common));
  if (!shared) donor_common = 0;
  const size_t ram_best = std::max(best_common, donor_common);
  bool from_ram = false, from_ssd = false;
  const int64_t skipped_before = cache_stats_.ssd_skipped;
  if (!exact_replay && try_ssd(row, static_cast<int64_t>(ram_best))) {
    from_ssd = true;
  } else if (shared && donor_common > best_common) {
    row.cache = std::move(*shared);
    row.fed = static_cast<int64_t>(donor_common);
    from_ram = true;
  } else if (best != idle_.end()) {
    if (std::optional<CacheList> fork = fork_cache_list(*best->cache, static_cast<int64_t>(best_common))) {
      row.cache = std::move(*fork);  // the kept cache stays, most recently used first
      best->since = Clock::now();
      idle_.splice(idle_.begin(), idle_, best);
    } else {
      const int64_t drop = static_cast<int64_t>(best->tokens.size() - best_common);
      row.cache = take_idle(*best);
      for (const auto& c : row.cache) c->trim(drop);
      idle_.erase(best);
    }
    row.fed = static_cast<int64_t>(best_common);
    from_ram = true;
  } else {
    row.cache = bundle_.make_cache();
    row.fed = 0;
  }
  row.has_cache = true;
  if (!row.admitted_before) {
    row.seq->result().cached_tokens = static_cast<int>(row.fed);
    (from_ram ? cache_stats_.ram_hits : cache_stats_.ram_misses)++;
    if (from_ram) cache_stats_.ram_reused_tokens += row.fed;
    if (from_ssd) {
      ++cache_stats_.ssd_hits;
      cache_stats_.ssd_reused_tokens += row.fed;
    }
    if (ssd_ && !from_ssd && !from_ram && cache_stats_.ssd_skipped == skipped_before) ++cache_stats_.ssd_misses;
    row.base = row.fed;
    row.segments.clear();
  }
  cache_stats_.last_attach_ms = std::chrono::duration<double, std::milli>(Clock::now() - attach_start).count();
  if (row.fed == row.base) {
    row.replayed = 0;  // resumed from the same start: replay every recorded forward
  } else {             // resumed from another prefix: fresh chunks from here (close, not bit-exact)
    row.base = row.fed;
    row.segments.clear();
    row.replayed = 0;
  }
}

// Whether `row` should wait for a running row that is still prefilling a prefix of its prompt (at least
// kPrefixWaitTokens long) that no kept or running cache serves in full yet. Only rows that have not run yet, on
// models whose caches fork at any prefix; only donors still reading their prompt, so the wait is one prefill at
// most.
bool Scheduler::waits_for_prefix(const Row& row) const {
  constexpr int64_t kPrefixWaitTokens = 64;
  if (!forks_any_prefix_ || row.admitted_before || !kv_fork_copies()) return false;
  const std::vector<int32_t>& h = row.seq->history();
  if (static_cast<int64_t>(h.size()) <= kPrefixWaitTokens) return false;
  const std::string ns = row.cache_ns();
  auto common_with = [&](const std::vector<int32_t>& tokens, size_t n) {
    size_t c = 0;
    n = std::min({n, tokens.size(), h.size() - 1});  // one input token is left to run
    while (c < n && tokens[c] == h[c]) ++c;
    return static_cast<int64_t>(c);
  };
  // What a row still reading its prompt will hold of this one's (usually no row is, and nothing is compared)...
  int64_t pending = 0;
  for (const auto& r : running_)
    if (r->has_cache && !r->prefilled && r->fed < r->input_end() && r->cache_ns() == ns)
      pending = std::max(pending, common_with(r->seq->history(), h.size()));
  if (pending < kPrefixWaitTokens) return false;
  // ...against what a kept or running cache holds of it now (compared no further than `pending`).
  const size_t upto = static_cast<size_t>(pending);
  for (const Idle& kept : idle_)
    if (kept.ns == ns && common_with(kept.tokens, upto) >= pending) return false;
  for (const auto& r : running_)
    if (r->has_cache && r->cache_ns() == ns && common_with(r->seq->history(), static_cast<size_t>(r->fed)) >= pending)
      return false;
  return true;
}

void Scheduler::admit() {
  while (!waiting_.empty() && static_cast<int>(running_.size()) < options_.max_batch) {
    Row& row = *waiting_.front();
    if (waits_for_prefix(row)) {  // FIFO: those behind it wait too, one prefill at most
      ++stats_.prefix_waits;
      break;
    }
    int64_t used = 0;
    for (const auto& r : running_) used += claim(*r, 0);
    const int64_t need = claim(row, 1);
    // Kept caches give way to a request that needs the room (a reused one is trimmed to the row's own prefix).
    while (used + idle_bytes() + need > options_.kv_cache_bytes && evict_idle()) {
    }
    if (used + idle_bytes() + need > options_.kv_cache_bytes) break;  // FIFO: it waits, and so do those after it
    try {
      attach_cache(row);
    } catch (...) {  // no memory for its cache (a KV block that cannot be mapped, say): this request fails alone
      std::unique_ptr<Row> failed = std::move(waiting_.front());
      waiting_.pop_front();
      failed->sink->on_error(std::current_exception());
      continue;
    }
    if (!row.admitted_before) row.admitted = Clock::now();
    row.admitted_before = true;
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

void Scheduler::preempt(size_t index) {
  auto row = std::move(running_[index]);
  running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(index));
  if (claim(*row, 0) > options_.kv_cache_bytes) {  // it could never be resumed: its budget is spent
    finish(std::move(row), "length");
    return;
  }
  row->cache.clear();
  row->has_cache = false;
  row->preempted = true;
  row->fed = 0;
  if (row->base > 0) {  // its reused prefix cannot be recomputed as it was: resume in fresh chunks
    row->segments.clear();
    row->base = -1;
  }
  ++stats_.preemptions;
  log::debug("scheduler: preempted a row at " + std::to_string(row->input_end()) + " tokens (KV budget full)");
  auto at = std::find_if(waiting_.begin(), waiting_.end(), [&](const auto& w) { return w->order > row->order; });
  waiting_.insert(at, std::move(row));
}

void Scheduler::keep_for_reuse(Row& row) {
  if (!row.has_cache || row.fed == 0 || options_.reuse_slots == 0) return;
  Idle kept;
  kept.cache = std::make_shared<CacheList>(std::move(row.cache));
  kept.tokens.assign(row.seq->history().begin(), row.seq->history().begin() + row.fed);
  kept.ns = row.cache_ns();
  kept.since = Clock::now();
  row.has_cache = false;
  // Kept caches this one extends serve nothing it does not (a fork of it serves any prefix): they go, without
  // a spill of their own (the extension's file replaces theirs on the SSD). Their shared blocks stay with it.
  for (auto it = idle_.begin(); it != idle_.end();) {
    const bool extended = it->ns == kept.ns && it->tokens.size() <= kept.tokens.size() &&
                          std::equal(it->tokens.begin(), it->tokens.end(), kept.tokens.begin()) &&
                          can_fork_cache_list(*kept.cache, static_cast<int64_t>(it->tokens.size()));
    it = extended ? idle_.erase(it) : std::next(it);
  }
  idle_.push_front(std::move(kept));
  while (static_cast<int>(idle_.size()) > options_.reuse_slots) drop_idle(std::prev(idle_.end()));
}

void Scheduler::finish(std::unique_ptr<Row> row, const std::string& reason) {
  if (auto tail = row->seq->finish(reason)) row->sink->on_token(*tail);
  GenerateResult& r = row->seq->result();
  if (row->admitted_before && !r.tokens.empty())
    r.decode_seconds = std::chrono::duration<double>(Clock::now() - row->first_token).count();
  keep_for_reuse(*row);
  row->sink->on_finish(std::move(r));
}

std::vector<DeviceSampleRow> Scheduler::device_rows(const std::vector<Row*>& rows, uint64_t steps_ahead) const {
  std::vector<DeviceSampleRow> dev(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    SequenceState& s = *rows[i]->seq;
    DeviceSampleRow& d = dev[i];
    d.params = &s.options().sampling;
    d.seed = s.seed();
    d.step = s.steps() + steps_ahead;
    d.history = s.history();  // read only by logits processors, which an overlapped step's rows have none of
    d.top_logprobs = s.options().top_logprobs;  // a row that wants logprobs is not one the device argmax serves
    d.logprob = s.options().logprob;
    d.constraint = s.constraint();
  }
  return dev;
}

void Scheduler::sample_rows(const Tensor& logits, const std::vector<Row*>& rows) {
  if (rows.empty()) return;
  const auto sample_start = Clock::now();
  std::vector<SampleResult> sampled;
  const std::vector<DeviceSampleRow> dev = device_rows(rows, 0);
  if (!sample_on_device(logits, dev, sampled)) {
    // One copy of the step's logits to the host, then the rows sampled in parallel: each row's sampler,
    // history and RNG are its own, so the result does not depend on the order (a 64-row step over a 152k
    // vocabulary is ~1 ms of host work per row). Rows under a grammar constraint share its compiled masks and
    // are sampled one after another (greedy ones without logprobs are masked on the device instead).
    const Tensor host = logits.device() == Device::CPU ? logits : logits.to(Device::CPU);
    sampled.assign(rows.size(), SampleResult());
    std::vector<size_t> parallel, serial;
    for (size_t i = 0; i < rows.size(); ++i)
      (rows[i]->seq->options().sampling.constraint ? serial : parallel).push_back(i);
    // f32 logits are read in place; other types are converted a row at a time, inside the parallel loop.
    const bool in_place = host.dtype() == DType::F32 && host.is_contiguous();
    const size_t vocab = static_cast<size_t>(host.numel()) / rows.size();
    auto sample_one = [&](size_t i) {
      if (in_place) {
        sampled[i] = rows[i]->seq->sample(std::span<const float>(host.data<float>() + i * vocab, vocab));
        return;
      }
      const int64_t r = static_cast<int64_t>(i);
      const std::vector<float> row = host.slice(0, r, r + 1).to_floats();
      sampled[i] = rows[i]->seq->sample(std::span<const float>(row));
    };
    parallel_for(static_cast<int64_t>(parallel.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e; ++k) sample_one(parallel[static_cast<size_t>(k)]);
    });
    for (size_t i : serial) sample_one(i);
  }
  stats_.sample_seconds += std::chrono::duration<double>(Clock::now() - sample_start).count();
  emit_sampled(rows, sampled);
}

void Scheduler::emit_sampled(const std::vector<Row*>& rows, const std::vector<SampleResult>& sampled) {
  const auto now = Clock::now();
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& row = *rows[i];
    GenerateResult& r = row.seq->result();
    if (r.tokens.empty()) {
      row.first_token = now;
      r.ttft_seconds = std::chrono::duration<double>(now - row.arrived).count();
    }
    row.sink->on_token(row.seq->accept(sampled[i]));
  }
  stats_.emit_seconds += std::chrono::duration<double>(Clock::now() - now).count();
}

// A failed forward leaves the batch's caches in an unknown state: those rows end with the error.
void Scheduler::fail_rows(const std::vector<Row*>& rows, const std::exception_ptr& e) {
  for (Row* r : rows) {
    auto it = std::find_if(running_.begin(), running_.end(), [&](const auto& x) { return x.get() == r; });
    if (!r || it == running_.end()) continue;  // listed twice, or gone already
    auto row = std::move(*it);
    running_.erase(it);
    row->sink->on_error(e);
  }
  stats_.running = static_cast<int64_t>(running_.size());
}

void Scheduler::step() {
  const auto step_start = Clock::now();
  struct StepTimer {  // every return path counts the step's time
    SchedulerStats& s;
    Clock::time_point t0;
    ~StepTimer() { s.step_seconds += std::chrono::duration<double>(Clock::now() - t0).count(); }
  } step_timer{stats_, step_start};
  if (inflight_.active) {
    // Queue the next decode step first when it needs nothing from the host, so the GPU runs it while this
    // thread reads the last step's ids and streams them; else read them, and plan a step as below.
    InFlight next;
    try {
      const bool overlapped = overlap_ready() && launch_overlapped(next);
      complete_inflight(overlapped ? &next : nullptr);
      if (overlapped) {
        inflight_ = std::move(next);
        stats_.kv_bytes_used = kv_bytes_used();
        stats_.running = static_cast<int64_t>(running_.size());
        return;
      }
    } catch (...) {  // as a failed forward below: the rows of the steps in flight end with the error
      std::vector<Row*> rows = inflight_.rows;
      rows.insert(rows.end(), next.rows.begin(), next.rows.end());
      inflight_ = InFlight();
      fail_rows(rows, std::current_exception());
      return;
    }
  }
  drop_cancelled();
  admit();
  // Rows grew by a token each last step: kept caches go first, then the newest rows wait again.
  for (;;) {
    int64_t used = idle_bytes();
    for (const auto& r : running_) used += claim(*r, 0);
    if (used <= options_.kv_cache_bytes) break;
    if (evict_idle()) continue;
    // The latest arrival gives way (a resumed old row sits at the back of running_ but keeps its turn).
    const auto newest = std::max_element(running_.begin(), running_.end(),
                                         [](const auto& a, const auto& b) { return a->order < b->order; });
    preempt(static_cast<size_t>(newest - running_.begin()));
  }
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(waiting_.size());
  if (running_.empty()) return;

  // Decoding rows first (one token each), then prompt chunks oldest first while the token budget lasts.
  int64_t tokens = 0;
  for (auto& r : running_) {
    const int64_t next = r->replaying() ? r->segments[r->replayed] : r->input_end() - r->fed;
    r->planned = next == 1 ? 1 : 0;
    tokens += r->planned;
  }
  for (auto& r : running_) {
    if (r->planned) continue;
    const int64_t t = r->replaying() ? r->segments[r->replayed] : std::min(chunk_, r->input_end() - r->fed);
    if (tokens + t > options_.max_batch_tokens) break;
    r->planned = t;
    tokens += t;
  }
  Batch batch;
  std::vector<Row*> in_batch, sampled;
  for (auto& r : running_) {
    if (!r->planned) continue;
    const auto& h = r->seq->history();
    BatchRow br;
    br.ids.assign(h.begin() + r->fed, h.begin() + r->fed + r->planned);
    br.caches = &r->cache;
    if (const lora::ForwardContext* a = r->adapters(); a && a->table) br.adapter_slot = a->uniform_slot;
    br.want_logits = r->fed + r->planned == r->input_end() && r->seq->options().max_tokens > 0;
    if (br.want_logits) sampled.push_back(r.get());
    in_batch.push_back(r.get());
    batch.rows.push_back(std::move(br));
  }
  stats_.batch_rows = static_cast<int64_t>(batch.rows.size());
  stats_.batch_tokens = tokens;
  ++stats_.steps;

  try {
    const auto forward_start = Clock::now();
    const Tensor logits = forward_grouped(batch, in_batch);
    const auto now = Clock::now();
    stats_.forward_seconds += std::chrono::duration<double>(now - forward_start).count();
    for (Row* r : in_batch) {
      r->fed += r->planned;
      if (r->replaying()) {
        ++r->replayed;
      } else {
        r->segments.push_back(r->planned);
        r->replayed = r->segments.size();
      }
      if (!r->prefilled && r->fed >= static_cast<int64_t>(r->seq->prompt_size())) {
        r->prefilled = true;
        r->seq->result().prefill_seconds = std::chrono::duration<double>(now - r->admitted).count();
        cache_stats_.last_prefill_ms = r->seq->result().prefill_seconds * 1000;
        cache_stats_.last_prefill_tokens = static_cast<int64_t>(r->seq->prompt_size()) - std::max<int64_t>(r->base, 0);
        // What recomputing costs on this engine under this load: the prompt tokens the row prefilled since its
        // admission (a preempted row's time includes its wait).
        if (cost_ && !r->preempted) {
          cost_->observe_prefill(static_cast<int64_t>(r->seq->prompt_size()) - r->base,
                                 r->seq->result().prefill_seconds);
          cache_stats_.prefill_tok_s = cost_->prefill_tok_s();
        }
      }
    }
    // Every row sampled and none needing the host between steps (sample_on_device_async declines the others
    // before launching anything): the ids are read at the next step().
    const bool async = sampled.size() == in_batch.size() && launch_async_sample(logits, sampled, 0, inflight_);
    if (!async) sample_rows(logits, sampled);
  } catch (...) {
    inflight_ = InFlight();
    fail_rows(in_batch, std::current_exception());
    return;
  }

  for (size_t i = 0; i < running_.size();) {
    Row& r = *running_[i];
    const bool zero_budget = r.seq->options().max_tokens == 0 && r.fed == r.input_end();
    if (r.seq->done() || zero_budget) {
      auto row = std::move(running_[i]);
      running_.erase(running_.begin() + static_cast<std::ptrdiff_t>(i));
      finish(std::move(row), "length");
    } else {
      ++i;
    }
  }
  stats_.kv_bytes_used = kv_bytes_used();
  stats_.running = static_cast<int64_t>(running_.size());
  stats_.waiting = static_cast<int64_t>(waiting_.size());
}

}  // namespace lathe
