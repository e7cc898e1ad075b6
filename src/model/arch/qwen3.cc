// Qwen3 (dense): Llama blocks plus per-head RMSNorm on q and k before RoPE; usually tied embeddings.
#include "model/arch/archs.h"
#include "model/decoder.h"

namespace lathe::arch {

std::unique_ptr<Model> build_qwen3(ModelConfig c, Checkpoint ckpt) {
  DecoderSpec s;
  s.qk_norm = true;
  s.qkv_bias = c.get_bool("attention_bias", false);
  s.act = parse_activation(c.hidden_act);
  return std::make_unique<DecoderModel>(std::move(c), std::move(ckpt), s);
}

}  // namespace lathe::arch
