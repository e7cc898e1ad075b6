#include "model/weights.h"

#include <cstdlib>

#include "common/env.h"
#include "common/error.h"
#include "io/finite_check.h"
#include "io/mapped_file.h"
#include "quant/affine.h"

namespace lathe {
namespace {
// Moves a bound tensor to where the model runs. On the CPU weights stay zero-copy views of the file.
Tensor place(const Tensor& t, const LoadOptions& o, DType dtype) {
  if (o.device == Device::CPU) return t;
  return t.to(dtype).to(o.device);
}
// Weights that hold a NaN or infinity make every output NaN; they are refused at load with the tensor's name.
void check_finite(const Tensor& t, const std::string& where) {
  if (const int64_t bad = first_non_finite(t); bad >= 0)
    throw Error(ErrorKind::Corrupt, where + " holds a NaN or infinite value (element " + std::to_string(bad) +
                                        "): the checkpoint is damaged");
}

// The CPU's integer-dot matmuls by default; the exact f32 kernels with --exact.
bool pack_on_cpu(const LoadOptions& o) { return o.device == Device::CPU && !o.exact; }

// Packs q for the CPU's integer-dot kernels. Once packed, the kernels read only the packed copy, so the file pages
// of its codes, scales and biases leave the resident set (a model no longer counts twice; an embedding lookup
// of a tied table faults back the rows it reads).
void pack_and_drop_source(QuantizedMatrix& q, int act_bits) {
  pack_for_cpu(q, act_bits);
  if (!q.cpu_packed) return;
  for (const Tensor* t : {&q.w, &q.scales, &q.biases})
    if (t->defined() && t->device() == Device::CPU && t->is_contiguous())
      MappedFile::drop_pages(t->raw(), static_cast<size_t>(t->numel()) * dtype_size(t->dtype()));
}

// Their activation precision: int8 per group, or 16-bit (two int8 rows, cpu/packed_quant.h) for models with
// linear-attention (Gated DeltaNet) layers, whose recurrence amplifies int8 rounding: on the qwen3_5 fixture
// int8 gives next-token KL 6.6e-2 against the exact path (~1e-3 for attention-only models), and keeping only
// the linear-attention projections exact still 1.4e-2. LATHE_CPU_ACT_BITS=8|16 overrides (measurements).
int cpu_act_bits(const ModelConfig& c) {
  if (const int64_t bits = env_int("LATHE_CPU_ACT_BITS", 0); bits == 8 || bits == 16) return static_cast<int>(bits);
  for (const std::string& t : c.layer_types)
    if (t == "linear_attention") return 16;
  return 8;
}
bool valid_bits(int b) { return b == 2 || b == 3 || b == 4 || b == 5 || b == 6 || b == 8; }
// 3, 5 and 6-bit codes straddle 32-bit words, which the exact CPU and the CUDA kernels do not read: on the CPU's
// default path such a module is packed for the integer-dot kernels (widened to their 4 or 8-bit layout); elsewhere
// it is dequantized once at load (bf16 on the CPU, the device's dense type on a GPU): dense speed and memory.
bool kernel_bits(int b) { return b == 2 || b == 4 || b == 8; }
Tensor dequantize_at_load(const Tensor& q, const Tensor& s, const Tensor& b, int64_t out, int64_t in, int bits,
                          int group_size) {
  Tensor dense = Tensor::empty({out, in}, DType::F32);
  const Tensor sf = s.to(DType::F32), bf = b.to(DType::F32);
  const int64_t words = q.dim(1), groups = in / group_size;
  for (int64_t r = 0; r < out; ++r)
    quant::dequantize_row(q.data<uint32_t>() + r * words, in, bits, group_size, sf.data<float>() + r * groups,
                          bf.data<float>() + r * groups, dense.data<float>() + r * in);
  return dense;
}
bool valid_group(int g) { return g == 32 || g == 64 || g == 128; }
}  // namespace

Tensor WeightBinder::tensor(const std::string& name, const Shape& shape) {
  return place(checked(name, shape), config_.load, DType::F32);  // norm weights and biases: f32 on a device
}

Tensor WeightBinder::checked(const std::string& name, const Shape& shape) {
  if (!ckpt_.has(name)) throw Error(ErrorKind::NotFound, ckpt_.dir() + ": missing tensor '" + name + "'");
  Tensor t = ckpt_.get(name);
  if (!is_float(t.dtype()))
    throw Error(ErrorKind::Corrupt, where(name) + " has dtype " + dtype_name(t.dtype()) + ", expected a float type");
  if (t.shape() != shape)
    throw Error(ErrorKind::Corrupt,
                where(name) + " has shape " + shape_str(t.shape()) + ", but config.json implies " + shape_str(shape));
  check_finite(t, where(name));
  used_.insert(name);
  return t;
}

Tensor WeightBinder::optional_tensor(const std::string& name, const Shape& shape) {
  return ckpt_.has(name) ? tensor(name, shape) : Tensor();
}

Weight WeightBinder::linear_on(const std::string& module, int64_t out, int64_t in, const LoadOptions& o) {
  const std::string wname = module + ".weight", sname = module + ".scales", bname = module + ".biases";
  Weight w;
  if (!ckpt_.has(wname)) throw Error(ErrorKind::NotFound, ckpt_.dir() + ": missing tensor '" + wname + "'");
  if (!ckpt_.has(sname)) {
    w.dense = place(checked(wname, {out, in}), o, o.dtype);
    return w;
  }
  // Quantized: the config must say how.
  const QuantSpec spec_value = quant_spec(module, in);
  const QuantSpec* spec = &spec_value;
  if (!ckpt_.has(bname)) throw Error(ErrorKind::NotFound, ckpt_.dir() + ": missing tensor '" + bname + "'");
  Tensor q = ckpt_.get(wname), s = ckpt_.get(sname), b = ckpt_.get(bname);
  const Shape wshape{out, in * spec->bits / 32}, sshape{out, in / spec->group_size};
  if (q.dtype() != DType::U32)
    throw Error(ErrorKind::Corrupt,
                where(wname) + " has dtype " + dtype_name(q.dtype()) + ", a quantized weight must be U32");
  if (q.shape() != wshape)
    throw Error(ErrorKind::Corrupt, where(wname) + " has shape " + shape_str(q.shape()) + ", but " +
                                        std::to_string(spec->bits) + "-bit [" + std::to_string(out) + ", " +
                                        std::to_string(in) + "] needs " + shape_str(wshape));
  for (const auto& [name, t] : {std::pair{sname, s}, std::pair{bname, b}}) {
    if (t.dtype() != DType::BF16 && t.dtype() != DType::F16 && t.dtype() != DType::F32)
      throw Error(ErrorKind::Corrupt, where(name) + " has dtype " + dtype_name(t.dtype()) + ", expected bf16/f16/f32");
    if (t.shape() != sshape)
      throw Error(ErrorKind::Corrupt, where(name) + " has shape " + shape_str(t.shape()) + ", but group size " +
                                          std::to_string(spec->group_size) + " needs " + shape_str(sshape));
  }
  check_finite(s, where(sname));
  check_finite(b, where(bname));
  used_.insert(wname);
  used_.insert(sname);
  used_.insert(bname);
  // 3, 5 and 6-bit weights stay quantized where the CPU's packed kernels take them; elsewhere they are dense.
  auto dense_copy = [&] {
    const Tensor dense = dequantize_at_load(q, s, b, out, in, spec->bits, spec->group_size);
    Weight d;
    d.dense = o.device == Device::CPU ? dense.to(DType::BF16) : dense.to(o.dtype).to(o.device);  // bf16 as a bf16 file
    return d;
  };
  if (!kernel_bits(spec->bits) && !pack_on_cpu(o)) return dense_copy();
  w.quantized = true;
  w.q.w = place(q, o, DType::U32);
  w.q.scales = place(s, o, s.dtype() == DType::BF16 ? DType::BF16 : DType::F32);
  w.q.biases = place(b, o, s.dtype() == DType::BF16 && b.dtype() == DType::BF16 ? DType::BF16 : DType::F32);
  if (w.q.scales.dtype() != w.q.biases.dtype()) w.q.scales = place(s, o, DType::F32);
  w.q.bits = spec->bits;
  w.q.group_size = spec->group_size;
  if (pack_on_cpu(o)) pack_and_drop_source(w.q, cpu_act_bits(config_));  // once, at load
  if (!kernel_bits(spec->bits) && !w.q.cpu_packed) return dense_copy();
  return w;
}

namespace {
Tensor cat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& t : parts) rows += t.dim(0);
  Tensor out = Tensor::empty({rows, parts[0].dim(1)}, parts[0].dtype());
  int64_t at = 0;
  for (const Tensor& t : parts) {
    copy_rows(out, at, t, 0, t.dim(0));
    at += t.dim(0);
  }
  return out;
}
}  // namespace

std::optional<Weight> WeightBinder::fused_linear(const std::vector<std::string>& modules,
                                                 const std::vector<int64_t>& outs, int64_t in) {
  if (config_.load.device == Device::CPU) return std::nullopt;
  for (const auto& m : modules)
    if (!ckpt_.has(m + ".weight") || ckpt_.has(m + ".scales") != ckpt_.has(modules[0] + ".scales")) return std::nullopt;
  // Validated exactly as linear() does, as host views of the file; then stacked and placed once.
  std::vector<Weight> parts;
  for (size_t i = 0; i < modules.size(); ++i)
    parts.push_back(linear_on(modules[i], outs[i], in, LoadOptions{Device::CPU, DType::F32, /*exact=*/true}));
  const Weight& p0 = parts[0];
  for (const Weight& p : parts) {
    const bool same = p.quantized
                          ? p.q.bits == p0.q.bits && p.q.group_size == p0.q.group_size &&
                                p.q.scales.dtype() == p0.q.scales.dtype() && p.q.biases.dtype() == p0.q.biases.dtype()
                          : p.dense.dtype() == p0.dense.dtype();
    if (!same) return std::nullopt;
  }
  std::vector<Tensor> a, s, b;
  for (const Weight& p : parts) {
    a.push_back(p.quantized ? p.q.w : p.dense);
    s.push_back(p.q.scales);
    b.push_back(p.q.biases);
  }
  Weight w;
  w.quantized = p0.quantized;
  const LoadOptions& o = config_.load;
  if (!w.quantized) {
    w.dense = place(cat_rows(a), o, o.dtype);
    return w;
  }
  w.q.w = place(cat_rows(a), o, DType::U32);
  const bool sb_bf16 = p0.q.scales.dtype() == DType::BF16 && p0.q.biases.dtype() == DType::BF16;
  w.q.scales = place(cat_rows(s), o, sb_bf16 ? DType::BF16 : DType::F32);
  w.q.biases = place(cat_rows(b), o, sb_bf16 ? DType::BF16 : DType::F32);
  w.q.bits = p0.q.bits;
  w.q.group_size = p0.q.group_size;
  return w;
}

Weight WeightBinder::row_slice(const Weight& w, int64_t begin, int64_t end) {
  Weight r = w;
  if (w.quantized) {
    r.q.w = w.q.w.slice(0, begin, end);
    r.q.scales = w.q.scales.slice(0, begin, end);
    r.q.biases = w.q.biases.slice(0, begin, end);
    r.q.cpu_packed_row0 = w.q.cpu_packed_row0 + begin;  // the slice shares its parent's CPU packing
  } else {
    r.dense = w.dense.slice(0, begin, end);
  }
  return r;
}

QuantSpec WeightBinder::quant_spec(const std::string& module, int64_t in) const {
  const std::string sname = module + ".scales";
  auto spec = config_.quant_for(module);
  if (!spec)
    throw Error(ErrorKind::Corrupt,
                where(sname) + " exists, but config.json has no quantization entry for '" + module + "'");
  if (!valid_bits(spec->bits))
    throw Error(ErrorKind::Unsupported, config_.dir + "/config.json: " + std::to_string(spec->bits) +
                                            "-bit quantization of '" + module +
                                            "' is not supported (2, 3, 4, 5, 6 or 8)");
  if (!valid_group(spec->group_size))
    throw Error(ErrorKind::Unsupported, config_.dir + "/config.json: group size " + std::to_string(spec->group_size) +
                                            " of '" + module + "' is not supported (32, 64 or 128)");
  if (in % spec->group_size != 0)
    throw Error(ErrorKind::Corrupt, where(sname) + ": input size " + std::to_string(in) +
                                        " is not a multiple of the group size " + std::to_string(spec->group_size));
  return *spec;
}

void WeightBinder::check_quantized(const std::string& module, const std::string& wname, const Shape& wshape,
                                   const Shape& sshape) const {
  const std::string sname = module + ".scales", bname = module + ".biases";
  if (!ckpt_.has(bname)) throw Error(ErrorKind::NotFound, ckpt_.dir() + ": missing tensor '" + bname + "'");
  const Tensor q = ckpt_.get(wname);
  if (q.dtype() != DType::U32)
    throw Error(ErrorKind::Corrupt,
                where(wname) + " has dtype " + dtype_name(q.dtype()) + ", a quantized weight must be U32");
  if (q.shape() != wshape)
    throw Error(ErrorKind::Corrupt, where(wname) + " has shape " + shape_str(q.shape()) +
                                        ", but the quantized layout needs " + shape_str(wshape));
  for (const std::string& name : {sname, bname}) {
    const Tensor t = ckpt_.get(name);
    if (t.dtype() != DType::BF16 && t.dtype() != DType::F16 && t.dtype() != DType::F32)
      throw Error(ErrorKind::Corrupt, where(name) + " has dtype " + dtype_name(t.dtype()) + ", expected bf16/f16/f32");
    if (t.shape() != sshape)
      throw Error(ErrorKind::Corrupt, where(name) + " has shape " + shape_str(t.shape()) +
                                          ", but the group size needs " + shape_str(sshape));
  }
}

std::vector<Weight> WeightBinder::stacked_linear(const std::string& module, int64_t experts, int64_t out, int64_t in) {
  const std::string wname = ckpt_.has(module) ? module : module + ".weight";
  const std::string sname = module + ".scales", bname = module + ".biases";
  if (!ckpt_.has(wname)) throw Error(ErrorKind::NotFound, ckpt_.dir() + ": missing tensor '" + module + "'");
  std::vector<Weight> stack(static_cast<size_t>(experts));
  if (!ckpt_.has(sname)) {
    // Dense experts take the activation type on a device, like other matmul weights.
    const Tensor t = place(checked(wname, {experts, out, in}), config_.load, config_.load.dtype);
    for (int64_t e = 0; e < experts; ++e) stack[static_cast<size_t>(e)].dense = t.select(0, e);
    return stack;
  }
  const QuantSpec spec = quant_spec(module, in);
  const LoadOptions& o = config_.load;
  auto unsupported = [&] {
    return Error(ErrorKind::Unsupported,
                 config_.dir + "/config.json: " + std::to_string(spec.bits) + "-bit experts of '" + module +
                     "' are not supported yet here (2, 4 or 8; 3, 5 and 6 on the CPU's default path)");
  };
  if (!kernel_bits(spec.bits) && !pack_on_cpu(o)) throw unsupported();
  check_quantized(module, wname, {experts, out, in * spec.bits / 32}, {experts, out, in / spec.group_size});
  // Uploaded once as whole stacks (scales/biases as linear() places them); experts are views into them.
  const Tensor sh = ckpt_.get(sname), bh = ckpt_.get(bname);
  const bool sb_bf16 = sh.dtype() == DType::BF16 && bh.dtype() == DType::BF16;
  const Tensor q = place(ckpt_.get(wname), o, DType::U32);
  const Tensor s = place(sh, o, sb_bf16 ? DType::BF16 : DType::F32),
               b = place(bh, o, sb_bf16 ? DType::BF16 : DType::F32);
  for (const auto& n : {wname, sname, bname}) used_.insert(n);
  for (int64_t e = 0; e < experts; ++e) {
    Weight& w = stack[static_cast<size_t>(e)];
    w.quantized = true;
    w.q = {q.select(0, e), s.select(0, e), b.select(0, e), spec.bits, spec.group_size};
    if (pack_on_cpu(o)) pack_and_drop_source(w.q, cpu_act_bits(config_));
    if (!kernel_bits(spec.bits) && !w.q.cpu_packed) throw unsupported();
  }
  return stack;
}

}  // namespace lathe
