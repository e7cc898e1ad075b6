// LoRA on CUDA: the residual op (uniform and per-token slots) against the CPU, and model parity with adapters
// mounted (f32 activations: the CPU's bound against the adapters' reference logits; bf16: same argmax at ≥ 90%
// of positions), including decode steps (the fused q|k|v and gate|up GEMVs with the gathered residual kernels,
// replayed from captured graphs) and unmount restoring the base logits exactly.
#include "common/fixture_reference.h"
#include "cuda/cuda_test_util.h"
#include "lora/adapter_manager.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

std::string adapters_dir(const std::string& name) { return test::fixtures_dir() + "/adapters/" + name; }

std::shared_ptr<lora::LinearSites> one_site() {
  auto s = std::make_shared<lora::LinearSites>();
  s->add("model.layers.0.self_attn.q_proj", 64, 64);
  s->add("model.layers.1.self_attn.q_proj", 64, 64);
  return s;
}

std::vector<float> residual(lora::AdapterManager& m, const std::vector<int32_t>& token_slots, const Tensor& x,
                            Device d) {
  lora::ForwardContext ctx{m.snapshot(), -1, token_slots, {}};
  Tensor y = Tensor::zeros({x.dim(0), 64}, DType::F32, d);
  const Tensor xd = d == Device::CPU ? x : x.to(d);
  const lora::ScopedContext s(&ctx);
  lora::add_residual(m.sites().find("model.layers.1.self_attn.q_proj"), xd, y);
  return y.to_floats();
}

TEST(LoraCuda, ResidualMatchesCpu) {
  LATHE_REQUIRE_GPU();
  lora::AdapterManager cpu(one_site(), Device::CPU, DType::F32), gpu(one_site(), Device::CUDA, DType::F32);
  for (auto* m : {&cpu, &gpu}) {
    m->mount("alpha", adapters_dir("qwen3-alpha"));
    m->mount("beta", adapters_dir("qwen3-beta"));
  }
  const int a = cpu.resolve("alpha").slot, ab = cpu.resolve("alpha+beta").slot;
  ASSERT_EQ(gpu.resolve("alpha").slot, a);
  ASSERT_EQ(gpu.resolve("alpha+beta").slot, ab);
  const Tensor x = Tensor::from_floats(random_floats(5 * 64, 7), {5, 64});
  for (const auto& slots : std::vector<std::vector<int32_t>>{{a, a, a, a, a}, {ab, -1, a, ab, -1}}) {
    const auto want = residual(cpu, slots, x, Device::CPU), got = residual(gpu, slots, x, Device::CUDA);
    EXPECT_LE(max_abs_diff(got, want), 1e-4f * std::max(1.0f, max_abs(want)));
    EXPECT_GT(max_abs(want), 0.0f);
  }
}

// The gathered kernels (lora_residual.cu) serve F32 and BF16 factors; a token's residual is the same bits
// whether it runs alone or beside tokens on other slots (or none), as batched serving needs.
TEST(LoraCuda, GatheredRowsEqualSoloRowsBitwise) {
  LATHE_REQUIRE_GPU();
  lora::AdapterManager cpu(one_site(), Device::CPU, DType::F32);
  cpu.mount("alpha", adapters_dir("qwen3-alpha"));
  cpu.mount("beta", adapters_dir("qwen3-beta"));
  const int a = cpu.resolve("alpha").slot, ab = cpu.resolve("alpha+beta").slot;
  const std::vector<int32_t> slots{ab, -1, a, ab, -1, a};
  const Tensor x = Tensor::from_floats(random_floats(6 * 64, 11), {6, 64});
  const auto want = residual(cpu, slots, x, Device::CPU);
  for (const DType dt : {DType::F32, DType::BF16}) {
    lora::AdapterManager gpu(one_site(), Device::CUDA, dt);
    gpu.mount("alpha", adapters_dir("qwen3-alpha"));
    gpu.mount("beta", adapters_dir("qwen3-beta"));
    ASSERT_EQ(gpu.resolve("alpha").slot, a);
    ASSERT_EQ(gpu.resolve("alpha+beta").slot, ab);
    const auto all = residual(gpu, slots, x, Device::CUDA);
    const float tol = dt == DType::F32 ? 1e-4f : 2e-2f;
    EXPECT_LE(max_abs_diff(all, want), tol * std::max(1.0f, max_abs(want))) << dtype_name(dt);
    for (int64_t t = 0; t < 6; ++t) {
      const Tensor xt =
          Tensor::from_floats(std::vector<float>(x.data<float>() + t * 64, x.data<float>() + (t + 1) * 64), {1, 64});
      const auto solo = residual(gpu, {slots[static_cast<size_t>(t)]}, xt, Device::CUDA);
      for (int64_t n = 0; n < 64; ++n)
        ASSERT_EQ(solo[static_cast<size_t>(n)], all[static_cast<size_t>(t * 64 + n)])
            << dtype_name(dt) << " token " << t << " column " << n;
    }
  }
}

TEST(LoraCuda, ModelParityWithAdapters) {
  LATHE_REQUIRE_GPU();
  for (const std::string arch : {"qwen3", "gemma3"}) {
    const auto ref = nlohmann::json::parse(read_text_file(adapters_dir(arch + "-reference") + "/reference.json"));
    const auto refs = SafetensorsFile::open(adapters_dir(arch + "-reference") + "/reference.safetensors");
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    for (const DType dt : {DType::F32, DType::BF16}) {
      LoadOptions lo;
      lo.device = Device::CUDA;
      lo.dtype = dt;
      auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
      lora::AdapterManager m(*model);
      m.mount("alpha", adapters_dir(arch + "-alpha"));
      m.mount("beta", adapters_dir(arch + "-beta"));
      m.mount("peft", adapters_dir(arch + "-alpha-peft"));
      auto run = [&](const std::string& spec, bool stepwise) {
        const auto sel = m.resolve(spec);
        const auto ctx = sel.context();
        const lora::ScopedContext s(sel.slot >= 0 ? &ctx : nullptr);
        CacheList c = model->make_cache();
        if (!stepwise) return testing::stack_rows({model->forward(prompt, c, true)});
        std::vector<Tensor> rows;
        // A replayed decode graph returns the same output tensor every step: copy each step's logits out.
        for (int32_t t : prompt) rows.push_back(model->forward({t}, c, false).to(Device::CPU));
        return testing::stack_rows(rows);
      };
      const Tensor base = run("none", false);
      for (const auto& [spec, key] : std::vector<std::pair<std::string, std::string>>{
               {"alpha", "alpha"}, {"beta", "beta"}, {"alpha+beta", "alpha+beta"}, {"peft", "alpha"}}) {
        for (bool stepwise : {false, true}) {
          const testing::Diff d = testing::compare_logits(run(spec, stepwise), refs->get("logits_chat_" + key));
          if (dt == DType::F32)
            EXPECT_TRUE(d.ok_up_to_near_ties())
                << arch << " " << spec << " stepwise " << stepwise << ": max |diff| " << d.max_abs << ", "
                << d.rows - d.argmax_agree - d.near_ties << " argmax flips beyond near ties";
          else
            EXPECT_GE(d.argmax_agree * 10, d.rows * 9) << arch << " " << spec << " bf16 stepwise " << stepwise;
        }
      }
      m.unmount("alpha");
      m.unmount("beta");
      m.unmount("peft");
      EXPECT_EQ(run("none", false).to_floats(), base.to_floats()) << arch;
    }
  }
}

}  // namespace
}  // namespace lathe
