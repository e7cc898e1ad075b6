// Decode attention over a quantized KV cache reads the 4/8-bit codes in place (tensor/cuda/decode_attention.cu)
// instead of dequantizing the whole cache every step. The contract: bitwise the output of dequantizing the cache
// to bf16 (dequantize_any) and attending over that, for every group geometry, context length (one split to
// many), GQA group, window, softcap and ring (explicit key positions) the kernel serves.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "cuda/cuda_test_util.h"
#include "quant/affine.h"
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/decode_attention_wide.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/kernels_models.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_cuda_check.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {
using namespace testing_cuda;

// The in-place reads are the default (cuda/decode_attention.h), so the model and batched tests of this binary
// cover them too; LATHE_CUDA_KV_IN_PLACE=0 runs the suite over the dequantizing path.

struct Case {
  int bits, group;
  int64_t Hq, Hkv, D, S;
  int64_t window = 0;
  float softcap = 0.f;
  bool ring = false;
};

Tensor dequantized(const QuantizedMatrix& m, int64_t S, int64_t H) {
  Tensor out = Tensor::empty({S, H, m.cols()}, DType::BF16, Device::CUDA);
  cuda::dequantize_any(gpu::view(m), out.raw(), DType::BF16);
  return out;
}

void check(const Case& c, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << c.bits << "-bit group " << c.group << ", Hq " << c.Hq << " Hkv " << c.Hkv << " D "
                                  << c.D << " S " << c.S << " window " << c.window << " ring " << c.ring);
  // As the cache stores them: [S·Hkv, D] rows, a head narrower than the group is one group.
  const int gs = c.D < c.group ? static_cast<int>(c.D) : c.group;
  const auto rows = [&](uint32_t s) {
    return Tensor::from_floats(random_floats(static_cast<size_t>(c.S * c.Hkv * c.D), s, -3.f, 3.f), {c.S * c.Hkv, c.D})
        .to(DType::BF16)
        .to(Device::CUDA);
  };
  const QuantizedMatrix qk = quantize_kv(rows(seed), c.bits, gs), qv = quantize_kv(rows(seed + 1), c.bits, gs);
  const Tensor q =
      Tensor::from_floats(random_floats(static_cast<size_t>(c.Hq * c.D), seed + 2, -2.f, 2.f), {1, c.Hq, c.D})
          .to(DType::BF16)
          .to(Device::CUDA);
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  p.softcap = c.softcap;
  p.window = c.window;
  p.q_pos0 = c.S + 2;
  p.k_pos0 = 3;
  std::vector<int64_t> positions;
  if (c.ring) {
    for (int64_t s = 0; s < c.S; ++s) positions.push_back(p.k_pos0 + (s * 7 + 5) % c.S);
    p.k_pos = &positions;
  }
  // The in-place path must really be the one taken (else the comparison below would hold trivially).
  ASSERT_TRUE(cuda::kv_in_place_on());
  cuda::AttentionArgs a;
  a.t = DType::BF16;
  a.T = 1;
  a.Hq = c.Hq;
  a.q_s1 = c.D;
  a.q = q.raw();
  ASSERT_TRUE(gpu::quantized_kv_args(a, qk, qv, c.Hkv));
  a.D = c.D;
  ASSERT_TRUE(cuda::decode_attention_applies(a));

  const std::vector<float> got = attention_quantized(q, qk, qv, c.Hkv, p).to_floats();
  const std::vector<float> want = attention(q, dequantized(qk, c.S, c.Hkv), dequantized(qv, c.S, c.Hkv), p).to_floats();
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
  EXPECT_GT(max_abs(got), 0.f);
}

TEST(CudaQuantizedKvAttention, InPlaceEqualsDequantizedBitwise) {
  LATHE_REQUIRE_GPU();
  uint32_t seed = 1;
  for (int bits : {4, 8}) {
    for (int group : {32, 64}) {
      // Qwen3-4B's heads at one key, one split, several splits (the last-block merge) and a long context.
      for (int64_t S : {1, 15, 200, 3000}) check({bits, group, 32, 8, 128, S}, seed++);
      check({bits, group, 16, 2, 64, 300, 40, 30.f, true}, seed++);  // GQA 8, window, softcap, ring positions
      check({bits, group, 8, 1, 256, 700, 512}, seed++);             // head 256, window over linear positions
      check({bits, group, 4, 4, 16, 50}, seed++);                    // a 16-wide head: one 16-value group
    }
  }
}

// The batched launch (one per layer for all rows) reads quantized rows in place too, each row bitwise its solo.
TEST(CudaQuantizedKvAttention, BatchedRowsEqualSolo) {
  LATHE_REQUIRE_GPU();
  const int64_t Hq = 32, Hkv = 8, D = 128;
  for (int bits : {4, 8}) {
    std::vector<QuantizedMatrix> qk, qv;
    std::vector<DecodeKV> rows;
    std::vector<std::vector<float>> solo;
    AttentionParams p;
    p.scale = 1.0f / std::sqrt(static_cast<float>(D));
    const std::vector<int64_t> lengths = {1, 40, 129, 2100};
    qk.reserve(lengths.size());
    qv.reserve(lengths.size());
    uint32_t seed = 50;
    for (int64_t S : lengths) {
      const auto kv = [&](uint32_t s) {
        return Tensor::from_floats(random_floats(static_cast<size_t>(S * Hkv * D), s), {S * Hkv, D})
            .to(DType::BF16)
            .to(Device::CUDA);
      };
      qk.push_back(quantize_kv(kv(seed++), bits, 64));
      qv.push_back(quantize_kv(kv(seed++), bits, 64));
      DecodeKV d;
      d.q = Tensor::from_floats(random_floats(static_cast<size_t>(Hq * D), seed++, -2.f, 2.f), {1, Hq, D})
                .to(DType::BF16)
                .to(Device::CUDA);
      d.quantized = true;
      d.kv_heads = Hkv;
      d.qk = &qk.back();
      d.qv = &qv.back();
      d.q_pos0 = S - 1;
      AttentionParams pr = p;
      pr.q_pos0 = d.q_pos0;
      solo.push_back(attention_quantized(d.q, qk.back(), qv.back(), Hkv, pr).to_floats());
      rows.push_back(d);
    }
    const Tensor out = attention_decode_rows(rows, p);
    ASSERT_TRUE(out.defined());
    for (size_t r = 0; r < rows.size(); ++r)
      EXPECT_EQ(out.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1).to_floats(), solo[r])
          << bits << "-bit row " << r;
  }
}

// A step wider than exact_decode_rows() takes the one-block-per-row kernel (decode_attention_wide.cu), which
// reads quantized rows in place too: bitwise that kernel over the rows' dequantized copies (before, a wide step
// dequantized every row's whole cache each layer and step: 64 streams served at 486 tok/s against 8,573 with bf16
// K/V, H100).
TEST(CudaQuantizedKvAttention, WideRowsEqualWideOverDequantized) {
  LATHE_REQUIRE_GPU();
  struct Shape {
    int64_t Hq, Hkv, D;
    int group;
    int64_t window;
  };
  uint32_t seed = 900;
  for (int bits : {4, 8})
    for (const Shape& sh :
         {Shape{32, 8, 128, 64, 0}, Shape{32, 8, 128, 32, 0}, Shape{16, 2, 64, 32, 100}, Shape{8, 1, 256, 64, 0}}) {
      SCOPED_TRACE(testing::Message() << bits << "-bit group " << sh.group << " Hq " << sh.Hq << " Hkv " << sh.Hkv
                                      << " D " << sh.D);
      // Enough rows that rows × kv heads cover the SMs (the wide kernel's condition).
      const int64_t n = std::max<int64_t>(gpu::exact_decode_rows() + 1, (cuda::sm_count() + sh.Hkv - 1) / sh.Hkv);
      std::vector<QuantizedMatrix> qk, qv;
      std::vector<Tensor> dk, dv;
      qk.reserve(static_cast<size_t>(n));
      qv.reserve(static_cast<size_t>(n));
      dk.reserve(static_cast<size_t>(n));
      dv.reserve(static_cast<size_t>(n));
      std::vector<DecodeKV> quant, dense;
      for (int64_t r = 0; r < n; ++r) {
        const int64_t S = 1 + (r * 37) % 300;  // tiles full and partial, one key to many
        const auto kv = [&](uint32_t s) {
          return Tensor::from_floats(random_floats(static_cast<size_t>(S * sh.Hkv * sh.D), s, -3.f, 3.f),
                                     {S * sh.Hkv, sh.D})
              .to(DType::BF16)
              .to(Device::CUDA);
        };
        qk.push_back(quantize_kv(kv(seed++), bits, sh.group));
        qv.push_back(quantize_kv(kv(seed++), bits, sh.group));
        dk.push_back(dequantized(qk.back(), S, sh.Hkv));
        dv.push_back(dequantized(qv.back(), S, sh.Hkv));
        DecodeKV d;
        d.q = Tensor::from_floats(random_floats(static_cast<size_t>(sh.Hq * sh.D), seed++, -2.f, 2.f), {1, sh.Hq, sh.D})
                  .to(DType::BF16)
                  .to(Device::CUDA);
        d.q_pos0 = S - 1;
        DecodeKV e = d;
        d.quantized = true;
        d.kv_heads = sh.Hkv;
        d.qk = &qk.back();
        d.qv = &qv.back();
        e.k = &dk.back();
        e.v = &dv.back();
        quant.push_back(d);
        dense.push_back(e);
      }
      cuda::AttentionArgs a;
      a.t = DType::BF16;
      a.T = 1;
      a.Hq = sh.Hq;
      a.q_s1 = sh.D;
      ASSERT_TRUE(gpu::quantized_kv_args(a, qk[0], qv[0], sh.Hkv));
      ASSERT_TRUE(cuda::decode_attention_wide_applies(a, n));  // else the comparison would not test the kernel
      AttentionParams p;
      p.scale = 1.0f / std::sqrt(static_cast<float>(sh.D));
      p.window = sh.window;
      const std::vector<float> got = attention_decode_rows(quant, p).to_floats();
      const std::vector<float> want = attention_decode_rows(dense, p).to_floats();
      ASSERT_EQ(got.size(), want.size());
      EXPECT_EQ(got, want);
      EXPECT_GT(max_abs(got), 0.f);
    }
}

// The device's K/V quantization (a warp per group of 32 or 64, kv_quant.cu) stores what the CPU's
// quant::quantize_kv_rows stores for the same bf16 values with bf16 scales: codes, scales and biases bitwise,
// for both widths, both group sizes, ranges that straddle zero or not, and a constant group.
TEST(CudaKvQuantize, RowsEqualTheCpuQuantization) {
  LATHE_REQUIRE_GPU();
  const int64_t rows = 96, cols = 256;
  for (int bits : {4, 8})
    for (int gs : {32, 64})
      for (const auto& [lo, hi] : {std::pair{-3.f, 3.f}, std::pair{0.5f, 2.f}, std::pair{-2.f, -0.25f}}) {
        SCOPED_TRACE(testing::Message() << bits << "-bit group " << gs << " range " << lo << ".." << hi);
        std::vector<float> x = random_floats(static_cast<size_t>(rows * cols), 11 + bits + gs, lo, hi);
        std::fill(x.begin(), x.begin() + gs, 1.25f);  // one group of equal values
        const Tensor xb = Tensor::from_floats(x, {rows, cols}).to(DType::BF16);
        const std::vector<float> exact = xb.to_floats();  // the values as bf16 holds them
        const QuantizedMatrix want = quant::quantize_kv_rows(exact.data(), rows, cols, bits, gs, DType::BF16);
        const QuantizedMatrix got = quantize_kv(xb.to(Device::CUDA), bits, gs);
        const Tensor w = got.w.to(Device::CPU), sc = got.scales.to(Device::CPU), bi = got.biases.to(Device::CPU);
        ASSERT_EQ(w.nbytes(), want.w.nbytes());
        ASSERT_EQ(sc.nbytes(), want.scales.nbytes());
        EXPECT_EQ(std::memcmp(sc.raw(), want.scales.raw(), sc.nbytes()), 0) << "scales differ";
        EXPECT_EQ(std::memcmp(bi.raw(), want.biases.raw(), bi.nbytes()), 0) << "biases differ";
        int64_t differ = 0;
        for (int64_t i = 0; i < w.numel(); ++i) differ += w.data<uint32_t>()[i] != want.w.data<uint32_t>()[i];
        EXPECT_EQ(differ, 0) << "code words differ";
      }
}

}  // namespace
}  // namespace lathe
