// lathe train grads --model DIR --adapter DIR --batch FILE.json --out FILE.safetensors: one batch's token-mean
// NLL (printed) and its LoRA gradients in mlx-lm layout (written), in f32 on the CPU or (--device cuda) the GPU —
// a gradient check.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/verbs.h"
#include "lab/train/batch_grads.h"
#include "lab/train/train_backend.h"

namespace lathe::cli {

Verb add_train_grads(CLI::App& train) {
  struct Opts {
    std::string model, adapter, batch, out, device = "cpu";
  };
  auto o = std::make_shared<Opts>();
  CLI::App* cmd = train.add_subcommand("grads", "one batch's loss and d loss / d lora_a, lora_b (f32)");
  cmd->add_option("--model", o->model, "base model directory")->required();
  cmd->add_option("--adapter", o->adapter, "LoRA adapter directory (mlx-lm or PEFT): the trainable params")->required();
  cmd->add_option("--batch", o->batch, "JSON file {batch: [[ids]], prompt_lens: [n]}")->required();
  cmd->add_option("--out", o->out, "output .safetensors (<module>.lora_a.grad [in, r], .lora_b.grad [r, out])")
      ->required();
  cmd->add_option("--device", o->device, "cpu or cuda: the gradient engine")->capture_default_str();
  return {cmd, [o] {
            const Device device = train::training_device(o->device);
            const auto batch = train::read_grad_batch(o->batch);
            LoadOptions lo;
            lo.exact = true;  // the exact f32 kernels: gradients are checked against an f32 reference
            const auto model = load_model(o->model, lo);
            const train::BatchGrads g = train::compute_batch_grads(*model, o->adapter, batch, device);
            train::write_grads(g, o->out);
            std::printf("loss %.9g over %lld targets; %zu gradient tensors written to %s\n", g.loss,
                        static_cast<long long>(g.targets), g.grads.size(), o->out.c_str());
            return 0;
          }};
}

}  // namespace lathe::cli
