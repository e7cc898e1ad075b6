// lathe: serve, run and build LLMs in the MLX checkpoint format. Dispatches to one file per verb.
#include <cstdio>
#include <vector>

#include "cli/verbs.h"
#include "common/error.h"
#include "common/heap.h"
#include "common/log.h"
#include "tensor/thread_pool.h"

int main(int argc, char** argv) {
  lathe::tune_heap_for_tensors();
  CLI::App app{"lathe: serve, run, fine-tune and quantize LLMs in the MLX checkpoint format"};
  app.require_subcommand(1);
  std::string log_level = "info";
  int threads = 0;
  app.add_option("--log-level", log_level, "debug|info|warn|error|off")->capture_default_str();
  app.add_option("--threads", threads, "CPU worker threads (default: the CPUs this process may run on)")
      ->check(CLI::Range(1, 1024));
  const std::vector<lathe::cli::Verb> verbs = {
      lathe::cli::add_run(app),      lathe::cli::add_synth(app),    lathe::cli::add_tokenize(app),
      lathe::cli::add_template(app), lathe::cli::add_generate(app), lathe::cli::add_chat(app),
      lathe::cli::add_serve(app),    lathe::cli::add_cache(app),    lathe::cli::add_job_run(app),
      lathe::cli::add_jobs(app),     lathe::cli::add_quantize(app), lathe::cli::add_fuse(app),
      lathe::cli::add_train(app),    lathe::cli::add_dataset(app)};
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    lathe::log::set_level(lathe::log::parse_level(log_level));
    if (threads > 0) lathe::set_num_threads(threads);
    for (const auto& v : verbs)
      if (v.command->parsed()) return v.action();
  } catch (const lathe::Error& e) {
    std::fprintf(stderr, "lathe: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lathe: internal error: %s\n", e.what());
    return 3;
  }
  return 1;
}
