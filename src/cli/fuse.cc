// lathe fuse --model BASE --adapter DIR --out DIR [--dequantize]: the fuse job in the foreground (a progress bar
// on a terminal, plain lines otherwise); the summary is printed as JSON on stdout.
#include <unistd.h>

#include <cstdio>

#include "cli/verbs.h"
#include "jobs/job_format.h"
#include "lab/fuse/fuser.h"

namespace lathe::cli {

Verb add_fuse(CLI::App& app) {
  auto o = std::make_shared<lab::FuseOptions>();
  CLI::App* cmd = app.add_subcommand("fuse", "fold a LoRA adapter into its base model's weights (a new checkpoint)");
  cmd->fallthrough();
  cmd->add_option("--model", o->model, "base checkpoint directory")->required();
  cmd->add_option("--adapter", o->adapter, "adapter directory (mlx-lm or PEFT)")->required();
  cmd->add_option("--out", o->output, "output directory (must not exist)")->required();
  cmd->add_flag("--dequantize", o->dequantize, "write quantized modules dense instead of re-quantizing them");
  cmd->add_option("--shard-bytes", o->shard_bytes, "largest output shard")->capture_default_str();
  return {cmd, [o] {
            const jobs::Emit emit = jobs::terminal_emit(::isatty(2) != 0);
            const jobs::JobResult r = lab::fuse_adapter(*o, emit);
            std::printf("%s\n", r.summary.dump(2).c_str());
            return 0;
          }};
}

}  // namespace lathe::cli
