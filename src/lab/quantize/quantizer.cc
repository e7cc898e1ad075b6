#include "lab/quantize/quantizer.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>

#include "common/error.h"
#include "io/safetensors.h"
#include "lab/checkpoint_source.h"
#include "lab/checkpoint_writer.h"
#include "lab/quantize/kl_eval.h"
#include "quant/affine.h"
#include "tensor/thread_pool.h"

namespace lathe::lab {
namespace {

using jobs::json;

struct Planned {
  std::string name;  // output tensor name
  DType dtype;
  Shape shape;
  size_t src;     // index into the source tensors
  int part = -1;  // -1 pass through; 0 weight, 1 scales, 2 biases
  ModuleBits spec{0, 0};
  uint64_t bytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

bool is_vision(const std::string& name) {
  return name.find("vision_tower") != std::string::npos || name.find("vision_model") != std::string::npos ||
         name.find("multi_modal_projector") != std::string::npos || name.rfind("visual.", 0) == 0;
}

// Converts rows [r0, r1) of a float source tensor to f32.
void rows_to_f32(const SourceTensor& t, const Tensor& src, int64_t cols, int64_t r0, int64_t r1, float* out) {
  const int64_t n = (r1 - r0) * cols;
  const char* base = static_cast<const char*>(src.raw()) + r0 * cols * static_cast<int64_t>(dtype_size(t.info.dtype));
  if (!floats_to_f32(base, t.info.dtype, n, out)) std::memcpy(out, base, static_cast<size_t>(n) * 4);
}

// The packed weight, scales and biases of the module being written (adjacent entries in name order).
struct ModuleCache {
  size_t src = SIZE_MAX;
  std::vector<uint32_t> packed;
  std::vector<unsigned char> scales, biases;
};

void quantize_module(const SourceTensor& t, const ModuleBits& spec, ModuleCache& cache) {
  const int64_t rows = t.info.shape[0], cols = t.info.shape[1];
  const int64_t words = cols * spec.bits / 32, groups = cols / spec.group_size;
  const size_t es = dtype_size(t.info.dtype);
  cache.src = SIZE_MAX;
  cache.packed.assign(static_cast<size_t>(rows * words), 0);
  cache.scales.assign(static_cast<size_t>(rows * groups) * es, 0);
  cache.biases.assign(static_cast<size_t>(rows * groups) * es, 0);
  const Tensor view = t.file->get(t.name);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / cols);  // ~256 KiB of f32 per chunk
  parallel_for(rows, grain, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(static_cast<size_t>((r1 - r0) * cols));
    rows_to_f32(t, view, cols, r0, r1, buf.data());
    quant::quantize_rows(buf.data(), r1 - r0, cols, spec.bits, spec.group_size, t.info.dtype,
                         cache.packed.data() + r0 * words, cache.scales.data() + static_cast<size_t>(r0 * groups) * es,
                         cache.biases.data() + static_cast<size_t>(r0 * groups) * es);
  });
}

}  // namespace

jobs::JobResult quantize_checkpoint(const QuantizeOptions& o, const jobs::Emit& emit) {
  const auto t0 = std::chrono::steady_clock::now();
  validate_quantize_options(o);
  validate_quantize_paths(o);
  emit(jobs::stage_event("starting", 0.0, "reading " + o.source));

  json config = read_json_file(o.source + "/config.json");
  if (!config.is_object()) throw Error(ErrorKind::Corrupt, o.source + "/config.json: not a JSON object");
  for (const char* key : {"quantization", "quantization_config"})
    if (config.contains(key) && !config[key].is_null())
      throw Error(ErrorKind::Unsupported, "quantize: " + o.source + " is already quantized (config.json has '" + key +
                                              "'); start from the bf16/f16/f32 checkpoint");
  const int num_layers = num_layers_of(config);
  const std::vector<SourceTensor> src = open_checkpoint_tensors(o.source);

  // The plan: every output tensor in name order, with its source.
  std::vector<Planned> plan;
  uint64_t source_bytes = 0, params = 0, qparams = 0;
  double qbits = 0;
  std::map<int, int64_t> histogram;  // bits -> modules
  std::map<std::string, ModuleBits> per_module;
  for (size_t i = 0; i < src.size(); ++i) {
    const SourceTensor& t = src[i];
    source_bytes += t.info.end - t.info.begin;
    params += static_cast<uint64_t>(shape_numel(t.info.shape));
    if (t.info.dtype == DType::F64)
      throw Error(ErrorKind::Unsupported, "quantize: tensor " + t.name + " is F64 (bf16, f16 and f32 are read)");
    const bool eligible =
        t.name.ends_with(".weight") && t.info.shape.size() == 2 && is_float(t.info.dtype) && !is_vision(t.name);
    const std::string module = eligible ? t.name.substr(0, t.name.size() - 7) : "";
    const ModuleBits spec = eligible ? module_bits(o, module, num_layers) : ModuleBits{0, 0};
    if (!eligible || t.info.shape[1] % spec.group_size != 0) {
      plan.push_back({t.name, t.info.dtype, t.info.shape, i});
      continue;
    }
    const int64_t rows = t.info.shape[0], cols = t.info.shape[1];
    plan.push_back({module + ".weight", DType::U32, {rows, cols * spec.bits / 32}, i, 0, spec});
    plan.push_back({module + ".scales", t.info.dtype, {rows, cols / spec.group_size}, i, 1, spec});
    plan.push_back({module + ".biases", t.info.dtype, {rows, cols / spec.group_size}, i, 2, spec});
    const uint64_t n = static_cast<uint64_t>(rows * cols);
    qparams += n;
    qbits += static_cast<double>(n) * spec.bits +
             static_cast<double>(n) / spec.group_size * 2 * 8 * static_cast<double>(dtype_size(t.info.dtype));
    histogram[spec.bits]++;
    per_module[module] = spec;
  }
  if (qparams == 0)
    throw Error(ErrorKind::InvalidArgument, "quantize: no tensor of " + o.source +
                                                " can be quantized with group size " + std::to_string(o.group_size));
  ModuleCache cache;
  uint64_t bytes_done = 0;
  std::vector<OutputTensor> tensors;
  tensors.reserve(plan.size());
  for (size_t pi = 0; pi < plan.size(); ++pi) {
    const Planned& p = plan[pi];
    tensors.push_back(
        {p.name, p.dtype, p.shape, [&, pi](void* dst) {
           const Planned& q = plan[pi];
           const SourceTensor& t = src[q.src];
           if (q.part < 0) {
             std::memcpy(dst, t.file->get(t.name).raw(), static_cast<size_t>(q.bytes()));
             bytes_done += t.info.end - t.info.begin;
             return;
           }
           if (cache.src != q.src) {
             quantize_module(t, q.spec, cache);
             cache.src = q.src;
             bytes_done += t.info.end - t.info.begin;
             json e =
                 jobs::stage_event("quantizing", 0.9 * static_cast<double>(bytes_done) / source_bytes,
                                   t.name.substr(0, t.name.size() - 7) + " (" + std::to_string(q.spec.bits) + "-bit)");
             e["bytes_done"] = bytes_done;
             e["bytes_total"] = source_bytes;
             emit(e);
           }
           if (q.part == 0)
             std::memcpy(dst, cache.packed.data(), cache.packed.size() * 4);
           else
             std::memcpy(dst, (q.part == 1 ? cache.scales : cache.biases).data(), static_cast<size_t>(q.bytes()));
         }});
  }

  // config.json with the quantization dict (the default, and an entry per module that differs from it).
  int default_bits = o.bits;
  if (!histogram.empty() && o.recipe != "uniform" && o.recipe != "embed_8")
    default_bits = std::max_element(histogram.begin(), histogram.end(), [](auto& a, auto& b) {
                     return a.second < b.second;
                   })->first;
  json qdict = {{"group_size", o.group_size}, {"bits", default_bits}, {"mode", "affine"}};
  for (const auto& [module, spec] : per_module)
    if (spec.bits != default_bits || spec.group_size != o.group_size)
      qdict[module] = {{"group_size", spec.group_size}, {"bits", spec.bits}};
  config["quantization"] = qdict;
  config["quantization_config"] = qdict;
  CheckpointWrite w;
  w.job = "quantize";
  w.source = o.source;
  w.output = o.output;
  w.shard_bytes = o.shard_bytes;
  w.config = std::move(config);
  w.parameters = params;
  w.on_shard = [&](const std::string& file, size_t i, size_t n) {
    emit(jobs::stage_event("writing", 0.9 * static_cast<double>(bytes_done) / source_bytes,
                           file + " (" + std::to_string(i + 1) + " of " + std::to_string(n) + ")"));
  };
  const WrittenCheckpoint written = write_checkpoint(w, std::move(tensors));
  const std::string& out = written.path;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  json hist = json::object();
  for (const auto& [bits, n] : histogram) hist[std::to_string(bits)] = n;
  jobs::JobResult r;
  r.output_path = out;
  r.summary = {{"source_bytes", source_bytes},
               {"output_bytes", written.bytes},
               {"parameters", params},
               {"quantized_parameters", qparams},
               {"bits_per_weight", qbits / static_cast<double>(qparams)},
               {"bits", default_bits},
               {"group_size", o.group_size},
               {"recipe", o.recipe},
               {"modules_by_bits", hist},
               {"shards", written.shards},
               {"seconds", seconds},
               {"source_gb_per_s", static_cast<double>(source_bytes) / 1e9 / std::max(seconds, 1e-9)}};
  if (o.eval_tokens > 0) {
    emit(jobs::stage_event("evaluating", 0.95, "KL of next-token distributions against the source"));
    r.summary["kl"] = next_token_kl(o.source, out, o.eval_tokens);
  }
  emit(jobs::stage_event("done", 1.0, out));
  return r;
}

}  // namespace lathe::lab
