// HTTP overhead of `lathe serve`. On one model and the same prompts, time to first token and decode tok/s
// through the server (SSE over loopback, measured by a raw-socket client) against the engine called directly
// in this process (ChatSession::generate), plus non-streamed request latency; and start-to-ready time of
// `lathe serve` on a synthetic qwen3-4b checkpoint (made with `lathe synth` and the real Qwen3 tokenizer
// fixture when absent). Direct and server runs alternate so load from other processes hits both alike.
// Prints one JSON object. Goals: ≤ 2% tok/s loss, ≤ 5 ms TTFT overhead, ≤ 0.3 s start-to-ready.
//
// Usage: server_overhead --lathe build/lathe [--model DIR] [--runs N] [--max-tokens N] [--ready-model DIR]
//                        [--ready-runs N] [--skip-ready]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "engine/chat_session.h"
#include "serve_harness.h"

namespace {

namespace fs = std::filesystem;
using bench::Clock;
using nlohmann::json;

using bench::http_post;
using bench::seconds;
using bench::ServerProcess;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// One generation as a client sees it: time to the first visible text, decode rate after it, total time.
struct Sample {
  double ttft_s = 0;
  double decode_tps = 0;
  double total_s = 0;
  int tokens = 0;
  std::string text;
};

json summarize(const std::vector<Sample>& runs) {
  std::vector<double> ttft, tps, total;
  for (const auto& s : runs) {
    ttft.push_back(s.ttft_s * 1e3);
    tps.push_back(s.decode_tps);
    total.push_back(s.total_s * 1e3);
  }
  return {{"ttft_ms", median(ttft)}, {"decode_tok_s", median(tps)}, {"total_ms", median(total)}};
}

json chat_body(const std::string& prompt, int max_tokens, bool stream) {
  return {{"messages", json::array({{{"role", "user"}, {"content", prompt}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0},
          {"stream", stream},
          {"stream_options", stream ? json{{"include_usage", true}} : json(nullptr)}};
}

Sample server_stream(int port, const std::string& prompt, int max_tokens) {
  Sample s;
  std::string pending;
  bool first = false;
  Clock::time_point t_first, t_last;
  const auto t0 = Clock::now();
  http_post(port, "/v1/chat/completions", chat_body(prompt, max_tokens, true).dump(), [&](const char* p, size_t n) {
    const auto now = Clock::now();
    pending.append(p, n);
    for (size_t end; (end = pending.find("\n\n")) != std::string::npos;) {
      const std::string frame = pending.substr(0, end);
      pending.erase(0, end + 2);
      if (frame.rfind("data: ", 0) != 0 || frame == "data: [DONE]") continue;
      const json j = json::parse(frame.substr(6));
      // The usage chunk (stream_options.include_usage) has an empty choices array, as OpenAI sends it.
      const json& choices = j.at("choices");
      const json no_choice = json::object();
      const json& choice = choices.empty() ? no_choice : choices.at(0);
      if (const auto d = choice.find("delta");
          d != choice.end() && d->contains("content") && (*d)["content"].is_string()) {
        const std::string text = (*d)["content"];
        if (!text.empty() && !first) {
          first = true;
          t_first = now;
        }
        s.text += text;
      }
      if (j.contains("usage") && j["usage"].is_object()) s.tokens = j["usage"].value("completion_tokens", 0);
      t_last = now;
    }
  });
  s.total_s = seconds(t0, Clock::now());
  s.ttft_s = first ? seconds(t0, t_first) : s.total_s;
  if (first && s.tokens > 1) s.decode_tps = (s.tokens - 1) / seconds(t_first, t_last);
  return s;
}

Sample server_nonstream(int port, const std::string& prompt, int max_tokens) {
  Sample s;
  std::string body;
  const auto t0 = Clock::now();
  http_post(port, "/v1/chat/completions", chat_body(prompt, max_tokens, false).dump(),
            [&](const char* p, size_t n) { body.append(p, n); });
  s.total_s = seconds(t0, Clock::now());
  const json j = json::parse(body);
  s.text = j["choices"][0]["message"].value("content", "");
  s.tokens = j["usage"].value("completion_tokens", 0);
  return s;
}

// The same work the server does per request: template + tokenize, then generate greedily.
Sample direct(lathe::ChatSession& session, const std::string& prompt, int max_tokens) {
  Sample s;
  const auto t0 = Clock::now();
  const auto ids = session.chat_prompt(json::array({{{"role", "user"}, {"content", prompt}}}));
  lathe::GenerateOptions opt;
  opt.max_tokens = max_tokens;
  opt.sampling = session.default_sampling();
  opt.sampling.temperature = 0;
  opt.eos_ids = session.eos_ids();
  bool first = false;
  Clock::time_point t_first, t_last;
  const auto r = session.generate(ids, opt, [&](const lathe::GeneratedToken& t) {
    const auto now = Clock::now();
    if (!first && !t.text.empty()) {
      first = true;
      t_first = now;
    }
    t_last = now;
  });
  s.total_s = seconds(t0, Clock::now());
  s.tokens = static_cast<int>(r.tokens.size());
  s.text = r.text;
  s.ttft_s = first ? seconds(t0, t_first) : s.total_s;
  if (first && s.tokens > 1) s.decode_tps = (s.tokens - 1) / seconds(t_first, t_last);
  return s;
}

void gunzip_to(const fs::path& from, const fs::path& to) {
  gzFile in = gzopen(from.c_str(), "rb");
  if (!in) throw std::runtime_error("cannot open " + from.string());
  FILE* out = std::fopen(to.c_str(), "wb");
  if (!out) {
    gzclose(in);
    throw std::runtime_error("cannot write " + to.string());
  }
  char buf[1 << 16];
  int n;
  while ((n = gzread(in, buf, sizeof buf)) > 0) std::fwrite(buf, 1, static_cast<size_t>(n), out);
  std::fclose(out);
  gzclose(in);
  if (n < 0) throw std::runtime_error("corrupt " + from.string());
}

// A synthetic qwen3-4b (4-bit, group 64) with the real Qwen3 tokenizer and chat template, made once.
std::string ready_checkpoint(const std::string& lathe, const std::string& source_dir) {
  const char* tmp = std::getenv("TMPDIR");
  const fs::path dir = fs::path(tmp ? tmp : "/tmp") / "lathe-synth-qwen3-4b-4-64";
  if (!fs::exists(dir / "model.safetensors")) {
    const std::string cmd = lathe + " synth --like qwen3-4b --bits 4 --group-size 64 --out " + dir.string() + " >&2";
    if (std::system(cmd.c_str()) != 0) throw std::runtime_error("lathe synth failed");
  }
  const fs::path tok = fs::path(source_dir) / "tests/fixtures/tokenizers/qwen3-real";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    if (!fs::exists(dir / f)) gunzip_to(tok / (std::string(f) + ".gz"), dir / f);
  return dir.string();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"HTTP overhead of lathe serve against the engine called directly, and its start-to-ready time"};
  std::string lathe = "build/lathe", model, ready_model, source_dir = ".";
  int runs = 5, max_tokens = 64, ready_runs = 3;
  bool skip_ready = false;
  app.add_option("--lathe", lathe, "the lathe binary")->capture_default_str();
  app.add_option("--model", model, "checkpoint for the tok/s and TTFT comparison (default: <source>/models/demo)");
  app.add_option("--source-dir", source_dir, "repository root (bundled demo model, tokenizer fixtures)")
      ->capture_default_str();
  app.add_option("--runs", runs, "measured runs per side (after one warm-up)")->capture_default_str();
  app.add_option("--max-tokens", max_tokens, "tokens per generation")->capture_default_str();
  app.add_option("--ready-model", ready_model, "checkpoint for start-to-ready (default: a synthetic qwen3-4b)");
  app.add_option("--ready-runs", ready_runs, "server starts to time")->capture_default_str();
  app.add_flag("--skip-ready", skip_ready, "skip the start-to-ready measurement");
  CLI11_PARSE(app, argc, argv);
  if (model.empty()) model = (fs::path(source_dir) / "models/demo").string();

  try {
    json out = {{"bench", "server_overhead"}, {"model", model}, {"max_tokens", max_tokens}, {"runs", runs}};

    // Prompts differ per run (as real traffic does); both sides see the same sequence, so their prompt
    // caches reuse the same prefixes.
    std::vector<std::string> prompts;
    for (int i = 0; i <= runs; ++i)
      prompts.push_back("please write request number " + std::to_string(i) +
                        " out in capital letters with every word here kept");

    lathe::ChatSession session(model);
    ServerProcess server(lathe, {"--model", model, "--port", "0"});
    const int port = server.wait_ready(120).first;

    std::vector<Sample> d, st, ns;
    int mismatches = 0;
    for (int i = 0; i <= runs; ++i) {  // run 0 warms both sides up and is not counted
      const auto a = direct(session, prompts[i], max_tokens);
      const auto b = server_stream(port, prompts[i], max_tokens);
      const auto c = server_nonstream(port, prompts[i], max_tokens);
      if (a.text != b.text || a.text != c.text || a.tokens != b.tokens) ++mismatches;
      if (i == 0) continue;
      d.push_back(a);
      st.push_back(b);
      ns.push_back(c);
    }
    out["prompt_tokens"] = session.chat_prompt(json::array({{{"role", "user"}, {"content", prompts[1]}}})).size();
    out["completion_tokens"] = d.empty() ? 0 : d[0].tokens;
    out["outputs_differ"] = mismatches;
    const json jd = summarize(d), js = summarize(st), jn = summarize(ns);
    out["direct"] = jd;
    out["server_stream"] = js;
    out["server_nonstream"] = {{"total_ms", jn["total_ms"]}};
    const double tps_loss = jd["decode_tok_s"].get<double>() > 0
                                ? 100.0 * (1.0 - js["decode_tok_s"].get<double>() / jd["decode_tok_s"].get<double>())
                                : 0.0;
    const double ttft_over = js["ttft_ms"].get<double>() - jd["ttft_ms"].get<double>();
    out["overhead"] = {{"decode_tok_s_loss_pct", tps_loss},
                       {"ttft_ms", ttft_over},
                       {"stream_total_ms", js["total_ms"].get<double>() - jd["total_ms"].get<double>()},
                       {"nonstream_total_ms", jn["total_ms"].get<double>() - jd["total_ms"].get<double>()}};
    json goals = {{"decode_tok_s_loss_pct_max", 2.0}, {"ttft_overhead_ms_max", 5.0}};
    json met = {{"decode_tok_s", tps_loss <= 2.0}, {"ttft", ttft_over <= 5.0}};

    if (!skip_ready) {
      if (ready_model.empty()) ready_model = ready_checkpoint(lathe, source_dir);
      // Warm the page cache once, as a restart on a serving machine would find it.
      {
        ServerProcess warm(lathe, {"--model", ready_model, "--port", "0"});
        warm.wait_ready(300);
      }
      std::vector<double> times;
      for (int i = 0; i < ready_runs; ++i) {
        ServerProcess s(lathe, {"--model", ready_model, "--port", "0"});
        times.push_back(s.wait_ready(300).second);
      }
      const double med = median(times);
      out["start_to_ready"] = {{"model", ready_model}, {"runs_s", times}, {"median_s", med}};
      goals["start_to_ready_s_max"] = 0.3;
      met["start_to_ready"] = med <= 0.3;
    }
    out["goals"] = goals;
    out["goals_met"] = met;
    std::printf("%s\n", out.dump(1).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "server_overhead: %s\n", e.what());
    return 1;
  }
  return 0;
}
