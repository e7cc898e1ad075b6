// Gemma 3 (text): sandwich norms with (1 + w) RMSNorm, q/k norm, GeGLU (tanh), embeddings scaled by
// sqrt(hidden), attention scale query_pre_attn_scalar^-1/2, sliding layers (local rope base) interleaved
// with global ones, tied head; optional attention / final logit softcaps.
#include <cmath>

#include "model/arch/archs.h"
#include "model/decoder.h"

namespace lathe::arch {

std::unique_ptr<Model> build_gemma3(ModelConfig c, Checkpoint ckpt) {
  DecoderSpec s;
  s.norm_plus_one = true;
  s.sandwich_norms = true;
  s.qk_norm = true;
  s.act = parse_activation(c.get_string("hidden_activation", "gelu_pytorch_tanh"));
  s.embed_scale = std::sqrt(static_cast<float>(c.hidden_size));
  s.attn_scale =
      1.0f / std::sqrt(static_cast<float>(c.get_double("query_pre_attn_scalar", static_cast<double>(c.head_dim))));
  s.attn_softcap = static_cast<float>(c.get_double("attn_logit_softcapping", 0.0));
  s.final_softcap = static_cast<float>(c.get_double("final_logit_softcapping", 0.0));
  c.tie_word_embeddings = true;
  if (!c.rope.count("sliding_attention")) {  // legacy configs without rope_local_base_freq: Gemma's 10k default
    RopeParams local;
    local.theta = 10000.0;
    c.rope["sliding_attention"] = local;
  }
  return std::make_unique<DecoderModel>(std::move(c), std::move(ckpt), s);
}

}  // namespace lathe::arch
