#include "lab/train/batch_grads.h"

#include "common/error.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/train/lora_engine_cpu.h"
#include "lab/train/lora_engine_cuda.h"
#include "lora/adapter_file.h"

namespace lathe::train {
namespace {

constexpr size_t kMaxBatchFileBytes = 64u << 20;
constexpr size_t kMaxSequences = 4096;
constexpr size_t kMaxTokensPerSequence = 1 << 20;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, where + ": " + what);
}

// a [r, in] -> [in, r] (and b [out, r] -> [r, out]): the mlx-lm layout of the gradient.
Tensor transposed(const Tensor& t) { return t.transpose(0, 1).contiguous(); }

}  // namespace

std::vector<TrainSequence> parse_grad_batch(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) bad(where, "must be a JSON object with 'batch' and 'prompt_lens'");
  if (!j.contains("batch") || !j["batch"].is_array()) bad(where, "'batch' must be an array of token-id arrays");
  if (!j.contains("prompt_lens") || !j["prompt_lens"].is_array()) bad(where, "'prompt_lens' must be an array");
  const auto& b = j["batch"];
  const auto& pl = j["prompt_lens"];
  if (b.empty()) bad(where, "'batch' is empty");
  if (b.size() > kMaxSequences) bad(where, "'batch' has more than " + std::to_string(kMaxSequences) + " sequences");
  if (pl.size() != b.size())
    bad(where,
        "'prompt_lens' has " + std::to_string(pl.size()) + " entries for " + std::to_string(b.size()) + " sequences");
  std::vector<TrainSequence> out;
  for (size_t i = 0; i < b.size(); ++i) {
    const std::string at = "batch[" + std::to_string(i) + "]";
    if (!b[i].is_array() || b[i].empty()) bad(where, at + " must be a non-empty array of token ids");
    if (b[i].size() > kMaxTokensPerSequence) bad(where, at + " is too long");
    TrainSequence s;
    for (const auto& v : b[i]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX)
        bad(where, at + " holds something that is not a token id");
      s.ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
    }
    if (!pl[i].is_number_integer()) bad(where, "prompt_lens[" + std::to_string(i) + "] must be an integer");
    const int64_t p = pl[i].get<int64_t>();
    const int64_t n = static_cast<int64_t>(s.ids.size());
    if (p < 1 || p > n)
      bad(where, "prompt_lens[" + std::to_string(i) + "] = " + std::to_string(p) + " must be in [1, " +
                     std::to_string(n) + "] (position 0 is never a target)");
    s.target.assign(s.ids.size(), 0);
    for (int64_t k = p; k < n; ++k) s.target[static_cast<size_t>(k)] = 1;
    out.push_back(std::move(s));
  }
  return out;
}

std::vector<TrainSequence> read_grad_batch(const std::string& path) {
  const std::string text = read_text_file(path);
  if (text.size() > kMaxBatchFileBytes) bad(path, "is larger than 64 MiB");
  if (auto err = io::check_json(text, io::file_json_limits())) bad(path, *err);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) bad(path, "is not valid JSON");
  return parse_grad_batch(j, path);
}

BatchGrads compute_batch_grads(const Model& model, const std::string& adapter_dir,
                               const std::vector<TrainSequence>& batch, Device device) {
  const lora::AdapterWeights adapter = lora::read_adapter(adapter_dir);
  if (adapter.factors.empty()) throw Error(ErrorKind::InvalidArgument, adapter_dir + ": the adapter has no LoRA pairs");
  LoraParams params = lora_params_from_adapter(adapter);
  auto engine = device == Device::CUDA ? make_cuda_lora_gradient_engine(model, params)
                                       : make_cpu_lora_gradient_engine(model, params);
  const SequenceLogProbs lp = engine->forward(batch, /*with_adapter=*/true);
  BatchGrads g;
  double sum = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    sum += lp.sum_logp[i];
    g.targets += lp.n_targets[i];
  }
  if (g.targets == 0) throw Error(ErrorKind::InvalidArgument, "the batch has no target tokens");
  g.loss = -sum / static_cast<double>(g.targets);
  engine->backward(std::vector<double>(batch.size(), -1.0 / static_cast<double>(g.targets)));
  for (const LoraParam& p : params.params) {
    g.grads.push_back({p.module + ".lora_a.grad", transposed(p.grad_a)});
    g.grads.push_back({p.module + ".lora_b.grad", transposed(p.grad_b)});
  }
  return g;
}

void write_grads(const BatchGrads& g, const std::string& path) {
  SafetensorsWriter w;
  for (const NamedGrad& n : g.grads) w.add(n.name, n.value);
  w.set_metadata("loss", std::to_string(g.loss));
  w.write(path);
}

}  // namespace lathe::train
