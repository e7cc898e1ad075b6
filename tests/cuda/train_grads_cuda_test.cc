// The CUDA training autograd and LoRA gradient engine. Per op: forward values and input / parameter gradients of
// each dg:: op against the CPU autograd (ag::) on small random shapes (f32 against f32: 2e-5 relative). Then the
// gradient parity of `lathe train grads --device cuda` (compute_batch_grads on the CUDA engine) against the
// PyTorch oracle's fixtures, with the CPU suite's bounds (loss 1e-5, each gradient 1e-4 relative), the base
// forward against the CPU engine's, and the whole engine against the CPU engine on all seven targets with packing
// and dropout.
#include <cmath>
#include <cstdio>
#include <set>

#include "cuda/cuda_test_util.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/train/autograd.h"
#include "lab/train/autograd_cuda.h"
#include "lab/train/batch_grads.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/lora_engine_cuda.h"
#include "model/model.h"
#include "quant/affine.h"
#include "support/fixtures.h"
#include "support/lora_test_util.h"

namespace lathe {
namespace {
using namespace testing_cuda;

// max |a - b| / max |b|.
double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  const double m = max_abs(b);
  return m > 0 ? max_abs_diff(a, b) / m : max_abs_diff(a, b);
}

constexpr double kOpTol = 2e-5;

// A CPU input and its device twin with the same values.
struct Pair {
  train::ag::Var c;
  train::dg::Var d;
};
Pair input(int64_t rows, int64_t cols, uint32_t seed, float scale = 1.0f) {
  std::vector<float> v = random_floats(static_cast<size_t>(rows * cols), seed, -scale, scale);
  return {train::ag::from_values(v, rows, cols, true), train::dg::from_host(v, rows, cols, true)};
}

// Seeds both outputs with the same random gradient and runs both tapes back.
void run_back(train::ag::Tape& tc, const train::ag::Var& yc, train::ag::Tape& td, const train::dg::Var& yd,
              uint32_t seed) {
  const std::vector<float> gy = random_floats(yc->value.size(), seed);
  yc->grad = gy;
  yd->grad = Tensor::from_floats(gy, {yd->rows, yd->cols}).to(Device::CUDA);
  tc.backward();
  td.backward();
}

void expect_close(const std::vector<float>& dev, const std::vector<float>& cpu, const char* what, double tol = kOpTol) {
  const double e = rel_err(dev, cpu);
  EXPECT_LT(e, tol) << what;
}
void expect_grads(const Pair& p, const char* what, double tol = kOpTol) {
  ASSERT_TRUE(p.d->grad.defined()) << what;
  expect_close(p.d->grad.to_floats(), p.c->grad, what, tol);
}

TEST(TrainCudaOps, RmsNormWholeRowAndPerHead) {
  LATHE_REQUIRE_GPU();
  for (const bool plus_one : {false, true})
    for (const int64_t group : {int64_t{96}, int64_t{32}}) {
      const Pair x = input(5, 96, 1);
      const std::vector<float> w = random_floats(static_cast<size_t>(group), 2, 0.5f, 1.5f);
      const Tensor wc = Tensor::from_floats(w, {group}), wd = wc.to(Device::CUDA);
      train::ag::Tape tc;
      train::ag::Tape td;
      const auto yc = train::ag::rms_norm(tc, x.c, wc, 1e-6f, plus_one, group);
      const auto yd = train::dg::rms_norm(td, x.d, wd, 1e-6f, plus_one, group);
      expect_close(yd->value.to_floats(), yc->value, "rms_norm value");
      run_back(tc, yc, td, yd, 3);
      expect_grads(x, "rms_norm dx");
    }
}

TEST(TrainCudaOps, RopeFullAndPartial) {
  LATHE_REQUIRE_GPU();
  for (const int dims : {16, 8}) {
    RopeTable table;
    table.dims = dims;
    for (int i = 0; i < dims / 2; ++i) table.inv_freq.push_back(std::pow(10000.0f, -2.0f * i / dims));
    table.attention_scaling = 1.1f;
    const std::vector<int64_t> pos = {0, 1, 2, 0, 1, 7};
    const Pair x = input(6, 3 * 16, 4);
    train::ag::Tape tc;
    train::ag::Tape td;
    const auto yc = train::ag::rope(tc, x.c, table, 16, pos);
    const auto yd = train::dg::rope(td, x.d, train::dg::rope_table(table, pos), 16);
    expect_close(yd->value.to_floats(), yc->value, "rope value");
    run_back(tc, yc, td, yd, 5);
    expect_grads(x, "rope dx");
  }
}

// Both device paths (direct kernels, cuBLAS scores) on each case.
class TrainCudaAttention : public ::testing::TestWithParam<train::dg::AttentionPath> {
 protected:
  void TearDown() override { train::dg::set_attention_path(train::dg::AttentionPath::Auto); }
};

TEST_P(TrainCudaAttention, GqaWindowSoftcapSegments) {
  LATHE_REQUIRE_GPU();
  train::dg::set_attention_path(GetParam());
  const int64_t T = 19, Hq = 6, Hkv = 2, D = 40;  // D not a multiple of 32: the lanes' tails
  struct Case {
    int64_t window;
    float softcap;
    bool packed;
  };
  for (const Case cs : {Case{0, 0.f, false}, Case{5, 0.f, false}, Case{0, 3.f, false}, Case{4, 2.f, true}}) {
    const Pair q = input(T, Hq * D, 6), k = input(T, Hkv * D, 7), v = input(T, Hkv * D, 8);
    std::vector<int64_t> seg;
    for (int64_t i = 0; i < T; ++i) seg.push_back(i < 7 ? 0 : i < 12 ? 7 : 12);
    train::ag::AttnShape sc;
    sc.heads = Hq;
    sc.kv_heads = Hkv;
    sc.head_dim = D;
    sc.scale = 0.3f;
    sc.softcap = cs.softcap;
    sc.window = cs.window;
    if (cs.packed) sc.segment_start = &seg;
    train::dg::AttnShape sd;
    sd.heads = Hq;
    sd.kv_heads = Hkv;
    sd.head_dim = D;
    sd.scale = 0.3f;
    sd.softcap = cs.softcap;
    sd.window = cs.window;
    if (cs.packed) {
      Tensor host = Tensor::empty({T}, DType::I64);
      std::copy(seg.begin(), seg.end(), host.data<int64_t>());
      sd.segment_start = host.to(Device::CUDA);
    }
    train::ag::Tape tc;
    train::ag::Tape td;
    const auto yc = train::ag::attention(tc, q.c, k.c, v.c, sc);
    const auto yd = train::dg::attention(td, q.d, k.d, v.d, sd);
    expect_close(yd->value.to_floats(), yc->value, "attention value");
    run_back(tc, yc, td, yd, 9);
    expect_grads(q, "attention dq");
    expect_grads(k, "attention dk");
    expect_grads(v, "attention dv");
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, TrainCudaAttention,
                         ::testing::Values(train::dg::AttentionPath::Direct, train::dg::AttentionPath::Gemm));

// A longer sequence (Auto takes the cuBLAS path there) against the CPU, with a window and softcap.
TEST(TrainCudaOps, AttentionLongSequence) {
  LATHE_REQUIRE_GPU();
  const int64_t T = 300, Hq = 4, Hkv = 1, D = 64;
  const Pair q = input(T, Hq * D, 30), k = input(T, Hkv * D, 31), v = input(T, Hkv * D, 32);
  train::ag::AttnShape sc;
  sc.heads = Hq;
  sc.kv_heads = Hkv;
  sc.head_dim = D;
  sc.scale = 0.125f;
  sc.softcap = 20.f;
  sc.window = 200;
  train::dg::AttnShape sd;
  sd.heads = Hq;
  sd.kv_heads = Hkv;
  sd.head_dim = D;
  sd.scale = 0.125f;
  sd.softcap = 20.f;
  sd.window = 200;
  train::ag::Tape tc;
  train::ag::Tape td;
  const auto yc = train::ag::attention(tc, q.c, k.c, v.c, sc);
  const auto yd = train::dg::attention(td, q.d, k.d, v.d, sd);
  expect_close(yd->value.to_floats(), yc->value, "attention value");
  run_back(tc, yc, td, yd, 33);
  expect_grads(q, "attention dq");
  expect_grads(k, "attention dk");
  expect_grads(v, "attention dv");
}

TEST(TrainCudaOps, GatedAddScaleMasked) {
  LATHE_REQUIRE_GPU();
  for (const auto act : {train::ag::Gate::SiLU, train::ag::Gate::GeluTanh}) {
    const Pair g = input(4, 33, 10, 3.0f), u = input(4, 33, 11);
    train::ag::Tape tc;
    train::ag::Tape td;
    const auto yc = train::ag::gated(tc, g.c, u.c, act);
    const auto yd = train::dg::gated(td, g.d, u.d, act);
    expect_close(yd->value.to_floats(), yc->value, "gated value");
    run_back(tc, yc, td, yd, 12);
    expect_grads(g, "gated dgate");
    expect_grads(u, "gated dup");
  }
  const Pair a = input(3, 10, 13), b = input(3, 10, 14);
  auto mask = std::make_shared<std::vector<float>>(random_floats(30, 15, 0.f, 2.f));
  train::ag::Tape tc;
  train::ag::Tape td;
  const auto yc = train::ag::masked(tc, train::ag::scale(tc, train::ag::add(tc, a.c, b.c), 0.7f), mask);
  const auto yd = train::dg::masked(td, train::dg::scale(td, train::dg::add(td, a.d, b.d), 0.7f),
                                    Tensor::from_floats(*mask, {30}).to(Device::CUDA));
  expect_close(yd->value.to_floats(), yc->value, "add/scale/masked value");
  run_back(tc, yc, td, yd, 16);
  expect_grads(a, "add/scale/masked da");
  expect_grads(b, "add/scale/masked db");
}

// A frozen weight [out, in] three ways: dense f32, dense bf16, 4-bit quantized (g32); CPU and device copies.
struct Frozen {
  Weight cpu, dev;
};
std::vector<Frozen> frozen_weights(int64_t out, int64_t in, uint32_t seed) {
  const std::vector<float> w = random_floats(static_cast<size_t>(out * in), seed, -0.5f, 0.5f);
  std::vector<Frozen> ws(3);
  ws[0].cpu.dense = Tensor::from_floats(w, {out, in});
  ws[0].dev.dense = ws[0].cpu.dense.to(Device::CUDA);
  ws[1].cpu.dense = ws[0].cpu.dense.to(DType::BF16);
  ws[1].dev.dense = ws[1].cpu.dense.to(Device::CUDA);
  ws[2].cpu.quantized = ws[2].dev.quantized = true;
  ws[2].cpu.q = quant::quantize(w.data(), out, in, 4, 32);
  ws[2].dev.q = ws[2].cpu.q;
  ws[2].dev.q.w = ws[2].cpu.q.w.to(Device::CUDA);
  ws[2].dev.q.scales = ws[2].cpu.q.scales.to(Device::CUDA);
  ws[2].dev.q.biases = ws[2].cpu.q.biases.to(Device::CUDA);
  return ws;
}

TEST(TrainCudaOps, LinearDenseBf16AndQuantized) {
  LATHE_REQUIRE_GPU();
  const std::vector<float> bias = random_floats(48, 17);
  const Tensor bc = Tensor::from_floats(bias, {48}), bd = bc.to(Device::CUDA);
  for (const Frozen& w : frozen_weights(48, 64, 18)) {
    const Pair x = input(7, 64, 19);
    train::ag::Tape tc;
    train::ag::Tape td;
    const auto yc = train::ag::linear(tc, x.c, w.cpu, &bc);
    const auto yd = train::dg::linear(td, x.d, w.dev, &bd);
    expect_close(yd->value.to_floats(), yc->value, "linear value");
    run_back(tc, yc, td, yd, 20);
    expect_grads(x, "linear dx");
  }
}

TEST(TrainCudaOps, LoraGradsIntoAAndB) {
  LATHE_REQUIRE_GPU();
  const int64_t T = 6, in = 40, out = 24, r = 4;
  train::LoraParam p;
  p.a = Tensor::from_floats(random_floats(r * in, 21), {r, in});
  p.b = Tensor::from_floats(random_floats(out * r, 22), {out, r});
  p.grad_a = Tensor::zeros({r, in}, DType::F32);
  p.grad_b = Tensor::zeros({out, r}, DType::F32);
  p.scale = 1.7f;
  train::dg::DeviceLora d;
  d.a = p.a.to(Device::CUDA);
  d.b = p.b.to(Device::CUDA);
  d.grad_a = Tensor::zeros({r, in}, DType::F32, Device::CUDA);
  d.grad_b = Tensor::zeros({out, r}, DType::F32, Device::CUDA);
  d.scale = p.scale;
  const Pair x = input(T, in, 23);
  train::ag::Tape tc;
  train::ag::Tape td;
  const auto yc = train::ag::lora(tc, x.c, p);
  const auto yd = train::dg::lora(td, x.d, d);
  expect_close(yd->value.to_floats(), yc->value, "lora value");
  run_back(tc, yc, td, yd, 24);
  expect_grads(x, "lora dx");
  expect_close(d.grad_a.to_floats(), p.grad_a.to_floats(), "lora da");
  expect_close(d.grad_b.to_floats(), p.grad_b.to_floats(), "lora db");
}

TEST(TrainCudaOps, TargetLogprobsChunkedWithSoftcap) {
  LATHE_REQUIRE_GPU();
  const int64_t T = 5, H = 32, V = 100;
  const std::vector<int32_t> targets = {3, -1, 99, 0, 57};
  for (const float cap : {0.f, 2.5f})
    for (const Frozen& w : frozen_weights(V, H, 25)) {
      const Pair h = input(T, H, 26, 2.0f);
      train::ag::Tape tc;
      train::ag::Tape td;
      const auto yc = train::ag::target_logprobs(tc, h.c, w.cpu, targets, cap, 32);  // 4 blocks, the last partial
      const auto yd = train::dg::target_logprobs(td, h.d, w.dev, targets, cap, 32);
      expect_close(yd->value.to_floats(), yc->value, "logprobs value");
      run_back(tc, yc, td, yd, 27);
      expect_grads(h, "logprobs dh");
    }
}

// --- the engine against the PyTorch oracle's fixtures ---

std::string training_dir(const std::string& arch) { return test::fixtures_dir() + "/training/" + arch + "-lora-grads"; }

class TrainGradsCudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainGradsCudaParity, LossAndGradsMatchReference) {
  LATHE_REQUIRE_GPU();
  const std::string dir = training_dir(GetParam());
  const auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  const auto batch = train::read_grad_batch(dir + "/reference.json");
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
  const train::BatchGrads g = train::compute_batch_grads(
      *model, test::fixtures_dir() + "/adapters/" + ref["adapter"].get<std::string>(), batch, Device::CUDA);
  const double ref_loss = ref["loss"].get<double>();
  const double loss_rel = std::abs(g.loss - ref_loss) / std::abs(ref_loss);
  EXPECT_LT(loss_rel, 1e-5) << "loss " << g.loss << " vs " << ref_loss;
  const auto grads = SafetensorsFile::open(dir + "/grads.safetensors");
  std::set<std::string> seen;
  double worst = 0;
  std::string worst_name;
  for (const train::NamedGrad& n : g.grads) {
    ASSERT_TRUE(grads->has(n.name)) << n.name << " is not in the reference";
    const Tensor r = grads->get(n.name);
    ASSERT_EQ(r.shape(), n.value.shape()) << n.name;
    const std::vector<float> a = n.value.to_floats(), b = r.to_floats();
    ASSERT_GT(max_abs(b), 0.f) << n.name;
    const double e = rel_err(a, b);
    EXPECT_LT(e, 1e-4) << n.name;
    if (e > worst) worst = e, worst_name = n.name;
    seen.insert(n.name);
  }
  EXPECT_EQ(seen.size(), grads->tensors().size()) << "every reference gradient is computed";
  std::printf("[train grads cuda %s] loss %.9g (ref %.9g, rel %.2e); worst grad rel %.2e at %s\n", GetParam().c_str(),
              g.loss, ref_loss, loss_rel, worst, worst_name.c_str());
}

// The CUDA engine's forward (base alone and with the adapter) against the CPU engine's, sequence by sequence.
TEST_P(TrainGradsCudaParity, ForwardMatchesCpuEngine) {
  LATHE_REQUIRE_GPU();
  const std::string dir = training_dir(GetParam());
  const auto ref = nlohmann::json::parse(read_text_file(dir + "/reference.json"));
  const auto batch = train::read_grad_batch(dir + "/reference.json");
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(ref["base"].get<std::string>()), lo);
  train::LoraParams none;
  auto cpu = train::make_cpu_lora_gradient_engine(*model, none);
  auto gpu = train::make_cuda_lora_gradient_engine(*model, none);
  const train::SequenceLogProbs a = gpu->forward(batch, false), b = cpu->forward(batch, false);
  ASSERT_EQ(a.sum_logp.size(), b.sum_logp.size());
  for (size_t s = 0; s < batch.size(); ++s) {
    EXPECT_NEAR(a.sum_logp[s], b.sum_logp[s], 1e-5 * std::abs(b.sum_logp[s])) << "sequence " << s;
    EXPECT_EQ(a.n_targets[s], b.n_targets[s]);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainGradsCudaParity, ::testing::Values("qwen3", "gemma3"));

// The CUDA engine against the CPU engine with LoRA on all seven targets of every layer, LoRA dropout on, a packed
// row (block-diagonal attention, restarting positions) beside a plain one, and two steps (the factors are
// re-read at every forward; grads accumulate into the host params): llama (separate head, llama3 rope), qwen3
// (4-bit, q/k norms), gemma3 (sandwich norms, sliding layers, softcaps).
class TrainCudaEngineVsCpu : public ::testing::TestWithParam<std::string> {};

TEST_P(TrainCudaEngineVsCpu, AllTargetsPackedWithDropout) {
  LATHE_REQUIRE_GPU();
  LoadOptions lo;
  lo.exact = true;
  const auto model = load_model(test::model_dir(GetParam()), lo);
  const int64_t V = model->config().vocab_size;
  std::vector<train::TrainSequence> batch(2);
  std::mt19937 g(11);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(V - 1));
  for (int j = 0; j < 14; ++j) batch[0].ids.push_back(tok(g));
  batch[0].target.assign(14, 1);
  batch[0].target[0] = batch[0].target[6] = 0;
  batch[0].segments = {6, 8};
  for (int j = 0; j < 9; ++j) batch[1].ids.push_back(tok(g));
  batch[1].target.assign(9, 0);
  for (int j = 3; j < 9; ++j) batch[1].target[static_cast<size_t>(j)] = 1;
  train::LoraParams pc = train::all_targets(model->config(), 4, 5), pd = train::all_targets(model->config(), 4, 5);
  auto cpu = train::make_cpu_lora_gradient_engine(*model, pc);
  auto gpu = train::make_cuda_lora_gradient_engine(*model, pd);
  const std::vector<double> w{-0.4, -0.9};
  for (int64_t step = 0; step < 2; ++step) {
    train::LoraDropout drop;
    drop.p = 0.25;
    drop.seed = 3;
    drop.step = step;
    cpu->dropout_next(drop);
    gpu->dropout_next(drop);
    const auto a = gpu->forward(batch, true), b = cpu->forward(batch, true);
    for (size_t s = 0; s < batch.size(); ++s)
      EXPECT_NEAR(a.sum_logp[s], b.sum_logp[s], 1e-5 * std::abs(b.sum_logp[s])) << "step " << step << " seq " << s;
    gpu->backward(w);
    cpu->backward(w);
    for (size_t i = 0; i < pc.params.size(); ++i) {
      expect_close(pd.params[i].grad_a.to_floats(), pc.params[i].grad_a.to_floats(), pc.params[i].module.c_str(), 1e-4);
      expect_close(pd.params[i].grad_b.to_floats(), pc.params[i].grad_b.to_floats(), pc.params[i].module.c_str(), 1e-4);
    }
    for (train::LoraParams* ps : {&pc, &pd})  // a step's worth of change, the same on both sides
      for (train::LoraParam& p : ps->params) {
        float* b = p.b.data<float>();
        const float* gb = p.grad_b.data<float>();
        for (int64_t e = 0; e < p.b.numel(); ++e) b[e] -= 0.5f * gb[e];
      }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, TrainCudaEngineVsCpu, ::testing::Values("llama-bf16", "qwen3-q4g64", "gemma3-bf16"));

}  // namespace
}  // namespace lathe
