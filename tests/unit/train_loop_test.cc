// The trainer's machinery ([train] #19): data formats and errors, batch plans, the loss weights against finite
// differences, AdamW / schedule / clipping, LoRA init, the adapter folder round trip through lora::read_adapter,
// and the loop itself on a bigram test engine: it learns, accumulation and clipping behave, and a run stopped
// and resumed from its checkpoint ends bit-identical to an uninterrupted one.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <set>

#include "chat/chat_template.h"
#include "common/error.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "lab/train/adapter_writer.h"
#include "lab/train/lora_init.h"
#include "lab/train/lr_schedule.h"
#include "lab/train/optimizer.h"
#include "lab/train/train_checkpoint.h"
#include "lab/train/train_config.h"
#include "lab/train/train_data.h"
#include "lab/train/train_losses.h"
#include "lab/train/trainer.h"
#include "lora/adapter_file.h"
#include "support/test_dir.h"
#include "support/text_codec_util.h"
#include "train_test_engine.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;
using train::Example;
using train::RowFormat;
using ojson = nlohmann::ordered_json;

constexpr int64_t kVocab = 32;

using testutil::test_codec;

// A per-test directory under the temp dir.
struct ScratchDir : testutil::TestDir {
  ScratchDir() : TestDir("train") {}
};

void write_lines(const std::string& path, const std::vector<std::string>& lines) {
  std::ofstream out(path);
  for (const auto& l : lines) out << l << "\n";
}

size_t first_target(const train::TrainSequence& s) {
  for (size_t j = 0; j < s.target.size(); ++j)
    if (s.target[j]) return j;
  return s.target.size();
}

// ---------------------------------------------------------------- data

TEST(TrainData, DetectsEachFormatAndMasksTheLoss) {
  const auto codec = test_codec();
  bool trunc = false;
  const Example t = train::parse_row(R"({"text": "abc"})", "f:1", codec, 512, false, &trunc);
  EXPECT_EQ(t.format, RowFormat::Text);
  EXPECT_EQ(t.seq.ids.size(), 4u);
  EXPECT_EQ(first_target(t.seq), 1u);  // every token after BOS

  const Example pc = train::parse_row(R"({"prompt": "Q?", "completion": "yes"})", "f:2", codec, 512, false, &trunc);
  EXPECT_EQ(pc.format, RowFormat::PromptCompletion);
  EXPECT_EQ(pc.seq.ids.size(), 1u + 5u);
  EXPECT_EQ(first_target(pc.seq), 3u);  // BOS Q ? | y e s

  const ojson msgs =
      ojson::parse(R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]})");
  const Example m = train::parse_row(msgs.dump(), "f:3", codec, 512, false, &trunc);
  EXPECT_EQ(m.format, RowFormat::Messages);
  // "<user>hi|<assistant>" is the prompt; "ok|" is learned.
  EXPECT_EQ(first_target(m.seq), 1u + std::string("<user>hi|<assistant>").size());
  EXPECT_EQ(m.seq.ids.size(), 1u + std::string("<user>hi|<assistant>ok|").size());

  const Example p =
      train::parse_row(R"({"prompt": "Q:", "chosen": "good", "rejected": "bad"})", "f:4", codec, 512, true, &trunc);
  EXPECT_EQ(p.format, RowFormat::Preference);
  EXPECT_EQ(first_target(p.seq), 3u);
  EXPECT_EQ(first_target(p.rejected), 3u);
  EXPECT_EQ(p.seq.ids.size(), 7u);
  EXPECT_EQ(p.rejected.ids.size(), 6u);
  EXPECT_FALSE(trunc);
}

TEST(TrainData, MessagesRowsCarryTheirToolsAndToolCalls) {
  // mlx-lm's tool rows: "tools" beside "messages", an assistant turn's tool_calls with arguments as a JSON string.
  const auto codec = test_codec();
  const ojson row = ojson::parse(R"({
    "messages": [
      {"role": "user", "content": "weather?"},
      {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
      {"role": "assistant", "content": "It is sunny."}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]})");
  bool trunc = false;
  const Example m = train::parse_row(row.dump(), "f:1", codec, 512, false, &trunc);
  EXPECT_EQ(m.format, RowFormat::Messages);
  // The template saw the tools and the call's arguments as an object (tojson of a string would quote it).
  ojson parsed = row["messages"];
  parsed[1]["tool_calls"][0]["function"]["arguments"] = {{"city", "Oslo"}};
  const std::string full = codec.render(parsed, row["tools"], false);
  EXPECT_EQ(full.rfind("<tools>get_weather;|<user>weather?|<assistant>[get_weather({", 0), 0u) << full;
  EXPECT_NE(full.find("Oslo"), std::string::npos) << full;
  EXPECT_EQ(full.find("\\\""), std::string::npos) << full;
  EXPECT_EQ(m.seq.ids.size(), 1u + full.size());
  // Only the last assistant turn is learned: everything up to its generation prompt is context.
  const std::string answer = "It is sunny.|";
  EXPECT_EQ(first_target(m.seq), 1u + full.size() - answer.size());

  bool t2 = false;
  ojson no_tools = row;
  no_tools.erase("tools");
  EXPECT_LT(train::parse_row(no_tools.dump(), "f:2", codec, 512, false, &t2).seq.ids.size(), m.seq.ids.size());
  for (const char* bad : {R"("tools": 5)", R"("tools": [{"type": "function"}])"}) {
    const std::string line =
        std::string(R"({"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], )") +
        bad + "}";
    EXPECT_THROW(train::parse_row(line, "f:3", codec, 512, false, &t2), Error) << line;
  }
  ojson bad_args = row;
  bad_args["messages"][1]["tool_calls"][0]["function"]["arguments"] = "{oops";
  EXPECT_THROW(train::parse_row(bad_args.dump(), "f:4", codec, 512, false, &t2), Error);
}

TEST(TrainData, TruncatesSftOnTheRightAndPreferenceOnTheLeft) {
  const auto codec = test_codec();
  bool trunc = false;
  const Example t = train::parse_row(R"({"prompt": "abcdef", "completion": "xyz"})", "f:1", codec, 8, false, &trunc);
  EXPECT_TRUE(trunc);
  EXPECT_EQ(t.seq.ids.size(), 8u);
  EXPECT_EQ(first_target(t.seq), 7u);
  trunc = false;
  const Example p =
      train::parse_row(R"({"prompt": "abcdef", "chosen": "xyz", "rejected": "uv"})", "f:1", codec, 6, true, &trunc);
  EXPECT_TRUE(trunc);
  ASSERT_EQ(p.seq.ids.size(), 6u);
  EXPECT_EQ(p.seq.ids.back(), codec.encode("z").back());  // the response survives, the prompt head goes
  EXPECT_EQ(first_target(p.seq), 3u);
  EXPECT_EQ(first_target(p.rejected), 4u);
}

TEST(TrainData, BadRowsNameFileAndLine) {
  ScratchDir d;
  write_lines(d.str("train.jsonl"), {R"({"text": "ok"})", "", R"({"prompt": "no completion"})"});
  try {
    train::load_jsonl(d.str("train.jsonl"), test_codec(), 512, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument);
    EXPECT_NE(std::string(e.what()).find("train.jsonl:3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("completion"), std::string::npos) << e.what();
  }
  for (const std::string bad :
       {"{not json", "[1,2]", R"({"foo": 1})", R"({"text": 5})", R"({"messages": [{"role": "user", "content": "x"}]})",
        R"({"prompt": "a", "chosen": "b", "rejected": "c"})"}) {
    write_lines(d.str("train.jsonl"), {bad});
    EXPECT_THROW(train::load_jsonl(d.str("train.jsonl"), test_codec(), 512, false), Error) << bad;
  }
  write_lines(d.str("train.jsonl"), {R"({"text": "plain"})"});
  EXPECT_THROW(train::load_jsonl(d.str("train.jsonl"), test_codec(), 512, true), Error);  // DPO needs pairs
  EXPECT_THROW(train::load_dataset(d.str("missing"), test_codec(), 512, false), Error);
  EXPECT_EQ(train::inspect_format(d.str("train.jsonl")), "text");
}

TEST(TrainData, BatchPlanIsDeterministicBucketedAndCoversEveryBatch) {
  std::vector<Example> ex(10);
  for (size_t i = 0; i < ex.size(); ++i) ex[i].seq.ids.assign((i * 7) % 10 + 2, 1);
  const train::BatchPlan a(ex, 3, 5), b(ex, 3, 5), c(ex, 3, 6);
  EXPECT_EQ(a.batches_per_epoch(), 3);  // the tail of one is dropped
  bool differs = false;
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_EQ(a.batch(i), b.batch(i));
    differs = differs || a.batch(i) != c.batch(i);
    const auto w = a.batch(i);
    for (size_t k = 1; k < w.size(); ++k) EXPECT_LE(ex[w[k - 1]].length(), ex[w[k]].length());
  }
  EXPECT_TRUE(differs);
  std::set<std::vector<size_t>> epoch;
  for (int64_t i = 3; i < 6; ++i) epoch.insert(a.batch(i));
  EXPECT_EQ(epoch.size(), 3u);
}

// ---------------------------------------------------------------- losses

using LossFn = std::function<train::LossResult(const train::SequenceLogProbs&)>;

void check_weights_by_finite_differences(const LossFn& f, train::SequenceLogProbs lp) {
  const train::LossResult r = f(lp);
  for (size_t i = 0; i < lp.sum_logp.size(); ++i) {
    const double h = 1e-5;
    auto up = lp, down = lp;
    up.sum_logp[i] += h;
    down.sum_logp[i] -= h;
    const double fd = (f(up).loss - f(down).loss) / (2 * h);
    EXPECT_NEAR(r.weight[i], fd, 1e-6 + 1e-5 * std::fabs(fd)) << "sequence " << i;
  }
}

TEST(TrainLosses, WeightsMatchFiniteDifferences) {
  train::SequenceLogProbs two{{-12.5, -3.0}, {5, 2}};
  check_weights_by_finite_differences([](const auto& l) { return train::sft_loss(l); }, two);
  EXPECT_NEAR(train::sft_loss(two).loss, 15.5 / 7, 1e-12);

  const train::SequenceLogProbs ref{{-10.0, -9.0, -4.0, -6.0}, {4, 3, 4, 3}};
  train::SequenceLogProbs pol{{-8.0, -9.5, -5.0, -5.5}, {4, 3, 4, 3}};
  check_weights_by_finite_differences([&](const auto& l) { return train::dpo_loss(l, ref, 0.1); }, pol);
  const auto d = train::dpo_loss(pol, ref, 0.1);
  EXPECT_NEAR(d.margin, (0.3 - 0.1) / 2, 1e-12);
  EXPECT_DOUBLE_EQ(d.accuracy, 0.5);  // pair 0 adv +0.3, pair 1 adv -0.1
  EXPECT_NEAR(d.loss, (train::softplus(-0.3) + train::softplus(0.1)) / 2, 1e-12);

  check_weights_by_finite_differences([](const auto& l) { return train::orpo_loss(l, 0.1, false); }, pol);
  train::SequenceLogProbs three{{-8.0, -9.5, -5.0, -5.5, -20.0, -18.0}, {4, 3, 4, 3, 9, 8}};
  check_weights_by_finite_differences([](const auto& l) { return train::orpo_loss(l, 0.5, true); }, three);
}

TEST(TrainLosses, StableHelpers) {
  EXPECT_NEAR(train::log1mexp(-1e-10), std::log(1e-10), 1e-6);
  EXPECT_NEAR(train::log1mexp(-50), -std::exp(-50.0), 1e-30);
  EXPECT_NEAR(train::softplus(800), 800, 1e-9);
  EXPECT_NEAR(train::sigmoid(-800), 0, 1e-300);
}

// ---------------------------------------------------------------- optimizer, schedule, init

train::LoraParams one_param(std::vector<float> a, std::vector<float> g) {
  train::LoraParams p;
  train::LoraParam q;
  q.module = "m";
  const int64_t n = static_cast<int64_t>(a.size());
  q.a = Tensor::from_floats(a, {1, n});
  q.grad_a = Tensor::from_floats(g, {1, n});
  q.b = Tensor::zeros({1, 1}, DType::F32);
  q.grad_b = Tensor::zeros({1, 1}, DType::F32);
  p.params.push_back(std::move(q));
  return p;
}

TEST(TrainOptimizer, AdamWStepsMatchTheFormula) {
  train::LoraParams p = one_param({1.0f, -2.0f}, {0.5f, -0.25f});
  train::AdamW opt(p, {});
  opt.step(p, 0.1);
  // Step 1 with bias correction: m_hat = g, v_hat = g^2, so the update is lr * sign(g) (eps aside), after decay.
  EXPECT_NEAR(p.params[0].a.data<float>()[0], 1.0 * (1 - 0.1 * 0.01) - 0.1, 1e-6);
  EXPECT_NEAR(p.params[0].a.data<float>()[1], -2.0 * (1 - 0.1 * 0.01) + 0.1, 1e-6);
  opt.step(p, 0.1);  // same grad again: the same unit step
  EXPECT_NEAR(p.params[0].a.data<float>()[0], (0.999 - 0.1) * 0.999 - 0.1, 1e-5);
  EXPECT_EQ(opt.steps(), 2);
}

// LoRA+: two param groups. With the same grads, B moves ratio times as far as with ratio 1 (decay included) and
// A moves exactly as with ratio 1.
TEST(TrainOptimizer, LoraPlusScalesOnlyTheBStep) {
  const auto make = [] {
    train::LoraParams p = one_param({0.7f, -1.3f}, {0.5f, -0.25f});
    p.params[0].b = Tensor::from_floats({0.4f, -0.9f}, {2, 1});
    p.params[0].grad_b = Tensor::from_floats({-0.3f, 0.05f}, {2, 1});
    return p;
  };
  const auto moved = [](const Tensor& before, const Tensor& after) {
    std::vector<double> d;
    for (int64_t i = 0; i < before.numel(); ++i) d.push_back(after.data<float>()[i] - before.data<float>()[i]);
    return d;
  };
  const train::LoraParams start = make();
  train::LoraParams base = make(), plus = make();
  train::AdamWOptions o;
  train::AdamW opt_base(base, o);
  o.lora_plus_ratio = 16;
  train::AdamW opt_plus(plus, o);
  opt_base.step(base, 1e-3);  // one step: after it B differs, so later decay terms would differ too
  opt_plus.step(plus, 1e-3);
  const auto db = moved(start.params[0].b, base.params[0].b), dp = moved(start.params[0].b, plus.params[0].b);
  for (size_t i = 0; i < db.size(); ++i) {
    ASSERT_NE(db[i], 0.0);
    EXPECT_NEAR(dp[i] / db[i], 16.0, 16.0 * 1e-4) << i;
  }
  for (int64_t i = 0; i < start.params[0].a.numel(); ++i)
    EXPECT_EQ(plus.params[0].a.data<float>()[i], base.params[0].a.data<float>()[i]) << i;
  // Bad ratios are refused with a message naming the option.
  for (double bad : {0.0, -1.0, std::numeric_limits<double>::infinity(), std::nan("")}) {
    o.lora_plus_ratio = bad;
    try {
      train::AdamW opt(base, o);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("lora_plus_ratio"), std::string::npos);
    }
  }
}

TEST(TrainOptimizer, ClippingReportsThePreClipNorm) {
  train::LoraParams p = one_param({0, 0}, {3, 4});
  EXPECT_DOUBLE_EQ(train::clip_grad_norm(p, 1.0), 5.0);
  EXPECT_NEAR(train::global_grad_norm(p), 1.0, 1e-6);
  EXPECT_NEAR(train::clip_grad_norm(p, 10.0), 1.0, 1e-6);  // under the limit: untouched
  EXPECT_NEAR(p.params[0].grad_a.data<float>()[1], 0.8, 1e-6);
}

TEST(TrainOptimizer, WarmupThenCosine) {
  train::LrSchedule s;
  s.kind = "cosine", s.peak = 1.0, s.warmup = 10, s.iters = 110;
  EXPECT_DOUBLE_EQ(s.at(1), 0.1);
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);
  EXPECT_NEAR(s.at(60), 0.55, 1e-12);  // half way down to 0.1
  EXPECT_NEAR(s.at(110), 0.1, 1e-12);
  train::LrSchedule c;
  c.peak = 2e-4;
  EXPECT_DOUBLE_EQ(c.at(1), 2e-4);
  EXPECT_DOUBLE_EQ(c.at(99), 2e-4);
}

TEST(TrainLoraInit, UniformAZeroBTargetsAndLastLayers) {
  lora::LinearSites sites;
  for (int l = 0; l < 4; ++l) {
    sites.add("model.layers." + std::to_string(l) + ".self_attn.q_proj", 8, 16);
    sites.add("model.layers." + std::to_string(l) + ".mlp.down_proj", 16, 32);
  }
  sites.add("lm_head", 100, 16);
  train::LoraSpec spec;
  spec.rank = 4, spec.num_layers = 2, spec.target_modules = {"q_proj"}, spec.seed = 3;
  const auto p = train::init_lora(sites, spec);
  ASSERT_EQ(p.params.size(), 2u);
  EXPECT_EQ(p.params[0].module, "model.layers.2.self_attn.q_proj");
  EXPECT_EQ(p.params[0].a.shape(), (Shape{4, 16}));
  EXPECT_EQ(p.params[0].b.shape(), (Shape{8, 4}));
  const float bound = 1.0f / 4.0f;
  double mean = 0;
  for (int64_t i = 0; i < 64; ++i) {
    const float v = p.params[0].a.data<float>()[i];
    EXPECT_LE(std::fabs(v), bound);
    mean += v / 64;
  }
  EXPECT_LT(std::fabs(mean), 0.1);
  for (int64_t i = 0; i < 32; ++i) EXPECT_EQ(p.params[0].b.data<float>()[i], 0.0f);
  const auto again = train::init_lora(sites, spec);
  EXPECT_EQ(0, std::memcmp(again.params[1].a.raw(), p.params[1].a.raw(), p.params[1].a.nbytes()));
  spec.rs_lora = true, spec.scale = 2.0f;
  EXPECT_FLOAT_EQ(train::init_lora(sites, spec).params[0].scale, 1.0f);
  spec.target_modules = {"nope"};
  EXPECT_THROW(train::init_lora(sites, spec), Error);
}

// ---------------------------------------------------------------- adapter folder

TEST(TrainAdapter, RoundTripsThroughTheAdapterReader) {
  ScratchDir d;
  lora::LinearSites sites;
  sites.add("model.layers.0.self_attn.q_proj", 6, 10);
  sites.add("model.layers.0.mlp.up_proj", 12, 10);
  train::TrainConfig cfg;
  cfg.model_dir = "/models/qwen3", cfg.lora.rank = 3, cfg.lora.scale = 2.5f;
  train::LoraParams p = train::init_lora(sites, cfg.lora);
  for (auto& q : p.params)
    for (int64_t i = 0; i < q.b.numel(); ++i) q.b.data<float>()[i] = 0.01f * static_cast<float>(i);
  train::write_adapter(d.str("out"), cfg, p);
  const lora::AdapterWeights w = lora::read_adapter(d.str("out"));
  EXPECT_EQ(w.config.format, "mlx-lm");
  EXPECT_EQ(w.config.rank, 3);
  EXPECT_FLOAT_EQ(w.config.scale, 2.5f);
  EXPECT_EQ(w.config.base_model, "/models/qwen3");
  ASSERT_EQ(w.factors.size(), 2u);
  for (const auto& f : w.factors) {
    const train::LoraParam* q = nullptr;
    for (const auto& x : p.params)
      if (x.module == f.module) q = &x;
    ASSERT_NE(q, nullptr) << f.module;
    ASSERT_EQ(f.a.shape(), q->a.shape());
    ASSERT_EQ(f.b.shape(), q->b.shape());
    EXPECT_EQ(0, std::memcmp(f.a.contiguous().raw(), q->a.raw(), q->a.nbytes()));
    EXPECT_EQ(0, std::memcmp(f.b.contiguous().raw(), q->b.raw(), q->b.nbytes()));
  }
  const auto cfg_json = ojson::parse(read_text_file(d.str("out/adapter_config.json")));
  EXPECT_EQ(cfg_json["lora_parameters"]["rank"], 3);
  EXPECT_EQ(cfg_json["training"]["method"], "sft");
}

// rsLoRA (scale / sqrt(rank)) and plain: the written adapter reloads through the server's loader with the scale it
// was trained with, read as mlx-lm (lora_parameters.scale) and, for PEFT tools, from r / lora_alpha / use_rslora.
TEST(TrainAdapter, RsLoraReloadsWithTheTrainedScale) {
  ScratchDir d;
  lora::LinearSites sites;
  sites.add("model.layers.0.self_attn.q_proj", 6, 10);
  sites.add("model.layers.0.mlp.down_proj", 10, 12);
  struct Case {
    int64_t rank;
    float scale;
    bool rs;
    float want;
  };
  for (const Case k : {Case{8, 1.0f, true, 0.35355339f}, Case{4, 2.0f, true, 1.0f}, Case{3, 2.5f, false, 2.5f}}) {
    SCOPED_TRACE("rank " + std::to_string(k.rank) + (k.rs ? " rslora" : ""));
    train::TrainConfig cfg;
    cfg.model_dir = "/models/qwen3", cfg.lora.rank = k.rank, cfg.lora.scale = k.scale, cfg.lora.rs_lora = k.rs;
    const train::LoraParams p = train::init_lora(sites, cfg.lora);
    ASSERT_FLOAT_EQ(p.params[0].scale, k.want);
    const std::string out = d.str("r" + std::to_string(k.rank));
    train::write_adapter(out, cfg, p);
    const lora::AdapterWeights w = lora::read_adapter(out);
    ASSERT_EQ(w.factors.size(), 2u);
    for (const auto& f : w.factors) EXPECT_EQ(f.scale, p.params[0].scale) << f.module;
    // The PEFT reading of the same config: drop lora_parameters, the loader then goes by r / lora_alpha.
    auto j = ojson::parse(read_text_file(out + "/adapter_config.json"));
    EXPECT_EQ(j["use_rslora"], k.rs);
    j.erase("lora_parameters");
    const std::string peft = out + "-peft";
    fs::create_directories(peft);
    write_lines(peft + "/adapter_config.json", {j.dump()});
    fs::copy_file(out + "/adapters.safetensors", peft + "/adapter_model.safetensors");
    const lora::AdapterConfig pc = lora::read_adapter_config(peft);
    EXPECT_EQ(pc.format, "peft");
    EXPECT_EQ(pc.rslora, k.rs);
    EXPECT_EQ(pc.scale, p.params[0].scale);
  }
  // The trainer's config takes PEFT's spelling too.
  const std::string base = R"("model_dir": "m", "data_dir": "d", "adapter_path": "o")";
  EXPECT_TRUE(train::parse_train_config(ojson::parse("{" + base + R"(, "use_rslora": true})")).lora.rs_lora);
  EXPECT_THROW(train::parse_train_config(ojson::parse("{" + base + R"(, "use_rslora": true, "rs_lora": false})")),
               Error);
}

TEST(TrainConfigParse, NamesTheBadField) {
  const auto msg = [](const std::string& text) {
    try {
      train::parse_train_config(ojson::parse(text));
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  const std::string base = R"("model_dir": "m", "data_dir": "d", "adapter_path": "o")";
  EXPECT_EQ(msg("{" + base + "}"), "accepted");
  EXPECT_NE(msg("{" + base + R"(, "rnak": 4})").find("rnak"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "method": "ppo"})").find("method"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "iters": 0})").find("iters"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "batch_size": 1.5})").find("batch_size"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "target_modules": "q_proj"})").find("target_modules"), std::string::npos);
  EXPECT_NE(msg(R"({"data_dir": "d", "adapter_path": "o"})").find("model_dir"), std::string::npos);
  EXPECT_DOUBLE_EQ(train::parse_train_config(ojson::parse("{" + base + R"(, "lora_dropout": 0.05})")).lora_dropout,
                   0.05);
  EXPECT_NE(msg("{" + base + R"(, "lora_dropout": 1})").find("lora_dropout"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "lora_dropout": -0.1})").find("lora_dropout"), std::string::npos);
  EXPECT_DOUBLE_EQ(train::parse_train_config(ojson::parse("{" + base + "}")).lora_plus_ratio, 1.0);
  EXPECT_DOUBLE_EQ(train::parse_train_config(ojson::parse("{" + base + R"(, "lora_plus_ratio": 16})")).lora_plus_ratio,
                   16.0);
  EXPECT_NE(msg("{" + base + R"(, "lora_plus_ratio": 0})").find("lora_plus_ratio"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "lora_plus_ratio": -2})").find("lora_plus_ratio"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "lora_plus_ratio": "x"})").find("lora_plus_ratio"), std::string::npos);
  EXPECT_TRUE(train::parse_train_config(ojson::parse("{" + base + R"(, "pack": true})")).pack);
  EXPECT_NE(msg("{" + base + R"(, "pack": true, "method": "dpo"})").find("pack"), std::string::npos);
  EXPECT_NE(msg("{" + base + R"(, "pack": 1})").find("pack"), std::string::npos);
  EXPECT_EQ(train::parse_train_config(ojson::parse("{" + base + "}")).device, "cpu");
  EXPECT_EQ(train::parse_train_config(ojson::parse("{" + base + R"(, "device": "cuda"})")).device, "cuda");
  EXPECT_NE(msg("{" + base + R"(, "device": "gpu"})").find("device"), std::string::npos);
  const auto dpo = train::parse_train_config(ojson::parse("{" + base + R"(, "method": "dpo"})"));
  EXPECT_DOUBLE_EQ(dpo.learning_rate, 5e-5);
  EXPECT_EQ(dpo.lr_schedule, "cosine");
}

// ---------------------------------------------------------------- the loop on the bigram engine

std::vector<float> random_base(uint64_t seed) {
  train::SplitMix64 rng(seed);
  std::vector<float> b(static_cast<size_t>(kVocab * kVocab));
  for (auto& v : b) v = static_cast<float>(rng.uniform() - 0.5);
  return b;
}

// SFT task: answer every question with "yes".
void write_sft_task(const std::string& dir) {
  std::vector<std::string> train, valid;
  for (int i = 0; i < 24; ++i)
    train.push_back(R"({"prompt": "Q)" + std::to_string(i) + R"(? ", "completion": "yes."})");
  for (int i = 50; i < 56; ++i)
    valid.push_back(R"({"prompt": "Q)" + std::to_string(i) + R"(? ", "completion": "yes."})");
  write_lines(dir + "/train.jsonl", train);
  write_lines(dir + "/valid.jsonl", valid);
}

void write_pref_task(const std::string& dir) {
  std::vector<std::string> rows;
  for (int i = 0; i < 16; ++i)
    rows.push_back(R"({"prompt": "Q)" + std::to_string(i) + R"(: ", "chosen": "yes", "rejected": "no"})");
  write_lines(dir + "/train.jsonl", rows);
  write_lines(dir + "/valid.jsonl", {rows[0], rows[1], rows[2]});
}

train::TrainConfig loop_config(const ScratchDir& d, train::Method method) {
  train::TrainConfig c;
  c.model_dir = "bigram";
  c.data_dir = d.str("data");
  c.adapter_path = d.str("out");
  c.method = method;
  c.lora.rank = 4;
  c.lora.target_modules = {"q_proj"};
  c.iters = 60;
  c.learning_rate = 5e-2;
  c.steps_per_eval = 20;
  c.steps_per_report = 10;
  c.seed = 7;
  c.lora.seed = 7;
  c.lr_schedule = method == train::Method::Sft ? "constant" : "cosine";
  return c;
}

struct LoopRun {
  train::TrainSummary summary;
  train::LoraParams params;
  std::vector<ojson> events;
};

LoopRun run_loop(const train::TrainConfig& c, const train::TrainHooks& hooks = {}) {
  const lora::LinearSites sites = test::BigramLoraEngine::sites(kVocab);
  const bool pref = c.method != train::Method::Sft;
  const train::Dataset data = train::load_dataset(c.data_dir, test_codec(), c.max_seq_length, pref);
  LoopRun r;
  r.params = train::init_lora(sites, c.lora);
  test::BigramLoraEngine engine(r.params, kVocab, random_base(11));
  r.summary = train::run_training(
      c, data, r.params, engine, [&](const ojson& e) { r.events.push_back(e); }, hooks);
  return r;
}

TEST(TrainLoop, StopsEarlyOnRequestOrWhenTheValidationLossStalls) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  // A stop request after step 3: the adapter and a checkpoint of three steps, marked stopped early.
  train::TrainConfig c = loop_config(d, train::Method::Sft);
  c.iters = 1000;
  int polls = 0;
  train::TrainHooks hooks;
  hooks.stop_requested = [&] { return ++polls >= 3; };
  LoopRun r = run_loop(c, hooks);
  EXPECT_EQ(r.summary.steps, 3);
  EXPECT_TRUE(r.summary.stopped_early);
  EXPECT_EQ(r.summary.stop_reason, "stop requested");
  EXPECT_TRUE(fs::exists(d.str("out/adapters.safetensors")));
  EXPECT_TRUE(fs::exists(d.str("out/checkpoints/step-00000003")));
  EXPECT_EQ(r.summary.to_json()["stopped_early"], true);

  // A learning rate too small to move the loss: evaluations at 0 (the best), 5 and 10 bring no improvement, so
  // patience 2 stops the run at step 10.
  fs::remove_all(d.str("out"));
  c.learning_rate = 1e-12;
  c.steps_per_eval = 5;
  c.early_stop_patience = 2;
  c.save_best = true;
  r = run_loop(c);
  EXPECT_EQ(r.summary.steps, 10);
  EXPECT_EQ(r.summary.best_step, 0);  // the best adapter is the one before any step
  EXPECT_TRUE(fs::exists(d.str("out/best/adapters.safetensors")));
  EXPECT_TRUE(fs::exists(d.str("out/best/adapter_config.json")));
  EXPECT_TRUE(r.summary.stopped_early);
  EXPECT_NE(r.summary.stop_reason.find("validation loss not improved for 2 evaluations"), std::string::npos)
      << r.summary.stop_reason;
  EXPECT_EQ(r.summary.val_trajectory.size(), 3u);
  EXPECT_TRUE(fs::exists(d.str("out/adapters.safetensors")));
  // Learning, it does not stop.
  fs::remove_all(d.str("out"));
  c.learning_rate = 5e-2;
  c.iters = 60;
  c.steps_per_eval = 20;
  r = run_loop(c);
  EXPECT_EQ(r.summary.steps, 60);
  EXPECT_FALSE(r.summary.stopped_early);
  EXPECT_EQ(r.summary.best_step, 60);  // each evaluation beat the last
  EXPECT_EQ(read_text_file(d.str("out/best/adapters.safetensors")), read_text_file(d.str("out/adapters.safetensors")));
  EXPECT_EQ(train::parse_train_config(ojson::parse(R"({"model_dir": "m", "data_dir": "d", "adapter_path": "a",
      "early_stop_patience": 3})"))
                .early_stop_patience,
            3);
}

TEST(TrainLoop, SftLearnsTheTaughtAnswerAndWritesItsOutputs) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  const LoopRun r = run_loop(loop_config(d, train::Method::Sft));
  EXPECT_EQ(r.summary.steps, 60);
  ASSERT_EQ(r.summary.val_trajectory.size(), 4u);  // steps 0, 20, 40, 60
  EXPECT_LT(r.summary.last_val_loss, 0.5 * r.summary.first_val_loss)
      << r.summary.first_val_loss << " -> " << r.summary.last_val_loss;
  EXPECT_TRUE(fs::exists(d.str("out/adapters.safetensors")));
  EXPECT_NO_THROW(lora::read_adapter(d.str("out")));
  std::ifstream m(d.str("out/metrics.jsonl"));
  std::string line;
  std::vector<ojson> lines;
  while (std::getline(m, line)) lines.push_back(ojson::parse(line));
  ASSERT_GE(lines.size(), 2u);
  EXPECT_EQ(lines[0]["type"], "meta");
  EXPECT_EQ(lines[0]["method"], "sft");
  int train_metrics = 0;
  for (const auto& e : r.events)
    if (e.value("type", "") == "metric" && e.value("kind", "") == "train") {
      ++train_metrics;
      for (const char* k : {"loss", "grad_norm", "learning_rate", "tokens_per_sec", "peak_gb", "eta_s", "progress"})
        EXPECT_TRUE(e.contains(k)) << k;
      EXPECT_GT(e["tokens_per_sec"].get<double>(), 0);
    }
  EXPECT_EQ(train_metrics, 7);  // step 1 and every 10th
}

TEST(TrainLoop, DpoAndOrpoMoveTheMarginTheRightWay) {
  for (const auto method : {train::Method::Dpo, train::Method::Orpo}) {
    ScratchDir d;
    fs::create_directories(d.str("data"));
    write_pref_task(d.str("data"));
    auto c = loop_config(d, method);
    c.iters = 40;
    c.learning_rate = 2e-2;
    c.batch_size = 2;
    const LoopRun r = run_loop(c);
    EXPECT_GT(r.summary.last_margin, r.summary.first_margin + 0.5) << train::method_name(method);
  }
}

TEST(TrainLoop, GradientAccumulationAveragesMicroBatches) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  // One step of batch 1 with k = 2 applies the mean of the two micro-batches' gradients: compare with the
  // gradient the engine gives each micro-batch separately.
  auto c = loop_config(d, train::Method::Sft);
  const lora::LinearSites sites = test::BigramLoraEngine::sites(kVocab);
  const train::Dataset data = train::load_dataset(c.data_dir, test_codec(), 512, false);
  train::LoraParams p = train::init_lora(sites, c.lora);
  for (int64_t i = 0; i < p.params[0].b.numel(); ++i) p.params[0].b.data<float>()[i] = 0.01f;
  test::BigramLoraEngine e(p, kVocab, random_base(11));
  const train::BatchPlan plan(data.train, 1, c.seed);
  std::vector<float> want(static_cast<size_t>(p.params[0].grad_b.numel()), 0.0f);
  for (int64_t m = 0; m < 2; ++m) {
    train::clear_grads(p);
    const auto lr = train::sft_loss(e.forward({data.train[plan.batch(m)[0]].seq}, true));
    e.backward(lr.weight);
    for (size_t i = 0; i < want.size(); ++i) want[i] += 0.5f * p.params[0].grad_b.data<float>()[i];
  }
  train::clear_grads(p);
  for (int64_t m = 0; m < 2; ++m) {
    auto lr = train::sft_loss(e.forward({data.train[plan.batch(m)[0]].seq}, true));
    for (double& w : lr.weight) w /= 2;
    e.backward(lr.weight);
  }
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(p.params[0].grad_b.data<float>()[i], want[i], 1e-6);
}

// With and without LoRA dropout: the masks are keyed by (seed, step, micro-batch), so redoing steps 11-17 after
// the resume draws what the uninterrupted run drew.
TEST(TrainLoop, ResumeFromACheckpointIsBitIdentical) {
  for (const double p : {0.0, 0.5}) {
    SCOPED_TRACE("lora_dropout " + std::to_string(p));
    ScratchDir d;
    fs::create_directories(d.str("data"));
    write_sft_task(d.str("data"));
    auto c = loop_config(d, train::Method::Sft);
    c.iters = 30, c.save_every = 10, c.grad_accumulation_steps = 2, c.batch_size = 2, c.lora_dropout = p;
    c.adapter_path = d.str("straight");
    const LoopRun straight = run_loop(c);

    c.adapter_path = d.str("resumed");
    train::TrainHooks stop;
    stop.stop_after_step = 17;  // killed between checkpoints: steps 11-17 are redone
    run_loop(c, stop);
    ASSERT_TRUE(train::latest_checkpoint(c.adapter_path));
    EXPECT_EQ(fs::path(*train::latest_checkpoint(c.adapter_path)).filename(), "step-00000010");
    EXPECT_FALSE(fs::exists(d.str("resumed/adapters.safetensors")));
    const LoopRun resumed = run_loop(c);
    EXPECT_EQ(resumed.summary.resumed_from, 10);
    EXPECT_EQ(read_text_file(d.str("straight/adapters.safetensors")),
              read_text_file(d.str("resumed/adapters.safetensors")));
    EXPECT_EQ(straight.summary.last_val_loss, resumed.summary.last_val_loss);
    // A different seed or dropout does not silently continue someone else's run.
    auto other = c;
    other.lora_dropout = p > 0 ? 0.0 : 0.5;
    EXPECT_THROW(run_loop(other), Error);
    c.seed = 8, c.lora.seed = 8;
    EXPECT_THROW(run_loop(c), Error);
  }
}

std::vector<double> train_losses(const LoopRun& r) {
  std::vector<double> out;
  for (const auto& e : r.events)
    if (e.value("type", "") == "metric" && e.value("kind", "") == "train") out.push_back(e["loss"].get<double>());
  return out;
}

TEST(TrainLoop, LoraDropoutIsSeededAndLeavesValidationAlone) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  auto c = loop_config(d, train::Method::Sft);
  c.iters = 20, c.steps_per_report = 1, c.steps_per_eval = 10;
  const LoopRun plain = run_loop(c);
  c.lora_dropout = 0.5;
  const LoopRun a = run_loop(c), b = run_loop(c);
  EXPECT_EQ(train_losses(a), train_losses(b));  // same seed, same loss sequence
  EXPECT_NE(train_losses(a), train_losses(plain));
  EXPECT_EQ(a.summary.val_trajectory, b.summary.val_trajectory);
  // Another seed draws other masks (it also reorders the data and re-inits A: losses differ from the first step).
  c.seed = 9, c.lora.seed = 9;
  EXPECT_NE(train_losses(run_loop(c)), train_losses(a));
  // Validation runs no dropout: the same params give the same validation loss whatever lora_dropout says.
  EXPECT_EQ(a.summary.first_val_loss, plain.summary.first_val_loss);
  const train::Dataset data = train::load_dataset(c.data_dir, test_codec(), c.max_seq_length, false);
  train::LoraParams params = a.params;
  test::BigramLoraEngine engine(params, kVocab, random_base(11));
  auto c0 = c;
  c0.lora_dropout = 0;
  EXPECT_EQ(train::evaluate(c0, data.valid, engine).loss, a.summary.last_val_loss);
  EXPECT_EQ(train::evaluate(c, data.valid, engine).loss, a.summary.last_val_loss);
  // The adapter records the real value, both spellings; the server's loader takes it (and never drops).
  const auto cfg = ojson::parse(read_text_file(c.adapter_path + "/adapter_config.json"));
  EXPECT_EQ(cfg["lora_parameters"]["dropout"], 0.5);
  EXPECT_EQ(cfg["lora_dropout"], 0.5);
  EXPECT_EQ(cfg["training"]["lora_dropout"], 0.5);
  EXPECT_NO_THROW(lora::read_adapter(c.adapter_path));
}

TEST(TrainLoop, LoraPlusRatioReachesTheAdapterConfigAndChangesTraining) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  auto c = loop_config(d, train::Method::Sft);
  c.iters = 5;
  const LoopRun plain = run_loop(c);
  c.lora_plus_ratio = 8;
  const LoopRun plus = run_loop(c);
  EXPECT_NE(train_losses(plus), train_losses(plain));
  const auto cfg = ojson::parse(read_text_file(c.adapter_path + "/adapter_config.json"));
  EXPECT_EQ(cfg["training"]["lora_plus_ratio"], 8.0);
}

TEST(TrainLoop, PackedSftLearnsAndReportsItsPacking) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  auto c = loop_config(d, train::Method::Sft);
  c.pack = true;
  c.max_seq_length = 64;
  const LoopRun r = run_loop(c);
  EXPECT_LT(r.summary.last_val_loss, 0.5 * r.summary.first_val_loss);
  const auto lines = read_text_file(c.adapter_path + "/metrics.jsonl");
  const ojson first = ojson::parse(lines.substr(0, lines.find('\n')));
  ASSERT_TRUE(first.contains("packing")) << first.dump();
  EXPECT_LT(first["packing"]["rows"].get<int64_t>(), first["packing"]["examples"].get<int64_t>());
  EXPECT_LE(first["packing"]["pad_tokens"].get<int64_t>(), first["packing"]["unpacked_pad_tokens"].get<int64_t>());
  const auto cfg = ojson::parse(read_text_file(c.adapter_path + "/adapter_config.json"));
  EXPECT_EQ(cfg["training"]["pack"], true);
}

TEST(TrainLoop, AMetricsLineTheDiskCannotTakeFailsTheRunWithTheErrno) {
  ScratchDir d;
  fs::create_directories(d.str("data"));
  write_sft_task(d.str("data"));
  auto c = loop_config(d, train::Method::Sft);
  c.iters = 2;
  // /dev/full opens and answers every write with ENOSPC, as a full disk does.
  fs::create_directories(c.adapter_path);
  fs::create_symlink("/dev/full", c.adapter_path + "/metrics.jsonl");
  try {
    run_loop(c);
    ADD_FAILURE() << "the run went on without its metrics";
  } catch (const OsError& e) {
    EXPECT_EQ(e.os_errno(), ENOSPC) << e.what();
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lathe
