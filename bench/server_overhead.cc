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

extern char** environ;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

double seconds(Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double>(b - a).count(); }

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

// ---------------------------------------------------------------------------------------------------------
// `lathe serve` as a child process: stderr is drained by a thread (so logging never blocks the server) and
// scanned for the ready line.
class ServerProcess {
 public:
  ServerProcess(const std::string& lathe, const std::vector<std::string>& args) {
    int fds[2];
    if (pipe(fds) != 0) throw std::runtime_error("pipe failed");
    std::vector<std::string> argv_s = {lathe, "serve"};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], STDERR_FILENO);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addopen(&fa, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    started_ = Clock::now();
    const int rc = posix_spawn(&pid_, lathe.c_str(), &fa, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    if (rc != 0) {
      close(fds[0]);
      throw std::runtime_error("cannot start " + lathe);
    }
    reader_ = std::thread([this, fd = fds[0]] { drain(fd); });
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      int status = 0;
      for (int i = 0; i < 100 && waitpid(pid_, &status, WNOHANG) == 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      if (waitpid(pid_, &status, WNOHANG) == 0) {
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
      }
    }
    if (reader_.joinable()) reader_.join();
  }

  // Blocks until the ready line (returns the port and the time from spawn to it) or the timeout.
  std::pair<int, double> wait_ready(double timeout_s) {
    const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(mu_);
        if (port_ > 0) return {port_, seconds(started_, ready_at_)};
        if (eof_) break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    std::lock_guard lock(mu_);
    throw std::runtime_error("lathe serve did not become ready; its log:\n" + log_);
  }

 private:
  void drain(int fd) {
    static const std::regex ready(R"(listening on http://[^\s:/]+:(\d+))");
    char buf[4096];
    std::string line;
    for (;;) {
      const ssize_t n = read(fd, buf, sizeof buf);
      if (n <= 0) break;
      const auto now = Clock::now();
      std::lock_guard lock(mu_);
      if (log_.size() < (1 << 20)) log_.append(buf, static_cast<size_t>(n));
      if (port_ == 0) {
        line.append(buf, static_cast<size_t>(n));
        std::smatch m;
        if (std::regex_search(line, m, ready)) {
          port_ = std::stoi(m[1].str());
          ready_at_ = now;
        }
      }
    }
    close(fd);
    std::lock_guard lock(mu_);
    eof_ = true;
  }

  pid_t pid_ = -1;
  Clock::time_point started_, ready_at_;
  std::thread reader_;
  std::mutex mu_;
  std::string log_;
  int port_ = 0;
  bool eof_ = false;
};

// ---------------------------------------------------------------------------------------------------------
// A minimal HTTP/1.1 client over one loopback connection per request: Connection: close, chunked or
// Content-Length bodies. on_body sees the decoded body bytes as they arrive.
void http_post(int port, const std::string& path, const std::string& body,
               const std::function<void(const char*, size_t)>& on_body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) throw std::runtime_error("socket failed");
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    throw std::runtime_error("connect failed");
  }
  const std::string req = "POST " + path +
                          " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  for (size_t off = 0; off < req.size();) {
    const ssize_t n = send(fd, req.data() + off, req.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      throw std::runtime_error("send failed");
    }
    off += static_cast<size_t>(n);
  }
  std::string in;  // bytes not consumed yet
  bool headers_done = false, chunked = false;
  size_t chunk_left = 0;  // bytes left in the current chunk (chunked mode)
  bool in_chunk = false;
  int status = 0;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    if (!headers_done) {
      const size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) continue;
      const std::string head = in.substr(0, end);
      status = std::atoi(head.c_str() + head.find(' ') + 1);
      std::string lower = head;
      std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
      chunked = lower.find("transfer-encoding: chunked") != std::string::npos;
      in.erase(0, end + 4);
      headers_done = true;
    }
    if (!chunked) {
      on_body(in.data(), in.size());
      in.clear();
      continue;
    }
    for (;;) {
      if (!in_chunk) {
        const size_t eol = in.find("\r\n");
        if (eol == std::string::npos) break;
        chunk_left = std::stoul(in.substr(0, eol), nullptr, 16);
        in.erase(0, eol + 2);
        in_chunk = true;
        if (chunk_left == 0) break;  // last chunk
      }
      const size_t take = std::min(chunk_left, in.size());
      on_body(in.data(), take);
      in.erase(0, take);
      chunk_left -= take;
      if (chunk_left > 0 || in.size() < 2) break;
      in.erase(0, 2);  // CRLF after the chunk data
      in_chunk = false;
    }
  }
  close(fd);
  if (status != 200) throw std::runtime_error("POST " + path + " answered " + std::to_string(status));
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
      const auto& choice = j.at("choices").at(0);
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
