// Dense weight copies (tensor/dense_weights.h): a multi-row quantized linear over the kept copy must equal the
// dequantize-to-scratch + cuBLAS path bit for bit, for a whole weight and for row views of it (fused q|k|v,
// gate|up), with one copy per storage, within the budget, and dropped when the weight is freed.
#include "tensor/dense_weights.h"
#include "cuda/cuda_test_util.h"
#include "model/weights.h"
#include "tensor/ops.h"

namespace lathe {
namespace {
using namespace testing_cuda;

Tensor bf16_tensor(const std::vector<float>& v, const Shape& s) { return Tensor::from_floats(v, s).to(DType::BF16); }

Weight random_device_weight(int64_t N, int64_t K, int bits, int gs, uint32_t seed) {
  Weight w;
  w.quantized = true;
  w.q.bits = bits;
  w.q.group_size = gs;
  Tensor codes = Tensor::empty({N, K * bits / 32}, DType::U32);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < codes.numel(); ++i) codes.data<uint32_t>()[i] = rng();
  w.q.w = codes.to(Device::CUDA);
  w.q.scales = bf16_tensor(random_floats(static_cast<size_t>(N * K / gs), seed + 1, 0.001f, 0.02f), {N, K / gs})
                   .to(Device::CUDA);
  w.q.biases =
      bf16_tensor(random_floats(static_cast<size_t>(N * K / gs), seed + 2, -0.1f, 0.1f), {N, K / gs}).to(Device::CUDA);
  return w;
}

class CudaDenseWeights : public ::testing::Test {
 protected:
  void TearDown() override {
    set_dense_weight_budget(0);
    release_dense_weights();
  }
};

TEST_F(CudaDenseWeights, GemmOnTheCopyEqualsDequantizeAndGemm) {
  LATHE_REQUIRE_GPU();
  struct Case {
    int bits, gs;
    int64_t M;
    DType act;
  };
  // Rows above each GEMV limit (32 for 4-bit g64, 16 otherwise), bf16 and f32 activations.
  for (const Case& c : {Case{4, 64, 64, DType::BF16}, Case{4, 64, 33, DType::F32}, Case{8, 32, 20, DType::BF16}}) {
    const int64_t N = 700, K = 1024;
    const Weight whole = random_device_weight(N, K, c.bits, c.gs, 31);
    // Row views as a fused weight's modules are bound (model/layers/modules.cc).
    const std::vector<Weight> weights{whole, WeightBinder::row_slice(whole, 0, 300),
                                      WeightBinder::row_slice(whole, 300, N)};
    const Tensor x_host = Tensor::from_floats(random_floats(static_cast<size_t>(c.M * K), 32), {c.M, K});
    const Tensor x = (c.act == DType::BF16 ? x_host.to(DType::BF16) : x_host).to(Device::CUDA);
    auto run_all = [&] {
      std::vector<std::vector<float>> out;
      for (const Weight& w : weights) {
        const Tensor bias =
            Tensor::from_floats(random_floats(static_cast<size_t>(w.out_features()), 33), {w.out_features()})
                .to(Device::CUDA);
        for (bool f32_out : {true, false}) out.push_back(linear(x, w, &bias, f32_out).to_floats());
      }
      return out;
    };
    set_dense_weight_budget(0);
    const auto scratch = run_all();
    EXPECT_EQ(dense_weight_stats().copies, 0);
    set_dense_weight_budget(int64_t{1} << 30);
    const auto kept = run_all();
    ASSERT_EQ(kept.size(), scratch.size());
    for (size_t i = 0; i < kept.size(); ++i)
      EXPECT_EQ(kept[i], scratch[i]) << c.bits << "-bit g" << c.gs << " M " << c.M << " output " << i;
    const DenseWeightStats s = dense_weight_stats();
    EXPECT_EQ(s.copies, 1) << "the whole weight and its row views share one copy";
    EXPECT_EQ(s.held_bytes, N * K * static_cast<int64_t>(dtype_size(c.act)));
    EXPECT_EQ(run_all(), scratch) << "a second pass reads the kept copy";
    release_dense_weights();
  }
}

TEST_F(CudaDenseWeights, StaysWithinTheBudgetAndDropsFreedWeights) {
  LATHE_REQUIRE_GPU();
  const int64_t N = 256, K = 512, M = 40, bytes = N * K * 2;
  const Tensor x =
      Tensor::from_floats(random_floats(static_cast<size_t>(M * K), 41), {M, K}).to(DType::BF16).to(Device::CUDA);
  const Weight a = random_device_weight(N, K, 4, 64, 42);
  set_dense_weight_budget(0);
  const std::vector<float> want = linear(x, a).to_floats();

  set_dense_weight_budget(bytes - 1);  // one byte short of the copy
  EXPECT_EQ(linear(x, a).to_floats(), want);
  DenseWeightStats s = dense_weight_stats();
  EXPECT_EQ(s.copies, 0);
  EXPECT_EQ(s.held_bytes, 0);
  EXPECT_EQ(s.over_budget, 1);

  set_dense_weight_budget(bytes);  // room for exactly one
  EXPECT_EQ(linear(x, a).to_floats(), want);
  {
    const Weight b = random_device_weight(N, K, 4, 64, 43);
    (void)linear(x, b);  // no room left: refused, and the scratch path serves it
    s = dense_weight_stats();
    EXPECT_EQ(s.copies, 1);
    EXPECT_EQ(s.held_bytes, bytes);
    EXPECT_EQ(s.over_budget, 1);
  }
  {
    const Weight dropped = random_device_weight(N, K, 4, 64, 46);
    release_dense_weights();
    EXPECT_EQ(dense_weight_stats().copies, 0);
    (void)linear(x, dropped);
    EXPECT_EQ(dense_weight_stats().copies, 1);
  }
  EXPECT_EQ(dense_weight_stats().copies, 0) << "a freed weight's copy is dropped";
  // Allocated after the free: its codes may well sit where the dropped weight's did.
  const Weight c = random_device_weight(N, K, 4, 64, 45);
  set_dense_weight_budget(0);
  const std::vector<float> want_c = linear(x, c).to_floats();
  set_dense_weight_budget(bytes);
  EXPECT_EQ(linear(x, c).to_floats(), want_c) << "the room of a freed weight's copy is reused";
  EXPECT_EQ(dense_weight_stats().copies, 1);

  set_dense_weight_budget(bytes / 2);  // lowered below what is held: every copy goes
  EXPECT_EQ(dense_weight_stats().held_bytes, 0);
  EXPECT_EQ(linear(x, c).to_floats(), want_c);
}

}  // namespace
}  // namespace lathe
