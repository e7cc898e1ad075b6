#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

#include "cache/kv_block_pool.h"

namespace lathe::server {
namespace {

std::string fmt(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  const size_t i = static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin());
  std::lock_guard lock(mu_);
  ++counts_[i];
  sum_ += value;
  ++count_;
}

void Histogram::render(const std::string& name, std::string& out) const {
  std::lock_guard lock(mu_);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + fmt(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + fmt(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      itl_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::request_finished(const std::string& endpoint, int status) {
  std::lock_guard lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::tokens(uint64_t prompt, uint64_t generated) {
  prompt_tokens_.fetch_add(prompt, std::memory_order_relaxed);
  generated_tokens_.fetch_add(generated, std::memory_order_relaxed);
}

std::string Metrics::render() const {
  std::string out;
  out += "# HELP lathe_requests_total HTTP requests answered, by endpoint and status.\n";
  out += "# TYPE lathe_requests_total counter\n";
  {
    std::lock_guard lock(mu_);
    for (const auto& [key, n] : requests_)
      out += "lathe_requests_total{endpoint=\"" + key.first + "\",status=\"" + std::to_string(key.second) + "\"} " +
             std::to_string(n) + "\n";
  }
  auto scalar = [&](const char* name, const char* type, const char* help, const std::string& value) {
    out +=
        std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " + value + "\n";
  };
  scalar("lathe_prompt_tokens_total", "counter", "Prompt tokens processed (cached ones included).",
         std::to_string(prompt_tokens_.load()));
  scalar("lathe_generation_tokens_total", "counter", "Tokens generated.", std::to_string(generated_tokens_.load()));
  scalar("lathe_requests_cancelled_total", "counter", "Generations stopped because the client went away.",
         std::to_string(cancelled_.load()));
  scalar("lathe_queue_depth", "gauge", "Generation requests waiting for the engine.",
         std::to_string(queue_depth_.load()));
  scalar("lathe_requests_in_flight", "gauge", "Generation requests queued or running.",
         std::to_string(in_flight_.load()));
  scalar("lathe_scheduler_running_rows", "gauge", "Sequences in the running batch.",
         std::to_string(running_rows_.load()));
  scalar("lathe_scheduler_waiting_rows", "gauge", "Sequences admitted to the scheduler but waiting for KV room.",
         std::to_string(waiting_rows_.load()));
  scalar("lathe_batch_rows", "gauge", "Rows in the last engine step.", std::to_string(batch_rows_.load()));
  scalar("lathe_batch_tokens", "gauge", "Tokens in the last engine step (prefill chunks and decode tokens).",
         std::to_string(batch_tokens_.load()));
  scalar("lathe_kv_cache_bytes_used", "gauge", "KV cache bytes held by running and kept sequences.",
         std::to_string(kv_used_.load()));
  scalar("lathe_kv_cache_bytes_budget", "gauge", "The KV cache budget (--kv-cache-bytes).",
         std::to_string(kv_budget_.load()));
  {  // the CPU's paged KV blocks, read at scrape time
    const KvPoolStats pool = kv_pool_stats();
    scalar("lathe_kv_pool_blocks", "gauge", "CPU KV blocks in use (a block shared by several sequences once).",
           std::to_string(pool.blocks));
    scalar("lathe_kv_pool_block_refs", "gauge", "CPU KV blocks as the sequences map them (shared ones per mapping).",
           std::to_string(pool.references));
    scalar("lathe_kv_pool_resident_bytes", "gauge", "Memory the CPU KV blocks hold (pages written).",
           std::to_string(pool.resident));
  }
  scalar("lathe_preemptions_total", "counter", "Running sequences set back to wait for KV room (recomputed later).",
         std::to_string(preemptions_.load()));
  scalar("lathe_prefix_waits_total", "counter",
         "Engine steps in which admission waited for a running request to prefill a prompt prefix it would share.",
         std::to_string(prefix_waits_.load()));
  {
    std::array<double, 4> t;
    int64_t steps;
    {
      std::lock_guard<std::mutex> lock(mu_);
      t = step_times_;
      steps = steps_;
    }
    scalar("lathe_engine_steps_total", "counter", "Scheduler steps (forward passes) run.", std::to_string(steps));
    scalar("lathe_engine_overlapped_steps_total", "counter",
           "Decode steps queued on the GPU before the previous step's token ids were read.",
           std::to_string(overlapped_steps_.load(std::memory_order_relaxed)));
    char line[512];
    std::snprintf(line, sizeof line,
                  "# HELP lathe_engine_seconds_total Engine-thread wall time in scheduler steps (phase=\"step\") and "
                  "in their forward calls, sampling and token hand-off.\n# TYPE lathe_engine_seconds_total counter\n"
                  "lathe_engine_seconds_total{phase=\"step\"} %.6f\nlathe_engine_seconds_total{phase=\"forward\"} "
                  "%.6f\nlathe_engine_seconds_total{phase=\"sample\"} %.6f\nlathe_engine_seconds_total{phase=\"emit\"} "
                  "%.6f\n",
                  t[0], t[1], t[2], t[3]);
    out += line;
  }
  {
    const CacheTierStats c = cache_tiers();
    auto tiered = [&](const char* name, const char* type, const char* help, const std::string& ram,
                      const std::string& ssd) {
      out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
      out += std::string(name) + "{tier=\"ram\"} " + ram + "\n";
      if (ssd_) out += std::string(name) + "{tier=\"ssd\"} " + ssd + "\n";
    };
    const SsdStoreStats s = ssd_ ? ssd_->stats() : SsdStoreStats{};
    tiered("lathe_prompt_cache_entries", "gauge", "Prompt-cache entries held.", std::to_string(c.ram_entries),
           std::to_string(s.entries));
    tiered("lathe_prompt_cache_bytes", "gauge", "Bytes the prompt cache holds (RAM: KV budget bytes; SSD: on disk).",
           std::to_string(c.ram_bytes), std::to_string(s.bytes));
    tiered("lathe_prompt_cache_hits_total", "counter", "Requests whose prompt prefix a tier served.",
           std::to_string(c.ram_hits), std::to_string(c.ssd_hits));
    tiered("lathe_prompt_cache_misses_total", "counter",
           "Requests a tier could not serve (SSD: asked when RAM fell short).", std::to_string(c.ram_misses),
           std::to_string(c.ssd_misses));
    tiered("lathe_prompt_cache_reused_tokens_total", "counter", "Prompt tokens served from a tier.",
           std::to_string(c.ram_reused_tokens), std::to_string(c.ssd_reused_tokens));
    if (ssd_) {
      scalar("lathe_ssd_cache_restore_seconds_total", "counter", "Time spent restoring KV files.",
             std::to_string(c.ssd_restore_ms_total / 1000.0));
      scalar("lathe_ssd_cache_restore_mb_per_second", "gauge", "Read rate of the last KV file restore.",
             std::to_string(s.restore_mb_s_last));
      scalar("lathe_ssd_cache_restores_skipped_total", "counter",
             "Stored prefixes recomputed because the cost model predicted that faster than restoring them.",
             std::to_string(c.ssd_skipped));
      scalar("lathe_ssd_cache_prefill_tokens_per_second_estimate", "gauge",
             "The cost model's running prefill rate of this engine.", std::to_string(c.prefill_tok_s));
      scalar("lathe_ssd_cache_restore_mb_per_second_estimate", "gauge",
             "The cost model's running restore rate of the SSD tier.", std::to_string(c.restore_mb_s));
      scalar("lathe_ssd_cache_spills_total", "counter", "KV files written.", std::to_string(s.spills));
      scalar("lathe_ssd_cache_write_failures_total", "counter", "Spills the disk refused (full, I/O error).",
             std::to_string(s.write_failures));
      scalar("lathe_ssd_cache_removed_invalid_total", "counter", "KV files deleted because they did not check out.",
             std::to_string(s.removed_invalid));
      scalar("lathe_ssd_cache_removed_tmp_total", "counter", "Unfinished KV file writes deleted by the start scan.",
             std::to_string(s.removed_tmp));
    }
  }
  out += "# HELP lathe_time_to_first_token_seconds Time from request arrival to the first generated token.\n";
  out += "# TYPE lathe_time_to_first_token_seconds histogram\n";
  ttft_.render("lathe_time_to_first_token_seconds", out);
  out += "# HELP lathe_inter_token_latency_seconds Time between consecutive generated tokens.\n";
  out += "# TYPE lathe_inter_token_latency_seconds histogram\n";
  itl_.render("lathe_inter_token_latency_seconds", out);
  return out;
}

}  // namespace lathe::server
