#include "lab/quantize/quantizer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "common/error.h"
#include "common/os_error.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/quantize/kl_eval.h"
#include "quant/affine.h"
#include "tensor/thread_pool.h"

namespace lathe::lab {
namespace {

namespace fs = std::filesystem;
using jobs::json;

// Files mlx_lm.convert carries over besides the weights and config.json.
const char* const kAuxFiles[] = {"tokenizer.json",
                                 "tokenizer_config.json",
                                 "tokenizer.model",
                                 "special_tokens_map.json",
                                 "added_tokens.json",
                                 "vocab.json",
                                 "merges.txt",
                                 "chat_template.jinja",
                                 "chat_template.json",
                                 "generation_config.json",
                                 "preprocessor_config.json",
                                 "processor_config.json",
                                 "spiece.model",
                                 "tokenizer.tiktoken"};

struct SourceTensor {
  std::string name;
  std::shared_ptr<SafetensorsFile> file;
  TensorInfo info;
};

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

json read_json(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw Error(ErrorKind::Corrupt, path + ": not valid JSON: " + e.what());
  }
}

std::vector<SourceTensor> open_source(const std::string& dir) {
  std::vector<std::string> shards;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(ErrorKind::Corrupt, index.string() + ": missing the weight_map object");
    std::set<std::string> seen;
    for (const auto& [k, v] : j["weight_map"].items()) {
      if (!v.is_string()) throw Error(ErrorKind::Corrupt, index.string() + ": weight_map['" + k + "'] is not a file");
      const std::string s = v.get<std::string>();
      if (s.find('/') != std::string::npos)
        throw Error(ErrorKind::Corrupt, index.string() + ": shard '" + s + "' is not a plain file name");
      if (seen.insert(s).second) shards.push_back(s);
    }
  } else {
    shards.push_back("model.safetensors");
  }
  std::vector<SourceTensor> out;
  std::set<std::string> names;
  for (const auto& s : shards) {
    auto f = SafetensorsFile::open((fs::path(dir) / s).string());
    for (const auto& [name, info] : f->tensors()) {
      if (!names.insert(name).second)
        throw Error(ErrorKind::Corrupt, dir + ": tensor " + name + " is stored in two shards");
      out.push_back({name, f, info});
    }
  }
  return out;
}

int num_layers_of(const json& config) {
  if (config.contains("num_hidden_layers") && config["num_hidden_layers"].is_number_integer())
    return config["num_hidden_layers"].get<int>();
  if (config.contains("text_config") && config["text_config"].is_object()) return num_layers_of(config["text_config"]);
  return 0;
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

void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), (directory ? O_RDONLY | O_DIRECTORY : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

std::string shard_name(size_t i, size_t n) {
  if (n == 1) return "model.safetensors";
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

// Removes the temporary folder unless released (the run reached its rename).
struct TempDirGuard {
  std::string path;
  bool keep = false;
  ~TempDirGuard() {
    if (keep || path.empty()) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

jobs::JobResult quantize_checkpoint(const QuantizeOptions& o, const jobs::Emit& emit) {
  const auto t0 = std::chrono::steady_clock::now();
  validate_quantize_options(o);
  validate_quantize_paths(o);
  emit(jobs::stage_event("starting", 0.0, "reading " + o.source));

  json config = read_json(o.source + "/config.json");
  if (!config.is_object()) throw Error(ErrorKind::Corrupt, o.source + "/config.json: not a JSON object");
  for (const char* key : {"quantization", "quantization_config"})
    if (config.contains(key) && !config[key].is_null())
      throw Error(ErrorKind::Unsupported, "quantize: " + o.source + " is already quantized (config.json has '" + key +
                                              "'); start from the bf16/f16/f32 checkpoint");
  const int num_layers = num_layers_of(config);
  const std::vector<SourceTensor> src = open_source(o.source);

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
  std::sort(plan.begin(), plan.end(), [](const Planned& a, const Planned& b) { return a.name < b.name; });

  // Shards: greedy in name order, a new one when the next tensor would pass shard_bytes.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, output_tensor_bytes = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const uint64_t b = plan[i].bytes();
    if (in_shard > 0 && in_shard + b > o.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    output_tensor_bytes += b;
  }

  TempDirGuard tmp;
  const std::string out = fs::absolute(o.output).lexically_normal().string();
  tmp.path = out + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp.path, ec);
  if (!fs::create_directory(tmp.path, ec))  // no error code: something is still there (EEXIST)
    throw OsError("quantize: cannot create the output folder " + tmp.path, ec ? ec.value() : EEXIST);

  ModuleCache cache;
  uint64_t bytes_done = 0;
  json weight_map = json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_name(s, shards.size());
    SafetensorsWriter w;
    w.set_metadata("format", "mlx");
    for (size_t pi : shards[s]) {
      const Planned& p = plan[pi];
      weight_map[p.name] = file;
      w.add(p.name, p.dtype, p.shape, [&, pi](void* dst) {
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
      });
    }
    emit(jobs::stage_event("writing", 0.9 * static_cast<double>(bytes_done) / source_bytes,
                           file + " (" + std::to_string(s + 1) + " of " + std::to_string(shards.size()) + ")"));
    w.write(tmp.path + "/" + file);
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
  const std::string config_text = config.dump(4);
  write_file_atomic(tmp.path + "/config.json", config_text.data(), config_text.size());
  const std::string index_text = json{
      {"metadata", {{"total_size", output_tensor_bytes}, {"total_parameters", params}}},
      {"weight_map", weight_map}}.dump(4);
  write_file_atomic(tmp.path + "/model.safetensors.index.json", index_text.data(), index_text.size());
  for (const char* aux : kAuxFiles) {
    const fs::path from = fs::path(o.source) / aux;
    if (!fs::exists(from, ec)) continue;
    const auto mapped = MappedFile::open(from.string());
    write_file_atomic(tmp.path + "/" + aux, mapped->data(), mapped->size());
  }
  fsync_path(tmp.path, true);
  if (fs::exists(out, ec)) throw Error(ErrorKind::InvalidArgument, "quantize: " + out + " appeared while quantizing");
  fs::rename(tmp.path, out, ec);
  if (ec) throw OsError("quantize: cannot rename " + tmp.path + " to " + out, ec.value());
  tmp.keep = true;
  fsync_path(fs::path(out).parent_path().string(), true);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  uint64_t output_bytes = 0;
  for (const auto& e : fs::directory_iterator(out, ec))
    if (e.is_regular_file()) output_bytes += e.file_size();
  json hist = json::object();
  for (const auto& [bits, n] : histogram) hist[std::to_string(bits)] = n;
  jobs::JobResult r;
  r.output_path = out;
  r.summary = {{"source_bytes", source_bytes},
               {"output_bytes", output_bytes},
               {"parameters", params},
               {"quantized_parameters", qparams},
               {"bits_per_weight", qbits / static_cast<double>(qparams)},
               {"bits", default_bits},
               {"group_size", o.group_size},
               {"recipe", o.recipe},
               {"modules_by_bits", hist},
               {"shards", shards.size()},
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
