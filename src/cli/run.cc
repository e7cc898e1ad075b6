// lathe run: greedy generation from token ids, with per-step timing and optional full-prompt logits dump.
#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cache/cache_identity.h"
#include "cli/adapter_flags.h"
#include "cli/device_flags.h"
#include "cli/run_kv.h"
#include "cli/verbs.h"
#include "common/error.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "tensor/device_memory.h"
#include "tensor/ops.h"

namespace lathe::cli {
namespace {

struct RunOptions {
  std::string model;
  std::string ids;
  int max_tokens = 16;
  std::string logits_out;
  bool ignore_eos = false;
  bool json = false;
  CacheOptions cache;
  std::string device = "cpu";
  std::string dtype = "f32";
  std::string save_kv, load_kv;  // KV file round trip (run_kv.h)
  bool kv_verify = false;
  AdapterFlags adapters;
  bool exact = false;
  std::string kv_dtype = "auto";
};

LoadOptions load_options(const RunOptions& o) {
  LoadOptions l;
  l.device = o.device == "cuda" ? Device::CUDA : Device::CPU;
  l.dtype = o.dtype == "bf16" ? DType::BF16 : DType::F32;
  l.exact = o.exact;
  return l;
}

std::vector<int32_t> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t pos = 0;
    long v = 0;
    try {
      v = std::stol(item, &pos);
    } catch (const std::exception&) {
      pos = 0;
    }
    while (pos < item.size() && item[pos] == ' ') ++pos;
    if (pos != item.size() || item.empty() || v < 0 || v > INT32_MAX)
      throw Error(ErrorKind::InvalidArgument, "--ids: '" + item + "' is not a token id");
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) throw Error(ErrorKind::InvalidArgument, "--ids: no token ids given");
  return ids;
}

double resident_mib() {
  std::ifstream f("/proc/self/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024.0;
  return 0;
}

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }
// CPU time of the whole process (all threads), in ms: on a shared machine, cost per token beside wall time.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

int run(const RunOptions& o) {
  const auto t_load = Clock::now();
  std::unique_ptr<Model> model = load_model(o.model, load_options(o));
  lora::Selection selection;
  const auto t_mount = Clock::now();
  const auto adapters = o.adapters.mount(*model, &selection);
  const double mount_ms = ms_since(t_mount);
  const lora::ForwardContext lora_ctx = selection.context();
  const lora::ScopedContext lora_scope(selection.slot >= 0 ? &lora_ctx : nullptr);
  const std::string kv_ns = cache_namespace(lora_ctx.key, "");  // KV files keyed by the adapters' content
  const double load_ms = ms_since(t_load);
  const double rss_after_load = resident_mib();
  const double file_mib = static_cast<double>(model->checkpoint().total_file_bytes()) / (1024.0 * 1024.0);
  const std::vector<int32_t> prompt = parse_ids(o.ids);
  CacheOptions cache_options = o.cache;
  cache_options.cpu_kv_bf16 = o.device == "cpu" && cpu_kv_bf16(o.kv_dtype, o.exact);
  validate_cache_options(cache_options);
  CacheList cache = model->make_cache(cache_options);
  KvRestoreResult restored;
  if (!o.load_kv.empty())
    restored = restore_kv_for_prompt(*model, cache_options, o.load_kv, o.kv_verify, prompt, cache, kv_ns);
  const std::vector<int32_t> to_run(prompt.begin() + restored.reused, prompt.end());

  const bool want_logits = !o.logits_out.empty();
  const auto t_prefill = Clock::now();
  Tensor logits = model->forward(to_run, cache, want_logits);
  // The argmax reads the logits back, so the time includes the device work (time to first token).
  int32_t next = argmax_rows(logits.slice(0, logits.dim(0) - 1, logits.dim(0)))[0];
  const double prefill_ms = ms_since(t_prefill);
  if (want_logits) {
    SafetensorsWriter w;
    w.add("logits", logits.to(Device::CPU));
    w.write(o.logits_out);
  }
  KvSaveResult saved;
  if (!o.save_kv.empty()) saved = save_kv_for_prompt(*model, cache_options, o.save_kv, prompt, cache, kv_ns);
  const DeviceMemoryStats mem_before_decode = device_memory_stats();
  const auto& eos = model->config().eos_token_ids;
  std::vector<int32_t> generated;
  std::vector<double> step_ms;
  const double cpu0 = process_cpu_ms();
  while (static_cast<int>(generated.size()) < o.max_tokens) {
    generated.push_back(next);
    if (!o.ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
    if (static_cast<int>(generated.size()) == o.max_tokens) break;
    const auto t = Clock::now();
    Tensor step = model->forward({next}, cache, false);
    next = argmax_rows(step)[0];
    step_ms.push_back(ms_since(t));
  }
  const double decode_cpu_ms = process_cpu_ms() - cpu0;
  double decode_ms = 0;
  for (double s : step_ms) decode_ms += s;
  const double prefill_tps = to_run.size() / (prefill_ms / 1000.0);
  const double decode_tps = step_ms.empty() ? 0.0 : step_ms.size() / (decode_ms / 1000.0);
  const double rss_after_decode = resident_mib();  // mapped weight pages now touched: ≈ file size if not copied
  size_t kv_bytes = 0;
  for (const auto& c : cache) kv_bytes += c->bytes();
  const DeviceMemoryStats mem = device_memory_stats();

  if (o.json) {
    nlohmann::json j = {{"model", o.model},
                        {"prompt_tokens", prompt.size()},
                        {"generated", generated},
                        {"load_ms", load_ms},
                        {"adapter_mount_ms", mount_ms},
                        {"prefill_ms", prefill_ms},
                        {"prefill_tok_s", prefill_tps},
                        {"decode_steps", step_ms.size()},
                        {"decode_ms", decode_ms},
                        {"decode_tok_s", decode_tps},
                        {"decode_cpu_ms", decode_cpu_ms},
                        {"step_ms", step_ms},
                        {"rss_after_load_mib", rss_after_load},
                        {"rss_after_decode_mib", rss_after_decode},
                        {"weights_file_mib", file_mib},
                        {"kv_cache_bytes", kv_bytes},
                        {"kv_bits", cache_options.kv_bits},
                        {"kv_dtype", cache_options.kv_bits       ? "quantized"
                                     : cache_options.cpu_kv_bf16 ? "bf16"
                                                                 : "f32"},
                        {"kv_restored_tokens", restored.reused},
                        {"kv_restore_ms", restored.ms},
                        {"kv_save_ms", saved.ms},
                        {"kv_saved_bytes", saved.file_bytes},

                        {"device", o.device},
                        {"dtype", o.dtype}};
    if (o.device == "cuda") {
      j["device_peak_mib"] = static_cast<double>(mem.peak_reserved_bytes) / (1024.0 * 1024.0);
      j["device_malloc_calls"] = mem.malloc_calls;
      j["device_malloc_calls_in_decode"] = mem.malloc_calls - mem_before_decode.malloc_calls;
    }
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  std::printf("generated:");
  for (size_t i = 0; i < generated.size(); ++i) std::printf("%s%d", i ? "," : " ", generated[i]);
  std::printf("\n");
  for (size_t i = 0; i < step_ms.size(); ++i) std::printf("step %zu: %.2f ms\n", i + 1, step_ms[i]);
  std::printf("load: %.1f ms, resident after load %.1f MiB, after decode %.1f MiB (weight files %.1f MiB)\n", load_ms,
              rss_after_load, rss_after_decode, file_mib);
  if (!o.load_kv.empty())
    std::printf("kv restore: %lld tokens from %s in %.2f ms\n", static_cast<long long>(restored.reused),
                o.load_kv.c_str(), restored.ms);
  std::printf("prefill: %zu tokens in %.2f ms (%.1f tok/s)\n", to_run.size(), prefill_ms, prefill_tps);
  if (!o.save_kv.empty())
    std::printf("kv save: %zu tokens, %llu bytes in %.2f ms\n", prompt.size(),
                static_cast<unsigned long long>(saved.file_bytes), saved.ms);
  std::printf("decode: %zu tokens in %.2f ms (%.1f tok/s)\n", step_ms.size(), decode_ms, decode_tps);
  if (o.device == "cuda")
    std::printf("device memory: peak %.1f MiB reserved, %llu cudaMalloc calls (%llu during decode)\n",
                static_cast<double>(mem.peak_reserved_bytes) / (1024.0 * 1024.0),
                static_cast<unsigned long long>(mem.malloc_calls),
                static_cast<unsigned long long>(mem.malloc_calls - mem_before_decode.malloc_calls));
  return 0;
}

}  // namespace

Verb add_run(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* cmd = app.add_subcommand("run", "greedy-generate from token ids (parity and speed checks)");
  cmd->add_option("--model", o->model, "checkpoint directory")->required();
  cmd->add_option("--ids", o->ids, "prompt token ids, comma-separated")->required();
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--logits-out", o->logits_out, "write prompt logits [T, vocab] f32 to this safetensors file");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past end-of-sequence tokens");
  cmd->add_flag("--json", o->json, "print one JSON object with ids and timings");
  cmd->add_option("--kv-bits", o->cache.kv_bits, "store the KV cache quantized to 4 or 8 bits (default: f32)")
      ->check(CLI::IsMember({4, 8}));
  cmd->add_option("--kv-group-size", o->cache.kv_group_size, "values per quantization group of the KV cache")
      ->capture_default_str()
      ->check(CLI::IsMember({32, 64}));
  cmd->add_option("--kv-dtype", o->kv_dtype, kKvDtypeHelp)
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "f32", "bf16"}));
  cmd->add_flag("--exact", o->exact, kExactHelp);
  cmd->add_option("--device", o->device, "cpu or cuda")->capture_default_str()->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->add_option("--dtype", o->dtype, "activation type: f32, or bf16 (cuda only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"f32", "bf16"}));
  cmd->add_option("--save-kv", o->save_kv, "after the prompt's prefill, save the KV caches to this file (format v2)");
  cmd->add_option("--load-kv", o->load_kv,
                  "restore KV caches from this file and reuse the prefix it shares with --ids");
  cmd->add_flag("--kv-verify", o->kv_verify, "with --load-kv: check every tensor hash before restoring");
  o->adapters.add_to(cmd);
  return {cmd, [o] { return run(*o); }};
}

}  // namespace lathe::cli
