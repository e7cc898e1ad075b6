#include "lab/fuse/fuser.h"

#include <chrono>
#include <cstring>
#include <map>

#include "common/error.h"
#include "lab/checkpoint_source.h"
#include "lab/checkpoint_writer.h"
#include "lora/adapter_file.h"
#include "lora/linear_sites.h"
#include "model/config.h"
#include "quant/affine.h"
#include "tensor/thread_pool.h"

namespace lathe::lab {
namespace fuser_detail {

using jobs::json;

// One module of the base as stored: its tensors and, when it is quantized, its spec.
struct BaseModule {
  const SourceTensor* weight = nullptr;
  const SourceTensor* scales = nullptr;
  const SourceTensor* biases = nullptr;
  QuantSpec spec;
  int64_t out = 0, in = 0;
  DType dtype = DType::F32;  // of the dense weights: the weight's, or the scales' for a quantized module
  const lora::LoraFactor* factor = nullptr;
  bool quantized() const { return scales != nullptr; }
};

float round_to(DType t, float v) {
  if (t == DType::BF16) return bf16_to_f32(f32_to_bf16(v));
  if (t == DType::F16) return f16_to_f32(f32_to_f16(v));
  return v;
}

void store_as(DType t, const float* v, int64_t n, void* dst) {
  if (t == DType::F32) {
    std::memcpy(dst, v, static_cast<size_t>(n) * 4);
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) d[i] = t == DType::BF16 ? f32_to_bf16(v[i]) : f32_to_f16(v[i]);
}

// The adapter's A factor [r, in] rounded to the module's dtype, as mlx-lm casts it before the product (made once
// a module, shared by every chunk of rows); empty without a factor.
std::vector<float> rounded_a(const BaseModule& m) {
  if (!m.factor) return {};
  const int64_t n = m.factor->rank() * m.in;
  const float* a = m.factor->a.data<float>();
  std::vector<float> ar(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) ar[static_cast<size_t>(k)] = round_to(m.dtype, a[k]);
  return ar;
}

// Rows [r0, r1) of the module's dense weights in f32 (dequantized as the loader's dense copies are: one
// rounding of q·scale + bias to the scales' dtype), with the adapter's product added when it has one (ar:
// rounded_a(m)).
void dense_rows(const BaseModule& m, const std::vector<float>& ar, int64_t r0, int64_t r1, float* out) {
  const int64_t in = m.in;
  if (!m.quantized()) {
    const Tensor w = m.weight->file->get(m.weight->name);
    const char* base = static_cast<const char*>(w.raw()) + r0 * in * static_cast<int64_t>(dtype_size(m.dtype));
    if (!floats_to_f32(base, m.dtype, (r1 - r0) * in, out))
      throw Error(ErrorKind::Unsupported, "fuse: " + m.weight->name + " is not a float tensor");
  } else {
    const Tensor w = m.weight->file->get(m.weight->name);
    const Tensor s = m.scales->file->get(m.scales->name), b = m.biases->file->get(m.biases->name);
    const int64_t words = in * m.spec.bits / 32, groups = in / m.spec.group_size;
    std::vector<float> sf(static_cast<size_t>(groups)), bf(static_cast<size_t>(groups));
    const size_t es = dtype_size(m.dtype);
    for (int64_t r = r0; r < r1; ++r) {
      floats_to_f32(static_cast<const char*>(s.raw()) + static_cast<size_t>(r * groups) * es, m.dtype, groups,
                    sf.data());
      floats_to_f32(static_cast<const char*>(b.raw()) + static_cast<size_t>(r * groups) * es, m.dtype, groups,
                    bf.data());
      float* row = out + (r - r0) * in;
      quant::dequantize_row(static_cast<const uint32_t*>(w.raw()) + r * words, in, m.spec.bits, m.spec.group_size,
                            sf.data(), bf.data(), row);
      for (int64_t i = 0; i < in; ++i) row[i] = round_to(m.dtype, row[i]);
    }
  }
  if (!m.factor) return;
  // mlx-lm's fuse: (scale·Bᵀ) and Aᵀ cast to the weight's dtype, their product rounded to it, then added.
  const lora::LoraFactor& f = *m.factor;
  const int64_t rank = f.rank();
  const float* b = f.b.data<float>();  // [out, r]
  std::vector<float> br(static_cast<size_t>(rank));
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t k = 0; k < rank; ++k) br[static_cast<size_t>(k)] = round_to(m.dtype, f.scale * b[r * rank + k]);
    float* row = out + (r - r0) * in;
    for (int64_t i = 0; i < in; ++i) {
      float d = 0;
      for (int64_t k = 0; k < rank; ++k) d += br[static_cast<size_t>(k)] * ar[static_cast<size_t>(k * in + i)];
      row[i] = round_to(m.dtype, row[i] + round_to(m.dtype, d));
    }
  }
}

// The module being written: its dense rows (dequantized output) or its re-quantized parts, made once for the
// adjacent tensors that share it.
struct ModuleCache {
  const BaseModule* module = nullptr;
  std::vector<float> dense;
  std::vector<uint32_t> packed;
  std::vector<unsigned char> scales, biases;
};

void prepare(const BaseModule& m, bool requantize, ModuleCache& c) {
  c.module = nullptr;
  c.dense.assign(static_cast<size_t>(m.out * m.in), 0.f);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / m.in);
  const std::vector<float> ar = rounded_a(m);
  parallel_for(m.out, grain, [&](int64_t r0, int64_t r1) { dense_rows(m, ar, r0, r1, c.dense.data() + r0 * m.in); });
  if (requantize) {
    const int64_t words = m.in * m.spec.bits / 32, groups = m.in / m.spec.group_size;
    const size_t es = dtype_size(m.dtype);
    c.packed.assign(static_cast<size_t>(m.out * words), 0);
    c.scales.assign(static_cast<size_t>(m.out * groups) * es, 0);
    c.biases.assign(static_cast<size_t>(m.out * groups) * es, 0);
    parallel_for(m.out, grain, [&](int64_t r0, int64_t r1) {
      quant::quantize_rows(c.dense.data() + r0 * m.in, r1 - r0, m.in, m.spec.bits, m.spec.group_size, m.dtype,
                           c.packed.data() + r0 * words, c.scales.data() + static_cast<size_t>(r0 * groups) * es,
                           c.biases.data() + static_cast<size_t>(r0 * groups) * es);
    });
  }
  c.module = &m;
}

std::string strip_suffix(const std::string& name, const std::string& suffix) {
  return name.ends_with(suffix) ? name.substr(0, name.size() - suffix.size()) : std::string();
}

}  // namespace fuser_detail

jobs::JobResult fuse_adapter(const FuseOptions& o, const jobs::Emit& emit) {
  using namespace fuser_detail;
  const auto t0 = std::chrono::steady_clock::now();
  validate_fuse_options(o);
  validate_fuse_paths(o);
  emit(jobs::stage_event("starting", 0.0, "reading " + o.model + " and " + o.adapter));

  const ModelConfig mc = load_model_config(o.model);
  json config = read_json_file(o.model + "/config.json");
  const lora::AdapterWeights adapter = lora::read_adapter(o.adapter);
  if (adapter.factors.empty())
    throw Error(ErrorKind::InvalidArgument, "fuse: the adapter " + o.adapter + " has no LoRA factors");
  const std::vector<SourceTensor> src = open_checkpoint_tensors(o.model);

  // The base's modules by stored name, then the adapter's factors on them (by canonical module path).
  std::map<std::string, BaseModule> modules;
  std::map<std::string, std::string> by_canonical;
  for (const SourceTensor& t : src) {
    for (const char* suffix : {".weight", ".scales", ".biases"}) {
      const std::string m = strip_suffix(t.name, suffix);
      if (m.empty()) continue;
      BaseModule& b = modules[m];
      (suffix[1] == 'w' ? b.weight : suffix[1] == 's' ? b.scales : b.biases) = &t;
      break;
    }
  }
  for (auto it = modules.begin(); it != modules.end();) {
    BaseModule& b = it->second;
    if (!b.weight || b.weight->info.shape.size() != 2 || (b.scales && !b.biases)) {
      it = modules.erase(it);  // a norm's weight, a bias vector: nothing an adapter attaches to
      continue;
    }
    if (b.scales) {
      const std::optional<QuantSpec> spec = mc.quant_for(it->first);
      if (!spec || b.scales->info.shape.size() != 2 || !is_float(b.scales->info.dtype) ||
          b.weight->info.dtype != DType::U32)
        throw Error(ErrorKind::Corrupt, "fuse: " + it->first + " has scales but no quantization entry in config.json");
      b.spec = *spec;
      b.out = b.weight->info.shape[0];
      b.in = b.scales->info.shape[1] * b.spec.group_size;
      b.dtype = b.scales->info.dtype;
      if (b.weight->info.shape[1] * 32 != b.in * b.spec.bits || b.scales->info.shape[0] != b.out ||
          b.biases->info.shape != b.scales->info.shape)
        throw Error(ErrorKind::Corrupt, "fuse: " + it->first + "'s weight, scales and biases do not fit " +
                                            std::to_string(b.spec.bits) + "-bit groups of " +
                                            std::to_string(b.spec.group_size));
    } else {
      if (!is_float(b.weight->info.dtype) || b.weight->info.dtype == DType::F64) {
        it = modules.erase(it);
        continue;
      }
      b.out = b.weight->info.shape[0];
      b.in = b.weight->info.shape[1];
      b.dtype = b.weight->info.dtype;
    }
    by_canonical[lora::canonical_module(it->first)] = it->first;
    ++it;
  }
  int fused = 0;
  for (const lora::LoraFactor& f : adapter.factors) {
    const auto c = by_canonical.find(f.module);
    if (c == by_canonical.end())
      throw Error(ErrorKind::InvalidArgument, "fuse: the adapter's module " + f.module + " has no linear weight in " +
                                                  o.model + " (an adapter for another base model?)");
    BaseModule& b = modules[c->second];
    if (b.out != f.out() || b.in != f.in())
      throw Error(ErrorKind::InvalidArgument, "fuse: the adapter's " + f.module + " is [" + std::to_string(f.out()) +
                                                  ", " + std::to_string(f.in()) + "] but the base's weight is [" +
                                                  std::to_string(b.out) + ", " + std::to_string(b.in) +
                                                  "] (an adapter for another base model?)");
    if (b.factor) throw Error(ErrorKind::Corrupt, "fuse: the adapter names " + f.module + " twice");
    b.factor = &f;
    ++fused;
  }

  // The output: every base tensor, in name order, with the fused and (de/re)quantized modules rewritten.
  std::map<const SourceTensor*, const BaseModule*> owner;
  for (const auto& [name, b] : modules)
    for (const SourceTensor* t : {b.weight, b.scales, b.biases})
      if (t) owner[t] = &b;
  ModuleCache cache;
  int requantized = 0, dequantized = 0, done = 0;
  uint64_t params = 0;
  std::vector<OutputTensor> tensors;
  for (const SourceTensor& t : src) {
    const auto ow = owner.find(&t);
    const BaseModule* m = ow == owner.end() ? nullptr : ow->second;
    // Parameters as the dense model counts them: a quantized module's out × in, once.
    params += !m || !m->quantized() ? static_cast<uint64_t>(shape_numel(t.info.shape))
              : &t == m->weight     ? static_cast<uint64_t>(m->out * m->in)
                                    : 0;
    if (!m || (!m->factor && !(o.dequantize && m->quantized()))) {  // copied as stored
      tensors.push_back({t.name, t.info.dtype, t.info.shape, [&t](void* dst) {
                           std::memcpy(dst, t.file->get(t.name).raw(), static_cast<size_t>(t.info.end - t.info.begin));
                         }});
      continue;
    }
    const bool dense_out = !m->quantized() || o.dequantize;
    if (dense_out && &t != m->weight) continue;  // a dequantized module keeps only its weight
    if (&t == m->weight) {
      if (m->quantized()) (dense_out ? dequantized : requantized) += 1;
    }
    const int part = &t == m->weight ? 0 : &t == m->scales ? 1 : 2;
    const DType dt = dense_out ? m->dtype : t.info.dtype;
    const Shape shape = dense_out ? Shape{m->out, m->in} : t.info.shape;
    tensors.push_back({t.name, dt, shape, [&, m, part, dense_out, fused](void* dst) {
                         if (cache.module != m) {
                           prepare(*m, !dense_out, cache);
                           if (m->factor) {
                             ++done;
                             emit(jobs::stage_event("fusing", 0.9 * done / std::max(1, fused), m->factor->module));
                           }
                         }
                         if (dense_out)
                           store_as(m->dtype, cache.dense.data(), m->out * m->in, dst);
                         else if (part == 0)
                           std::memcpy(dst, cache.packed.data(), cache.packed.size() * 4);
                         else
                           std::memcpy(dst, (part == 1 ? cache.scales : cache.biases).data(),
                                       (part == 1 ? cache.scales : cache.biases).size());
                       }});
  }
  if (o.dequantize) {
    config.erase("quantization");
    config.erase("quantization_config");
    if (config.contains("text_config") && config["text_config"].is_object()) {
      config["text_config"].erase("quantization");
      config["text_config"].erase("quantization_config");
    }
  }

  CheckpointWrite w;
  w.job = "fuse";
  w.source = o.model;
  w.output = o.output;
  w.shard_bytes = o.shard_bytes;
  w.config = std::move(config);
  w.parameters = params;
  w.on_shard = [&](const std::string& file, size_t i, size_t n) {
    emit(jobs::stage_event("writing", 0.9 * done / std::max(1, fused),
                           file + " (" + std::to_string(i + 1) + " of " + std::to_string(n) + ")"));
  };
  const WrittenCheckpoint written = write_checkpoint(w, std::move(tensors));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  jobs::JobResult r;
  r.output_path = written.path;
  r.summary = {{"fused_modules", fused},
               {"requantized_modules", requantized},
               {"dequantized_modules", dequantized},
               {"adapter_format", adapter.config.format},
               {"rank", adapter.config.rank},
               {"output_bytes", written.bytes},
               {"shards", written.shards},
               {"seconds", seconds}};
  emit(jobs::stage_event("done", 1.0, written.path));
  return r;
}

}  // namespace lathe::lab
