// Op entry points: check shapes and dtypes once, allocate outputs, dispatch to the device's kernels.
#include "tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "common/error.h"
#include "tensor/cpu/kernels.h"
#include "tensor/cpu/packed_quant.h"
#include "tensor/cpu/row_scan.h"
#include "tensor/device_memory.h"
#include "tensor/thread_pool.h"
#ifdef LATHE_HAVE_CUDA
#include "tensor/ops_cuda.h"
// Sends an op to the CUDA backend when its first tensor lives on the GPU.
#define LATHE_ON_CUDA(t, ...) \
  if ((t).device() == Device::CUDA) return __VA_ARGS__;
#else
#define LATHE_ON_CUDA(t, ...)
#endif

namespace lathe {
namespace {

void require_cpu(const Tensor& t, const char* op) {
  if (t.device() != Device::CPU)
    throw Error(ErrorKind::Unsupported, std::string(op) + ": no kernel for device " + device_name(t.device()));
}

void require_f32_rows(const Tensor& x, const char* op) {
  if (x.dtype() != DType::F32)
    throw Error(ErrorKind::InvalidArgument, std::string(op) + ": activations must be F32, got " + x.describe());
}

// y[M, N] += bias[N] (a CPU linear's bias).
void add_bias(Tensor& y, const Tensor* bias) {
  if (!bias || !bias->defined()) return;
  const std::vector<float> b = bias->to_floats();
  float* yp = y.data<float>();
  const int64_t N = y.dim(1);
  for (int64_t m = 0; m < y.dim(0); ++m)
    for (int64_t n = 0; n < N; ++n) yp[m * N + n] += b[static_cast<size_t>(n)];
}

}  // namespace

Tensor linear(const Tensor& x_in, const Weight& w, const Tensor* bias, bool f32_out) {
  LATHE_ON_CUDA(x_in, gpu::linear(x_in, w, bias, f32_out));
  require_cpu(x_in, "linear");
  require_cpu(w.quantized ? w.q.w : w.dense, "linear (weights on another device than the activations)");
  require_f32_rows(x_in, "linear");
  const Tensor x = x_in.contiguous();
  if (x.ndim() != 2 || x.dim(1) != w.in_features())
    throw Error(ErrorKind::InvalidArgument, "linear: input " + x.describe() + " does not match weight [" +
                                                std::to_string(w.out_features()) + ", " +
                                                std::to_string(w.in_features()) + "]");
  Tensor y = Tensor::empty({x.dim(0), w.out_features()}, DType::F32);
  if (w.quantized)
    cpu::linear_quantized(x, w.q, y);
  else
    cpu::linear_dense(x, w.dense, y);
  add_bias(y, bias);
  return y;
}

std::vector<Tensor> linear_many(const Tensor& x_in, const std::vector<const Weight*>& ws,
                                const std::vector<const Tensor*>& biases, bool f32_out) {
  const size_t n = ws.size();
  std::vector<Tensor> ys(n);
  auto bias_of = [&](size_t i) { return i < biases.size() ? biases[i] : nullptr; };
  if (x_in.device() == Device::CPU && x_in.dtype() == DType::F32 && x_in.ndim() == 2) {
    // The packed weights that can share x's quantized rows with the first of them (the others run alone).
    const Tensor x = x_in.contiguous();
    std::vector<cpu::PackedLinear> calls;
    std::vector<size_t> idx;
    for (size_t i = 0; i < n; ++i) {
      const Weight& w = *ws[i];
      const cpu::PackedQuant* p = w.quantized ? w.q.cpu_packed.get() : nullptr;
      if (!p || w.q.w.device() != Device::CPU || w.in_features() != x.dim(1) ||
          (!calls.empty() && !cpu::packed_share_input(*calls[0].p, *p)))
        continue;
      ys[i] = Tensor::empty({x.dim(0), w.out_features()}, DType::F32);
      calls.push_back({p, w.q.cpu_packed_row0, w.out_features(), ys[i].data<float>()});
      idx.push_back(i);
    }
    if (calls.size() >= 2) {
      cpu::linear_packed_many(x.data<float>(), x.dim(0), calls.data(), static_cast<int>(calls.size()));
      for (size_t i : idx) add_bias(ys[i], bias_of(i));
    } else {
      for (size_t i : idx) ys[i] = Tensor();
    }
  }
  for (size_t i = 0; i < n; ++i)
    if (!ys[i].defined()) ys[i] = linear(x_in, *ws[i], bias_of(i), f32_out);
  return ys;
}

Tensor dequantize(const QuantizedMatrix& q, int64_t row0, int64_t n) {
  if (n < 0) n = q.rows() - row0;
  LATHE_CHECK(row0 >= 0 && row0 + n <= q.rows(), "dequantize: rows out of range");
  LATHE_ON_CUDA(q.w, gpu::dequantize(q, row0, n, DType::F32));
  Tensor out = Tensor::empty({n, q.cols()}, DType::F32);
  cpu::dequantize_rows(q, row0, n, out.data<float>());
  return out;
}

Tensor embedding(const std::vector<int32_t>& ids, const Weight& table, DType out_type) {
  LATHE_ON_CUDA(table.quantized ? table.q.w : table.dense, gpu::embedding(ids, table, out_type));
  if (out_type != DType::F32)
    throw Error(ErrorKind::Unsupported,
                std::string("the cpu computes activations in F32, not ") + dtype_name(out_type));
  const int64_t vocab = table.out_features(), dim = table.in_features();
  Tensor out = Tensor::empty({static_cast<int64_t>(ids.size()), dim}, DType::F32);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= vocab)
      throw Error(ErrorKind::InvalidArgument, "token id " + std::to_string(ids[i]) +
                                                  " is out of range for a vocabulary of " + std::to_string(vocab));
    float* row = out.data<float>() + static_cast<int64_t>(i) * dim;
    if (table.quantized)
      cpu::dequantize_rows(table.q, ids[i], 1, row);
    else
      cpu::dense_row_to_f32(table.dense, ids[i], row);
  }
  return out;
}

Tensor rms_norm(const Tensor& x_in, const Tensor& weight, float eps, bool plus_one, std::optional<DType> out_type) {
  LATHE_ON_CUDA(x_in, gpu::rms_norm(x_in, weight, eps, plus_one, out_type.value_or(x_in.dtype())));
  if (out_type && *out_type != DType::F32)
    throw Error(ErrorKind::Unsupported,
                std::string("the cpu computes activations in F32, not ") + dtype_name(*out_type));
  require_cpu(x_in, "rms_norm");
  require_f32_rows(x_in, "rms_norm");
  const Tensor x = x_in.contiguous();
  if (weight.defined() && weight.numel() != x.dim(-1))
    throw Error(ErrorKind::InvalidArgument, "rms_norm: weight " + weight.describe() + " vs input " + x.describe());
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  cpu::rms_norm(x, weight, eps, plus_one, out);
  return out;
}

void rope_inplace(Tensor& x, const RopeTable& rope, int64_t pos0) {
  LATHE_CHECK(rope.dims <= x.dim(2) && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "rope: table does not fit the head size");
  LATHE_ON_CUDA(x, gpu::rope_inplace(x, rope, pos0));
  require_cpu(x, "rope");
  LATHE_CHECK(x.ndim() == 3 && x.is_contiguous() && x.dtype() == DType::F32, "rope: expects contiguous F32 [T, H, D]");
  LATHE_CHECK(rope.dims <= x.dim(2) && static_cast<int64_t>(rope.inv_freq.size()) == rope.dims / 2,
              "rope: table does not fit the head size");
  cpu::rope_inplace(x, rope, pos0);
}

Tensor attention(const Tensor& q_in, const Tensor& k, const Tensor& v, const AttentionParams& p) {
  LATHE_CHECK(q_in.ndim() == 3 && k.ndim() == 3 && v.ndim() == 3, "attention: expects [T, H, D] tensors");
  LATHE_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "attention: head dim must be dense");
  LATHE_CHECK(q_in.dim(2) == k.dim(2) && k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1), "attention: q/k/v shapes");
  LATHE_CHECK(k.dim(1) > 0 && q_in.dim(1) % k.dim(1) == 0, "attention: query heads must be a multiple of kv heads");
  LATHE_CHECK(!p.k_pos || static_cast<int64_t>(p.k_pos->size()) == k.dim(0), "attention: key positions");
  LATHE_ON_CUDA(q_in, gpu::attention(q_in, k, v, p));
  require_cpu(q_in, "attention");
  const Tensor q = q_in.contiguous();
  LATHE_CHECK(k.stride(2) == 1 && v.stride(2) == 1, "attention: head dim must be dense");
  LATHE_CHECK(q.dim(2) == k.dim(2) && k.dim(0) == v.dim(0) && k.dim(1) == v.dim(1), "attention: q/k/v shapes");
  LATHE_CHECK(k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0, "attention: query heads must be a multiple of kv heads");
  LATHE_CHECK(!p.k_pos || static_cast<int64_t>(p.k_pos->size()) == k.dim(0), "attention: key positions");
  Tensor out = Tensor::empty({q.dim(0), q.dim(1), v.dim(2)}, DType::F32);
  cpu::attention(q, k, v, p, out);
  return out;
}

Tensor attention_quantized(const Tensor& q_in, const QuantizedMatrix& k, const QuantizedMatrix& v, int64_t kv_heads,
                           const AttentionParams& p) {
  LATHE_ON_CUDA(q_in, gpu::attention_quantized(q_in, k, v, kv_heads, p));
  require_cpu(q_in, "attention_quantized");
  const Tensor q = q_in.contiguous();
  LATHE_CHECK(q.ndim() == 3 && kv_heads > 0 && q.dim(1) % kv_heads == 0, "attention_quantized: head layout");
  LATHE_CHECK(k.rows() == v.rows() && k.rows() % kv_heads == 0 && k.cols() == q.dim(2),
              "attention_quantized: key/value rows");
  LATHE_CHECK(!p.k_pos || static_cast<int64_t>(p.k_pos->size()) * kv_heads == k.rows(),
              "attention_quantized: key positions");
  Tensor out = Tensor::empty({q.dim(0), q.dim(1), v.cols()}, DType::F32);
  cpu::attention_quantized(q, k, v, kv_heads, p, out);
  return out;
}

Tensor sigmoid_mul(const Tensor& x, const Tensor& gate) {
  LATHE_ON_CUDA(x, gpu::sigmoid_mul(x, gate));
  require_cpu(x, "sigmoid_mul");
  LATHE_CHECK(x.shape() == gate.shape(), "sigmoid_mul: shapes differ");
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  cpu::sigmoid_mul(x.contiguous(), gate.contiguous(), out);
  return out;
}

Tensor l2_normalize(const Tensor& x_in, float eps) {
  LATHE_ON_CUDA(x_in, gpu::l2_normalize(x_in, eps));
  require_cpu(x_in, "l2_normalize");
  require_f32_rows(x_in, "l2_normalize");
  const Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  cpu::l2_normalize(x, eps, out);
  return out;
}

Tensor rms_norm_gated(const Tensor& x_in, const Tensor& z, const Tensor& weight, float eps) {
  LATHE_ON_CUDA(x_in, gpu::rms_norm_gated(x_in, z, weight, eps));
  require_cpu(x_in, "rms_norm_gated");
  require_f32_rows(x_in, "rms_norm_gated");
  const Tensor x = x_in.contiguous();
  LATHE_CHECK(x.shape() == z.shape() && weight.numel() == x.dim(-1), "rms_norm_gated: shapes");
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  cpu::rms_norm_gated(x, z.contiguous(), weight, eps, out);
  return out;
}

Tensor causal_conv1d_silu(const Tensor& x_in, const Tensor& weight, Tensor& state, bool fast_exp) {
  LATHE_ON_CUDA(x_in, gpu::causal_conv1d_silu(x_in, weight, state));
  require_cpu(x_in, "causal_conv1d");
  require_f32_rows(x_in, "causal_conv1d");
  const Tensor x = x_in.contiguous();
  // [C, K], stored so or as the transposed view of a contiguous [K, C] (taps by channel, read in place).
  const bool by_channel = weight.ndim() == 2 && weight.stride(0) == 1 && weight.stride(1) == weight.dim(0);
  LATHE_CHECK(x.ndim() == 2 && weight.ndim() == 2 && weight.dim(0) == x.dim(1) && weight.dtype() == DType::F32 &&
                  (weight.is_contiguous() || by_channel),
              "causal_conv1d: weight must be F32 [C, K]");
  LATHE_CHECK(state.dtype() == DType::F32 && state.is_contiguous() && state.ndim() == 2 &&
                  state.dim(0) == weight.dim(1) - 1 && state.dim(1) == x.dim(1),
              "causal_conv1d: state must be F32 [K-1, C]");
  Tensor out = Tensor::empty(x.shape(), DType::F32);
  cpu::causal_conv1d_silu(x, weight, state, out, fast_exp);
  return out;
}

Tensor gated_delta_rule(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, const Tensor& g_in,
                        const Tensor& beta_in, Tensor& state) {
  LATHE_ON_CUDA(q_in, gpu::gated_delta_rule(q_in, k_in, v_in, g_in, beta_in, state));
  require_cpu(q_in, "gated_delta_rule");
  const Tensor q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), g = g_in.contiguous(),
               beta = beta_in.contiguous();
  LATHE_CHECK(
      q.ndim() == 3 && q.shape() == k.shape() && v.ndim() == 3 && v.dim(0) == q.dim(0) && v.dim(1) % q.dim(1) == 0,
      "gated_delta_rule: q/k/v shapes");
  LATHE_CHECK(g.numel() == v.dim(0) * v.dim(1) && beta.numel() == g.numel(), "gated_delta_rule: g/beta shapes");
  LATHE_CHECK(
      state.dtype() == DType::F32 && state.is_contiguous() && state.shape() == Shape({v.dim(1), v.dim(2), q.dim(2)}),
      "gated_delta_rule: state must be F32 [Hv, Dv, Dk]");
  Tensor out = Tensor::empty(v.shape(), DType::F32);
  cpu::gated_delta_rule(q, k, v, g, beta, state, out);
  return out;
}

Tensor gather_rows(const Tensor& x_in, const std::vector<int32_t>& idx) {
  LATHE_ON_CUDA(x_in, gpu::gather_rows(x_in, idx));
  require_cpu(x_in, "gather_rows");
  const Tensor x = x_in.contiguous();
  const int64_t D = x.numel() / std::max<int64_t>(x.dim(0), 1);
  Tensor out = Tensor::empty({static_cast<int64_t>(idx.size()), D}, x.dtype());
  const size_t row = static_cast<size_t>(D) * dtype_size(x.dtype());
  for (size_t i = 0; i < idx.size(); ++i) {
    LATHE_CHECK(idx[i] >= 0 && idx[i] < x.dim(0), "gather_rows: index out of range");
    std::memcpy(static_cast<char*>(out.raw()) + i * row, static_cast<const char*>(x.raw()) + idx[i] * row, row);
  }
  return out;
}

void scatter_add_rows(Tensor& out, const std::vector<int32_t>& idx, const Tensor& x_in, const std::vector<float>& w) {
  LATHE_ON_CUDA(out, gpu::scatter_add_rows(out, idx, x_in, w));
  require_cpu(out, "scatter_add_rows");
  const Tensor x = x_in.contiguous();
  LATHE_CHECK(out.is_contiguous() && out.dtype() == DType::F32 && x.dtype() == DType::F32 && out.ndim() == 2 &&
                  x.ndim() == 2 && x.dim(1) == out.dim(1) && x.dim(0) == static_cast<int64_t>(idx.size()) &&
                  w.size() == idx.size(),
              "scatter_add_rows: shapes");
  const int64_t D = x.dim(1);
  for (size_t i = 0; i < idx.size(); ++i) {
    LATHE_CHECK(idx[i] >= 0 && idx[i] < out.dim(0), "scatter_add_rows: index out of range");
    float* o = out.data<float>() + idx[i] * D;
    const float* r = x.data<float>() + static_cast<int64_t>(i) * D;
    for (int64_t d = 0; d < D; ++d) o[d] += w[i] * r[d];
  }
}

Tensor silu_mul(const Tensor& gate, const Tensor& up, bool fast_exp) {
  LATHE_CHECK(gate.shape() == up.shape(), "silu_mul: shapes differ");
  LATHE_ON_CUDA(gate, gpu::gated(gate, up, false));
  require_cpu(gate, "silu_mul");
  Tensor out = Tensor::empty(gate.shape(), DType::F32);
  cpu::silu_mul(gate.contiguous(), up.contiguous(), out, fast_exp);
  return out;
}

Tensor gelu_tanh_mul(const Tensor& gate, const Tensor& up) {
  LATHE_CHECK(gate.shape() == up.shape(), "gelu_tanh_mul: shapes differ");
  LATHE_ON_CUDA(gate, gpu::gated(gate, up, true));
  require_cpu(gate, "gelu_tanh_mul");
  Tensor out = Tensor::empty(gate.shape(), DType::F32);
  cpu::gelu_tanh_mul(gate.contiguous(), up.contiguous(), out);
  return out;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Tensor out = a.contiguous().clone();
  add_inplace(out, b);
  return out;
}

void add_inplace(Tensor& a, const Tensor& b_in) {
  LATHE_CHECK(a.shape() == b_in.shape() && a.is_contiguous(), "add: shapes differ");
  LATHE_ON_CUDA(a, gpu::add_inplace(a, b_in));
  require_cpu(a, "add");
  LATHE_CHECK(a.dtype() == DType::F32, "add: expects F32");
  const Tensor b = b_in.contiguous();
  float* ap = a.data<float>();
  const float* bp = b.data<float>();
  for (int64_t i = 0, n = a.numel(); i < n; ++i) ap[i] += bp[i];
}

void scale_inplace(Tensor& x, float s) {
  LATHE_CHECK(x.is_contiguous(), "scale: expects a contiguous tensor");
  LATHE_ON_CUDA(x, gpu::scale_inplace(x, s));
  require_cpu(x, "scale");
  LATHE_CHECK(x.dtype() == DType::F32, "scale: expects F32");
  float* p = x.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] *= s;
}

void softcap_inplace(Tensor& x, float cap) {
  LATHE_CHECK(x.is_contiguous(), "softcap: expects a contiguous tensor");
  LATHE_ON_CUDA(x, gpu::softcap_inplace(x, cap));
  require_cpu(x, "softcap");
  LATHE_CHECK(x.dtype() == DType::F32, "softcap: expects F32");
  float* p = x.data<float>();
  for (int64_t i = 0, n = x.numel(); i < n; ++i) p[i] = std::tanh(p[i] / cap) * cap;
}

std::vector<int32_t> argmax_rows(const Tensor& x_in) {
  if (x_in.device() == Device::CUDA) {  // one launch; only the ids come back
    const Tensor host = argmax_rows_device(x_in).to(Device::CPU);
    return std::vector<int32_t>(host.data<int32_t>(), host.data<int32_t>() + host.numel());
  }
  const Tensor x = x_in.device() == Device::CPU ? x_in.contiguous() : x_in.to(Device::CPU);
  LATHE_CHECK(x.ndim() == 2 && x.dtype() == DType::F32, "argmax_rows: expects F32 [rows, cols]");
  std::vector<int32_t> out(static_cast<size_t>(x.dim(0)));
  const int64_t C = x.dim(1);
  for (int64_t r = 0; r < x.dim(0); ++r) {
    const float* row = x.data<float>() + r * C;
    // The first maximum, as max_element gives it; NaN rows keep max_element's own answer.
    const cpu::RowMax m = cpu::row_max(row, static_cast<size_t>(C));
    out[static_cast<size_t>(r)] = static_cast<int32_t>(
        m.nan ? std::max_element(row, row + C) - row
              : static_cast<std::ptrdiff_t>(cpu::first_at_least(row, static_cast<size_t>(C), m.max)));
  }
  return out;
}

void apply_logit_edits(Tensor& x, const std::vector<LogitEdit>& edits) {
  if (edits.empty()) return;
  LATHE_ON_CUDA(x, gpu::apply_logit_edits(x, edits));
  require_cpu(x, "apply_logit_edits");
  LATHE_CHECK(x.dtype() == DType::F32 && x.is_contiguous(), "apply_logit_edits: expects contiguous F32");
  float* p = x.data<float>();
  for (const LogitEdit& e : edits) {
    LATHE_CHECK(e.index >= 0 && e.index < x.numel(), "apply_logit_edits: index out of range");
    p[e.index] = apply_logit_edit(p[e.index], e);
  }
}

void apply_token_masks(Tensor& x, const std::vector<int32_t>& rows, const std::vector<uint64_t>& bits) {
  if (rows.empty()) return;
  LATHE_CHECK(x.ndim() == 2 && x.dtype() == DType::F32 && x.is_contiguous(),
              "apply_token_masks: expects contiguous F32 [rows, vocab]");
  const int64_t V = x.dim(1);
  const size_t words = static_cast<size_t>((V + 63) / 64);
  LATHE_CHECK(bits.size() == rows.size() * words, "apply_token_masks: one bitset of ceil(vocab / 64) words per row");
  for (int32_t r : rows) LATHE_CHECK(r >= 0 && r < x.dim(0), "apply_token_masks: row out of range");
  LATHE_ON_CUDA(x, gpu::apply_token_masks(x, rows, bits));
  require_cpu(x, "apply_token_masks");
  constexpr float kOff = -std::numeric_limits<float>::infinity();
  for (size_t k = 0; k < rows.size(); ++k) {
    float* p = x.data<float>() + static_cast<int64_t>(rows[k]) * V;
    const uint64_t* b = bits.data() + k * words;
    for (int64_t t = 0; t < V; ++t)
      if (!((b[t >> 6] >> (t & 63)) & 1)) p[t] = kOff;
  }
}

Tensor argmax_rows_device(const Tensor& x) {
  LATHE_ON_CUDA(x, gpu::argmax_rows_device(x));
  throw Error(ErrorKind::Unsupported, "argmax_rows_device: CUDA only");
}

Tensor sample_rows_device(const Tensor& x, const std::vector<RowSampling>& rows) {
  LATHE_CHECK(
      x.ndim() == 2 && x.dtype() == DType::F32 && x.is_contiguous() && x.dim(0) == static_cast<int64_t>(rows.size()),
      "sample_rows: expects contiguous F32 [rows, vocab] and one setting a row");
  LATHE_ON_CUDA(x, gpu::sample_rows_device(x, rows));
  throw Error(ErrorKind::Unsupported, "sample_rows: CUDA only (the CPU samples with engine/sampler.h)");
}

std::vector<int32_t> sample_rows(const Tensor& x, const std::vector<RowSampling>& rows, std::vector<float>& logprobs) {
  const Tensor host = sample_rows_device(x, rows).to(Device::CPU);  // the ids [n], then the logprobs' bits [n]
  const int64_t n = x.dim(0);
  const int32_t* h = host.data<int32_t>();
  logprobs.resize(static_cast<size_t>(n));
  std::memcpy(logprobs.data(), h + n, static_cast<size_t>(n) * sizeof(float));
  return std::vector<int32_t>(h, h + n);
}

void copy_rows(Tensor& dst, int64_t dst_row, const Tensor& src_in, int64_t src_row, int64_t n) {
  if (n <= 0) return;
  const bool to_bf16 = dst.device() == Device::CPU && src_in.dtype() == DType::F32 && dst.dtype() == DType::BF16;
  LATHE_CHECK(dst.device() == src_in.device() && (dst.dtype() == src_in.dtype() || to_bf16) && dst.is_contiguous(),
              "copy_rows: tensors differ in device or type");
  const Tensor src = src_in.contiguous();
  const int64_t elems = src.numel() / std::max<int64_t>(src.dim(0), 1);
  LATHE_CHECK(dst.numel() / std::max<int64_t>(dst.dim(0), 1) == elems, "copy_rows: row sizes differ");
  LATHE_CHECK(src_row + n <= src.dim(0) && dst_row + n <= dst.dim(0), "copy_rows: rows out of range");
  const size_t row = static_cast<size_t>(elems) * dtype_size(src.dtype());
  const size_t drow = static_cast<size_t>(elems) * dtype_size(dst.dtype());
  char* d = static_cast<char*>(dst.raw()) + static_cast<size_t>(dst_row) * drow;
  const char* s = static_cast<const char*>(src.raw()) + static_cast<size_t>(src_row) * row;
  if (dst.device() == Device::CPU) {
    // Rows [b, e), converted on the way for a BF16 destination.
    auto rows = [&](int64_t b, int64_t e) {
      if (!to_bf16) {
        std::memcpy(d + static_cast<size_t>(b) * row, s + static_cast<size_t>(b) * row,
                    static_cast<size_t>(e - b) * row);
        return;
      }
      const float* in = reinterpret_cast<const float*>(s) + b * elems;
      uint16_t* out = reinterpret_cast<uint16_t*>(d) + b * elems;
      for (int64_t i = 0; i < (e - b) * elems; ++i) out[i] = f32_to_bf16(in[i]);
    };
    // A copy into fresh pages (a prefill's K/V rows into new KV blocks, a cache restored from a KV file) is
    // mostly the kernel allocating and clearing those pages at first touch (~2.3 us a 4 KiB page of the block
    // pool's shared memory here), not the copy: from 64 KiB it is split over the pool, so each thread faults in
    // its own rows' pages. (A 128-token prefill's K/V appends, serial, were ~10% of its time at two threads; 940
    // MB restored into the pool ran 2-3x faster split, on the 2-vCPU build machine.)
    constexpr size_t kParallelCopyBytes = size_t{64} << 10;
    if (static_cast<size_t>(n) * drow >= kParallelCopyBytes) {
      parallel_for(n, 1, rows);
      return;
    }
    rows(0, n);
    return;
  }
#ifdef LATHE_HAVE_CUDA
  gpu::copy_rows(dst.raw(), dst_row, s, n, row);  // a kernel, so graph replays can shift the rows
#else
  device_copy(d, s, static_cast<size_t>(n) * row, dst.device(), src.device());
#endif
}

}  // namespace lathe
