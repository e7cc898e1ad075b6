// Forward + backward of the LoRA gradient engine (src/lab/train; CPU, or CUDA with --cuda 1) on a synthetic
// qwen3-shaped checkpoint (random weights, 4-bit g64 or bf16, shape from flags), LoRA on all seven targets of
// every layer. Prints one JSON line: tokens/s of a training step (forward + backward), the process's peak RSS and,
// on CUDA, the device allocator's peak (reserved: what the process holds on the GPU beyond its context).
//   train_step [--hidden 512] [--inter 1536] [--layers 4] [--heads 8] [--kv-heads 4] [--head-dim 64]
//              [--vocab 8192] [--seq 256] [--batch 1] [--rank 16] [--bits 4|0] [--steps 3] [--mixed 0]
//              [--cuda 0|1] [--bf16 0|1 (CUDA: matmuls on bf16 tensor cores)]
// Qwen3-4B's shape: --hidden 2560 --inter 9728 --layers 36 --heads 32 --kv-heads 8 --head-dim 128 --vocab 151936.
// --mixed N: instead, N short examples (8 .. seq/2 tokens, seeded) as one micro-batch laid out three ways, one
// line each: padded to the longest (pad tokens computed, no loss), ragged (each at its own length) and packed
// (train_packing.h, rows of seq tokens); tokens/s counts real tokens only.
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>

#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/lora_engine_cuda.h"
#include "lab/train/train_losses.h"
#include "lab/train/train_packing.h"
#include "model/model.h"
#include "tensor/device_memory.h"
#include "tensor/thread_pool.h"

namespace {

using lathe::DType;
using lathe::Tensor;

uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

void add_random(lathe::SafetensorsWriter& w, const std::string& name, DType dt, const lathe::Shape& shape, float scale,
                uint32_t seed) {
  w.add(name, dt, shape, [dt, shape, scale, seed](void* dst) {
    std::mt19937 g(seed);
    std::normal_distribution<float> d(0.0f, scale);
    const int64_t n = lathe::shape_numel(shape);
    if (dt == DType::U32) {
      for (int64_t i = 0; i < n; ++i) static_cast<uint32_t*>(dst)[i] = g();
    } else if (dt == DType::BF16) {
      for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = to_bf16(d(g));
    } else {
      for (int64_t i = 0; i < n; ++i) static_cast<float*>(dst)[i] = 1.0f + d(g);
    }
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, int64_t> f{{"hidden", 512},  {"inter", 1536}, {"layers", 4}, {"heads", 8}, {"kv-heads", 4},
                                   {"head-dim", 64}, {"vocab", 8192}, {"seq", 256},  {"batch", 1}, {"rank", 16},
                                   {"bits", 4},      {"steps", 3},    {"mixed", 0},  {"cuda", 0},  {"bf16", 0}};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || !f.count(k.substr(2))) {
      std::fprintf(stderr, "train_step: unknown flag %s\n", argv[i]);
      return 2;
    }
    f[k.substr(2)] = std::stoll(argv[i + 1]);
  }
  const int64_t H = f["hidden"], I = f["inter"], L = f["layers"], Hq = f["heads"], Hkv = f["kv-heads"],
                D = f["head-dim"], V = f["vocab"], bits = f["bits"];
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("lathe_train_step_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = {{"model_type", "qwen3"},
                        {"hidden_size", H},
                        {"intermediate_size", I},
                        {"num_hidden_layers", L},
                        {"num_attention_heads", Hq},
                        {"num_key_value_heads", Hkv},
                        {"head_dim", D},
                        {"vocab_size", V},
                        {"max_position_embeddings", 1 << 16},
                        {"rms_norm_eps", 1e-6},
                        {"rope_theta", 1000000.0},
                        {"hidden_act", "silu"},
                        {"tie_word_embeddings", true}};
  if (bits > 0) cfg["quantization"] = {{"group_size", 64}, {"bits", bits}};
  const std::string text = cfg.dump();
  lathe::write_file_atomic(dir + "/config.json", text.data(), text.size());
  lathe::SafetensorsWriter w;
  uint32_t seed = 1;
  auto linear = [&](const std::string& m, int64_t out, int64_t in) {
    if (bits > 0) {
      add_random(w, m + ".weight", DType::U32, {out, in * bits / 32}, 0, seed++);
      add_random(w, m + ".scales", DType::BF16, {out, in / 64}, 0.002f, seed++);
      add_random(w, m + ".biases", DType::BF16, {out, in / 64}, 0.01f, seed++);
    } else {
      add_random(w, m + ".weight", DType::BF16, {out, in}, 0.02f, seed++);
    }
  };
  linear("model.embed_tokens", V, H);
  add_random(w, "model.norm.weight", DType::F32, {H}, 0.01f, seed++);
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l);
    linear(p + ".self_attn.q_proj", Hq * D, H);
    linear(p + ".self_attn.k_proj", Hkv * D, H);
    linear(p + ".self_attn.v_proj", Hkv * D, H);
    linear(p + ".self_attn.o_proj", H, Hq * D);
    linear(p + ".mlp.gate_proj", I, H);
    linear(p + ".mlp.up_proj", I, H);
    linear(p + ".mlp.down_proj", H, I);
    for (const auto& [n, dim] :
         {std::pair{".input_layernorm.weight", H}, std::pair{".post_attention_layernorm.weight", H},
          std::pair{".self_attn.q_norm.weight", D}, std::pair{".self_attn.k_norm.weight", D}})
      add_random(w, p + n, DType::F32, {dim}, 0.01f, seed++);
  }
  w.write(dir + "/model.safetensors");

  int rc = 0;
  try {
    lathe::LoadOptions lo;
    lo.exact = true;
    const auto model = lathe::load_model(dir, lo);
    lathe::train::LoraParams params;
    std::mt19937 g(7);
    std::normal_distribution<float> d(0.0f, 0.01f);
    const int64_t r = f["rank"];
    const char* sites[] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                           "mlp.gate_proj",    "mlp.up_proj",      "mlp.down_proj"};
    const int64_t outs[] = {Hq * D, Hkv * D, Hkv * D, H, I, I, H}, ins[] = {H, H, H, Hq * D, H, H, I};
    for (int64_t l = 0; l < L; ++l)
      for (int s = 0; s < 7; ++s) {
        lathe::train::LoraParam p;
        p.module = "model.layers." + std::to_string(l) + "." + sites[s];
        std::vector<float> a(static_cast<size_t>(r * ins[s])), b(static_cast<size_t>(outs[s] * r));
        for (float& x : a) x = d(g);
        for (float& x : b) x = d(g);
        p.a = Tensor::from_floats(a, {r, ins[s]});
        p.b = Tensor::from_floats(b, {outs[s], r});
        p.grad_a = Tensor::zeros(p.a.shape(), DType::F32);
        p.grad_b = Tensor::zeros(p.b.shape(), DType::F32);
        p.scale = 2.0f;
        params.params.push_back(std::move(p));
      }
    std::unique_ptr<lathe::train::LoraGradientEngine> engine;
    if (f["cuda"] != 0) {
      lathe::train::CudaEngineOptions o;
      o.bf16_matmul = f["bf16"] != 0;
      engine = lathe::train::make_cuda_lora_gradient_engine(*model, params, o);
    } else {
      engine = lathe::train::make_cpu_lora_gradient_engine(*model, params);
    }
    if (f["mixed"] > 0) {
      namespace tr = lathe::train;
      std::vector<tr::Example> ex;
      std::uniform_int_distribution<int64_t> len(8, std::max<int64_t>(8, f["seq"] / 2));
      std::uniform_int_distribution<int32_t> tk(0, static_cast<int32_t>(V - 1));
      int64_t real = 0;
      for (int64_t i = 0; i < f["mixed"]; ++i) {
        tr::Example e;
        const int64_t n = len(g);
        for (int64_t j = 0; j < n; ++j) e.seq.ids.push_back(tk(g));
        e.seq.target.assign(e.seq.ids.size(), 1);
        e.seq.target[0] = 0;
        ex.push_back(std::move(e));
        real += n;
      }
      std::vector<tr::TrainSequence> ragged, padded, packed;
      size_t longest = 0;
      for (const auto& e : ex) ragged.push_back(e.seq), longest = std::max(longest, e.seq.ids.size());
      for (auto s : ragged) {
        s.ids.resize(longest, 0), s.target.resize(longest, 0);  // pad tokens: computed, never a target
        padded.push_back(std::move(s));
      }
      for (const auto& r : tr::pack_examples(ex, f["seq"])) packed.push_back(r.seq);
      for (const auto& [name, batch] :
           {std::pair{"padded", &padded}, std::pair{"ragged", &ragged}, std::pair{"packed", &packed}}) {
        double best = 1e30, loss = 0;
        int64_t computed = 0;
        for (const auto& s : *batch) computed += static_cast<int64_t>(s.ids.size());
        for (int64_t step = 0; step < f["steps"]; ++step) {
          const auto t0 = std::chrono::steady_clock::now();
          const tr::LossResult l = tr::sft_loss(engine->forward(*batch, true));
          engine->backward(l.weight);
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
          loss = l.loss;
        }
        nlohmann::json out = {{"bench", "train_step_mixed"},
                              {"layout", name},
                              {"threads", lathe::num_threads()},
                              {"shape", f},
                              {"examples", ex.size()},
                              {"rows", batch->size()},
                              {"real_tokens", real},
                              {"computed_tokens", computed},
                              {"tokens_per_s", static_cast<double>(real) / best},
                              {"best_step_s", best},
                              {"loss", loss}};
        std::printf("%s\n", out.dump().c_str());
        std::fflush(stdout);
      }
      std::filesystem::remove_all(dir);
      return 0;
    }
    std::vector<lathe::train::TrainSequence> batch(static_cast<size_t>(f["batch"]));
    std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(V - 1));
    for (auto& s : batch) {
      for (int64_t j = 0; j < f["seq"]; ++j) s.ids.push_back(tok(g));
      s.target.assign(s.ids.size(), 1);
      s.target[0] = 0;
    }
    double best = 1e30, loss = 0;
    for (int64_t step = 0; step < f["steps"]; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const auto lp = engine->forward(batch, true);
      engine->backward(std::vector<double>(batch.size(), -1.0 / static_cast<double>(batch.size() * (f["seq"] - 1))));
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      best = std::min(best, dt);
      loss = -lp.sum_logp[0] / static_cast<double>(lp.n_targets[0]);
    }
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json out = {{"bench", "train_step"},
                          {"threads", lathe::num_threads()},
                          {"shape", f},
                          {"tokens_per_s", static_cast<double>(batch.size() * f["seq"]) / best},
                          {"best_step_s", best},
                          {"loss", loss},
                          {"peak_rss_mib", static_cast<double>(ru.ru_maxrss) / 1024.0}};
    if (f["cuda"] != 0) {
      const lathe::DeviceMemoryStats m = lathe::device_memory_stats();
      out["device_peak_reserved_gib"] = static_cast<double>(m.peak_reserved_bytes) / (1 << 30);
      out["device_peak_in_use_gib"] = static_cast<double>(m.peak_in_use_bytes) / (1 << 30);
    }
    std::printf("%s\n", out.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step: %s\n", e.what());
    rc = 1;
  }
  std::filesystem::remove_all(dir);
  return rc;
}
