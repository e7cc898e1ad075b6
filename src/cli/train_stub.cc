// lathe train: this build carries only the `grads` sub-verb (the trainer's own `lathe train` lives on the
// train-loop branch; the integrator replaces this file with it and keeps add_train_grads registered).
#include "cli/verbs.h"
#include "common/error.h"

namespace lathe::cli {

Verb add_train(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("train", "fine-tune a LoRA adapter (this build: `train grads` only)");
  cmd->allow_extras();
  const Verb grads = add_train_grads(*cmd);
  return {cmd, [grads] {
            if (grads.command->parsed()) return grads.action();
            throw Error(ErrorKind::Unsupported,
                        "lathe train: fine-tuning runs are not in this build; `lathe train grads` is");
          }};
}

}  // namespace lathe::cli
