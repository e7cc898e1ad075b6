// lathe serve: the OpenAI- and Anthropic-compatible HTTP server over one loaded model.
#include <pthread.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

#include "cli/device_flags.h"
#include "cli/sampling_flags.h"
#include "cli/verbs.h"
#include "common/error.h"
#include "common/limits.h"
#include "common/log.h"
#include "engine/kv_budget.h"
#include "engine/model_bundle.h"
#include "server/host_check.h"
#include "server/http_server.h"
#include "server/server_context.h"

namespace lathe::cli {
namespace {

namespace fs = std::filesystem;

struct ServeFlags {
  std::string model, chat_template, chat_template_args, api_key_file;
  std::vector<std::string> aliases;
  std::string logprobs_format = "openai";
  bool api_key_given = false;
  bool ssd_flags_given = false;
  server::ServeOptions server;
  std::optional<int> max_tokens;
  SamplingFlags sampling;
  DeviceFlags where;
};

// The bundled demo checkpoint: next to the binary (build tree or install), else the source tree it was built from.
std::string find_demo_model() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> candidates;
  if (const char* env = std::getenv("LATHE_DEMO_MODEL")) candidates.emplace_back(env);
  if (!ec) {
    candidates.push_back(exe.parent_path() / "models/demo");
    candidates.push_back(exe.parent_path().parent_path() / "models/demo");
    candidates.push_back(exe.parent_path().parent_path() / "share/lathe/models/demo");
  }
#ifdef LATHE_SOURCE_DIR
  candidates.push_back(fs::path(LATHE_SOURCE_DIR) / "models/demo");
#endif
  for (const auto& c : candidates)
    if (fs::exists(c / "config.json", ec)) return c.string();
  throw Error(ErrorKind::NotFound, "no --model given and the bundled demo model (models/demo) was not found");
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, "cannot read " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The key from --api-key, --api-key-file or LATHE_API_KEY (in that order); a given but empty key is an error,
// never a silent "no authentication".
void resolve_api_key(ServeFlags& f) {
  std::string& key = f.server.api_key;
  const char* source = "--api-key";
  if (!f.api_key_given && !f.api_key_file.empty()) {
    key = read_file(f.api_key_file);
    while (!key.empty() && (key.back() == '\n' || key.back() == '\r' || key.back() == ' ')) key.pop_back();
    source = "--api-key-file";
    f.api_key_given = true;
  } else if (!f.api_key_given) {
    if (const char* env = std::getenv("LATHE_API_KEY")) {
      key = env;
      source = "LATHE_API_KEY";
      f.api_key_given = true;
    }
  }
  if (f.api_key_given && key.empty())
    throw Error(ErrorKind::InvalidArgument,
                std::string(source) + " is empty: give a key, or leave it out to serve without authentication");
}

int run_serve(ServeFlags& f) {
  resolve_api_key(f);
  const bool demo = f.model.empty();
  if (demo) f.model = find_demo_model();
  auto session = std::make_unique<ModelBundle>(f.model, f.where.load(), f.where.cache());
  if (!f.chat_template.empty())
    session->set_chat_template(ChatTemplate(read_file(f.chat_template), session->chat_template()
                                                                            ? session->chat_template()->special_tokens()
                                                                            : nlohmann::ordered_json::object()));

  server::ServeOptions o = f.server;
  o.scheduler.validate();
  // Dense weight copies take only what the KV budget (filled as requests come) leaves of the device memory.
  f.where.apply_dense_weights(o.scheduler.kv_cache_bytes > 0 ? o.scheduler.kv_cache_bytes : default_kv_cache_bytes());
  if (!f.chat_template.empty()) o.ssd.template_source = read_file(f.chat_template);
  if (o.ssd.dir.empty() && (f.ssd_flags_given))
    throw Error(ErrorKind::InvalidArgument,
                "--ssd-cache-max, --ssd-cache-verify, --ssd-demote-idle, --ssd-restore, --ssd-read-rate and "
                "--prefill-rate need --ssd-cache DIR");
  o.defaults.sampling = f.sampling.resolve(session->default_sampling());
  if (f.max_tokens) o.defaults.max_tokens = *f.max_tokens;
  o.defaults.logprobs_format =
      f.logprobs_format == "mlx" ? server::LogprobsFormat::Mlx : server::LogprobsFormat::OpenAI;
  o.defaults.vocab_size = session->model().config().vocab_size;
  if (!f.chat_template_args.empty()) {
    try {
      o.chat_template_args = nlohmann::ordered_json::parse(f.chat_template_args);
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(ErrorKind::InvalidArgument, std::string("--chat-template-args is not valid JSON: ") + e.what());
    }
    if (!o.chat_template_args.is_object())
      throw Error(ErrorKind::InvalidArgument, "--chat-template-args must be a JSON object");
  }
  std::string dir_name = fs::path(f.model).lexically_normal().filename().string();
  if (dir_name.empty()) dir_name = fs::path(f.model).lexically_normal().parent_path().filename().string();
  // The first --alias is the id reported to clients; the directory name and every alias are accepted.
  o.model_id = !f.aliases.empty() ? f.aliases.front() : dir_name;
  o.model_names = {o.model_id};
  for (const std::string& n : f.aliases)
    if (n != o.model_id) o.model_names.push_back(n);
  if (dir_name != o.model_id) o.model_names.push_back(dir_name);

  // Signals are taken by one thread with sigwait, so every other thread runs with them blocked.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);  // a client closing its socket must not kill the server

  server::ServerContext ctx(o, std::move(session));
  std::string default_adapters;  // --adapter DIRs: mounted under their folder names, stacked as the default
  for (const std::string& dir : o.adapter_paths) {
    const std::string id = fs::path(dir).lexically_normal().filename().string();
    ctx.adapters().mount(id.empty() ? fs::path(dir).lexically_normal().parent_path().filename().string() : id, dir);
    default_adapters += (default_adapters.empty() ? "" : "+") + ctx.adapters().list().back().id;
  }
  if (!default_adapters.empty()) ctx.adapters().set_default(default_adapters);
  server::HttpServer http(ctx);
  const int port = http.bind();
  if (demo) log::info("no --model given: serving the bundled demo model " + f.model + " (it answers in upper case)");
  if (!server::is_loopback_host(o.host) && o.api_key.empty())
    log::warn("listening on " + o.host + " without --api-key: anyone who can reach this address can use the model");
  // First signal: stop accepting, let running generations finish for --shutdown-timeout, then cancel them
  // (their clients get an end frame saying why). A second signal exits at once.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread deadline;
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    {
      std::lock_guard lock(mu);
      if (done) return;
    }
    char grace[32];
    std::snprintf(grace, sizeof grace, "%g", o.shutdown_timeout_s);
    log::info("stopping (signal " + std::to_string(sig) + "): running generations have " + grace +
              " s to finish; a second signal exits at once");
    http.stop();
    deadline = std::thread([&] {
      std::unique_lock lock(mu);
      const auto timeout = std::chrono::duration<double>(o.shutdown_timeout_s);
      if (cv.wait_for(lock, timeout, [&] { return done; })) return;
      log::warn("shutdown timeout: cancelling the generations still running or queued");
      ctx.cancel_all();
      // Cancelled generations stop at their next token and idle keep-alive connections close within
      // kKeepAliveIdleSec; a handler stuck elsewhere does not hold the exit.
      const auto grace = std::chrono::seconds(limits::kKeepAliveIdleSec + 5);
      if (cv.wait_for(lock, grace, [&] { return done; })) return;
      log::error("requests still open after the shutdown timeout: exiting");
      std::_Exit(1);
    });
    sigwait(&stop_signals, &sig);
    {
      std::lock_guard lock(mu);
      if (done) return;
    }
    log::warn("second signal " + std::to_string(sig) + ": exiting now");
    std::_Exit(128 + sig);
  });
  std::fprintf(stderr, "lathe: serving %s (%s) — listening on http://%s:%d\n", o.model_id.c_str(), f.model.c_str(),
               o.host.c_str(), port);
  if (o.web_ui) std::fprintf(stderr, "lathe: web UI at http://%s:%d/\n", o.host.c_str(), port);
  std::fflush(stderr);
  http.run();
  {
    std::lock_guard lock(mu);
    done = true;
  }
  cv.notify_all();
  pthread_kill(stopper.native_handle(), SIGTERM);  // wakes sigwait (first or second) so the thread can return
  stopper.join();
  if (deadline.joinable()) deadline.join();
  return 0;
}

}  // namespace

Verb add_serve(CLI::App& app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a model over OpenAI- and Anthropic-compatible HTTP APIs");
  cmd->fallthrough();  // global flags (--log-level, --threads) may follow the verb
  cmd->add_option("--model", f->model, "checkpoint directory (default: the bundled demo model)");
  cmd->add_option("--alias", f->aliases,
                  "a model name clients may send (repeatable; the first is the id reported; the directory name is "
                  "always accepted)");
  cmd->add_option("--logprobs-format", f->logprobs_format,
                  "logprobs shape: openai (default) or mlx (mlx_lm.server's, top_logprobs up to 11)")
      ->check(CLI::IsMember({"openai", "mlx"}));
  cmd->add_flag("--accept-any-model", f->server.accept_any_model,
                "serve requests whatever model name they send (for clients that hard-code one)");
  cmd->add_option("--host", f->server.host, "address to bind")->capture_default_str();
  cmd->add_option("--port", f->server.port, "port (0 = any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option_function<std::string>(
      "--api-key",
      [f](const std::string& k) {
        f->server.api_key = k;
        f->api_key_given = true;
      },
      "require this key (Authorization: Bearer or x-api-key); visible in ps: prefer --api-key-file or LATHE_API_KEY");
  cmd->add_option("--cors-origin", f->server.cors.origins,
                  "browser origin allowed besides loopback ones (repeatable; * = any)");
  cmd->add_option("--allowed-host", f->server.allowed_hosts,
                  "Host header name answered besides localhost, 127.x.x.x and [::1] while bound to loopback "
                  "(repeatable; * = any; guards against DNS rebinding)");
  cmd->add_option("--api-key-file", f->api_key_file, "read the API key from this file (trailing newline ignored)");
  cmd->add_option(
         "--http-threads", f->server.http_threads,
         "worker threads: each runs one fully read request (a stream for its length); idle connections hold none")
      ->capture_default_str()
      ->check(CLI::Range(16, 8192));
  cmd->add_option("--shutdown-timeout", f->server.shutdown_timeout_s,
                  "seconds running generations may finish after SIGTERM/SIGINT before they are cancelled")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  f->where.add_to(cmd);
  cmd->add_option("--max-tokens", f->max_tokens, "tokens to generate when a request does not say (default 512)")
      ->check(CLI::PositiveNumber);
  f->sampling.add_to(cmd);
  cmd->add_option("--chat-template", f->chat_template, "Jinja chat template file to use instead of the model's");
  cmd->add_option("--chat-template-args", f->chat_template_args,
                  "JSON object of extra template variables, e.g. '{\"enable_thinking\": false}'");
  cmd->add_option("--max-body-bytes", f->server.max_body_bytes, "larger request bodies get 413")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--data-dir", f->server.data_dir, "jobs database and logs (default: $XDG_DATA_HOME/lathe)");
  cmd->add_flag("--no-ui{false}", f->server.web_ui, "do not serve the web UI at GET /");
  cmd->add_option("--adapter,--adapter-path", f->server.adapter_paths,
                  "LoRA adapter directory mounted at start (repeatable: stacked; the stack is the default)");
  cmd->add_option("--job-root", f->server.job_roots,
                  "directory that every file or folder a job reads or writes must lie in (repeatable; default: any)");
  cmd->add_option("--adapter-dir", f->server.adapter_stores,
                  "directory of LoRA adapters that POST /v1/adapters may mount from (repeatable)");
  cmd->add_option("--max-queue", f->server.max_queue, "requests waiting for the engine before 429")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  auto& s = f->server.scheduler;
  cmd->add_option("--max-batch", s.max_batch, "sequences decoded together in one engine step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--max-batch-tokens", s.max_batch_tokens, "tokens in one step (prefill chunks + decode tokens)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--prefill-chunk", s.prefill_chunk, "prompt tokens one sequence feeds per step")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--kv-cache-bytes", s.kv_cache_bytes,
                  "KV cache budget; requests that do not fit wait (default: half the available memory)")
      ->check(CLI::NonNegativeNumber);
  auto& ssd = f->server.ssd;
  cmd->add_option("--ssd-cache", ssd.dir,
                  "keep prompt caches as KV files under DIR (survive restarts; DIR/<identity>/<namespace>/)");
  cmd->add_option_function<uint64_t>(
         "--ssd-cache-max",
         [f](uint64_t b) {
           f->server.ssd.max_bytes = b;
           f->ssd_flags_given = true;
         },
         "cap on the bytes the SSD cache's files occupy, least recently used go first (default 8 GiB)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag_callback(
      "--ssd-cache-verify",
      [f] {
        f->server.ssd.verify = true;
        f->ssd_flags_given = true;
      },
      "check every tensor hash of a KV file before restoring it (reads it all)");
  cmd->add_option_function<double>(
         "--ssd-demote-idle",
         [f](double s) {
           f->server.ssd.demote_idle_s = s;
           f->ssd_flags_given = true;
         },
         "a kept prompt cache idle this many seconds leaves RAM for the SSD cache (default: only when evicted)")
      ->check(CLI::PositiveNumber);
  cmd->add_option_function<std::string>(
         "--ssd-restore",
         [f](const std::string& p) {
           f->server.ssd.restore.policy = parse_restore_policy(p);
           f->ssd_flags_given = true;
         },
         "auto: restore a stored prefix only when reading it is predicted faster than prefilling it (learned "
         "rates); always; never (default auto)")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  cmd->add_option_function<double>(
         "--ssd-read-rate",
         [f](double mb_s) {
           f->server.ssd.restore.restore_mb_s = mb_s;
           f->ssd_flags_given = true;
         },
         "the SSD cache's restore rate in MB/s to assume until restores have measured it (default 1000)")
      ->check(CLI::PositiveNumber);
  cmd->add_option_function<double>(
         "--prefill-rate",
         [f](double tok_s) {
           f->server.ssd.restore.prefill_tok_s = tok_s;
           f->ssd_flags_given = true;
         },
         "this engine's prefill rate in tokens/s to assume until prefills have measured it (default 400 on the "
         "CPU, 20000 on a GPU); only the SSD cache's restore decisions use it")
      ->check(CLI::PositiveNumber);
  return {cmd, [f] { return run_serve(*f); }};
}

}  // namespace lathe::cli
