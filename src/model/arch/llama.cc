// Llama (and Mistral): pre-norm blocks, GQA, SwiGLU, RoPE incl. llama3 scaling, untied head unless
// tie_word_embeddings. Config keys: hidden_size, intermediate_size, num_*, head_dim, rope_*, rms_norm_eps,
// attention_bias, mlp_bias, tie_word_embeddings.
#include "model/arch/archs.h"
#include "model/decoder.h"

namespace lathe::arch {

std::unique_ptr<Model> build_llama(ModelConfig c, Checkpoint ckpt) {
  DecoderSpec s;
  s.qkv_bias = c.get_bool("attention_bias", false);
  s.mlp_bias = c.get_bool("mlp_bias", false);
  s.act = parse_activation(c.hidden_act);
  return std::make_unique<DecoderModel>(std::move(c), std::move(ckpt), s);
}

}  // namespace lathe::arch
