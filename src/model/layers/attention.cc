#include "model/layers/attention.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "cache/quantized_kv_cache.h"
#include "common/env.h"
#include "common/error.h"
#include "model/batch_graph.h"
#include "tensor/ops_extra.h"

namespace lathe {

Tensor attend(const Tensor& q, const KVView& kv, const AttentionParams& params) {
  AttentionParams ap = params;
  ap.k_pos0 = kv.pos0;
  ap.k_pos = kv.positions.empty() ? nullptr : &kv.positions;
  if (kv.quantized) return attention_quantized(q, kv.qk, kv.qv, kv.kv_heads, ap);
  return attention(q, kv.k, kv.v, ap);
}

Attention::Attention(WeightBinder& b, const std::string& p, const AttentionSpec& s) : spec_(s) {
  const int64_t q_out = s.heads * s.head_dim * (s.q_gate ? 2 : 1), kv_out = s.kv_heads * s.head_dim;
  std::vector<std::string> names{p + ".q_proj"};
  std::vector<int64_t> outs{q_out};
  for (const char* m : {".k_proj", ".v_proj"})
    if (!s.kv_shared && (m[1] == 'k' || !s.k_eq_v)) {
      names.push_back(p + m);
      outs.push_back(kv_out);
    }
  if (auto f = s.qkv_bias || names.size() == 1 ? std::nullopt : b.fused_linear(names, outs, s.hidden)) {
    fused_qkv_ = true;
    qkv_ = *f;
    q_ = bind_row_slice(b, *f, names[0], 0, q_out);
    k_ = bind_row_slice(b, *f, names[1], q_out, q_out + kv_out);
    if (names.size() == 3) v_ = bind_row_slice(b, *f, names[2], q_out + kv_out, q_out + 2 * kv_out);
  } else {
    q_ = bind_linear(b, p + ".q_proj", q_out, s.hidden, s.qkv_bias);
  }
  if (!s.kv_shared && !fused_qkv_) {
    k_ = bind_linear(b, p + ".k_proj", s.kv_heads * s.head_dim, s.hidden, s.qkv_bias);
    if (!s.k_eq_v) v_ = bind_linear(b, p + ".v_proj", s.kv_heads * s.head_dim, s.hidden, s.qkv_bias);
  }
  o_ = bind_linear(b, p + ".o_proj", s.hidden, s.heads * s.head_dim, s.o_bias);
  if (s.qk_norm) {
    q_norm_ = {b.tensor(p + ".q_norm.weight", {s.head_dim}), s.norm_eps, s.norm_plus_one};
    if (!s.kv_shared) k_norm_ = {b.tensor(p + ".k_norm.weight", {s.head_dim}), s.norm_eps, s.norm_plus_one};
  }
  v_norm_ = {Tensor(), s.norm_eps, false};
  direct_ = fused_qkv_ && !s.q_gate && !s.k_eq_v && !s.v_norm && !s.kv_shared;
  direct_step_ = {s.heads,        s.kv_heads,     s.head_dim, s.qk_norm,
                  q_norm_.weight, k_norm_.weight, s.norm_eps, s.norm_plus_one};
}

AttentionParams Attention::params() const {
  AttentionParams ap;
  ap.scale = spec_.scale;
  ap.softcap = spec_.softcap;
  ap.window = spec_.window;
  return ap;
}

Tensor Attention::project_q(const Tensor& q_lin, int64_t pos0, Tensor* gate) const {
  const int64_t T = q_lin.dim(0), H = spec_.heads, D = spec_.head_dim;
  Tensor q = q_lin;
  if (spec_.q_gate) {  // per head: [query (D) | gate (D)]
    const Tensor qg = q.reshape({T, H, 2 * D});
    *gate = qg.slice(2, D, 2 * D).contiguous().reshape({T, H * D});
    q = qg.slice(2, 0, D).contiguous();
  } else {
    q = q.reshape({T, H, D});
  }
  if (spec_.qk_norm) return rms_norm_rope(q, q_norm_.weight, q_norm_.eps, q_norm_.plus_one, spec_.rope, pos0);
  rope_inplace(q, spec_.rope, pos0);
  return q;
}

Tensor Attention::attend_heads(const Tensor& q, const Tensor& gate, const KVView& kv, int64_t pos0) const {
  const int64_t T = q.dim(0);
  AttentionParams ap = params();
  ap.q_pos0 = pos0;
  Tensor out = attend(q, kv, ap).reshape({T, spec_.heads * spec_.head_dim});
  if (spec_.q_gate) out = sigmoid_mul(out, gate);
  return out;
}

Tensor Attention::out_proj(const Tensor& heads) const {
  return o_(heads, spec_.f32_out);  // the Linear adds any LoRA residual at o_proj
}

Tensor Attention::finish(const Tensor& q, const Tensor& gate, const KVView& kv, int64_t pos0) const {
  return out_proj(attend_heads(q, gate, kv, pos0));
}

void Attention::project_kv(const Tensor& k_lin, const Tensor& v_lin, int64_t pos0, Tensor& k, Tensor& v) const {
  const int64_t T = k_lin.dim(0);
  const Tensor k_raw = k_lin.reshape({T, spec_.kv_heads, spec_.head_dim});
  v = spec_.k_eq_v ? k_raw : v_lin.reshape({T, spec_.kv_heads, spec_.head_dim});
  if (spec_.qk_norm) {  // one pass (one launch on CUDA) for the norm and the rotation
    k = rms_norm_rope(k_raw, k_norm_.weight, k_norm_.eps, k_norm_.plus_one, spec_.rope, pos0);
  } else {
    k = k_raw.clone();
    rope_inplace(k, spec_.rope, pos0);
  }
  if (spec_.v_norm) v = v_norm_(v);
}

Tensor Attention::decode_heads(const Tensor& y, LayerCache& cache, KVView* kv_out) const {
  const int64_t pos0 = cache.offset();
  const int64_t qo = q_.w.out_features(), ko = k_.w.out_features();
  // On a device, one kernel norms and ropes q and k and writes k and v straight into the cache's row.
  const bool direct_ok = direct_ && y.device() != Device::CPU;
  if (auto slot = direct_ok ? cache.direct_row(y.slice(1, qo, qo + ko).reshape({1, spec_.kv_heads, spec_.head_dim}))
                            : std::nullopt) {
    const Tensor q = qkv_rope_append(y, direct_step_, spec_.rope, pos0, *slot->keys, *slot->values, slot->row);
    const KVView kv = cache.commit_direct();
    if (kv_out) *kv_out = kv;
    return attend_heads(q, Tensor(), kv, pos0);
  }
  if (y.device() != Device::CPU) {  // a quantized cache: the batched steps' append, so they stay bitwise this
    std::vector<KVView> views;
    const Tensor heads = decode_rows_quantized(y, {&cache}, {pos0}, kv_out ? &views : nullptr);
    if (heads.defined()) {
      if (kv_out) *kv_out = views[0];
      return heads;
    }
  }
  Tensor gate, k, v;
  const Tensor q = project_q(y.slice(1, 0, qo), pos0, &gate);
  project_kv(y.slice(1, qo, qo + ko), spec_.k_eq_v ? Tensor() : y.slice(1, qo + ko, qo + 2 * ko), pos0, k, v);
  const KVView kv = cache.update(k, v);
  if (kv_out) *kv_out = kv;
  return attend_heads(q, gate, kv, pos0);
}

Tensor Attention::decode_rows(const Tensor& y, const std::vector<LayerCache*>& caches,
                              std::vector<KVView>* kv_out) const {
  if (batch_graph_capturing()) return decode_rows_captured(y, caches, kv_out);
  const size_t B = caches.size();
  const int64_t qo = q_.w.out_features(), ko = k_.w.out_features();
  std::vector<int64_t> pos(B);
  for (size_t r = 0; r < B; ++r) pos[r] = caches[r]->offset();
  if (Tensor heads = decode_rows_quantized(y, caches, pos, kv_out); heads.defined()) return heads;
  auto row_of = [&](size_t r) { return y.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1); };
  std::vector<AppendSlot> slots;
  if (direct_) {
    // direct_row() reads only the shape and type of the row it is shown, which every row shares: one view for
    // all (per-row views were a tenth of the host's time in a 64-row step).
    const Tensor like = row_of(0).slice(1, qo, qo + ko).reshape({1, spec_.kv_heads, spec_.head_dim});
    slots.reserve(B);
    for (size_t r = 0; r < B; ++r) {
      const auto slot = caches[r]->direct_row(like);
      if (!slot) break;
      slots.push_back({slot->keys, slot->values, slot->row, pos[r]});
    }
  }
  // A slot reserved above but not used stays free: update() below writes the same row.
  const Tensor q_all = slots.size() == B ? qkv_rope_append_rows(y, direct_step_, spec_.rope, slots) : Tensor();
  std::vector<KVView> views(B);
  std::vector<DecodeKV> rows(B);
  for (size_t r = 0; r < B; ++r) {
    if (q_all.defined()) {
      views[r] = caches[r]->commit_direct();
      rows[r].q = q_all.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1);
    } else {
      Tensor gate, k, v;
      const Tensor yr = row_of(r);
      rows[r].q = project_q(yr.slice(1, 0, qo), pos[r], &gate);
      project_kv(yr.slice(1, qo, qo + ko), spec_.k_eq_v ? Tensor() : yr.slice(1, qo + ko, qo + 2 * ko), pos[r], k, v);
      views[r] = caches[r]->update(k, v);
    }
  }
  return attend_rows(rows, views, pos, kv_out);
}

namespace {
std::atomic<int64_t> g_batched_quantized_appends{0};
}  // namespace

int64_t batched_quantized_kv_appends() { return g_batched_quantized_appends.load(std::memory_order_relaxed); }

Tensor Attention::decode_rows_quantized(const Tensor& y, const std::vector<LayerCache*>& caches,
                                        const std::vector<int64_t>& pos, std::vector<KVView>* kv_out) const {
  // Per row, update() projected, quantized and appended with ~12 launches a layer: 64 rows of Qwen3-4B with
  // 8-bit K/V decoded at 486-628 tok/s against 8,573 with bf16 K/V (H100). Solo steps (decode_heads) take this
  // path too, so a batched row stays bitwise its solo step: the fused norm + RoPE of a row is the same in both,
  // and quantization is per row and group.
  const int64_t B = static_cast<int64_t>(caches.size());
  if (!direct_ || B == 0 || batch_graph_capturing() || !copy_segments_available(y.device())) return Tensor();
  std::vector<QuantizedKVCache*> qc(caches.size());
  for (size_t r = 0; r < caches.size(); ++r) {
    qc[r] = dynamic_cast<QuantizedKVCache*>(caches[r]);
    if (!qc[r] || qc[r]->bits() != qc[0]->bits() || qc[r]->group_size() != qc[0]->group_size()) return Tensor();
  }
  std::vector<QuantizedRowDest> dest(caches.size());
  for (size_t r = 0; r < caches.size(); ++r) {
    const auto d = qc[r]->next_row();  // (room made for a row that is not counted yet changes nothing)
    if (!d) return Tensor();
    dest[r] = *d;
  }
  Tensor q_all = append_quantized_fused(y, dest, pos, qc[0]->bits(), qc[0]->group_size(), nullptr);
  if (!q_all.defined()) {  // a geometry the fused kernel does not cover: staging rows, quantized, then copied
    Tensor ks, vs;
    q_all = stage_rows(y, pos, nullptr, ks, vs);
    if (!q_all.defined()) return Tensor();
    copy_quantized_rows(qc[0]->quantize(ks, vs), dest, nullptr);
  }
  g_batched_quantized_appends.fetch_add(1, std::memory_order_relaxed);
  std::vector<KVView> views(caches.size());
  std::vector<DecodeKV> rows(caches.size());
  for (size_t r = 0; r < caches.size(); ++r) {
    views[r] = qc[r]->commit_row();
    rows[r].q = q_all.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1);
  }
  return attend_rows(rows, views, pos, kv_out);
}

Tensor Attention::stage_rows(const Tensor& y, const std::vector<int64_t>& pos, const GraphTable* table, Tensor& ks,
                             Tensor& vs) const {
  const int64_t B = y.dim(0);
  ks = Tensor::empty({B, spec_.kv_heads, spec_.head_dim}, y.dtype(), y.device());
  vs = Tensor::empty({B, spec_.kv_heads, spec_.head_dim}, y.dtype(), y.device());
  std::vector<AppendSlot> slots(pos.size());
  for (size_t r = 0; r < pos.size(); ++r) slots[r] = {&ks, &vs, static_cast<int64_t>(r), pos[r]};
  return qkv_rope_append_rows(y, direct_step_, spec_.rope, slots, table);
}

Tensor Attention::append_quantized_fused(const Tensor& y, const std::vector<QuantizedRowDest>& dest,
                                         const std::vector<int64_t>& pos, int bits, int group_size,
                                         const GraphTable* table) const {
  if (!quantized_append_covers(y.device(), spec_.head_dim, bits, group_size)) return Tensor();
  const int64_t codes = spec_.kv_heads * spec_.head_dim * bits / 8;
  const int64_t sb = spec_.kv_heads * (spec_.head_dim / group_size) * static_cast<int64_t>(dtype_size(y.dtype()));
  std::vector<QuantAppendSlot> slots(dest.size());
  for (size_t r = 0; r < dest.size(); ++r) {
    for (size_t i = 0; i < 6; ++i) {
      LATHE_CHECK(dest[r].bytes[i] == (i % 3 == 0 ? codes : sb),
                  "quantized KV rows: a cache's row does not match the step's");
      slots[r].dst[i] = dest[r].dst[i];
    }
    slots[r].pos = pos[r];
  }
  return qkv_rope_append_quantized_rows(y, direct_step_, spec_.rope, slots, bits, group_size, table);
}

void Attention::copy_quantized_rows(const RowTensors& quantized, const std::vector<QuantizedRowDest>& dest,
                                    const GraphTable* table) {
  const int64_t B = static_cast<int64_t>(dest.size());
  std::vector<CopySegment> segs;
  segs.reserve(6 * dest.size());
  for (size_t i = 0; i < 6; ++i) {  // part-major: a replay rewrites entry i·B + r (model/batch_graph.cc)
    const Tensor& part = quantized.parts[i];
    const int64_t bytes = static_cast<int64_t>(part.nbytes()) / B;
    for (size_t r = 0; r < dest.size(); ++r) {
      LATHE_CHECK(dest[r].bytes[i] == bytes, "quantized KV rows: a cache's row does not match the step's");
      segs.push_back({static_cast<const char*>(part.raw()) + static_cast<int64_t>(r) * bytes, dest[r].dst[i], bytes});
    }
  }
  copy_segments(segs, table);
}

// A captured step over quantized caches: decode_rows_quantized's launches, reading their tables from the graph's
// arena (batch_graph.cc rewrites each row's position, copy destinations and attention buffers per replay).
Tensor Attention::decode_rows_captured_quantized(const Tensor& y, BatchGraphLayer& t) const {
  std::vector<int64_t> pos;
  pos.reserve(t.qrows.size());
  for (const QuantizedRowDest& d : t.qrows) pos.push_back(d.row);
  Tensor q_all;
  if (t.fused_append) {
    q_all = append_quantized_fused(y, t.qrows, pos, t.quantized->bits(), t.quantized->group_size(), &t.append);
  } else {
    Tensor ks, vs;
    q_all = stage_rows(y, pos, &t.append, ks, vs);
    if (q_all.defined()) copy_quantized_rows(t.quantized->quantize(ks, vs), t.qrows, &t.copies);
  }
  if (!q_all.defined()) throw Error(ErrorKind::Unsupported, "batch graph: the fused append does not cover this layer");
  std::vector<DecodeKV> rows(pos.size());
  for (size_t r = 0; r < pos.size(); ++r)
    rows[r].q = q_all.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1);
  return attend_rows(rows, t.qviews, pos, nullptr, &t.attention);
}

Tensor Attention::attend_rows(std::vector<DecodeKV>& rows, std::vector<KVView>& views, const std::vector<int64_t>& pos,
                              std::vector<KVView>* kv_out, const GraphTable* table) const {
  const size_t B = rows.size();
  for (size_t r = 0; r < B; ++r) {
    const KVView& kv = views[r];
    DecodeKV& d = rows[r];
    d.k = &kv.k;
    d.v = &kv.v;
    d.quantized = kv.quantized;
    d.qk = &kv.qk;
    d.qv = &kv.qv;
    d.kv_heads = kv.kv_heads;
    d.q_pos0 = pos[r];
    d.k_pos0 = kv.pos0;
    d.k_pos = kv.positions.empty() ? nullptr : &kv.positions;
  }
  Tensor heads = attention_decode_rows(rows, params(), table);
  if (heads.defined()) {
    heads = heads.reshape({static_cast<int64_t>(B), spec_.heads * spec_.head_dim});
  } else if (table) {
    throw Error(ErrorKind::Unsupported, "batch graph: the batched attention does not cover this layer");
  } else {
    std::vector<Tensor> parts;
    parts.reserve(B);
    for (size_t r = 0; r < B; ++r) parts.push_back(attend_heads(rows[r].q, Tensor(), views[r], pos[r]));
    heads = concat_rows(parts);
  }
  if (kv_out) *kv_out = std::move(views);
  return heads;
}

// A batched decode step being captured into a graph (model/batch_graph.h): the same kernels as decode_rows,
// reading their row tables from the graph's arena, which each replay rewrites with the rows of that step.
Tensor Attention::decode_rows_captured(const Tensor& y, const std::vector<LayerCache*>& caches,
                                       std::vector<KVView>* kv_out) const {
  if (!direct_ || kv_out)
    throw Error(ErrorKind::Unsupported, "batch graph: this attention layer's decode step cannot be captured");
  const int64_t B = static_cast<int64_t>(caches.size());
  const int64_t qo = q_.w.out_features(), ko = k_.w.out_features();
  const Tensor like = y.slice(0, 0, 1).slice(1, qo, qo + ko).reshape({1, spec_.kv_heads, spec_.head_dim});
  BatchGraphLayer t = batch_graph_layer(caches, like);
  if (t.quantized) return decode_rows_captured_quantized(y, t);
  std::vector<AppendSlot> slots;
  slots.reserve(t.rows.size());
  for (const DirectRow& d : t.rows) slots.push_back({d.keys, d.values, d.row, d.row});
  const Tensor q_all = qkv_rope_append_rows(y, direct_step_, spec_.rope, slots, &t.append);
  if (!q_all.defined()) throw Error(ErrorKind::Unsupported, "batch graph: the fused append does not cover this layer");
  std::vector<Tensor> ks, vs;
  ks.reserve(t.rows.size());
  vs.reserve(t.rows.size());
  std::vector<DecodeKV> rows(t.rows.size());
  for (size_t r = 0; r < t.rows.size(); ++r) {
    const DirectRow& d = t.rows[r];
    ks.push_back(d.keys->slice(0, 0, d.row + 1));
    vs.push_back(d.values->slice(0, 0, d.row + 1));
    DecodeKV& row = rows[r];
    row.q = q_all.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1);
    row.k = &ks.back();
    row.v = &vs.back();
    row.kv_heads = spec_.kv_heads;
    row.q_pos0 = d.row;
    row.k_pos0 = 0;
  }
  const Tensor heads = attention_decode_rows(rows, params(), &t.attention);
  if (!heads.defined())
    throw Error(ErrorKind::Unsupported, "batch graph: the batched attention does not cover this layer");
  return heads.reshape({B, spec_.heads * spec_.head_dim});
}

std::vector<Tensor> Attention::project_lin(const Tensor& x) const {
  return spec_.k_eq_v ? apply_linears(x, {&q_, &k_}) : apply_linears(x, {&q_, &k_, &v_});
}

LoraGroup Attention::qkv_group() const { return stacked_lora_group({&q_, &k_, &v_}); }

Tensor Attention::qkv_fused(const Tensor& x) const {
  const lora::PendingResidual r = lora::begin_residual(qkv_group(), x);
  Tensor y = linear(x, qkv_);
  lora::finish_residual(r, x, y);
  return y;
}

Tensor Attention::forward(const Tensor& x, LayerCache& cache, KVView* kv_out) const {
  LATHE_CHECK(!spec_.kv_shared, "a KV-shared attention layer has no cache of its own");
  // Decode: one GEMV over the stacked rows (its column slices of one token are contiguous). Prefill: a GEMM per
  // row view, so each output is contiguous (slicing one [T, q+k+v] output would need three copies); on the CPU
  // the three share one quantization of x and one parallel region (apply_linears).
  // LoRA residuals are added to the fused output by the gathered device kernels; where those cannot serve the
  // adapters in use, the per-module route (row views of the same weight) adds them in its Linears.
  if (fused_qkv_ && x.dim(0) == 1 && lora::group_fusable(qkv_group(), x))
    return out_proj(decode_heads(qkv_fused(x), cache, kv_out));
  // Prefill on a device: the batched rows' path with one row, so a prompt's cache and output are the same
  // whether it was admitted alone or beside others.
  if (x.dim(0) > 1) {
    std::vector<KVView> views;
    if (Tensor h = prefill_direct(x, {x.dim(0)}, {&cache}, kv_out ? &views : nullptr); h.defined()) {
      if (kv_out) *kv_out = views[0];
      return out_proj(h);
    }
  }
  const int64_t pos0 = cache.offset();
  Tensor gate, k, v;
  const std::vector<Tensor> lin = project_lin(x);
  const Tensor q = project_q(lin[0], pos0, &gate);
  project_kv(lin[1], spec_.k_eq_v ? Tensor() : lin[2], pos0, k, v);
  const KVView kv = cache.update(k, v);
  if (kv_out) *kv_out = kv;
  return finish(q, gate, kv, pos0);
}

Tensor Attention::forward_shared(const Tensor& x, const KVView& kv, int64_t pos0) const {
  Tensor gate;
  const Tensor q = project_q(q_(x), pos0, &gate);
  return finish(q, gate, kv, pos0);
}

Tensor Attention::forward_rows(const Tensor& x, const RowSpans& s, const std::vector<LayerCache*>& caches,
                               std::vector<KVView>* kv_out) const {
  LATHE_CHECK(!spec_.kv_shared, "a KV-shared attention layer has no cache of its own");
  LATHE_CHECK(caches.size() == s.rows(), "forward_rows: one cache per row");
  if (kv_out) kv_out->assign(s.rows(), KVView());
  // A captured batched step takes decode_rows or nothing: the per-row paths would bake this step's rows in.
  const bool capture = batch_graph_capturing();
  if (s.rows() == 1 && !capture) return forward(x, *caches[0], kv_out ? &(*kv_out)[0] : nullptr);
  std::vector<Tensor> heads;
  heads.reserve(s.rows());
  // A step of decode rows only: the stacked q|k|v projection over all rows at once, then each row exactly as
  // its solo decode step runs it (the fused append on a device), so a row's result does not depend on the batch.
  if (fused_qkv_ && std::all_of(s.len.begin(), s.len.end(), [](int64_t n) { return n == 1; }) &&
      lora::group_fusable(qkv_group(), x)) {
    const Tensor y = qkv_fused(x);
    if (y.device() != Device::CPU && !spec_.q_gate && batched_decode_enabled())
      return out_proj(decode_rows(y, caches, kv_out));
    if (capture) throw Error(ErrorKind::Unsupported, "batch graph: this layer decodes row by row");
    for (size_t r = 0; r < s.rows(); ++r)
      heads.push_back(decode_heads(y.slice(0, static_cast<int64_t>(r), static_cast<int64_t>(r) + 1), *caches[r],
                                   kv_out ? &(*kv_out)[r] : nullptr));
    return out_proj(concat_rows(heads));
  }
  if (capture) throw Error(ErrorKind::Unsupported, "batch graph: this layer's step is not a fused decode step");
  if (Tensor h = prefill_direct(x, s.len, caches, kv_out); h.defined()) return out_proj(h);
  const std::vector<Tensor> lin = project_lin(x);
  const Tensor &q_lin = lin[0], &k_lin = lin[1], v_lin = spec_.k_eq_v ? Tensor() : lin[2];
  for (size_t r = 0; r < s.rows(); ++r) {
    const int64_t pos0 = caches[r]->offset();
    Tensor gate, k, v;
    const Tensor q = project_q(row_part(q_lin, s, r), pos0, &gate);
    project_kv(row_part(k_lin, s, r), spec_.k_eq_v ? Tensor() : row_part(v_lin, s, r), pos0, k, v);
    const KVView kv = caches[r]->update(k, v);
    heads.push_back(attend_heads(q, gate, kv, pos0));
    if (kv_out) (*kv_out)[r] = kv;
  }
  return out_proj(concat_rows(heads));
}

namespace attention_detail {
// LATHE_PREFILL_DIRECT=0 sends prefill rows through the per-row ops instead (comparisons).
bool prefill_direct_enabled() {
  static const bool on = env_switch("LATHE_PREFILL_DIRECT");
  return on;
}
}  // namespace attention_detail

Tensor Attention::prefill_direct(const Tensor& x, const std::vector<int64_t>& len,
                                 const std::vector<LayerCache*>& caches, std::vector<KVView>* kv_out) const {
  if (!direct_ || !fused_qkv_ || x.device() == Device::CPU || batch_graph_capturing() ||
      !attention_detail::prefill_direct_enabled() || !lora::group_fusable(qkv_group(), x))
    return Tensor();
  const size_t B = caches.size();
  const Tensor like = Tensor::empty({1, spec_.kv_heads, spec_.head_dim}, x.dtype(), x.device());
  std::vector<int64_t> pos(B);
  std::vector<AppendSlot> slots;
  slots.reserve(static_cast<size_t>(x.dim(0)));
  for (size_t r = 0; r < B; ++r) {
    pos[r] = caches[r]->offset();
    // Room reserved here but not used (a later row cannot take direct writes) stays free: update() reuses it.
    const auto d = caches[r]->direct_rows(like, len[r]);
    if (!d) return Tensor();
    for (int64_t t = 0; t < len[r]; ++t) slots.push_back({d->keys, d->values, d->row + t, pos[r] + t});
  }
  const Tensor y = qkv_fused(x);
  const Tensor q_all = qkv_rope_append_rows(y, direct_step_, spec_.rope, slots);
  if (!q_all.defined()) return Tensor();
  std::vector<Tensor> heads;
  heads.reserve(B);
  if (kv_out) kv_out->assign(B, KVView());
  int64_t start = 0;
  for (size_t r = 0; r < B; ++r) {
    const KVView kv = caches[r]->commit_direct_rows(len[r]);
    heads.push_back(attend_heads(q_all.slice(0, start, start + len[r]), Tensor(), kv, pos[r]));
    if (kv_out) (*kv_out)[r] = kv;
    start += len[r];
  }
  return B == 1 ? heads[0] : concat_rows(heads);
}

Tensor Attention::forward_shared_rows(const Tensor& x, const RowSpans& s, const std::vector<KVView>& kv) const {
  LATHE_CHECK(kv.size() == s.rows(), "forward_shared_rows: one view per row");
  if (s.rows() == 1) return forward_shared(x, kv[0], s.pos0[0]);
  const Tensor q_lin = q_(x);
  std::vector<Tensor> heads;
  heads.reserve(s.rows());
  for (size_t r = 0; r < s.rows(); ++r) {
    Tensor gate;
    const Tensor q = project_q(row_part(q_lin, s, r), s.pos0[r], &gate);
    heads.push_back(attend_heads(q, gate, kv[r], s.pos0[r]));
  }
  return out_proj(concat_rows(heads));
}

}  // namespace lathe
