// Qwen2 / Qwen2.5: Llama blocks with a bias on the q/k/v projections (not on o_proj).
#include "model/arch/archs.h"
#include "model/decoder.h"

namespace lathe::arch {

std::unique_ptr<Model> build_qwen2(ModelConfig c, Checkpoint ckpt) {
  DecoderSpec s;
  s.qkv_bias = true;
  s.act = parse_activation(c.hidden_act);
  return std::make_unique<DecoderModel>(std::move(c), std::move(ckpt), s);
}

}  // namespace lathe::arch
