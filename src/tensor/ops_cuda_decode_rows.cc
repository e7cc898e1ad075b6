// Device dispatch of the batched decode attention (ops_extra.h attention_decode_rows): per-row checks, the
// row table and ring positions in one upload, one launch for all rows: tensor/cuda/decode_attention.cu (each
// row bitwise its solo launch), or decode_attention_wide.cu for steps wider than exact_decode_rows().
#ifdef LATHE_HAVE_CUDA
#include <algorithm>
#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "tensor/cuda/decode_attention.h"
#include "tensor/cuda/decode_attention_wide.h"
#include "tensor/cuda/kernels_models.h"
#include "tensor/ops_cuda.h"
#include "tensor/ops_cuda_check.h"
#include "tensor/ops_extra.h"

namespace lathe::gpu {

Tensor attention_decode_rows(const std::vector<DecodeKV>& rows, const AttentionParams& p, const GraphTable* table) {
  // Inside a graph capture only with a table the replays rewrite (else the row table is uploaded from reused
  // host staging).
  if (rows.empty() || cuda::decode_attention_off() || (cuda::capturing() && !table)) return Tensor();
  const size_t B = rows.size();
  std::vector<Tensor> keep;  // dequantized K/V of quantized rows, alive until the launch is queued
  std::vector<cuda::DecodeRow> host(B);
  std::vector<int64_t> positions;
  std::vector<int64_t> pos_at(B, -1);
  cuda::AttentionArgs a;
  // One launch reads one kind of K/V: quantized rows beside dense ones (not a model's step, whose rows share a
  // cache kind) are dequantized like a wide step's.
  const bool all_quantized = std::all_of(rows.begin(), rows.end(), [](const DecodeKV& r) { return r.quantized; });
  bool v16 = true;
  for (size_t r = 0; r < B; ++r) {
    const DecodeKV& row = rows[r];
    const Tensor& q = row.q;
    if (q.device() != Device::CUDA || q.dtype() != DType::BF16 || q.ndim() != 3 || q.dim(0) != 1 || !q.is_contiguous())
      return Tensor();
    cuda::AttentionArgs ai;
    // Quantized rows are read in place by either kernel (a captured step's replays rewrite their codes, scales
    // and biases in the table); LATHE_CUDA_KV_IN_PLACE=0 dequantizes them (to q's type, as attention_quantized's
    // fallback), outside captures.
    const bool in_place = row.quantized && all_quantized && cuda::kv_in_place_on();
    const Tensor* kp = row.k;
    const Tensor* vp = row.v;
    if (row.quantized && !in_place) {
      if (table || row.kv_heads <= 0 || !row.qk || !row.qv) return Tensor();
      const int64_t S = row.qk->rows() / row.kv_heads;
      keep.push_back(Tensor::empty({S, row.kv_heads, row.qk->cols()}, q.dtype(), Device::CUDA));
      keep.push_back(Tensor::empty({S, row.kv_heads, row.qv->cols()}, q.dtype(), Device::CUDA));
      kp = &keep[keep.size() - 2];
      vp = &keep.back();
      cuda::dequantize_any(view(*row.qk), kp->raw(), q.dtype());
      cuda::dequantize_any(view(*row.qv), vp->raw(), q.dtype());
    }
    if (in_place) {
      if (!row.qk || !row.qv || !quantized_kv_args(ai, *row.qk, *row.qv, row.kv_heads) || ai.D != q.dim(2))
        return Tensor();
      // The wide kernel copies value codes to shared memory 16 bytes at a time.
      v16 = v16 && (reinterpret_cast<uintptr_t>(ai.v) & 15) == 0;
    } else {
      if (!kp || !vp) return Tensor();
      const Tensor& k = *kp;
      const Tensor& v = *vp;
      if (k.device() != Device::CUDA || v.device() != Device::CUDA || k.dtype() != q.dtype() ||
          v.dtype() != q.dtype() || k.ndim() != 3 || v.ndim() != 3 || k.stride(2) != 1 || v.stride(2) != 1 ||
          k.dim(0) != v.dim(0) || k.dim(1) != v.dim(1) || k.dim(2) != q.dim(2) || k.dim(0) == 0)
        return Tensor();
      dense_kv_args(ai, k, v);
    }
    if (ai.S == 0 || (row.k_pos && (table || static_cast<int64_t>(row.k_pos->size()) != ai.S))) return Tensor();
    ai.q = q.raw();
    ai.t = q.dtype();
    ai.T = 1;
    ai.Hq = q.dim(1);
    ai.D = q.dim(2);
    ai.q_s0 = q.stride(0);
    ai.q_s1 = q.stride(1);
    ai.scale = p.scale;
    ai.softcap = p.softcap;
    ai.window = p.window;
    ai.causal = p.causal;
    if (!cuda::decode_attention_applies(ai)) return Tensor();
    if (r == 0) {
      a = ai;
    } else if (ai.Hq != a.Hq || ai.D != a.D || ai.Hkv != a.Hkv || ai.Dv != a.Dv || ai.k_s0 != a.k_s0 ||
               ai.k_s1 != a.k_s1 || ai.v_s0 != a.v_s0 || ai.v_s1 != a.v_s1 || ai.q_s1 != a.q_s1 ||
               ai.kv_bits != a.kv_bits || ai.k_gs != a.k_gs || ai.v_gs != a.v_gs || ai.ksb_s0 != a.ksb_s0 ||
               ai.ksb_s1 != a.ksb_s1 || ai.vsb_s0 != a.vsb_s0 || ai.vsb_s1 != a.vsb_s1) {
      return Tensor();
    }
    host[r] = {q.raw(),    ai.k,        ai.v,        nullptr,     ai.S,       row.q_pos0,
               row.k_pos0, ai.k_scales, ai.k_biases, ai.v_scales, ai.v_biases};
    if (row.k_pos) {
      pos_at[r] = static_cast<int64_t>(positions.size());
      positions.insert(positions.end(), row.k_pos->begin(), row.k_pos->end());
    }
  }
  if (static_cast<int64_t>(B) > cuda::decode_attention_max_rows(a)) return Tensor();
  // One upload: the row table, then the ring rows' key positions.
  const size_t table_bytes = B * sizeof(cuda::DecodeRow), bytes = table_bytes + positions.size() * sizeof(int64_t);
  Tensor dev;
  char* base = nullptr;
  if (table) {  // a captured step (no ring rows): its replays rewrite the row table
    base = static_cast<char*>(const_cast<void*>(table->dev));
    std::memcpy(table->host, host.data(), table_bytes);
  } else {
    dev = Tensor::empty({static_cast<int64_t>(bytes)}, DType::U8, Device::CUDA);
    base = static_cast<char*>(dev.raw());
    for (size_t r = 0; r < B; ++r)
      if (pos_at[r] >= 0) host[r].k_pos = reinterpret_cast<const int64_t*>(base + table_bytes) + pos_at[r];
    std::vector<char> blob(bytes);
    std::memcpy(blob.data(), host.data(), table_bytes);
    if (!positions.empty())
      std::memcpy(blob.data() + table_bytes, positions.data(), positions.size() * sizeof(int64_t));
    cuda::upload_async(base, blob.data(), bytes);
  }
  const int64_t n = static_cast<int64_t>(B);
  Tensor out = Tensor::empty({n, a.Hq, a.Dv}, a.t, Device::CUDA);
  a.out = out.raw();
  a.delta = nullptr;
  a.k_pos = nullptr;
  if (n > exact_decode_rows() && (a.kv_bits == 0 || v16) && cuda::decode_attention_wide_applies(a, n)) {
    cuda::decode_attention_wide(a, reinterpret_cast<const cuda::DecodeRow*>(base), n);
    return out;
  }
  const int splits = cuda::decode_attention_splits(a);
  int max_active = table ? splits : 1;  // a replay may run at a longer context than its capture
  for (const cuda::DecodeRow& h : host)
    max_active = std::max(max_active, cuda::decode_attention_active_splits(h.S, splits));
  Tensor part;
  if (splits > 1) part = Tensor::empty({n * a.Hq * splits * (a.Dv + 4)}, DType::F32, Device::CUDA);
  cuda::decode_attention_rows(a, reinterpret_cast<const cuda::DecodeRow*>(base), n, splits, max_active,
                              splits > 1 ? part.data<float>() : nullptr);
  return out;
}

}  // namespace lathe::gpu
#endif
