#include "lab/train/train_config.h"

#include <filesystem>

#include "common/error.h"
#include "jobs/kinds.h"

namespace lathe::train {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

int64_t int_field(const ojson& c, const char* key, int64_t fallback, double lo, double hi) {
  const double v = jobs::number_field(c, key, static_cast<double>(fallback), lo, hi);
  if (v != static_cast<double>(static_cast<int64_t>(v)))
    throw Error(ErrorKind::InvalidArgument, std::string("config field '") + key + "' must be an integer");
  return static_cast<int64_t>(v);
}

bool bool_field(const ojson& c, const char* key, bool fallback) {
  const auto it = c.find(key);
  if (it == c.end() || it->is_null()) return fallback;
  if (!it->is_boolean())
    throw Error(ErrorKind::InvalidArgument, std::string("config field '") + key + "' must be a boolean");
  return it->get<bool>();
}

}  // namespace

const char* method_name(Method m) {
  switch (m) {
    case Method::Sft: return "sft";
    case Method::Dpo: return "dpo";
    case Method::Orpo: return "orpo";
  }
  return "sft";
}

std::vector<std::string> train_config_fields() {
  return {"model_dir",
          "data_dir",
          "adapter_path",
          "method",
          "rank",
          "scale",
          "rs_lora",
          "use_rslora",
          "target_modules",
          "num_layers",
          "iters",
          "learning_rate",
          "lr_schedule",
          "warmup",
          "max_seq_length",
          "batch_size",
          "grad_accumulation_steps",
          "seed",
          "steps_per_report",
          "steps_per_eval",
          "save_every",
          "early_stop_patience",
          "save_best",
          "weight_decay",
          "grad_clip_norm",
          "val_max_examples",
          "dpo_beta",
          "orpo_lambda",
          "sft_scope",
          "resume",
          "lora_dropout",
          "lora_plus_ratio",
          "pack",
          "device"};
}

TrainConfig parse_train_config(const ojson& c) {
  jobs::check_fields(c, "finetune", train_config_fields());
  TrainConfig t;
  t.model_dir = jobs::string_field(c, "model_dir");
  t.data_dir = jobs::string_field(c, "data_dir");
  t.adapter_path = jobs::string_field(c, "adapter_path");
  const std::string method = jobs::string_field(c, "method", "sft");
  if (method == "sft")
    t.method = Method::Sft;
  else if (method == "dpo")
    t.method = Method::Dpo;
  else if (method == "orpo")
    t.method = Method::Orpo;
  else
    throw Error(ErrorKind::InvalidArgument, "config field 'method' must be sft, dpo or orpo (got '" + method + "')");
  t.lora.rank = int_field(c, "rank", 8, 1, 4096);
  t.lora.scale = static_cast<float>(jobs::number_field(c, "scale", 1.0, 0, 1e6));
  t.lora.rs_lora = bool_field(c, "rs_lora", false);
  if (c.contains("use_rslora") && !c["use_rslora"].is_null()) {  // PEFT's spelling of the same switch
    const bool peft = bool_field(c, "use_rslora", false);
    if (c.contains("rs_lora") && !c["rs_lora"].is_null() && peft != t.lora.rs_lora)
      throw Error(ErrorKind::InvalidArgument, "config fields 'rs_lora' and 'use_rslora' disagree");
    t.lora.rs_lora = peft;
  }
  if (c.contains("target_modules") && !c["target_modules"].is_null()) {
    const auto& tm = c["target_modules"];
    if (!tm.is_array() || tm.empty())
      throw Error(ErrorKind::InvalidArgument, "config field 'target_modules' must be a non-empty list of strings");
    t.lora.target_modules.clear();
    for (const auto& m : tm) {
      if (!m.is_string() || m.get<std::string>().empty() || m.get<std::string>().size() > 256)
        throw Error(ErrorKind::InvalidArgument, "config field 'target_modules' must be a non-empty list of strings");
      t.lora.target_modules.push_back(m.get<std::string>());
    }
  }
  t.lora.num_layers = int_field(c, "num_layers", -1, -1, 1e6);
  if (t.lora.num_layers == 0)
    throw Error(ErrorKind::InvalidArgument, "config field 'num_layers' must be -1 (all) or at least 1");
  t.iters = int_field(c, "iters", 100, 1, 1e9);
  const double lr_default = t.method == Method::Sft ? 2e-4 : t.method == Method::Dpo ? 5e-5 : 1e-5;
  t.learning_rate = jobs::number_field(c, "learning_rate", lr_default, 0, 10);
  t.lr_schedule = jobs::string_field(c, "lr_schedule", t.method == Method::Sft ? "constant" : "cosine");
  if (t.lr_schedule != "constant" && t.lr_schedule != "cosine")
    throw Error(ErrorKind::InvalidArgument, "config field 'lr_schedule' must be constant or cosine");
  t.warmup = int_field(c, "warmup", 0, 0, 1e9);
  t.max_seq_length = int_field(c, "max_seq_length", 512, 2, 1 << 20);
  t.batch_size = int_field(c, "batch_size", 1, 1, 4096);
  t.grad_accumulation_steps = int_field(c, "grad_accumulation_steps", 1, 1, 4096);
  t.seed = static_cast<uint64_t>(int_field(c, "seed", 0, 0, 9007199254740991.0));
  t.lora.seed = t.seed;
  t.steps_per_report = int_field(c, "steps_per_report", 10, 1, 1e9);
  t.steps_per_eval = int_field(c, "steps_per_eval", 50, 1, 1e9);
  t.save_every = int_field(c, "save_every", 0, 0, 1e9);
  t.early_stop_patience = int_field(c, "early_stop_patience", 0, 0, 1e6);
  t.save_best = bool_field(c, "save_best", false);
  t.weight_decay = jobs::number_field(c, "weight_decay", 0.01, 0, 10);
  t.grad_clip_norm = jobs::number_field(c, "grad_clip_norm", 1.0, 0, 1e9);
  t.val_max_examples = int_field(c, "val_max_examples", 256, 1, 1e9);
  t.dpo_beta = jobs::number_field(c, "dpo_beta", 0.1, 1e-6, 1e3);
  t.orpo_lambda = jobs::number_field(c, "orpo_lambda", 0.1, 0, 1e3);
  t.sft_scope = jobs::string_field(c, "sft_scope", "full");
  if (t.sft_scope != "full" && t.sft_scope != "response")
    throw Error(ErrorKind::InvalidArgument, "config field 'sft_scope' must be full or response");
  t.resume = bool_field(c, "resume", true);
  t.pack = bool_field(c, "pack", false);
  t.device = jobs::string_field(c, "device", "cpu");
  if (t.device != "cpu" && t.device != "cuda")
    throw Error(ErrorKind::InvalidArgument, "config field 'device' must be cpu or cuda (got '" + t.device + "')");
  t.lora_dropout = jobs::number_field(c, "lora_dropout", 0, 0, 1);
  if (t.lora_dropout >= 1)  // every element dropped: the 1 / (1 - p) rescale is undefined
    throw Error(ErrorKind::InvalidArgument, "config field 'lora_dropout' must be in [0, 1)");
  t.lora_plus_ratio = jobs::number_field(c, "lora_plus_ratio", 1, 0, 1e6);
  if (t.lora_plus_ratio <= 0)  // a zero ratio freezes B at its zero init: the adapter would never learn
    throw Error(ErrorKind::InvalidArgument, "config field 'lora_plus_ratio' must be > 0 (1: plain LoRA)");
  validate_train_config(t, false);
  return t;
}

void validate_train_config(const TrainConfig& c, bool check_paths) {
  if (c.model_dir.empty()) throw Error(ErrorKind::InvalidArgument, "config field 'model_dir' is required");
  if (c.data_dir.empty()) throw Error(ErrorKind::InvalidArgument, "config field 'data_dir' is required");
  if (c.adapter_path.empty()) throw Error(ErrorKind::InvalidArgument, "config field 'adapter_path' is required");
  if (c.pack && c.method != Method::Sft)  // preference losses need each branch's own log-prob row
    throw Error(ErrorKind::InvalidArgument, "config field 'pack' is for method sft only");
  if (c.warmup > c.iters) throw Error(ErrorKind::InvalidArgument, "config field 'warmup' must not exceed 'iters'");
  if (!check_paths) return;
  std::error_code ec;
  if (!fs::exists(fs::path(c.model_dir) / "config.json", ec))
    throw Error(ErrorKind::InvalidArgument, "config field 'model_dir': " + c.model_dir + " has no config.json");
  if (!fs::exists(fs::path(c.data_dir) / "train.jsonl", ec))
    throw Error(ErrorKind::InvalidArgument, "config field 'data_dir': " + c.data_dir + " has no train.jsonl");
  const fs::path out(c.adapter_path);
  if (fs::exists(out, ec) && !fs::is_directory(out, ec))
    throw Error(ErrorKind::InvalidArgument, "config field 'adapter_path': " + c.adapter_path + " is a file");
  const fs::path parent = out.has_parent_path() ? out.parent_path() : fs::path(".");
  if (!fs::exists(out, ec) && !fs::is_directory(parent, ec))
    throw Error(ErrorKind::InvalidArgument,
                "config field 'adapter_path': the parent directory " + parent.string() + " does not exist");
}

ojson TrainConfig::to_json() const {
  ojson j;
  j["model_dir"] = model_dir;
  j["data_dir"] = data_dir;
  j["adapter_path"] = adapter_path;
  j["method"] = method_name(method);
  j["rank"] = lora.rank;
  j["scale"] = lora.scale;
  j["rs_lora"] = lora.rs_lora;
  j["target_modules"] = lora.target_modules;
  j["num_layers"] = lora.num_layers;
  j["iters"] = iters;
  j["learning_rate"] = learning_rate;
  j["lr_schedule"] = lr_schedule;
  j["warmup"] = warmup;
  j["max_seq_length"] = max_seq_length;
  j["batch_size"] = batch_size;
  j["grad_accumulation_steps"] = grad_accumulation_steps;
  j["seed"] = seed;
  j["steps_per_report"] = steps_per_report;
  j["steps_per_eval"] = steps_per_eval;
  j["save_every"] = save_every;
  if (early_stop_patience > 0) j["early_stop_patience"] = early_stop_patience;
  if (save_best) j["save_best"] = true;
  j["weight_decay"] = weight_decay;
  j["grad_clip_norm"] = grad_clip_norm;
  j["lora_dropout"] = lora_dropout;
  j["lora_plus_ratio"] = lora_plus_ratio;
  j["pack"] = pack;
  j["val_max_examples"] = val_max_examples;
  if (method == Method::Dpo) j["dpo_beta"] = dpo_beta;
  if (method == Method::Orpo) j["orpo_lambda"] = orpo_lambda, j["sft_scope"] = sft_scope;
  return j;
}

}  // namespace lathe::train
