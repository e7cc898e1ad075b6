// lathe quantize --model SRC --out DIR --bits B --group-size G [--recipe R]: the quantize job in the
// foreground (a progress bar on a terminal, plain lines otherwise); the summary is printed as JSON on stdout.
#include <unistd.h>

#include <cstdio>

#include "cli/verbs.h"
#include "jobs/job_format.h"
#include "lab/quantize/quantizer.h"

namespace lathe::cli {

Verb add_quantize(CLI::App& app) {
  auto o = std::make_shared<lab::QuantizeOptions>();
  CLI::App* cmd = app.add_subcommand("quantize", "quantize an HF bf16/f16/f32 checkpoint to MLX affine");
  cmd->fallthrough();
  cmd->add_option("--model", o->source, "source checkpoint directory")->required();
  cmd->add_option("--out", o->output, "output directory (must not exist)")->required();
  cmd->add_option("--bits", o->bits, "2, 3, 4, 5, 6 or 8")->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "32, 64 or 128")->capture_default_str();
  cmd->add_option("--recipe", o->recipe, "uniform, embed_8, mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6")
      ->capture_default_str();
  cmd->add_option("--shard-bytes", o->shard_bytes, "largest output shard")->capture_default_str();
  cmd->add_option("--eval-tokens", o->eval_tokens, "tokens per prompt for the KL summary (0: skip)")
      ->capture_default_str();
  return {cmd, [o] {
            const jobs::Emit emit = jobs::terminal_emit(::isatty(2) != 0);
            const jobs::JobResult r = lab::quantize_checkpoint(*o, emit);
            std::printf("%s\n", r.summary.dump(2).c_str());
            return 0;
          }};
}

}  // namespace lathe::cli
