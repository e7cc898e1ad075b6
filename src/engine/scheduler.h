// Iteration-level scheduling of many sequences over one model. Each step() admits waiting requests (FIFO, up
// to max_batch rows, while the KV budget has room for their prompts), gives every running row its next tokens —
// one for a decoding row, a prefill chunk of at most prefill_chunk for a row still reading its prompt, within
// max_batch_tokens — runs them as one Model::forward(const Batch&), samples the rows that reached the end of
// their input and hands each its token. Prefill chunks sit beside decode tokens, so a long prompt never stalls
// running streams.
//
// A request whose prompt shares a long prefix with a row still prefilling it waits (and FIFO, those behind it) until
// that row has fed the prefix, then forks its cache: a burst of requests over one new system prompt prefills it
// once, not once per row beside each other.
//
// When growing rows outrun the KV budget, finished caches kept for prefix reuse go first, then the newest
// running row is preempted: its cache is dropped and it waits again, to be recomputed from prompt + generated
// tokens; its sampler, stops and detokenizer are kept, so its output is unchanged. A row whose client left
// (options.cancel) leaves at the next step. A request's tokens never depend on the load: chunk boundaries are
// fixed per row and every row samples from its own (seed, step) stream.
//
// With an SSD tier (enable_ssd), a request whose longest RAM prefix is shorter than what a KV file holds restores
// from the file when the cost model predicts that faster than prefilling the difference (restore_cost.h; it
// learns from this scheduler's prefills and restores); kept caches are written behind (housekeeping(), after
// write_behind_s idle) and when they leave RAM (eviction, demotion after demote_idle_s), by a background writer: the
// step loop never waits for the disk.
//
// Single-threaded: the caller (the server's engine thread, or a test) owns the scheduler and the model.
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <memory>
#include <string>
#include <vector>

#include "cache/restore_cost.h"
#include "cache/ssd_spill_writer.h"
#include "cache/ssd_store.h"
#include "engine/device_sampler.h"
#include "engine/kv_budget.h"
#include "engine/model_bundle.h"
#include "engine/sequence_state.h"

namespace lathe {

struct SchedulerOptions {
  int max_batch = 8;           // rows in one step
  int max_batch_tokens = 512;  // tokens in one step (a decoding row counts one)
  int prefill_chunk = 256;     // prompt tokens one row feeds per step (clamped to fit beside max_batch decodes)
  int64_t kv_cache_bytes = 0;  // KV budget; 0 = half of the available memory
  int reuse_slots = 4;         // finished sequences whose caches stay for prefix reuse
  // Throws InvalidArgument naming the flag for values that cannot work.
  void validate() const;
};

struct SsdTierOptions {
  double write_behind_s = 1.0;  // a kept cache idle this long is written to the SSD tier (debounce)
  double demote_idle_s = 0;     // ...and leaves RAM once idle this long (0: only when evicted)
  int64_t min_tokens = 8;       // shorter prefixes are not worth a file
  bool host_snapshot = false;   // caches on a GPU: copied to the host on the engine thread before the writer
  Device device = Device::CPU;  // where the caches live (the cost model's default prefill rate)
  RestoreCostOptions restore;   // cost-aware restore (restore_cost.h): --ssd-restore and the rate seeds
};

// Prompt-cache counters by tier (per first admission of a request).
struct CacheTierStats {
  int64_t ram_entries = 0, ram_bytes = 0;
  int64_t ram_hits = 0, ram_misses = 0;  // a kept RAM cache served the request / did not
  int64_t ssd_hits = 0, ssd_misses = 0;  // asked when RAM fell short: a file served it / none could
  int64_t ssd_skipped = 0;               // a file could serve more than RAM, but recomputing was predicted faster
  int64_t ssd_reused_tokens = 0, ram_reused_tokens = 0;
  double ssd_restore_ms_total = 0;
  // The cost model's current estimates and its last decision (restore_cost.h); 0 before any.
  double prefill_tok_s = 0, restore_mb_s = 0;
  double last_restore_est_s = 0, last_recompute_est_s = 0;
  bool last_decision_restore = false;
  // Where the last request's time to its first token went on the engine thread: attaching its cache (a RAM
  // fork or take, or an SSD restore) and its prefill from admission to the last prompt token's logits.
  double last_attach_ms = 0, last_prefill_ms = 0;
  int64_t last_prefill_tokens = 0;
  int64_t spills_queued = 0;
};

// Where a sequence's output goes; called on the scheduler's thread.
class SequenceSink {
 public:
  virtual ~SequenceSink() = default;
  virtual void on_token(const GeneratedToken& t) = 0;
  // Last call for a sequence that ran (finish_reason stop, length or cancelled; cached_tokens set).
  virtual void on_finish(GenerateResult r) = 0;
  // Last call for a sequence that cannot run (a prompt larger than the whole budget, a failed forward).
  virtual void on_error(std::exception_ptr e) = 0;
};

struct SchedulerStats {
  int64_t running = 0, waiting = 0;          // rows now
  int64_t batch_rows = 0, batch_tokens = 0;  // of the last step
  int64_t kv_bytes_used = 0, kv_bytes_budget = 0;
  int64_t preemptions = 0, steps = 0;  // since start
  // Steps queued on the device before the previous step's ids were read (CUDA decode steps; see step()).
  int64_t overlapped_steps = 0;
  // Admissions held back (FIFO: with the rows behind) while a running row prefilled a prompt prefix the front
  // row shares, so that row then forks it instead of prefilling it beside (since start, per step held).
  int64_t prefix_waits = 0;
  // Engine-thread wall time since start: whole steps, and within them the forward call (on CUDA mostly the
  // launches), sampling (on CUDA: the wait for the step to finish, then the sampler) and handing each row its
  // token (detokenizer, stop strings, the sink). step − the three = planning, admission, KV bookkeeping.
  double step_seconds = 0, forward_seconds = 0, sample_seconds = 0, emit_seconds = 0;
};

class Scheduler {
 public:
  Scheduler(ModelBundle& bundle, SchedulerOptions options);
  ~Scheduler();

  // Queues a request (FIFO). Errors (empty prompt, bad max_tokens, a prompt that can never fit) go to the sink.
  void add(std::vector<int32_t> prompt, GenerateOptions options, std::shared_ptr<SequenceSink> sink);
  // One iteration; does nothing when idle().
  void step();
  bool idle() const { return running_.empty() && waiting_.empty() && !inflight_.active; }
  // Rows waiting + running: how many more add() calls the next step could admit is max_batch minus this.
  size_t rows() const { return running_.size() + waiting_.size(); }
  const SchedulerStats& stats() const { return stats_; }
  const SchedulerOptions& options() const { return options_; }
  const KvBudget& budget() const { return budget_; }

  // Turns the SSD tier on (the store scanned already; it must outlive the scheduler).
  void enable_ssd(SsdStore& store, SsdTierOptions options);
  // Debounced write-behind and idle demotion; returns how long until it has more to do (-1: nothing pending).
  // Cheap: call it after every step and when idle.
  double housekeeping();
  // Writes every kept cache not yet on the SSD and waits for the writer, and keeps the learned restore and
  // prefill rates beside the files (shutdown, tests).
  void flush_ssd();
  const CacheTierStats& cache_stats() const { return cache_stats_; }
  const SsdStore* ssd() const { return ssd_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Row;  // engine/scheduler_row.h
  struct Idle {
    std::shared_ptr<CacheList> cache;  // shared with the SSD writer while busy
    std::vector<int32_t> tokens;       // what the cache holds
    std::string ns;                    // cache namespace (adapter set content + salt): reused only under it
    bool spilled = false;              // handed to the writer already
    std::shared_ptr<std::atomic<bool>> busy = std::make_shared<std::atomic<bool>>(false);
    Clock::time_point since;
  };

  void drop_cancelled();
  void admit();
  bool waits_for_prefix(const Row& row) const;
  void attach_cache(Row& row);
  int64_t claim(const Row& row, int64_t extra) const;  // bytes the row holds after `extra` more tokens
  int64_t idle_bytes() const;
  int64_t kv_bytes_used() const;  // kept caches plus every running row's tokens so far
  bool evict_idle();
  void spill(Idle& idle);                        // hands a kept cache to the SSD writer (once)
  void drop_idle(std::list<Idle>::iterator it);  // spills it first when the SSD tier wants it
  CacheList take_idle(Idle& idle);               // its caches (a copy while the writer still reads them)
  bool try_ssd(Row& row, int64_t ram_best);
  void preempt(size_t index);
  void finish(std::unique_ptr<Row> row, const std::string& reason);
  void keep_for_reuse(Row& row);
  void sample_rows(const Tensor& logits, const std::vector<Row*>& rows);
  // Each row takes its sampled token (the stream sees it), in row order.
  void emit_sampled(const std::vector<Row*>& rows, const std::vector<SampleResult>& sampled);
  std::vector<DeviceSampleRow> device_rows(const std::vector<Row*>& rows, uint64_t steps_ahead) const;
  // Step overlap (CUDA): a step's sampling is launched and its ids read at the next step() call, after that
  // call queued its own decode step over the same rows with those ids still on the device.
  struct InFlight {
    std::vector<Row*> rows;  // the rows sampled, in order; null once a row has left
    PendingSample sample;
    bool active = false;
  };
  // steps_ahead: 1 when the rows' in-flight token is not accepted yet (the draw is their step after it).
  bool launch_async_sample(const Tensor& logits, const std::vector<Row*>& rows, uint64_t steps_ahead, InFlight& into);
  void fail_rows(const std::vector<Row*>& rows, const std::exception_ptr& e);
  bool overlap_ready() const;
  bool launch_overlapped(InFlight& next);
  void complete_inflight(InFlight* next);
  // One forward per pinned adapter table among the batch's rows (usually one), logits in row order.
  Tensor forward_grouped(const Batch& batch, const std::vector<Row*>& in_batch);

  ModelBundle& bundle_;
  SchedulerOptions options_;
  KvBudget budget_;
  int64_t chunk_;
  bool forks_any_prefix_ = false;  // every layer's cache forks at any prefix (no rings, no SSM states)
  uint64_t next_order_ = 0;
  std::deque<std::unique_ptr<Row>> waiting_;   // by arrival
  std::vector<std::unique_ptr<Row>> running_;  // by admission
  std::list<Idle> idle_;                       // most recently finished first
  SchedulerStats stats_;
  CacheTierStats cache_stats_;
  SsdStore* ssd_ = nullptr;
  SsdTierOptions ssd_options_;
  std::unique_ptr<RestoreCostModel> cost_;  // with the SSD tier
  InFlight inflight_;
  DeviceReadback readbacks_[2];  // alternate: a step's ids land in one while the other's are read
  int next_readback_ = 0;
  bool overlap_ = true;                     // LATHE_STEP_OVERLAP=0 turns it off
  std::unique_ptr<SsdSpillWriter> writer_;  // declared last: joined first, while the caches it reads live
};

}  // namespace lathe
