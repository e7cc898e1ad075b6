// Load on `lathe serve`: N concurrent streaming clients over HTTP, each sending a fixed-length prompt (token
// ids) and reading a fixed number of tokens (EOS banned with logit_bias), for each N in --clients. Reports per
// N the aggregate decode tok/s (all tokens / wall time), time to first token, inter-token latency p50/p99 and each
// stream's decode rate (p50) as clients see them, the server's CPU milliseconds per token, and the server's peak
// RSS. Prints one JSON line.
// --peer-server BIN runs the same load against another OpenAI-compatible server (llama-server for issue #13's
// same-run comparison), started as BIN with the --serve-arg arguments alone; its requests add ignore_eos, and with
// --model (a checkpoint with the same tokenizer) a ban on the tokens that are not UTF-8 alone (non_utf8_tokens).
// Each run counts the streams that ended before --max-tokens, by finish reason.
// Shared prompts ([cache] on many rows): --shared-prefix-tokens S starts every prompt with the same S tokens (a
// system prompt) before its own --prompt-tokens; each run is preceded by one request of the prefix alone, as a
// server that has seen the prompt before (--cold-prefix: not, a burst over a new prompt), and reports the
// prompt-cache hits and tokens served during the run.
// LoRA ([lora] benchmark): --adapter DIR mounts adapters at serve start (under their folder names) and --mix
// 'a;b+c;none' gives client c the adapter spec mix[c % size] (round robin); --repeat runs every N again.
//
// Usage: serve_load --lathe build/lathe [--model DIR] [--clients 1,4] [--prompt-tokens 128] [--shared-prefix-tokens 0]
//                   [--max-tokens 64] [--rounds 1] [--repeat 1] [--json-schema FILE] [--adapter DIR ...]
//                   [--mix SPECS] [--serve-arg ARG ...] [--peer-server BIN]
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "serve_harness.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/utf8.h"

namespace {

using bench::Clock;
using bench::seconds;
using nlohmann::json;

double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5));
  return v[i];
}

// Token events of one streamed completion: arrival times of the SSE frames that carry text, and the completion
// tokens the final usage chunk reports (a frame can hold back the bytes of an incomplete UTF-8 character, so the
// frames may be fewer than the tokens).
struct Stream {
  Clock::time_point sent;
  std::vector<Clock::time_point> tokens;
  int64_t usage_tokens = 0;
  std::string finish_reason;  // the last choice's, "" if the stream never said
  std::string last_frame;     // the frame that carried it (kept to show why a stream ended early)
  int64_t count() const { return std::max<int64_t>(usage_tokens, static_cast<int64_t>(tokens.size())); }
};

Stream run_client(int port, const std::string& body) {
  Stream s;
  s.sent = Clock::now();
  std::string pending;
  bench::http_post(port, "/v1/completions", body, [&](const char* p, size_t n) {
    const auto now = Clock::now();
    pending.append(p, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos; pending.erase(0, end + 2)) {
      const std::string frame = pending.substr(0, end);
      if (frame.rfind("data: {", 0) != 0) continue;
      const json j = json::parse(frame.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
          j["usage"]["completion_tokens"].is_number_integer())
        s.usage_tokens = j["usage"]["completion_tokens"].get<int64_t>();
      if (!j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) continue;
      const auto& c = j["choices"][0];
      if (c.contains("finish_reason") && c["finish_reason"].is_string()) {
        s.finish_reason = c["finish_reason"].get<std::string>();
        s.last_frame = frame.substr(6);
      }
      if (c.contains("text") && c["text"].is_string() && !c["text"].get<std::string>().empty()) s.tokens.push_back(now);
    }
  });
  return s;
}

// The values of the given /metrics lines (their names with labels and a trailing space), 0 where absent.
template <size_t N>
std::array<double, N> metric_values(int port, const std::array<const char*, N>& keys) {
  const std::string text = bench::http_get(port, "/metrics");
  std::array<double, N> c{};
  for (size_t k = 0; k < N; ++k) {
    const size_t at = text.find(std::string("\n") + keys[k]);
    if (at != std::string::npos) c[k] = std::atof(text.c_str() + at + 1 + std::strlen(keys[k]));
  }
  return c;
}

// The engine's step-time counters from /metrics: steps, then seconds in steps, forward, sample, emit, then the
// steps queued before the previous step's ids were read (step overlap).
std::array<double, 6> engine_counters(int port) {
  return metric_values<6>(
      port, {"lathe_engine_steps_total ", "lathe_engine_seconds_total{phase=\"step\"} ",
             "lathe_engine_seconds_total{phase=\"forward\"} ", "lathe_engine_seconds_total{phase=\"sample\"} ",
             "lathe_engine_seconds_total{phase=\"emit\"} ", "lathe_engine_overlapped_steps_total "});
}

// Mean engine-thread milliseconds per step over a run, by phase (other = planning, admission, bookkeeping).
json engine_split(const std::array<double, 6>& a, const std::array<double, 6>& b) {
  const double steps = b[0] - a[0];
  if (steps <= 0) return json::object();
  auto ms = [&](size_t k) { return (b[k] - a[k]) * 1e3 / steps; };
  return {{"steps", steps},
          {"step_ms", ms(1)},
          {"forward_ms", ms(2)},
          {"sample_ms", ms(3)},
          {"emit_ms", ms(4)},
          {"other_ms", ms(1) - ms(2) - ms(3) - ms(4)},
          {"overlapped_steps", b[5] - a[5]}};
}

// The RAM tier's hits and reused tokens (/metrics).
std::array<double, 2> prompt_cache_counters(int port) {
  return metric_values<2>(
      port, {"lathe_prompt_cache_hits_total{tier=\"ram\"} ", "lathe_prompt_cache_reused_tokens_total{tier=\"ram\"} "});
}

std::vector<int> eos_ids(const std::string& dir) {
  std::vector<int> ids;
  for (const char* f : {"/config.json", "/generation_config.json"}) {
    std::ifstream in(dir + f);
    if (!in) continue;
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.contains("eos_token_id")) continue;
    const json& e = j["eos_token_id"];
    if (e.is_number_integer()) ids.push_back(e.get<int>());
    if (e.is_array())
      for (const auto& x : e)
        if (x.is_number_integer()) ids.push_back(x.get<int>());
  }
  return ids;
}

// Byte-level BPE (GPT-2 / Qwen) vocabulary entries whose bytes are not valid UTF-8 on their own. llama-server
// parses every streamed output as UTF-8 and cuts the stream (HTTP 500 "output that does not match the expected
// Content-only format") when it is not: a random-weight model emits such tokens often (session 15's early stops
// on the H200), so the peer's requests ban them. A concatenation of valid pieces stays valid.
std::vector<int> non_utf8_tokens(const std::string& dir) {
  std::ifstream in(dir + "/tokenizer.json");
  if (!in) return {};
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.contains("model") || !j["model"].contains("vocab") || !j["model"]["vocab"].is_object())
    return {};
  std::vector<int> ids;
  for (const auto& [piece, id] : j["model"]["vocab"].items()) {
    if (!id.is_number_integer() || !lathe::utf8::is_valid(piece)) continue;
    std::string bytes;  // the piece's characters back to the bytes they stand for (tokenizer/byte_level.h)
    bool mapped = true;
    for (size_t i = 0; i < piece.size() && mapped;) {
      const int b = lathe::byte_level::byte_for_char(lathe::utf8::next(piece, i));
      if (b < 0)
        mapped = false;  // not a byte-level piece: leave it alone
      else
        bytes.push_back(static_cast<char>(b));
    }
    if (mapped && !lathe::utf8::is_valid(bytes)) ids.push_back(id.get<int>());
  }
  return ids;
}

// User + system CPU seconds of a process so far.
double cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(text.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; rest >> field; ++i) {  // fields 14 and 15 (1-based) after "pid (comm)"
    if (i == 14) utime = std::atof(field.c_str());
    if (i == 15) {
      stime = std::atof(field.c_str());
      break;
    }
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, sep);)
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t peak_rss_kib(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"concurrent streaming clients against lathe serve"};
  std::string lathe = "build/lathe", model;
  std::vector<int> clients = {1, 4};
  int prompt_tokens = 128, max_tokens = 64, rounds = 1, repeat = 1, shared_prefix = 0;
  std::vector<std::string> adapters;
  std::string mix_text;
  double temperature = 0.0, top_p = 1.0;
  std::vector<std::string> serve_args;
  std::string schema_file;
  app.add_option("--lathe", lathe, "the lathe binary");
  app.add_option("--model", model, "checkpoint directory (default: the bundled demo model)");
  app.add_option("--clients", clients, "concurrent clients, one run each")->delimiter(',');
  app.add_option("--prompt-tokens", prompt_tokens, "prompt length (token ids)")->check(CLI::PositiveNumber);
  app.add_option("--max-tokens", max_tokens, "tokens each client reads")->check(CLI::PositiveNumber);
  app.add_option("--shared-prefix-tokens", shared_prefix, "tokens every prompt starts with (a system prompt)")
      ->check(CLI::NonNegativeNumber);
  bool cold_prefix = false;
  app.add_flag("--cold-prefix", cold_prefix, "do not send the shared prefix alone before each run");
  app.add_option("--rounds", rounds, "requests each client sends in turn")->check(CLI::PositiveNumber);
  // Greedy by default (the device sampler's path); a temperature samples each client's own seeded stream.
  app.add_option("--temperature", temperature, "sampling temperature of every request")->check(CLI::NonNegativeNumber);
  app.add_option("--top-p", top_p, "top_p of every request")->check(CLI::Range(0.0, 1.0));
  // Structured output (issue #18's benchmark): every request is held to this JSON schema by the grammar sampler.
  app.add_option("--json-schema", schema_file, "a JSON schema file sent as response_format")->check(CLI::ExistingFile);
  app.add_option("--repeat", repeat, "run every client count this many times")->check(CLI::PositiveNumber);
  app.add_option("--adapter", adapters, "LoRA adapter directory mounted at serve start (repeatable)");
  app.add_option("--mix", mix_text, "adapter spec per client, ';'-separated, round robin ('none' = base)");
  app.add_option("--serve-arg", serve_args, "extra argument for lathe serve (repeatable)")->allow_extra_args(false);
  std::string peer;
  app.add_option("--peer-server", peer,
                 "start this OpenAI-compatible server binary with the --serve-arg arguments alone (they must set "
                 "its model and port) instead of lathe serve")
      ->check(CLI::ExistingFile);
  std::string server_log;
  app.add_option("--server-log", server_log, "write the last 64 KiB of the server's log here after the runs");
  CLI11_PARSE(app, argc, argv);

  try {
    // Any model name: the request body says "m" whatever checkpoint is served.
    std::vector<std::string> args;
    if (peer.empty()) {
      args = {"--port", "0", "--accept-any-model"};
      if (!model.empty()) args.insert(args.end(), {"--model", model});
      for (const std::string& a : adapters) args.insert(args.end(), {"--adapter", a});
    }
    args.insert(args.end(), serve_args.begin(), serve_args.end());
    const std::vector<std::string> mix = split(mix_text, ';');
    bench::ServerProcess server(peer.empty() ? lathe : peer, args, peer.empty());
    const int port = server.wait_ready(600).first;
    std::string dir = model;
    if (dir.empty() && peer.empty()) dir = (std::filesystem::path(lathe).parent_path() / "../models/demo").string();
    // The peer: --model (optional) names the checkpoint whose tokenizer says which tokens to ban (see
    // non_utf8_tokens).
    const std::vector<int> peer_bans = peer.empty() || dir.empty() ? std::vector<int>{} : non_utf8_tokens(dir);

    json response_format;  // null: unconstrained
    if (!schema_file.empty()) {
      std::ifstream in(schema_file);
      response_format = {{"type", "json_schema"},
                         {"json_schema", {{"name", "bench"}, {"strict", true}, {"schema", json::parse(in)}}}};
    }
    // lathe: the checkpoint's EOS ids banned. The peer's end-of-generation ids need not be the checkpoint's:
    // ignore_eos bans all of them (llama-server's logit_bias field would replace that ban, so none is sent).
    json bias = json::object();
    if (peer.empty())
      for (int id : eos_ids(dir)) bias[std::to_string(id)] = -100;
    auto body_for = [&](int client, int round, bool with_prefix = true) {
      json prompt = json::array();
      for (int k = 0; with_prefix && k < shared_prefix; ++k) prompt.push_back(7 + (k * 13) % 497);
      for (int k = 0; k < prompt_tokens; ++k) prompt.push_back(5 + (client * 131 + round * 17 + k * 7) % 500);
      json body = {{"model", "m"},
                   {"prompt", prompt},
                   {"max_tokens", max_tokens},
                   {"temperature", temperature},
                   {"top_p", top_p},
                   {"seed", client * 1000 + round},
                   {"stream", true},
                   {"stream_options", {{"include_usage", true}}}};
      if (peer.empty()) {
        body["logit_bias"] = bias;
      } else {
        body["ignore_eos"] = true;  // llama-server adds its EOG bans after the logit_bias field's
        if (!peer_bans.empty()) {
          // The [[id, false], ...] form: llama-server before 2025 reads only arrays here (an object is ignored).
          json ban = json::array();
          for (int id : peer_bans) ban.push_back({id, false});
          body["logit_bias"] = ban;
        }
      }
      if (!response_format.is_null()) body["response_format"] = response_format;
      if (!mix.empty() && client >= 0) body["adapter"] = mix[static_cast<size_t>(client) % mix.size()];
      return body.dump();
    };
    // Warm-up: first-touch page faults, thread start (without the shared prefix where it must arrive cold).
    run_client(port, body_for(999, 0, !cold_prefix));
    // Every adapter spec of --mix resolved once (concurrently, one token each) before anything is timed: the
    // first request naming a new adapter set publishes a new slot table, and rows pinned to different tables
    // run in separate forwards (engine/scheduler.cc), which is a first-use cost, not the mixed batch's.
    {
      std::vector<std::thread> warm;
      for (size_t k = 0; k < mix.size(); ++k)
        warm.emplace_back([&, k] {
          json b = json::parse(body_for(static_cast<int>(k), 99));
          b["max_tokens"] = 1;
          run_client(port, b.dump());
        });
      for (auto& t : warm) t.join();
    }

    json runs = json::array();
    std::vector<int> plan;
    for (int n : clients)
      for (int k = 0; k < repeat; ++k) plan.push_back(n);
    // The shared prefix alone, one token: the server then holds it as a previous request left it.
    auto prime_prefix = [&] {
      if (shared_prefix == 0 || cold_prefix) return;
      json b = json::parse(body_for(-1, 0));
      b["prompt"] = json(std::vector<json>(b["prompt"].begin(), b["prompt"].begin() + shared_prefix));
      b["max_tokens"] = 1;
      run_client(port, b.dump());
    };
    for (int n : plan) {
      prime_prefix();
      const std::array<double, 2> cache_before = peer.empty() ? prompt_cache_counters(port) : std::array<double, 2>{};
      std::vector<std::vector<Stream>> per(static_cast<size_t>(n));
      const std::array<double, 6> before = peer.empty() ? engine_counters(port) : std::array<double, 6>{};
      const double cpu0 = cpu_seconds(server.pid());
      const auto t0 = Clock::now();
      std::vector<std::thread> threads;
      std::mutex errors_mu;
      int errors = 0;
      std::string last_error;
      for (int c = 0; c < n; ++c)
        threads.emplace_back([&, c] {
          // A refused request (429 when the queue is full, 503) is counted, not thrown: an exception escaping a
          // thread would abort the whole run.
          for (int r = 0; r < rounds; ++r) {
            try {
              per[static_cast<size_t>(c)].push_back(run_client(port, body_for(c, r)));
            } catch (const std::exception& e) {
              std::lock_guard lock(errors_mu);
              ++errors;
              last_error = e.what();
            }
          }
        });
      for (auto& t : threads) t.join();
      const double wall = seconds(t0, Clock::now());
      const double server_cpu_s = cpu_seconds(server.pid()) - cpu0;
      const std::array<double, 2> cache_after = peer.empty() ? prompt_cache_counters(port) : std::array<double, 2>{};
      std::vector<double> ttft, itl, stream_rate;
      int64_t tokens = 0;
      // Streams that ended before --max-tokens, by finish reason, with one such stream's last frame: a server
      // that stops early serves fewer tokens late in the run, which the aggregate alone would hide.
      json short_streams = json::object();
      std::string short_example;
      for (const auto& streams : per)
        for (const Stream& s : streams) {
          tokens += s.count();
          if (s.count() < max_tokens) {
            const std::string why = s.finish_reason.empty() ? "none" : s.finish_reason;
            short_streams[why] = short_streams.value(why, 0) + 1;
            if (short_example.empty()) short_example = s.last_frame;
          }
          if (s.tokens.empty()) continue;
          ttft.push_back(seconds(s.sent, s.tokens.front()) * 1e3);
          for (size_t i = 1; i < s.tokens.size(); ++i) itl.push_back(seconds(s.tokens[i - 1], s.tokens[i]) * 1e3);
          // A stream's own decode rate, first token to last: for a fast model the client reads several tokens per
          // socket read, so the inter-token p50 says little there.
          if (const double span = seconds(s.tokens.front(), s.tokens.back()); s.tokens.size() > 1 && span > 0)
            stream_rate.push_back(static_cast<double>(s.tokens.size() - 1) / span);
        }
      runs.push_back({{"clients", n},
                      {"tokens", tokens},
                      {"wall_s", wall},
                      {"aggregate_tok_s", wall > 0 ? static_cast<double>(tokens) / wall : 0},
                      {"server_cpu_ms_per_token", tokens > 0 ? server_cpu_s * 1e3 / static_cast<double>(tokens) : 0},
                      {"ttft_ms_p50", percentile(ttft, 0.5)},
                      {"ttft_ms_p99", percentile(ttft, 0.99)},
                      {"itl_ms_p50", percentile(itl, 0.5)},
                      {"itl_ms_p99", percentile(itl, 0.99)},
                      {"stream_decode_tok_s_p50", percentile(stream_rate, 0.5)},
                      {"prompt_cache_hits", cache_after[0] - cache_before[0]},
                      {"prompt_cache_reused_tokens", cache_after[1] - cache_before[1]},
                      {"failed_requests", errors},
                      {"short_streams", short_streams},
                      {"short_example", short_example},
                      {"last_error", last_error},
                      {"engine", peer.empty() ? engine_split(before, engine_counters(port)) : json::object()}});
    }
    const json out = {{"bench", "serve_load"},
                      {"server", peer.empty() ? "lathe" : std::filesystem::path(peer).filename().string()},
                      {"model", dir},
                      {"prompt_tokens", prompt_tokens},
                      {"shared_prefix_tokens", shared_prefix},
                      {"cold_prefix", cold_prefix},
                      {"max_tokens", max_tokens},
                      {"rounds", rounds},
                      {"temperature", temperature},
                      {"top_p", top_p},
                      {"serve_args", serve_args},
                      {"adapters", adapters},
                      {"mix", mix},
                      {"repeat", repeat},
                      {"json_schema", schema_file},
                      {"peer_banned_tokens", peer_bans.size()},
                      {"runs", runs},
                      {"server_peak_rss_mib", static_cast<double>(peak_rss_kib(server.pid())) / 1024.0}};
    std::printf("%s\n", out.dump().c_str());
    if (!server_log.empty()) {
      std::ofstream log(server_log);
      log << server.log_tail();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
