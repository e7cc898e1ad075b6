// lathe synth: a checkpoint with a real model's configuration and random weights (MLX-quantized or bf16),
// for benchmarks at real sizes without downloading anything.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"

namespace lathe::cli {
namespace {

using json = nlohmann::ordered_json;

struct SynthOptions {
  std::string like;
  int bits = 4;
  int group_size = 64;
  std::string out;
  uint64_t seed = 1;
  int lora_rank = 0;  // > 0: write a random mlx-lm LoRA adapter for this shape instead of a checkpoint
  double lora_scale = 2.0;
  int64_t vocab = 0;  // > 0: this vocabulary size instead of the model's (e.g. to match a tokenizer at hand)
};

json base_config(const std::string& like) {
  if (like == "qwen3-0.6b" || like == "qwen3-4b") {
    const bool big = like == "qwen3-4b";
    return {{"architectures", {"Qwen3ForCausalLM"}},
            {"model_type", "qwen3"},
            {"hidden_size", big ? 2560 : 1024},
            {"intermediate_size", big ? 9728 : 3072},
            {"num_hidden_layers", big ? 36 : 28},
            {"num_attention_heads", big ? 32 : 16},
            {"num_key_value_heads", 8},
            {"head_dim", 128},
            {"vocab_size", 151936},
            {"max_position_embeddings", 40960},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", true},
            {"bos_token_id", 151643},
            {"eos_token_id", 151645}};
  }
  if (like == "llama-3.1-8b") {
    return {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"hidden_size", 4096},
            {"intermediate_size", 14336},
            {"num_hidden_layers", 32},
            {"num_attention_heads", 32},
            {"num_key_value_heads", 8},
            {"head_dim", 128},
            {"vocab_size", 128256},
            {"max_position_embeddings", 131072},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 500000.0},
            {"rope_scaling",
             {{"rope_type", "llama3"},
              {"factor", 8.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 8192}}},
            {"hidden_act", "silu"},
            {"tie_word_embeddings", false},
            {"bos_token_id", 128000},
            {"eos_token_id", {128001, 128008, 128009}}};
  }
  if (like == "gemma3-1b") {
    json types = json::array();
    for (int i = 0; i < 26; ++i) types.push_back((i + 1) % 6 == 0 ? "full_attention" : "sliding_attention");
    return {{"architectures", {"Gemma3ForCausalLM"}},
            {"model_type", "gemma3_text"},
            {"hidden_size", 1152},
            {"intermediate_size", 6912},
            {"num_hidden_layers", 26},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 1},
            {"head_dim", 256},
            {"vocab_size", 262144},
            {"max_position_embeddings", 32768},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 1000000.0},
            {"rope_local_base_freq", 10000.0},
            {"sliding_window", 512},
            {"layer_types", types},
            {"query_pre_attn_scalar", 256},
            {"hidden_activation", "gelu_pytorch_tanh"},
            {"tie_word_embeddings", true},
            {"bos_token_id", 2},
            {"eos_token_id", {1, 106}}};
  }
  if (like == "qwen3.5-0.8b") {
    // A Qwen3.5-0.8B-class hybrid: three Gated DeltaNet layers to one gated full-attention layer.
    json types = json::array();
    for (int i = 0; i < 24; ++i) types.push_back((i + 1) % 4 == 0 ? "full_attention" : "linear_attention");
    return {
        {"architectures", {"Qwen3_5ForCausalLM"}},
        {"model_type", "qwen3_5_text"},
        {"hidden_size", 1024},
        {"intermediate_size", 3584},
        {"num_hidden_layers", 24},
        {"num_attention_heads", 8},
        {"num_key_value_heads", 2},
        {"head_dim", 256},
        {"linear_num_key_heads", 16},
        {"linear_key_head_dim", 128},
        {"linear_num_value_heads", 16},
        {"linear_value_head_dim", 128},
        {"linear_conv_kernel_dim", 4},
        {"layer_types", types},
        {"vocab_size", 248320},
        {"max_position_embeddings", 262144},
        {"rms_norm_eps", 1e-6},
        {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 10000000.0}, {"partial_rotary_factor", 0.25}}},
        {"hidden_act", "silu"},
        {"tie_word_embeddings", true},
        {"eos_token_id", 248044}};
  }
  throw Error(ErrorKind::InvalidArgument,
              "--like '" + like + "': choose qwen3-0.6b, qwen3-4b, llama-3.1-8b, gemma3-1b or qwen3.5-0.8b");
}

// xorshift64*: fast, seeded, good enough for random weights.
struct Rng {
  uint64_t s;
  uint64_t next() {
    s ^= s >> 12;
    s ^= s << 25;
    s ^= s >> 27;
    return s * 2685821657736338717ull;
  }
  float uniform() { return static_cast<float>(next() >> 40) / static_cast<float>(1 << 24); }  // [0, 1)
};

// A random mlx-lm adapter (F32 lora_a [in, r], lora_b [r, out]) on all seven linear targets of every layer.
int synth_adapter(const SynthOptions& o, const json& cfg) {
  const int64_t H = cfg["hidden_size"], I = cfg["intermediate_size"], L = cfg["num_hidden_layers"];
  const int64_t q = cfg["num_attention_heads"].get<int64_t>() * cfg["head_dim"].get<int64_t>(),
                kv = cfg["num_key_value_heads"].get<int64_t>() * cfg["head_dim"].get<int64_t>();
  const std::vector<std::tuple<std::string, int64_t, int64_t>> targets = {
      {"self_attn.q_proj", H, q}, {"self_attn.k_proj", H, kv}, {"self_attn.v_proj", H, kv}, {"self_attn.o_proj", q, H},
      {"mlp.gate_proj", H, I},    {"mlp.up_proj", H, I},       {"mlp.down_proj", I, H}};  // (module, in, out)
  std::filesystem::create_directories(o.out);
  auto rng = std::make_shared<Rng>(Rng{o.seed * 0x9E3779B97F4A7C15ull + 7});
  SafetensorsWriter w;
  const int64_t r = o.lora_rank;
  for (int64_t l = 0; l < L; ++l)
    for (const auto& [module, in, out] : targets)
      for (const auto& [suffix, shape] : {std::pair<std::string, Shape>{".lora_a", {in, r}}, {".lora_b", {r, out}}})
        w.add("model.layers." + std::to_string(l) + "." + module + suffix, DType::F32, shape,
              [rng, n = shape[0] * shape[1]](void* dst) {
                auto* p = static_cast<float*>(dst);
                for (int64_t i = 0; i < n; ++i) p[i] = (rng->uniform() * 2.f - 1.f) * 0.01f;
              });
  w.write(o.out + "/adapters.safetensors");
  const json ac = {{"fine_tune_type", "lora"},
                   {"num_layers", L},
                   {"lora_parameters", {{"rank", r}, {"scale", o.lora_scale}, {"dropout", 0.0}}}};
  const std::string text = ac.dump(2) + "\n";
  write_file_atomic(o.out + "/adapter_config.json", text.data(), text.size());
  std::printf("wrote %s (LoRA rank %lld on all seven targets of %s)\n", o.out.c_str(), static_cast<long long>(r),
              o.like.c_str());
  return 0;
}

int synth(const SynthOptions& o) {
  if (o.lora_rank > 0) return synth_adapter(o, base_config(o.like));
  if (o.bits != 16 && o.bits != 2 && o.bits != 4 && o.bits != 8)
    throw Error(ErrorKind::InvalidArgument, "--bits must be 2, 4, 8 or 16 (bf16, unquantized)");
  if (o.group_size != 32 && o.group_size != 64 && o.group_size != 128)
    throw Error(ErrorKind::InvalidArgument, "--group-size must be 32, 64 or 128");
  json cfg = base_config(o.like);
  if (o.vocab > 0) {
    cfg["vocab_size"] = o.vocab;
    // Special ids past the new vocabulary would be rejected (logit_bias, stop ids): the last id stands in.
    auto clamp_id = [&](json& id) {
      if (id.is_number_integer() && id.get<int64_t>() >= o.vocab) id = o.vocab - 1;
    };
    for (const char* key : {"bos_token_id", "eos_token_id"}) {
      if (!cfg.contains(key)) continue;
      json& v = cfg[key];
      if (v.is_array())
        for (json& e : v) clamp_id(e);
      else
        clamp_id(v);
    }
  }
  const bool quant = o.bits != 16;
  if (quant) {
    cfg["quantization"] = {{"group_size", o.group_size}, {"bits", o.bits}};
    cfg["quantization_config"] = cfg["quantization"];
  }
  const bool gemma = o.like.rfind("gemma", 0) == 0;
  const bool hybrid = cfg["model_type"] == "qwen3_5_text";  // zero-centred norms like Gemma's (HF conv layout)
  const int64_t H = cfg["hidden_size"], I = cfg["intermediate_size"], L = cfg["num_hidden_layers"];
  const int64_t nh = cfg["num_attention_heads"], nkv = cfg["num_key_value_heads"], hd = cfg["head_dim"];
  const int64_t V = cfg["vocab_size"];
  const bool tied = cfg["tie_word_embeddings"];

  std::filesystem::create_directories(o.out);
  auto rng = std::make_shared<Rng>(Rng{o.seed * 0x9E3779B97F4A7C15ull + 1});
  SafetensorsWriter w;
  constexpr float kStd = 0.02f;
  auto add_matrix = [&](const std::string& module, int64_t out, int64_t in) {
    if (!quant) {
      w.add(module + ".weight", DType::BF16, {out, in}, [rng, n = out * in](void* dst) {
        auto* p = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16((rng->uniform() * 2.f - 1.f) * kStd * 1.7320508f);
      });
      return;
    }
    const int64_t words = in * o.bits / 32, groups = in / o.group_size;
    w.add(module + ".weight", DType::U32, {out, words}, [rng, n = out * words](void* dst) {
      auto* p = static_cast<uint32_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = static_cast<uint32_t>(rng->next() >> 32);
    });
    // Uniform codes centred on zero with the target standard deviation.
    const float half_levels = static_cast<float>((1 << o.bits) - 1) / 2.f;
    const float scale = kStd * 1.7320508f / half_levels;
    w.add(module + ".scales", DType::BF16, {out, groups}, [rng, n = out * groups, scale](void* dst) {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(scale * (0.8f + 0.4f * rng->uniform()));
    });
    w.add(module + ".biases", DType::BF16, {out, groups}, [n = out * groups, scale, half_levels](void* dst) {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(-scale * half_levels);
    });
  };
  // Norm weights that scale by 1: 0 where the model scales by (1 + w) (Gemma, qwen3_5's layer norms), else 1.
  auto add_norm = [&](const std::string& name, int64_t n, bool plain = false) {
    w.add(name, DType::BF16, {n}, [n, zero = (gemma || hybrid) && !plain](void* dst) {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(zero ? 0.0f : 1.0f);
    });
  };
  // bf16 values lo + (hi − lo) · u, u uniform in [0, 1).
  auto add_uniform = [&](const std::string& name, const Shape& shape, float lo, float hi) {
    w.add(name, DType::BF16, shape, [rng, n = shape_numel(shape), lo, hi](void* dst) {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(lo + (hi - lo) * rng->uniform());
    });
  };
  // A Gated DeltaNet mixer (qwen3_5's linear_attention layers; model/layers/gated_delta.h).
  auto add_gated_delta = [&](const std::string& p) {
    const int64_t kh = cfg["linear_num_key_heads"], kd = cfg["linear_key_head_dim"];
    const int64_t vh = cfg["linear_num_value_heads"], vd = cfg["linear_value_head_dim"];
    const int64_t ck = cfg["linear_conv_kernel_dim"], conv = 2 * kh * kd + vh * vd;
    add_matrix(p + ".in_proj_qkv", conv, H);
    add_matrix(p + ".in_proj_z", vh * vd, H);
    add_matrix(p + ".in_proj_a", vh, H);
    add_matrix(p + ".in_proj_b", vh, H);
    add_matrix(p + ".out_proj", H, vh * vd);
    add_uniform(p + ".conv1d.weight", {conv, 1, ck}, -0.5f, 0.5f);
    add_uniform(p + ".A_log", {vh}, 0.0f, 2.7f);  // decay rates e^A_log in 1..15
    add_uniform(p + ".dt_bias", {vh}, 0.0f, 1.0f);
    add_norm(p + ".norm.weight", vd, /*plain=*/true);  // the gated output norm scales by w itself
  };
  add_matrix("model.embed_tokens", V, H);
  for (int64_t i = 0; i < L; ++i) {
    const std::string p = "model.layers." + std::to_string(i);
    add_norm(p + ".input_layernorm.weight", H);
    add_norm(p + ".post_attention_layernorm.weight", H);
    if (gemma) {
      add_norm(p + ".pre_feedforward_layernorm.weight", H);
      add_norm(p + ".post_feedforward_layernorm.weight", H);
    }
    if (hybrid && cfg["layer_types"][static_cast<size_t>(i)] == "linear_attention") {
      add_gated_delta(p + ".linear_attn");
      add_matrix(p + ".mlp.gate_proj", I, H);
      add_matrix(p + ".mlp.up_proj", I, H);
      add_matrix(p + ".mlp.down_proj", H, I);
      continue;
    }
    add_matrix(p + ".self_attn.q_proj", (hybrid ? 2 : 1) * nh * hd, H);  // qwen3_5: the query and its output gate
    add_matrix(p + ".self_attn.k_proj", nkv * hd, H);
    add_matrix(p + ".self_attn.v_proj", nkv * hd, H);
    add_matrix(p + ".self_attn.o_proj", H, nh * hd);
    if (cfg["model_type"] != "llama") {
      add_norm(p + ".self_attn.q_norm.weight", hd);
      add_norm(p + ".self_attn.k_norm.weight", hd);
    }
    add_matrix(p + ".mlp.gate_proj", I, H);
    add_matrix(p + ".mlp.up_proj", I, H);
    add_matrix(p + ".mlp.down_proj", H, I);
  }
  add_norm("model.norm.weight", H);
  if (!tied) add_matrix("lm_head", V, H);
  w.set_metadata("format", "mlx");
  w.write(o.out + "/model.safetensors");
  const std::string text = cfg.dump(2) + "\n";
  write_file_atomic(o.out + "/config.json", text.data(), text.size());
  std::printf("wrote %s (%s, %s)\n", o.out.c_str(), o.like.c_str(),
              quant ? (std::to_string(o.bits) + "-bit g" + std::to_string(o.group_size)).c_str() : "bf16");
  return 0;
}

}  // namespace

Verb add_synth(CLI::App& app) {
  auto o = std::make_shared<SynthOptions>();
  CLI::App* cmd = app.add_subcommand("synth", "write a random-weight checkpoint with a real model's shapes");
  cmd->add_option("--like", o->like, "qwen3-0.6b | qwen3-4b | llama-3.1-8b | gemma3-1b | qwen3.5-0.8b")->required();
  cmd->add_option("--bits", o->bits, "2, 4, 8, or 16 for bf16")->capture_default_str();
  cmd->add_option("--group-size", o->group_size, "32, 64 or 128")->capture_default_str();
  cmd->add_option("--out", o->out, "output directory")->required();
  cmd->add_option("--seed", o->seed, "random seed")->capture_default_str();
  cmd->add_option("--vocab-size", o->vocab, "a vocabulary of this size instead of the model's (e.g. a tokenizer's)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24));
  cmd->add_option("--lora-rank", o->lora_rank,
                  "write a random mlx-lm LoRA adapter of this rank (all seven targets) instead of a checkpoint");
  cmd->add_option("--lora-scale", o->lora_scale, "the adapter's scale (with --lora-rank)")->capture_default_str();
  return {cmd, [o] { return synth(*o); }};
}

}  // namespace lathe::cli
