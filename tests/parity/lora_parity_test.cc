// LoRA parity: `lathe run --adapter … --logits-out` on the fixture bases against the adapters' reference
// logits (alpha, beta, alpha+beta, alpha in PEFT layout), and unmounting restores the base logits exactly.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "common/fixture_reference.h"
#include "lora/adapter_manager.h"
#include "model/model.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

std::string adapters_dir(const std::string& name) { return test::fixtures_dir() + "/adapters/" + name; }

struct LoraCase {
  std::string arch;                   // qwen3 / gemma3
  std::vector<std::string> adapters;  // stacked in order
  std::string reference;              // logits_chat_<reference>
};

class LoraParity : public ::testing::TestWithParam<LoraCase> {};

TEST_P(LoraParity, RunWithAdaptersMatchesReference) {
  const LoraCase& c = GetParam();
  const auto ref = nlohmann::json::parse(read_text_file(adapters_dir(c.arch + "-reference") + "/reference.json"));
  const auto refs = SafetensorsFile::open(adapters_dir(c.arch + "-reference") + "/reference.safetensors");
  const std::string base = ref["base"].get<std::string>();
  std::string ids;
  for (int32_t t : ref["prompt"].get<std::vector<int32_t>>()) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(t);
  }
  const std::string out = (std::filesystem::temp_directory_path() /
                           ("lathe_lora_parity_" + std::to_string(::getpid()) + "_" + c.reference + ".safetensors"))
                              .string();
  std::string cmd = std::string(LATHE_BINARY) + " run --model " + test::model_dir(base) + " --ids " + ids +
                    " --max-tokens 1 --exact --logits-out " + out;  // the f32 kernels: the reference's arithmetic
  for (const auto& a : c.adapters) cmd += " --adapter " + adapters_dir(c.arch + "-" + a);
  cmd += " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const auto got = SafetensorsFile::open(out);
  const testing::Diff d = testing::compare_logits(got->get("logits"), refs->get("logits_chat_" + c.reference));
  std::filesystem::remove(out);
  EXPECT_TRUE(d.ok()) << "max |diff| " << d.max_abs << " (max |ref| " << d.max_ref << "), argmax " << d.argmax_agree
                      << "/" << d.rows;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraParity,
                         ::testing::Values(LoraCase{"qwen3", {"alpha"}, "alpha"}, LoraCase{"qwen3", {"beta"}, "beta"},
                                           LoraCase{"qwen3", {"alpha", "beta"}, "alpha+beta"},
                                           LoraCase{"qwen3", {"alpha-peft"}, "alpha"},
                                           LoraCase{"gemma3", {"alpha"}, "alpha"}, LoraCase{"gemma3", {"beta"}, "beta"},
                                           LoraCase{"gemma3", {"alpha", "beta"}, "alpha+beta"},
                                           LoraCase{"gemma3", {"alpha-peft"}, "alpha"}),
                         [](const auto& info) {
                           std::string n = info.param.arch;
                           for (const auto& a : info.param.adapters) n += "_" + a;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// The CPU default path keeps factors in BF16 (lora/cpu_residual.h). Held to the bound of the CUDA BF16 path
// (argmax on ≥ 90% of the positions), on the default base kernels (int8 activations) and on the exact ones; on
// the exact ones also to 1e-2 of the logits' scale (BF16 keeps 8 mantissa bits: the F32 bound, 1e-3, is for
// F32 factors; measured 0.85e-2 on qwen3 alpha, whose factors are large).
TEST(LoraParity, CpuBf16FactorsWithinTheBound) {
  for (const std::string arch : {"qwen3", "gemma3"}) {
    const auto ref = nlohmann::json::parse(read_text_file(adapters_dir(arch + "-reference") + "/reference.json"));
    const auto refs = SafetensorsFile::open(adapters_dir(arch + "-reference") + "/reference.safetensors");
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    for (const bool exact_base : {true, false}) {
      LoadOptions lo;
      lo.exact = exact_base;
      auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
      lora::AdapterManager m(model->linear_sites(), Device::CPU, DType::F32, /*cpu_bf16=*/true);
      m.mount("alpha", adapters_dir(arch + "-alpha"));
      m.mount("beta", adapters_dir(arch + "-beta"));
      for (const std::string spec : {"alpha", "beta", "alpha+beta"}) {
        const auto sel = m.resolve(spec);
        const auto ctx = sel.context();
        const lora::ScopedContext s(&ctx);
        CacheList c = model->make_cache();
        const testing::Diff d =
            testing::compare_logits(model->forward(prompt, c, true), refs->get("logits_chat_" + spec));
        EXPECT_GE(d.argmax_agree * 10, d.rows * 9) << arch << " " << spec << " exact base " << exact_base;
        if (exact_base) {
          EXPECT_LE(d.max_abs, 1e-2 * std::max(1.0, d.max_ref))
              << arch << " " << spec << ": max |diff| " << d.max_abs << " (max |ref| " << d.max_ref << ")";
        }
      }
    }
  }
}

TEST(LoraParity, UnmountRestoresBaseLogitsExactly) {
  for (const std::string arch : {"qwen3", "gemma3"}) {
    const auto ref = nlohmann::json::parse(read_text_file(adapters_dir(arch + "-reference") + "/reference.json"));
    const auto prompt = ref["prompt"].get<std::vector<int32_t>>();
    LoadOptions exact;
    exact.exact = true;  // the f32 kernels, as the parity suites use
    auto model = load_model(test::model_dir(ref["base"].get<std::string>()), exact);
    lora::AdapterManager m(*model);
    auto logits = [&](const std::string& spec) {
      const auto sel = m.resolve(spec);
      const auto ctx = sel.context();
      const lora::ScopedContext s(sel.slot >= 0 ? &ctx : nullptr);
      CacheList c = model->make_cache();
      return model->forward(prompt, c, true).to_floats();
    };
    const auto before = logits("none");
    m.mount("alpha", adapters_dir(arch + "-alpha"));
    m.set_default("alpha");
    const auto with = logits("");
    EXPECT_NE(with, before) << arch;
    m.unmount("alpha");
    EXPECT_EQ(logits(""), before) << arch;
    // The base matches the model's own reference (so the comparison above is against the real base).
    const auto model_ref = testing::Reference::load(ref["base"].get<std::string>());
    const testing::Diff d = testing::compare_logits(
        Tensor::from_floats(before, {static_cast<int64_t>(prompt.size()), model->config().vocab_size}),
        model_ref.logits_of("chat"));
    EXPECT_TRUE(d.ok()) << arch << " base max |diff| " << d.max_abs;
  }
}

}  // namespace
}  // namespace lathe
