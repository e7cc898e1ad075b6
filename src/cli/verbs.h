// Each CLI verb registers its subcommand and returns the action run when it is chosen.
#pragma once
#include <functional>

#include <CLI/CLI.hpp>

namespace lathe::cli {

using Action = std::function<int()>;
struct Verb {
  CLI::App* command;
  Action action;
};

Verb add_run(CLI::App& app);
Verb add_synth(CLI::App& app);
Verb add_tokenize(CLI::App& app);
Verb add_template(CLI::App& app);
Verb add_generate(CLI::App& app);
Verb add_chat(CLI::App& app);
Verb add_serve(CLI::App& app);
Verb add_cache(CLI::App& app);
Verb add_job_run(CLI::App& app);
Verb add_jobs(CLI::App& app);
Verb add_quantize(CLI::App& app);
Verb add_fuse(CLI::App& app);
Verb add_dataset(CLI::App& app);
Verb add_train(CLI::App& app);
// `train grads`, registered on the train command.
Verb add_train_grads(CLI::App& train);

}  // namespace lathe::cli
