// CUDA ops against the CPU ops on random inputs: quantized GEMV (one row) and GEMM (several rows) for every
// bit width and group size, attention (decode with split-KV, prefill, sliding window, softcap, GQA, bf16
// tensor-core path), and the small row ops.
#include <cmath>
#include <sstream>
#include <tuple>

#include "cuda/cuda_test_util.h"
#include "tensor/cuda/gemm_q4.h"
#include "tensor/cuda/kernels.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {
using namespace testing_cuda;

Tensor bf16_kernel_tensor(const std::vector<float>& v, const Shape& s) {
  return Tensor::from_floats(v, s).to(DType::BF16);
}

QuantizedMatrix random_quantized(int64_t N, int64_t K, int bits, int gs, uint32_t seed) {
  QuantizedMatrix q;
  q.bits = bits;
  q.group_size = gs;
  q.w = Tensor::empty({N, K * bits / 32}, DType::U32);
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < q.w.numel(); ++i) q.w.data<uint32_t>()[i] = rng();
  q.scales = bf16_kernel_tensor(random_floats(static_cast<size_t>(N * K / gs), seed + 1, 0.001f, 0.02f), {N, K / gs});
  q.biases = bf16_kernel_tensor(random_floats(static_cast<size_t>(N * K / gs), seed + 2, -0.1f, 0.1f), {N, K / gs});
  return q;
}

Weight on_device(const QuantizedMatrix& q) {
  Weight w;
  w.quantized = true;
  w.q = q;
  w.q.w = q.w.to(Device::CUDA);
  w.q.scales = q.scales.to(Device::CUDA);
  w.q.biases = q.biases.to(Device::CUDA);
  return w;
}

struct QCase {
  int bits, gs;
  int64_t M;
  int64_t K = 1024;
};

class QuantLinear : public ::testing::TestWithParam<QCase> {};

TEST_P(QuantLinear, MatchesCpu) {
  LATHE_REQUIRE_GPU();
  const QCase c = GetParam();
  const int64_t N = 333, K = c.K;  // N not a multiple of the rows per block
  const QuantizedMatrix q = random_quantized(N, K, c.bits, c.gs, 7);
  Weight wc;
  wc.quantized = true;
  wc.q = q;
  const Weight wd = on_device(q);
  const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(c.M * K), 11), {c.M, K});
  const Tensor bias = Tensor::from_floats(random_floats(static_cast<size_t>(N), 12), {N});
  const Tensor bias_d = bias.to(Device::CUDA);
  const std::vector<float> ref = linear(x, wc, &bias).to_floats();
  const std::vector<float> got = linear(x.to(Device::CUDA), wd, &bias_d).to_floats();
  EXPECT_LE(max_abs_diff(got, ref), 1e-4f * std::max(1.f, max_abs(ref)));
  // bf16 activations: the same sums over the bf16-rounded inputs (f32 accumulation, so only the bf16 output
  // rounding of M > 1 rows remains), and within bf16 rounding of the f32 reference.
  const Tensor x16 = x.to(DType::BF16);
  const std::vector<float> ref16 = linear(x16.to(DType::F32), wc, &bias).to_floats();
  const std::vector<float> got16 = linear(x16.to(Device::CUDA), wd, &bias_d, true).to_floats();
  EXPECT_LE(max_abs_diff(got16, ref16), (c.M == 1 ? 1e-4f : 1e-2f) * std::max(1.f, max_abs(ref16)));
  EXPECT_LE(max_abs_diff(got16, ref), 2e-2f * std::max(1.f, max_abs(ref)));
}

INSTANTIATE_TEST_SUITE_P(Shapes, QuantLinear,
                         ::testing::Values(QCase{4, 32, 1}, QCase{4, 64, 1}, QCase{4, 128, 1}, QCase{8, 32, 1},
                                           QCase{8, 64, 1}, QCase{8, 128, 1}, QCase{4, 64, 7}, QCase{8, 32, 5},
                                           // a partial last iteration of 8 groups; an odd group count
                                           QCase{4, 128, 1, 2560}, QCase{8, 128, 1, 2560}, QCase{4, 64, 1, 1344},
                                           // 5 to 8 iterations of 8 groups per row
                                           QCase{4, 64, 1, 2560}, QCase{8, 64, 1, 3072}, QCase{4, 32, 1, 2048},
                                           QCase{8, 32, 1, 1792},
                                           // 4-bit above 8 rows: gemm_q4 (split K for N = 333)
                                           QCase{4, 64, 9}, QCase{4, 32, 40, 2048}, QCase{4, 128, 64, 2560},
                                           QCase{4, 64, 128}));

// Batched decode: bf16 rows run the GEMV per row in one launch (4-bit g32/g64: weights unpacked once per 8
// rows), each row bit-identical to its own one-row GEMV (what makes batched greedy equal solo greedy in the
// linears), up to linear()'s GEMV row limit: 8 where 4-bit weights take gemm_q4 above it, else 16.
TEST(CudaOps, QuantLinearRowsEqualOneRowCalls) {
  LATHE_REQUIRE_GPU();
  for (const auto& [bits, gs, K] : std::vector<std::tuple<int, int, int64_t>>{
           {4, 64, 2560}, {8, 32, 1024}, {4, 64, 1344}, {8, 128, 2560}, {4, 32, 2048}, {4, 32, 800}}) {
    const int64_t N = 333;
    const Weight wd = on_device(random_quantized(N, K, bits, gs, 21));
    const Tensor bias = Tensor::from_floats(random_floats(static_cast<size_t>(N), 22), {N}).to(Device::CUDA);
    for (int64_t M : {2, 5, 8, 9, 16}) {
      if (M > 8 && bits == 4) continue;  // gemm_q4 above 8 rows
      const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(M * K), 23), {M, K}).to(DType::BF16);
      const Tensor xd = x.to(Device::CUDA);
      for (bool f32_out : {true, false}) {
        const std::vector<float> all = linear(xd, wd, &bias, f32_out).to_floats();
        for (int64_t m = 0; m < M; ++m) {
          const std::vector<float> one = linear(xd.slice(0, m, m + 1), wd, &bias, f32_out).to_floats();
          const std::vector<float> row(all.begin() + m * N, all.begin() + (m + 1) * N);
          EXPECT_EQ(row, one) << bits << "-bit g" << gs << " K " << K << " M " << M << " row " << m;
        }
      }
    }
  }
}

// gemm_q4 (4-bit weights) against cuBLAS over the same weights dequantized to bf16: the same products summed in
// another order, for every group size and row-tile width (16, 32, 64 rows per block; 128 rows as two blocks),
// with split K (N = 333: 3 column tiles; K = 1792 splits unevenly) and without (N = 1000 over K = 256), f32 and
// bf16 outputs, bias; the same bits on a rerun; and linear() taking it for 9-32 rows.
TEST(CudaOps, GemmQ4MatchesDequantizedGemm) {
  LATHE_REQUIRE_GPU();
  for (const auto& [gs, N, K] : std::vector<std::tuple<int, int64_t, int64_t>>{
           {64, 333, 2048}, {32, 333, 2048}, {128, 333, 1792}, {64, 1000, 256}, {32, 1000, 256}}) {
    const QuantizedMatrix qm = random_quantized(N, K, 4, gs, 31);
    const Weight wd = on_device(qm);
    cuda::QuantView v;
    v.w = wd.q.w.data<uint32_t>();
    v.scales = wd.q.scales.raw();
    v.biases = wd.q.biases.raw();
    v.group_size = gs;
    v.rows = N;
    v.cols = K;
    v.w_stride = K / 8;
    v.sb_stride = K / gs;
    const Tensor dense = dequantize(qm).to(DType::BF16).to(Device::CUDA);
    const Tensor bias = Tensor::from_floats(random_floats(static_cast<size_t>(N), 32), {N}).to(Device::CUDA);
    for (int64_t M : {9, 16, 17, 32, 33, 64, 65, 128}) {
      const Tensor xd =
          Tensor::from_floats(random_floats(static_cast<size_t>(M * K), 33), {M, K}).to(DType::BF16).to(Device::CUDA);
      Tensor ref = Tensor::empty({M, N}, DType::F32, Device::CUDA);
      cuda::gemm(xd.raw(), dense.raw(), DType::BF16, M, N, K, ref.raw(), DType::F32);
      cuda::add_bias(ref.raw(), DType::F32, M, N, bias.data<float>());
      const std::vector<float> want = ref.to_floats();
      const cuda::GemmQ4Plan plan = cuda::plan_gemm_q4(v, xd.raw(), M);
      ASSERT_TRUE(plan.covered);
      EXPECT_EQ(plan.splits > 1, N == 333) << "K " << K << " M " << M;
      Tensor ws = Tensor::empty({std::max<int64_t>(1, plan.workspace_floats)}, DType::F32, Device::CUDA);
      auto run = [&](DType yt) {
        Tensor y = Tensor::empty({M, N}, yt, Device::CUDA);
        cuda::gemm_q4(plan, v, xd.raw(), M, y.raw(), yt, bias.data<float>(), ws.data<float>());
        return y.to_floats();
      };
      const std::vector<float> got = run(DType::F32);
      std::ostringstream where;
      where << "g" << gs << " N " << N << " K " << K << " M " << M;
      const std::string at = where.str();
      EXPECT_LE(max_abs_diff(got, want), 1e-4f * std::max(1.f, max_abs(want))) << at;
      EXPECT_EQ(got, run(DType::F32)) << "rerun, " << at;
      EXPECT_LE(max_abs_diff(run(DType::BF16), want), 1e-2f * std::max(1.f, max_abs(want))) << "bf16 out, " << at;
      if (M <= 32) {
        EXPECT_EQ(linear(xd, wd, &bias, true).to_floats(), got) << "linear(), " << at;
      }
    }
  }
}

struct ACase {
  int64_t T, S, Hq, Hkv, D, window;
  float softcap;
  bool bf16;
};

class Attention : public ::testing::TestWithParam<ACase> {};

TEST_P(Attention, MatchesCpu) {
  LATHE_REQUIRE_GPU();
  const ACase c = GetParam();
  const Tensor q = Tensor::from_floats(random_floats(static_cast<size_t>(c.T * c.Hq * c.D), 1), {c.T, c.Hq, c.D});
  // Keys/values as a view into a larger cache buffer, as the KV cache passes them.
  const Tensor kbuf =
      Tensor::from_floats(random_floats(static_cast<size_t>((c.S + 5) * c.Hkv * c.D), 2), {c.S + 5, c.Hkv, c.D});
  const Tensor vbuf =
      Tensor::from_floats(random_floats(static_cast<size_t>((c.S + 5) * c.Hkv * c.D), 3), {c.S + 5, c.Hkv, c.D});
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(c.D));
  p.softcap = c.softcap;
  p.window = c.window;
  p.q_pos0 = c.S - c.T;
  const DType t = c.bf16 ? DType::BF16 : DType::F32;
  // The reference sees the same rounded inputs.
  const Tensor qr = q.to(t).to(DType::F32), kr = kbuf.to(t).to(DType::F32), vr = vbuf.to(t).to(DType::F32);
  const std::vector<float> ref = attention(qr, kr.slice(0, 0, c.S), vr.slice(0, 0, c.S), p).to_floats();
  const Tensor kd = kbuf.to(t).to(Device::CUDA), vd = vbuf.to(t).to(Device::CUDA);
  const std::vector<float> got =
      attention(q.to(t).to(Device::CUDA), kd.slice(0, 0, c.S), vd.slice(0, 0, c.S), p).to_floats();
  EXPECT_LE(max_abs_diff(got, ref), c.bf16 ? 2e-2f : 1e-5f);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Attention,
    ::testing::Values(ACase{1, 1000, 32, 8, 128, 0, 0.f, false},   // decode, split-KV
                      ACase{1, 1000, 32, 8, 128, 0, 0.f, true},    // decode bf16
                      ACase{1, 10, 32, 8, 128, 0, 0.f, true},      // decode bf16, short context
                      ACase{1, 1, 8, 8, 128, 0, 0.f, true},        // decode bf16, one key, no GQA
                      ACase{1, 700, 4, 1, 256, 512, 0.f, true},    // decode bf16, window, head 256
                      ACase{1, 600, 16, 2, 64, 0, 30.f, true},     // decode bf16, 8 heads per kv head, softcap
                      ACase{1, 700, 4, 1, 256, 512, 0.f, false},   // sliding window, head 256
                      ACase{40, 40, 4, 2, 16, 8, 50.f, false},     // fixture-sized, window + softcap
                      ACase{300, 300, 8, 2, 64, 0, 0.f, false},    // prefill
                      ACase{600, 600, 8, 2, 128, 0, 0.f, true},    // bf16 prefill (tensor cores)
                      ACase{333, 333, 8, 8, 64, 100, 30.f, true},  // bf16 prefill, window + softcap
                      ACase{257, 400, 4, 2, 256, 0, 0.f, true}));  // bf16 chunked prefill after a cache

TEST(CudaOps, QkvRopeAppendMatchesCpu) {
  LATHE_REQUIRE_GPU();
  const int64_t Hq = 8, Hkv = 2, D = 128, cap = 6, row = 4;
  const Tensor y = Tensor::from_floats(random_floats(static_cast<size_t>((Hq + 2 * Hkv) * D), 21, -3.f, 3.f),
                                       {1, (Hq + 2 * Hkv) * D});
  const RopeTable rope = test_rope(96);  // partial rotation
  for (bool norm : {false, true}) {
    const QkvStep st = test_qkv_step(Hq, Hkv, D, norm, 22, Device::CPU);
    QkvStep sd = st;
    sd.q_w = st.q_w.to(Device::CUDA);
    sd.k_w = st.k_w.to(Device::CUDA);
    Tensor kc = Tensor::zeros({cap, Hkv, D}, DType::F32), vc = Tensor::zeros({cap, Hkv, D}, DType::F32);
    Tensor kd = kc.to(DType::BF16).to(Device::CUDA), vd = vc.to(DType::BF16).to(Device::CUDA);
    const Tensor yb = y.to(DType::BF16);
    const std::vector<float> q_ref = qkv_rope_append(yb.to(DType::F32), st, rope, 1000, kc, vc, row).to_floats();
    const std::vector<float> q_got = qkv_rope_append(yb.to(Device::CUDA), sd, rope, 1000, kd, vd, row).to_floats();
    EXPECT_LE(max_abs_diff(q_got, q_ref), 2e-2f * std::max(1.f, max_abs(q_ref))) << "norm " << norm;
    EXPECT_LE(max_abs_diff(kd.to_floats(), kc.to_floats()), 2e-2f * std::max(1.f, max_abs(kc.to_floats())));
    EXPECT_EQ(vd.to_floats(), vc.to_floats());  // copied exactly (the inputs are bf16 values)
  }
}

// The fused append (a warp per head for head sizes 64/128/256, a block per head otherwise) is bitwise the
// separate ops on the device: rms_norm_rope (or rope_inplace) for the q and k heads, the v heads copied.
TEST(CudaOps, QkvRopeAppendEqualsUnfusedBitwise) {
  LATHE_REQUIRE_GPU();
  const int64_t Hq = 8, Hkv = 2, cap = 5, row = 3, pos0 = 777;
  for (const int64_t D : {64, 96, 128, 256}) {
    for (const int64_t dims : {D, D / 2}) {
      const RopeTable rope = test_rope(dims);
      const Tensor y = bf16_kernel_tensor(random_floats(static_cast<size_t>((Hq + 2 * Hkv) * D), 31, -3.f, 3.f),
                                          {1, (Hq + 2 * Hkv) * D})
                           .to(Device::CUDA);
      for (bool norm : {false, true}) {
        const QkvStep st = test_qkv_step(Hq, Hkv, D, norm, 32);
        Tensor kd = Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA);
        Tensor vd = Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA);
        const Tensor q = qkv_rope_append(y, st, rope, pos0, kd, vd, row);
        Tensor qh = y.slice(1, 0, Hq * D).contiguous().reshape({1, Hq, D});
        Tensor kh = y.slice(1, Hq * D, (Hq + Hkv) * D).contiguous().reshape({1, Hkv, D});
        const Tensor vh = y.slice(1, (Hq + Hkv) * D, (Hq + 2 * Hkv) * D).contiguous().reshape({1, Hkv, D});
        if (norm) {
          qh = rms_norm_rope(qh, st.q_w, st.eps, st.plus_one, rope, pos0);
          kh = rms_norm_rope(kh, st.k_w, st.eps, st.plus_one, rope, pos0);
        } else {
          rope_inplace(qh, rope, pos0);
          rope_inplace(kh, rope, pos0);
        }
        const std::string at =
            "D " + std::to_string(D) + " dims " + std::to_string(dims) + " norm " + std::to_string(norm);
        EXPECT_EQ(q.to_floats(), qh.to_floats()) << at;
        EXPECT_EQ(kd.slice(0, row, row + 1).to_floats(), kh.to_floats()) << at;
        EXPECT_EQ(vd.slice(0, row, row + 1).to_floats(), vh.to_floats()) << at;
      }
    }
  }
}

TEST(CudaOps, RowOpsMatchCpu) {
  LATHE_REQUIRE_GPU();
  const int64_t T = 5, H = 4, D = 64;
  const Tensor x = Tensor::from_floats(random_floats(static_cast<size_t>(T * H * D), 5, -3.f, 3.f), {T, H, D});
  const Tensor w = Tensor::from_floats(random_floats(static_cast<size_t>(D), 6), {D});
  const Tensor xd = x.to(Device::CUDA), wd = w.to(Device::CUDA);
  EXPECT_LE(max_abs_diff(rms_norm(xd, wd, 1e-6f, true).to_floats(), rms_norm(x, w, 1e-6f, true).to_floats()), 1e-5f);
  const RopeTable rope = test_rope(48);
  Tensor xc = x.clone(), xg = x.to(Device::CUDA);
  rope_inplace(xc, rope, 4000);
  rope_inplace(xg, rope, 4000);
  EXPECT_LE(max_abs_diff(xg.to_floats(), xc.to_floats()), 1e-4f);
  const Tensor u = Tensor::from_floats(random_floats(static_cast<size_t>(T * H * D), 8, -3.f, 3.f), {T, H, D});
  const Tensor ud = u.to(Device::CUDA);
  EXPECT_LE(max_abs_diff(silu_mul(xd, ud).to_floats(), silu_mul(x, u).to_floats()), 1e-5f);
  EXPECT_LE(max_abs_diff(gelu_tanh_mul(xd, ud).to_floats(), gelu_tanh_mul(x, u).to_floats()), 1e-5f);
  // Gate and up as the column halves of one [rows, 2I] fused output, read in place: as from separate tensors.
  const int64_t I = 37;
  const Tensor gu = Tensor::from_floats(random_floats(static_cast<size_t>(T * 2 * I), 9, -4.f, 4.f), {T, 2 * I});
  const Tensor gud = gu.to(DType::BF16).to(Device::CUDA);
  const Tensor gv = gud.slice(1, 0, I), uv = gud.slice(1, I, 2 * I);
  ASSERT_FALSE(gv.is_contiguous());
  EXPECT_EQ(silu_mul(gv, uv).to_floats(), silu_mul(gv.contiguous(), uv.contiguous()).to_floats());
  EXPECT_EQ(gelu_tanh_mul(gv, uv).to_floats(), gelu_tanh_mul(gv.contiguous(), uv.contiguous()).to_floats());
  // Widths and strides of whole 16-byte pieces take the vectorized kernel: bitwise the one-value kernel, which
  // takes the same values one column over (a stride of no whole pieces).
  const int64_t V = 72;
  const std::vector<float> gu_v = random_floats(static_cast<size_t>(T * 2 * V), 10, -4.f, 4.f);
  std::vector<float> odd(static_cast<size_t>(T * (2 * V + 2)), 0.f);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t c = 0; c < 2 * V; ++c)
      odd[static_cast<size_t>(r * (2 * V + 2) + c + 1 + (c >= V ? 1 : 0))] = gu_v[static_cast<size_t>(r * 2 * V + c)];
  const Tensor vec = Tensor::from_floats(gu_v, {T, 2 * V}).to(DType::BF16).to(Device::CUDA);
  const Tensor one = Tensor::from_floats(odd, {T, 2 * V + 2}).to(DType::BF16).to(Device::CUDA);
  EXPECT_EQ(silu_mul(vec.slice(1, 0, V), vec.slice(1, V, 2 * V)).to_floats(),
            silu_mul(one.slice(1, 1, V + 1), one.slice(1, V + 2, 2 * V + 2)).to_floats());
  EXPECT_EQ(gelu_tanh_mul(vec.slice(1, 0, V), vec.slice(1, V, 2 * V)).to_floats(),
            gelu_tanh_mul(one.slice(1, 1, V + 1), one.slice(1, V + 2, 2 * V + 2)).to_floats());
  Tensor s = x.clone(), sd = x.to(Device::CUDA);
  softcap_inplace(s, 2.f);
  softcap_inplace(sd, 2.f);
  EXPECT_LE(max_abs_diff(sd.to_floats(), s.to_floats()), 1e-6f);
  const Tensor rows = x.reshape({T * H, D});
  EXPECT_EQ(argmax_rows(rows.to(Device::CUDA)), argmax_rows(rows));
}

}  // namespace
}  // namespace lathe
