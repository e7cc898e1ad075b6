// The batched decode kernels (one launch per layer for all rows) against their per-row forms, bitwise: the
// q/k norm + RoPE + KV append, the decode attention over bf16, ring (explicit positions, sliding window) and
// quantized caches, and whole models stepping several sequences at once against each sequence alone. Bitwise
// is the contract: batched greedy must equal solo greedy.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "cuda/cuda_test_util.h"
#include "model/layers/attention.h"
#include "model/model.h"
#include "support/fixtures.h"
#include "tensor/ops.h"
#include "tensor/ops_extra.h"

namespace lathe {
namespace {
using namespace testing_cuda;

Tensor dev_bf16(const std::vector<float>& v, const Shape& shape) {
  return Tensor::from_floats(v, shape).to(DType::BF16).to(Device::CUDA);
}

struct Row {
  int64_t S;
  bool ring = false;       // explicit, shuffled key positions
  bool quantized = false;  // 8-bit KV triples
};

// tol 0: each row bitwise its solo launch; else within tol·max(1, |solo|).
void check_rows(int64_t Hq, int64_t Hkv, int64_t D, int64_t window, float softcap, const std::vector<Row>& spec,
                float tol = 0.f) {
  AttentionParams p;
  p.scale = 1.0f / std::sqrt(static_cast<float>(D));
  p.softcap = softcap;
  p.window = window;
  std::vector<DecodeKV> rows;
  std::vector<std::vector<int64_t>> positions(spec.size());
  // What the rows point at (DecodeKV holds pointers), one slot per row so nothing moves.
  std::vector<Tensor> keys(spec.size()), values(spec.size());
  std::vector<QuantizedMatrix> qkeys(spec.size()), qvalues(spec.size());
  std::vector<std::vector<float>> solo;
  uint32_t seed = 100;
  for (size_t r = 0; r < spec.size(); ++r) {
    const Row& c = spec[r];
    DecodeKV d;
    d.q = dev_bf16(random_floats(static_cast<size_t>(Hq * D), seed++, -2.f, 2.f), {1, Hq, D});
    // Keys/values as a view into a larger buffer, as the KV cache passes them.
    const Tensor kb = dev_bf16(random_floats(static_cast<size_t>((c.S + 7) * Hkv * D), seed++), {c.S + 7, Hkv, D});
    const Tensor vb = dev_bf16(random_floats(static_cast<size_t>((c.S + 7) * Hkv * D), seed++), {c.S + 7, Hkv, D});
    d.q_pos0 = c.S - 1 + static_cast<int64_t>(r);
    d.k_pos0 = static_cast<int64_t>(r);
    AttentionParams pr = p;
    pr.q_pos0 = d.q_pos0;
    pr.k_pos0 = d.k_pos0;
    if (c.ring) {
      for (int64_t s = 0; s < c.S; ++s) positions[r].push_back(d.k_pos0 + (s * 7 + 3) % c.S);
      d.k_pos = &positions[r];
      pr.k_pos = d.k_pos;
    }
    if (c.quantized) {
      d.quantized = true;
      d.kv_heads = Hkv;
      qkeys[r] = quantize_kv(kb.slice(0, 0, c.S).contiguous().reshape({c.S * Hkv, D}), 8, 64);
      qvalues[r] = quantize_kv(vb.slice(0, 0, c.S).contiguous().reshape({c.S * Hkv, D}), 8, 64);
      d.qk = &qkeys[r];
      d.qv = &qvalues[r];
      solo.push_back(attention_quantized(d.q, qkeys[r], qvalues[r], Hkv, pr).to_floats());
    } else {
      keys[r] = kb.slice(0, 0, c.S);
      values[r] = vb.slice(0, 0, c.S);
      d.k = &keys[r];
      d.v = &values[r];
      solo.push_back(attention(d.q, keys[r], values[r], pr).to_floats());
    }
    rows.push_back(d);
  }
  const Tensor out = attention_decode_rows(rows, p);
  ASSERT_TRUE(out.defined()) << "the batched kernel declined these rows";
  ASSERT_EQ(out.dim(0), static_cast<int64_t>(rows.size()));
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<float> got = out.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1).to_floats();
    if (tol == 0.f) {
      EXPECT_EQ(got, solo[r]) << "row " << r << " (S " << spec[r].S << ") differs from its solo launch";
      continue;
    }
    ASSERT_EQ(got.size(), solo[r].size());
    float worst = 0.f;
    for (size_t i = 0; i < got.size(); ++i)
      worst = std::max(worst, std::fabs(got[i] - solo[r][i]) / std::max(1.f, std::fabs(solo[r][i])));
    EXPECT_LE(worst, tol) << "row " << r << " (S " << spec[r].S << ")";
  }
}

TEST(CudaDecodeRows, AttentionEqualsSoloBitwise) {
  LATHE_REQUIRE_GPU();
  // Qwen3-4B's heads (GQA 4): contexts from one key to several splits' worth, mixed kinds in one launch.
  check_rows(32, 8, 128, 0, 0.f, {{1}, {17}, {300}, {2500}, {64, false, true}, {129}});
  // Sliding window over a ring's explicit positions and over linear ones, softcap, GQA 8, head 256.
  check_rows(16, 2, 64, 40, 30.f, {{100, true}, {33}, {100}, {9, true}, {90, true, true}});
  check_rows(8, 1, 256, 512, 0.f, {{700}, {1}, {600, true}});
  // Short contexts only: the launch gets blocks for the splits they use (9 of 33), the rest none.
  check_rows(32, 8, 128, 0, 0.f, {{17}, {40}, {129}, {64, false, true}, {3, true}});
}

// Steps wider than exact_decode_rows() whose rows cover the SMs take the one-block-per-row kernel: close to
// each row's solo launch (sums in another order, one bf16 rounding), over the same kinds of rows.
TEST(CudaDecodeRows, WideAttentionCloseToSolo) {
  LATHE_REQUIRE_GPU();
  std::vector<Row> many;
  for (int64_t r = 0; r < 64; ++r) many.push_back({1 + (r * 397) % 2600, r % 9 == 4, r % 13 == 7});
  check_rows(32, 8, 128, 0, 0.f, many, 8e-3f);
  std::vector<Row> windowed;  // GQA 8, head 64, a window and softcap, rings
  for (int64_t r = 0; r < 160; ++r) windowed.push_back({1 + (r * 37) % 300, r % 3 == 0});
  check_rows(16, 2, 64, 40, 30.f, windowed, 8e-3f);
  std::vector<Row> wide_heads;  // GQA 2, head 256
  for (int64_t r = 0; r < 40; ++r) wide_heads.push_back({1 + (r * 53) % 700, r % 5 == 1});
  check_rows(8, 4, 256, 0, 0.f, wide_heads, 8e-3f);
}

TEST(CudaDecodeRows, QkvRopeAppendEqualsSoloBitwise) {
  LATHE_REQUIRE_GPU();
  const int64_t Hq = 8, Hkv = 2, D = 128, cap = 9, B = 3;
  const RopeTable rope = test_rope(96);  // partial rotation
  for (bool norm : {false, true}) {
    const QkvStep st = test_qkv_step(Hq, Hkv, D, norm, 22);
    const Tensor y =
        dev_bf16(random_floats(static_cast<size_t>(B * (Hq + 2 * Hkv) * D), 21, -3.f, 3.f), {B, (Hq + 2 * Hkv) * D});
    std::vector<Tensor> kb, vb, ks, vs;
    std::vector<AppendSlot> slots;
    for (int64_t r = 0; r < B; ++r) {
      kb.push_back(Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA));
      vb.push_back(Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA));
      ks.push_back(Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA));
      vs.push_back(Tensor::zeros({cap, Hkv, D}, DType::BF16, Device::CUDA));
    }
    for (int64_t r = 0; r < B; ++r) slots.push_back({&kb[r], &vb[r], 2 * r, 1000 + 37 * r});
    const Tensor q = qkv_rope_append_rows(y, st, rope, slots);
    ASSERT_TRUE(q.defined());
    for (int64_t r = 0; r < B; ++r) {
      const Tensor yr = y.slice(0, r, r + 1).contiguous();
      const Tensor qs =
          qkv_rope_append(yr, st, rope, 1000 + 37 * r, ks[static_cast<size_t>(r)], vs[static_cast<size_t>(r)], 2 * r);
      EXPECT_EQ(q.slice(0, r, r + 1).to_floats(), qs.to_floats()) << "norm " << norm << " row " << r;
      EXPECT_EQ(kb[static_cast<size_t>(r)].to_floats(), ks[static_cast<size_t>(r)].to_floats());
      EXPECT_EQ(vb[static_cast<size_t>(r)].to_floats(), vs[static_cast<size_t>(r)].to_floats());
    }
  }
}

// The fused append over quantized caches (one launch: norm + RoPE, quantization, writes to each row's parts)
// stores bitwise what staging the rows (qkv_rope_append_rows) and quantizing them (quantize_kv) stores, and
// returns the same q: 4 and 8 bits, groups of 32 and 64, with and without the q/k norm, partial rotation.
TEST(CudaDecodeRows, FusedQuantizedAppendEqualsStagedBitwise) {
  LATHE_REQUIRE_GPU();
  const int64_t Hq = 8, Hkv = 2, D = 128, B = 5;
  const RopeTable rope = test_rope(96);
  for (bool norm : {false, true})
    for (int bits : {4, 8})
      for (int gs : {32, 64}) {
        SCOPED_TRACE(testing::Message() << "norm " << norm << ", " << bits << "-bit group " << gs);
        ASSERT_TRUE(quantized_append_covers(Device::CUDA, D, bits, gs));
        const QkvStep st = test_qkv_step(Hq, Hkv, D, norm, 32);
        const Tensor y = dev_bf16(random_floats(static_cast<size_t>(B * (Hq + 2 * Hkv) * D), 31 + bits + gs, -3.f, 3.f),
                                  {B, (Hq + 2 * Hkv) * D});
        std::vector<int64_t> pos;
        for (int64_t r = 0; r < B; ++r) pos.push_back(500 + 41 * r);
        // Staged: rows into [B, Hkv, D] buffers, then quantized.
        Tensor ks = Tensor::zeros({B, Hkv, D}, DType::BF16, Device::CUDA);
        Tensor vs = Tensor::zeros({B, Hkv, D}, DType::BF16, Device::CUDA);
        std::vector<AppendSlot> slots;
        for (int64_t r = 0; r < B; ++r) slots.push_back({&ks, &vs, r, pos[static_cast<size_t>(r)]});
        const Tensor q_staged = qkv_rope_append_rows(y, st, rope, slots);
        ASSERT_TRUE(q_staged.defined());
        const QuantizedMatrix qk = quantize_kv(ks.reshape({B * Hkv, D}), bits, gs);
        const QuantizedMatrix qv = quantize_kv(vs.reshape({B * Hkv, D}), bits, gs);
        // Fused: straight into six part buffers laid out as a cache's rows [B, Hkv, ...].
        std::vector<Tensor> parts = {Tensor::zeros({B, Hkv, D * bits / 32}, DType::U32, Device::CUDA),
                                     Tensor::zeros({B, Hkv, D / gs}, DType::BF16, Device::CUDA),
                                     Tensor::zeros({B, Hkv, D / gs}, DType::BF16, Device::CUDA),
                                     Tensor::zeros({B, Hkv, D * bits / 32}, DType::U32, Device::CUDA),
                                     Tensor::zeros({B, Hkv, D / gs}, DType::BF16, Device::CUDA),
                                     Tensor::zeros({B, Hkv, D / gs}, DType::BF16, Device::CUDA)};
        std::vector<QuantAppendSlot> qslots(static_cast<size_t>(B));
        for (int64_t r = 0; r < B; ++r) {
          for (size_t i = 0; i < 6; ++i) qslots[static_cast<size_t>(r)].dst[i] = parts[i].slice(0, r, r + 1).raw();
          qslots[static_cast<size_t>(r)].pos = pos[static_cast<size_t>(r)];
        }
        const Tensor q_fused = qkv_rope_append_quantized_rows(y, st, rope, qslots, bits, gs);
        ASSERT_TRUE(q_fused.defined());
        EXPECT_EQ(q_fused.to_floats(), q_staged.to_floats());
        const Tensor* want[6] = {&qk.w, &qk.scales, &qk.biases, &qv.w, &qv.scales, &qv.biases};
        for (size_t i = 0; i < 6; ++i) {
          const Tensor a = parts[i].to(Device::CPU), b = want[i]->to(Device::CPU);
          ASSERT_EQ(a.nbytes(), b.nbytes()) << "part " << i;
          EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "part " << i << " differs";
        }
      }
}

// Four sequences of different lengths decode together; every step's logits equal each one's solo step.
void check_model(const std::string& name, const CacheOptions& kv) {
  const test::Reference ref = test::load_reference(name);
  auto model = load_model(test::model_dir(name), LoadOptions{Device::CUDA, DType::BF16});
  const std::vector<std::vector<int32_t>> prompts = {ref.prompts.at("chat"), ref.prompts.at("long"),
                                                     ref.prompts.at("one"), ref.prompts.at("chat_greedy")};
  std::vector<CacheList> solo, batched;
  std::vector<int32_t> next;
  for (const auto& p : prompts) {
    solo.push_back(model->make_cache(kv));
    batched.push_back(model->make_cache(kv));
    const Tensor l = model->forward(p, solo.back(), false);
    model->forward(p, batched.back(), false);
    const std::vector<float> f = l.to_floats();
    next.push_back(static_cast<int32_t>(std::max_element(f.begin(), f.end()) - f.begin()));
  }
  const int64_t appends = batched_quantized_kv_appends();
  for (int step = 0; step < 6; ++step) {
    Batch batch;
    for (size_t s = 0; s < prompts.size(); ++s) batch.rows.push_back({{next[s]}, &batched[s], true, -1});
    const std::vector<float> all = model->forward(batch).to_floats();
    const size_t V = all.size() / prompts.size();
    for (size_t s = 0; s < prompts.size(); ++s) {
      const std::vector<float> want = model->forward({next[s]}, solo[s], false).to_floats();
      const std::vector<float> got(all.begin() + static_cast<std::ptrdiff_t>(s * V),
                                   all.begin() + static_cast<std::ptrdiff_t>((s + 1) * V));
      ASSERT_EQ(got, want) << name << " kv_bits " << kv.kv_bits << " step " << step << " sequence " << s;
      next[s] = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
    }
  }
  // Quantized full-attention caches: solo and batched steps both took the batched append (ring caches do not).
  if (kv.kv_bits && name.rfind("gemma", 0) != 0) {
    EXPECT_GT(batched_quantized_kv_appends(), appends) << name;
  }
}

// Quantized caches in a step wider than the bitwise rows: the rows' K/V are normed and roped by one kernel,
// quantized by one launch and copied into each cache's next row (Attention::decode_rows_quantized) instead of
// each row's update(). Every cache then holds one more token, and each row's logits stay close to its solo
// step (the wide GEMMs and attention sum in another order).
TEST(CudaDecodeRows, WideQuantizedStepsCloseToSolo) {
  LATHE_REQUIRE_GPU();
  const bool was = batched_decode_enabled();
  set_batched_decode_enabled(true);
  const std::string name = "qwen3-q4g64";
  const test::Reference ref = test::load_reference(name);
  auto model = load_model(test::model_dir(name), LoadOptions{Device::CUDA, DType::BF16});
  const CacheOptions kv{8, 64};
  const std::vector<std::vector<int32_t>> base = {ref.prompts.at("chat"), ref.prompts.at("long"), ref.prompts.at("one"),
                                                  ref.prompts.at("chat_greedy")};
  const size_t n = static_cast<size_t>(exact_batched_decode_rows()) + 3;
  std::vector<CacheList> solo, batched;
  std::vector<int32_t> next;
  for (size_t s = 0; s < n; ++s) {
    std::vector<int32_t> p = base[s % base.size()];
    p.push_back(static_cast<int32_t>(5 + s));  // every sequence its own
    solo.push_back(model->make_cache(kv));
    batched.push_back(model->make_cache(kv));
    const std::vector<float> f = model->forward(p, solo.back(), false).to_floats();
    model->forward(p, batched.back(), false);
    next.push_back(static_cast<int32_t>(std::max_element(f.begin(), f.end()) - f.begin()));
  }
  const int64_t appends = batched_quantized_kv_appends();
  for (int step = 0; step < 4; ++step) {
    Batch batch;
    for (size_t s = 0; s < n; ++s) batch.rows.push_back({{next[s]}, &batched[s], true, -1});
    const std::vector<float> all = model->forward(batch).to_floats();
    const size_t V = all.size() / n;
    for (size_t s = 0; s < n; ++s) {
      const std::vector<float> want = model->forward({next[s]}, solo[s], false).to_floats();
      float scale = 1.f, diff = 0.f;
      for (size_t i = 0; i < V; ++i) {
        scale = std::max(scale, std::fabs(want[i]));
        diff = std::max(diff, std::fabs(all[s * V + i] - want[i]));
      }
      EXPECT_LE(diff, 0.05f * scale) << "step " << step << " sequence " << s;
      ASSERT_EQ(batched[s][0]->offset(), solo[s][0]->offset());
      EXPECT_STREQ(batched[s][0]->kind(), "quantized");
      next[s] = static_cast<int32_t>(std::max_element(want.begin(), want.end()) - want.begin());
    }
  }
  EXPECT_GT(batched_quantized_kv_appends(), appends);  // the batched append served these steps
  set_batched_decode_enabled(was);
}

TEST(CudaDecodeRows, ModelStepsEqualSoloBitwise) {
  LATHE_REQUIRE_GPU();
  const bool was = batched_decode_enabled();
  set_batched_decode_enabled(true);
  check_model("qwen3-q4g64", {});
  check_model("qwen3-q4g64", {8, 64});
  check_model("gemma3-q4g64", {});  // sliding-window layers: ring caches
  check_model("llama-q4g64", {4, 32});
  set_batched_decode_enabled(was);
}

}  // namespace
}  // namespace lathe
