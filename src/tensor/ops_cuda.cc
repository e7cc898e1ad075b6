// Device dispatch for ops.h: validates device tensors and calls the kernels in tensor/cuda/. Quantized linear
// layers take the fused GEMV for one row, the same GEMV per row in one launch up to LATHE_CUDA_GEMV_ROWS rows
// (batched decode), and cuBLAS above (prefill, wide batches) over a kept dense copy or a dequantized scratch.
#ifdef LATHE_HAVE_CUDA
#include "tensor/ops_cuda.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/env.h"
#include "common/error.h"
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/gemm_q4.h"
#include "tensor/cuda/gemv_mma.h"
#include "tensor/cuda/kernels.h"
#include "tensor/cuda/kernels_models.h"
#include "tensor/dense_weights.h"
#include "tensor/device_memory.h"
#include "tensor/ops_cuda_check.h"
#include "tensor/ops_extra.h"

namespace lathe::gpu {
namespace {

// Token ids on the device. While a decode step is captured into a graph they come from the step buffer that
// each replay rewrites (a synchronous upload cannot be captured).
const int32_t* upload_ids(const std::vector<int32_t>& ids, int64_t vocab, Tensor& holder) {
  for (int32_t id : ids)
    if (id < 0 || id >= vocab)
      throw Error(ErrorKind::InvalidArgument,
                  "token id " + std::to_string(id) + " is out of range for a vocabulary of " + std::to_string(vocab));
  if (cuda::capturing()) {
    if (const int32_t* batch = cuda::capture_batch_ids(static_cast<int64_t>(ids.size()))) return batch;
    LATHE_CHECK(ids.size() == 1, "graph capture: one token per step");
    return cuda::step_ids();
  }
  holder = Tensor::from_ints(ids, {static_cast<int64_t>(ids.size())}).to(Device::CUDA);
  return holder.data<int32_t>();
}

// LATHE_CUDA_GEMV_ROWS, or 0 when unset (or not positive).
int64_t gemv_rows_env() {
  static const int64_t env = std::max<int64_t>(0, env_int("LATHE_CUDA_GEMV_ROWS", 0));
  return env;
}

// Rows up to which a quantized linear runs as per-row GEMVs: LATHE_CUDA_GEMV_ROWS, default 16, or 32 where the
// weights are unpacked once for 8 rows (4-bit g32/g64: gemv_mma_tokens.cu). H200, Qwen3-4B 4-bit decode step:
// the shared-unpack GEMV beats dequantize + GEMM up to 32 rows (1,831 against 1,597 tok/s) and loses above
// (64: 1,925 against 2,659), being bound by its mma work; LATHE_CUDA_GEMV_ROWS=256 keeps every row of a
// decode batch bitwise its solo result at that cost. Prefill chunks take the GEMM.
int64_t gemv_rows_limit(const cuda::QuantView& q) {
  if (gemv_rows_env() > 0) return gemv_rows_env();
  return cuda::gemv_q_mma_tokens_covers(q) ? 32 : 16;
}

// The limit where the weight has a kept dense copy (tensor/dense_weights.h): cuBLAS over the copy has no
// dequantize to pay for. H200, Qwen3-4B 4-bit g64 decode step at 2 / 4 / 8 / 16 / 32 rows: GEMV 3.59 / 4.11 /
// 5.55 / 9.46 / 17.3 ms, GEMM over the copies 4.31 / 4.40 / 4.90 / 5.87 / 7.89 ms. Batches of up to 8 rows stay
// on the GEMV, so they stay bitwise their rows' solo results, for 12% at 8 rows.
constexpr int64_t kGemvRowsWithDenseCopy = 8;

// Rows up to which quantized linears above the GEMV's limit take gemm_q4 (4-bit weights): LATHE_CUDA_Q4_ROWS,
// default 32, 0 turns it off. H100, Qwen3-4B 4-bit decode step against cuBLAS over dense copies: faster up to 32
// rows, slower at 64 (docs/benchmarks/cuda.md, session 29). Up to the limit no dense copy is made.
int64_t q4_rows_limit() {
  static const int64_t limit = std::max<int64_t>(0, env_int("LATHE_CUDA_Q4_ROWS", 32));
  return limit;
}

}  // namespace

int64_t exact_decode_rows() { return gemv_rows_env() > 0 ? gemv_rows_env() : kGemvRowsWithDenseCopy; }

Tensor linear(const Tensor& x_in, const Weight& w, const Tensor* bias, bool f32_out) {
  require_act(x_in, "linear");
  const Tensor x = x_in.contiguous();
  const DType yt = f32_out ? DType::F32 : x.dtype();
  const int64_t M = x.dim(0), N = w.out_features(), K = w.in_features();
  Tensor y = Tensor::empty({M, N}, yt, Device::CUDA);
  const float* b = f32_ptr(bias, "linear bias");
  if (w.quantized) {
    require_device(w.q.w, "linear");
    const cuda::QuantView q = view(w.q);
    if (M == 1) {
      cuda::gemv_quantized(q, x.raw(), x.dtype(), y.raw(), yt, b);
      return y;
    }
    // A batched decode step (few rows): the GEMV per row in one launch, weights from DRAM once, each row's
    // result bit-identical to its solo GEMV (batched greedy equals solo greedy). Above the limit the dequantized
    // GEMM's fixed cost (writing and reading the bf16 weights) is the cheaper one; with a kept dense copy there
    // is no such cost and the limit is lower.
    int64_t limit = gemv_rows_limit(q);
    // Wider decode steps over 4-bit weights: the GEMM that reads the codes (gemm_q4.cu) instead of a dense copy.
    cuda::GemmQ4Plan q4;
    if (M > kGemvRowsWithDenseCopy && M <= q4_rows_limit() && gemv_rows_env() == 0 && x.dtype() == DType::BF16)
      q4 = cuda::plan_gemm_q4(q, x.raw(), M);
    const void* wd = nullptr;
    if (q4.covered || (M > kGemvRowsWithDenseCopy && gemv_rows_env() == 0 && (wd = dense_weight(w.q, x.dtype()))))
      limit = kGemvRowsWithDenseCopy;
    if (M <= limit && cuda::gemv_quantized_rows(q, x.raw(), x.dtype(), M, y.raw(), yt, b)) return y;
    if (q4.covered) {
      Tensor ws;
      if (q4.workspace_floats > 0) ws = Tensor::empty({q4.workspace_floats}, DType::F32, Device::CUDA);
      cuda::gemm_q4(q4, q, x.raw(), M, y.raw(), yt, b, q4.workspace_floats > 0 ? ws.data<float>() : nullptr);
      return y;
    }
    // Prefill and wide decode steps: a tensor-core GEMM over the weight dequantized to the activation type. A
    // dense copy kept within --cuda-dense-weights' budget (tensor/dense_weights.h) skips the dequantize, which
    // writes and rereads 2 bytes per weight for the GEMM's 2: ~2/3 of a 64-row Qwen3-4B step on the H200.
    // Otherwise dequantize into scratch, which returns to the allocator's cache for the next layer.
    if (!wd) wd = dense_weight(w.q, x.dtype());
    if (wd) {
      cuda::gemm(x.raw(), wd, x.dtype(), M, N, K, y.raw(), yt);
    } else {
      Tensor wd_scratch = Tensor::empty({N, K}, x.dtype(), Device::CUDA);
      cuda::dequantize(q, 0, N, wd_scratch.raw(), x.dtype());
      cuda::gemm(x.raw(), wd_scratch.raw(), x.dtype(), M, N, K, y.raw(), yt);
    }
  } else {
    require_device(w.dense, "linear");
    if (w.dense.dtype() != x.dtype() || !w.dense.is_contiguous())
      throw Error(ErrorKind::Internal,
                  "linear: device weight " + w.dense.describe() + " does not match activations " + x.describe());
    cuda::gemm(x.raw(), w.dense.raw(), x.dtype(), M, N, K, y.raw(), yt);
  }
  if (b) cuda::add_bias(y.raw(), yt, M, N, b);
  return y;
}

Tensor embedding(const std::vector<int32_t>& ids, const Weight& table, DType out) {
  const int64_t n = static_cast<int64_t>(ids.size()), dim = table.in_features();
  Tensor holder;
  const int32_t* dev_ids = upload_ids(ids, table.out_features(), holder);
  Tensor y = Tensor::empty({n, dim}, out, Device::CUDA);
  if (table.quantized) {
    cuda::embedding_quantized(view(table.q), dev_ids, n, y.raw(), out);
  } else {
    LATHE_CHECK(table.dense.is_contiguous(), "embedding: table must be contiguous");
    cuda::embedding_dense(table.dense.raw(), table.dense.dtype(), dim, dev_ids, n, y.raw(), out);
  }
  return y;
}

Tensor dequantize(const QuantizedMatrix& q, int64_t row0, int64_t n, DType out) {
  Tensor y = Tensor::empty({n, q.cols()}, out, Device::CUDA);
  cuda::dequantize(view(q), row0, n, y.raw(), out);
  return y;
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, float eps, bool plus_one, DType out_type) {
  require_act(x_in, "rms_norm");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), out_type, Device::CUDA);
  const int64_t D = x.dim(-1);
  cuda::rms_norm(x.raw(), x.dtype(), out.raw(), out_type, x.numel() / D, D, f32_ptr(&weight, "rms_norm"), eps,
                 plus_one);
  return out;
}

void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0) {
  require_act(x, "rope");
  LATHE_CHECK(x.ndim() == 3 && x.is_contiguous(), "rope: expects contiguous [T, H, D]");
  cuda::rope(x.raw(), x.dtype(), x.dim(0), x.dim(1), x.dim(2), rope.inv_freq.data(), rope.dims, rope.attention_scaling,
             pos0);
}

namespace {
// q's side of an attention launch and p's scale and masking. K/V, their shapes and the key positions
// (key_positions) are the caller's.
cuda::AttentionArgs query_args(const Tensor& q, const Tensor& out, const AttentionParams& p, int64_t S) {
  cuda::AttentionArgs a;
  a.q = q.raw();
  a.out = const_cast<void*>(out.raw());
  a.t = q.dtype();
  a.T = q.dim(0);
  a.Hq = q.dim(1);
  a.D = q.dim(2);
  a.S = S;
  a.q_s0 = q.stride(0);
  a.q_s1 = q.stride(1);
  a.scale = p.scale;
  a.softcap = p.softcap;
  a.window = p.window;
  a.causal = p.causal;
  a.q_pos0 = p.q_pos0;
  a.k_pos0 = p.k_pos0;
  return a;
}

// p's key positions for a launch of a.S keys; returns the ring's positions uploaded, which the caller keeps alive
// until the launch is queued.
Tensor key_positions(cuda::AttentionArgs& a, const AttentionParams& p) {
  if (!p.k_pos) {
    a.delta = cuda::step_delta();  // linear positions: a replayed step shifts them on the device
    return Tensor();
  }
  Tensor pos = Tensor::empty({a.S}, DType::I64);  // ring-buffer caches: explicit key positions
  std::copy(p.k_pos->begin(), p.k_pos->end(), pos.data<int64_t>());
  pos = pos.to(Device::CUDA);
  a.k_pos = pos.data<int64_t>();
  return pos;
}
}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  require_act(q_in, "attention");
  require_act(k, "attention");
  require_act(v, "attention");
  LATHE_CHECK(k.dtype() == q_in.dtype() && v.dtype() == q_in.dtype(), "attention: q/k/v types differ");
  const Tensor q = q_in.contiguous();
  Tensor out = Tensor::empty({q.dim(0), q.dim(1), v.dim(2)}, q.dtype(), Device::CUDA);
  cuda::AttentionArgs a = query_args(q, out, p, k.dim(0));
  dense_kv_args(a, k, v);
  const Tensor pos = key_positions(a, p);
  cuda::attention(a);
  return out;
}

void dense_kv_args(cuda::AttentionArgs& a, const Tensor& k, const Tensor& v) {
  a.k = k.raw();
  a.v = v.raw();
  a.S = k.dim(0);
  a.Hkv = k.dim(1);
  a.Dv = v.dim(2);
  a.k_s0 = k.stride(0);
  a.k_s1 = k.stride(1);
  a.v_s0 = v.stride(0);
  a.v_s1 = v.stride(1);
}

bool quantized_kv_args(cuda::AttentionArgs& a, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads) {
  const auto fits = [](const QuantizedMatrix& m) {
    return m.w.device() == Device::CUDA && m.w.dtype() == DType::U32 && m.w.ndim() == 2 && m.w.stride(1) == 1 &&
           m.scales.dtype() == DType::BF16 && m.biases.dtype() == DType::BF16 && m.scales.ndim() == 2 &&
           m.scales.stride(1) == 1 && m.biases.stride(1) == 1 && m.biases.stride(0) == m.scales.stride(0) &&
           m.scales.dim(0) == m.w.dim(0) && m.group_size > 0 && m.scales.dim(1) * m.group_size == m.cols();
  };
  if (kv_heads <= 0 || k.bits != v.bits || !fits(k) || !fits(v) || k.rows() != v.rows() || k.rows() % kv_heads != 0)
    return false;
  a.kv_bits = k.bits;
  a.k = k.w.raw();
  a.v = v.w.raw();
  a.S = k.rows() / kv_heads;
  a.Hkv = kv_heads;
  a.D = k.cols();
  a.Dv = v.cols();
  // A row of the matrices is one token's head: strides in values (codes) and in groups.
  a.k_s1 = k.w.stride(0) * 32 / k.bits;
  a.k_s0 = kv_heads * a.k_s1;
  a.v_s1 = v.w.stride(0) * 32 / v.bits;
  a.v_s0 = kv_heads * a.v_s1;
  a.k_scales = k.scales.raw();
  a.k_biases = k.biases.raw();
  a.v_scales = v.scales.raw();
  a.v_biases = v.biases.raw();
  a.k_gs = k.group_size;
  a.v_gs = v.group_size;
  a.ksb_s1 = k.scales.stride(0);
  a.ksb_s0 = kv_heads * a.ksb_s1;
  a.vsb_s1 = v.scales.stride(0);
  a.vsb_s0 = kv_heads * a.vsb_s1;
  return true;
}

Tensor attention_quantized(const Tensor& q_in, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                           const AttentionParams& p) {
  require_act(q_in, "attention_quantized");
  const Tensor q = q_in.contiguous();
  // A decode step reads the codes in place (no per-step dequantized copy of the whole cache), bitwise the same.
  if (q.dim(0) == 1 && kv_heads > 0 && k.rows() % kv_heads == 0 && !cuda::decode_attention_off() &&
      cuda::kv_in_place_on()) {
    const int64_t S = k.rows() / kv_heads;
    LATHE_CHECK(!p.k_pos || static_cast<int64_t>(p.k_pos->size()) == S, "attention_quantized: key positions");
    Tensor out = Tensor::empty({1, q.dim(1), v.cols()}, q.dtype(), Device::CUDA);
    cuda::AttentionArgs a = query_args(q, out, p, S);
    if (quantized_kv_args(a, k, v, kv_heads) && cuda::decode_attention_applies(a)) {
      const Tensor pos = key_positions(a, p);
      cuda::attention(a);
      return out;
    }
  }
  const int64_t S = k.rows() / kv_heads;
  Tensor kd = Tensor::empty({S, kv_heads, k.cols()}, q.dtype(), Device::CUDA);
  Tensor vd = Tensor::empty({S, kv_heads, v.cols()}, q.dtype(), Device::CUDA);
  cuda::dequantize_any(view(k), kd.raw(), q.dtype());
  cuda::dequantize_any(view(v), vd.raw(), q.dtype());
  return gpu::attention(q, kd, vd, p);
}

Tensor gated(const Tensor& gate, const Tensor& up, bool gelu) {
  require_act(gate, "gated activation");
  LATHE_CHECK(gate.dtype() == up.dtype(), "gated activation: types differ");
  const cuda::Gate kind = gelu ? cuda::Gate::GeluTanh : cuda::Gate::SiLU;
  // The column halves of one [rows, 2I] gate|up output: read in place rather than copied out first.
  if (gate.ndim() == 2 && up.ndim() == 2 && !gate.is_contiguous() && gate.stride(1) == 1 && up.stride(1) == 1 &&
      gate.stride(0) == up.stride(0) && gate.shape() == up.shape()) {
    Tensor out = Tensor::empty(gate.shape(), gate.dtype(), Device::CUDA);
    cuda::gated_rows(gate.raw(), up.raw(), out.raw(), gate.dtype(), gate.dim(0), gate.dim(1), gate.stride(0), kind);
    return out;
  }
  const Tensor g = gate.contiguous(), u = up.contiguous();
  Tensor out = Tensor::empty(g.shape(), g.dtype(), Device::CUDA);
  cuda::gated(g.raw(), u.raw(), out.raw(), g.dtype(), g.numel(), kind);
  return out;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  require_act(a, "add");
  require_act(b_in, "add");
  const Tensor b = b_in.contiguous();
  cuda::add_inplace(a.raw(), a.dtype(), b.raw(), b.dtype(), a.numel());
}

void scale_inplace(Tensor& x, float s) {
  require_act(x, "scale");
  cuda::scale_inplace(x.raw(), x.dtype(), x.numel(), s);
}

void softcap_inplace(Tensor& x, float cap) {
  require_act(x, "softcap");
  cuda::softcap_inplace(x.raw(), x.dtype(), x.numel(), cap);
}

Tensor argmax_rows_device(const Tensor& x_in) {
  require_act(x_in, "argmax");
  const Tensor x = x_in.contiguous();
  LATHE_CHECK(x.ndim() == 2, "argmax_rows: expects [rows, cols]");
  Tensor idx = Tensor::empty({x.dim(0)}, DType::I32, Device::CUDA);
  cuda::argmax_rows(x.raw(), x.dtype(), x.dim(0), x.dim(1), idx.data<int32_t>());
  return idx;
}

void apply_logit_edits(Tensor& x, const std::vector<LogitEdit>& edits) {
  LATHE_CHECK(x.dtype() == DType::F32 && x.is_contiguous(), "apply_logit_edits: expects contiguous F32");
  for (const LogitEdit& e : edits)
    LATHE_CHECK(e.index >= 0 && e.index < x.numel(), "apply_logit_edits: index out of range");
  const size_t bytes = edits.size() * sizeof(LogitEdit);
  Tensor dev = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA);
  cuda::upload_async(dev.raw(), edits.data(), bytes);
  cuda::apply_logit_edits(x.data<float>(), static_cast<const LogitEdit*>(dev.raw()),
                          static_cast<int64_t>(edits.size()));
}

void apply_token_masks(Tensor& x, const std::vector<int32_t>& rows, const std::vector<uint64_t>& bits) {
  // Checked by the caller (ops.cc): contiguous F32, one bitset per row, rows in range. One upload for the row
  // list and the bitsets (~19 KiB a row for a 152k vocabulary).
  const size_t row_bytes = rows.size() * sizeof(int32_t);
  const size_t bits_at = (row_bytes + 15) / 16 * 16;
  std::vector<char> staged(bits_at + bits.size() * sizeof(uint64_t));
  std::memcpy(staged.data(), rows.data(), row_bytes);
  std::memcpy(staged.data() + bits_at, bits.data(), bits.size() * sizeof(uint64_t));
  Tensor dev = Tensor::empty({static_cast<int64_t>(staged.size())}, DType::U8, Device::CUDA);
  cuda::upload_async(dev.raw(), staged.data(), staged.size());
  const char* base = static_cast<const char*>(dev.raw());
  cuda::apply_token_masks(x.data<float>(), x.dim(1), reinterpret_cast<const int32_t*>(base),
                          static_cast<int64_t>(rows.size()), reinterpret_cast<const uint64_t*>(base + bits_at));
}

Tensor sample_rows_device(const Tensor& x, const std::vector<RowSampling>& rows) {
  // Checked by the caller (ops.cc). One upload of the settings, one launch: ids [n], then logprobs' bits [n].
  const int64_t n = x.dim(0);
  const size_t param_bytes = rows.size() * sizeof(RowSampling);
  Tensor params = Tensor::empty({static_cast<int64_t>(param_bytes)}, DType::U8, Device::CUDA);
  cuda::upload_async(params.raw(), rows.data(), param_bytes);
  Tensor picked = Tensor::empty({2 * n}, DType::I32, Device::CUDA);
  int32_t* ids = picked.data<int32_t>();
  cuda::sample_rows(x.data<float>(), n, x.dim(1), static_cast<const RowSampling*>(params.raw()), ids,
                    reinterpret_cast<float*>(ids + n));
  return picked;
}

void copy_segments(const std::vector<CopySegment>& segs, const GraphTable* table) {
  if (segs.empty()) return;
  LATHE_CHECK(table || !cuda::capturing(), "copy_segments: a captured copy needs a table its replays rewrite");
  std::vector<cuda::CopySegment> host(segs.size());
  for (size_t i = 0; i < segs.size(); ++i) {
    const CopySegment& s = segs[i];
    LATHE_CHECK(
        s.bytes % 4 == 0 && reinterpret_cast<uintptr_t>(s.src) % 4 == 0 && reinterpret_cast<uintptr_t>(s.dst) % 4 == 0,
        "copy_segments: sizes and addresses must be multiples of 4 bytes");
    host[i] = {s.src, s.dst, s.bytes};
  }
  Tensor dev;
  const void* segs_dev = row_table(host.data(), host.size() * sizeof(cuda::CopySegment), table, dev);
  cuda::copy_segments(static_cast<const cuda::CopySegment*>(segs_dev), static_cast<int64_t>(host.size()));
}

const void* row_table(const void* host, size_t bytes, const GraphTable* table, Tensor& keep) {
  if (table) {  // a captured step: the replays rewrite this table
    std::memcpy(table->host, host, bytes);
    return table->dev;
  }
  keep = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA);
  cuda::upload_async(keep.raw(), host, bytes);
  return keep.raw();
}

void copy_rows(void* dst, int64_t dst_row, const void* src_rows, int64_t n, size_t row_bytes) {
  LATHE_CHECK(row_bytes % 4 == 0, "copy_rows: row size must be a multiple of 4 bytes");
  cuda::copy_rows(dst, dst_row, src_rows, n, row_bytes);
}

}  // namespace lathe::gpu
#endif
