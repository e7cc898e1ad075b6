#include "lab/train/train_checkpoint.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include "common/error.h"
#include "common/os_error.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "lab/train/adapter_writer.h"

namespace lathe::train {
namespace {

namespace fs = std::filesystem;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string moment_name(size_t k, const char* which) {
  std::string s = std::to_string(k);
  s.insert(0, 1, 't');
  s.push_back('.');
  s.append(which);
  return s;
}

}  // namespace

std::string save_checkpoint(const std::string& adapter_path, const TrainConfig& config, const LoraParams& params,
                            AdamW& optimizer, const TrainState& state) {
  const fs::path root = fs::path(adapter_path) / "checkpoints";
  const fs::path final_dir = root / step_name(state.step);
  const fs::path tmp = root / (step_name(state.step) + ".tmp");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw OsError("cannot create " + tmp.string(), ec.value());
  write_adapter(tmp.string(), config, params);
  SafetensorsWriter w;
  auto& m = optimizer.m();
  auto& v = optimizer.v();
  for (size_t k = 0; k < m.size(); ++k) {
    const std::vector<float>* mk = &m[k];
    const std::vector<float>* vk = &v[k];
    const Shape shape = {static_cast<int64_t>(mk->size())};
    w.add(moment_name(k, "m"), DType::F32, shape, [mk](void* d) { std::memcpy(d, mk->data(), mk->size() * 4); });
    w.add(moment_name(k, "v"), DType::F32, shape, [vk](void* d) { std::memcpy(d, vk->data(), vk->size() * 4); });
  }
  w.write((tmp / "optimizer.safetensors").string());
  nlohmann::ordered_json s;
  s["step"] = state.step;
  s["optimizer_steps"] = optimizer.steps();
  s["batches_seen"] = state.batches_seen;
  s["seed"] = state.seed;
  s["lora_dropout"] = state.lora_dropout;
  s["tensors"] = m.size();
  const std::string text = s.dump(2) + "\n";
  write_file_atomic((tmp / "state.json").string(), text.data(), text.size());
  fs::remove_all(final_dir, ec);
  fs::rename(tmp, final_dir, ec);
  if (ec) throw OsError("cannot rename " + tmp.string(), ec.value());
  return final_dir.string();
}

std::optional<std::string> latest_checkpoint(const std::string& adapter_path) {
  const fs::path root = fs::path(adapter_path) / "checkpoints";
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return std::nullopt;
  std::optional<std::string> best;
  std::string best_name;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() != 13 || name.rfind("step-", 0) != 0) continue;  // skips *.tmp leftovers
    if (!fs::exists(e.path() / "state.json", ec)) continue;
    if (!best || name > best_name) best = e.path().string(), best_name = name;
  }
  return best;
}

TrainState load_checkpoint(const std::string& dir, LoraParams& params, AdamW& optimizer) {
  const std::string state_path = dir + "/state.json";
  const auto s =
      io::parse_json_checked(read_text_file(state_path), io::file_json_limits(), ErrorKind::Corrupt, state_path);
  TrainState st;
  try {
    st.step = s.at("step").get<int64_t>();
    st.batches_seen = s.at("batches_seen").get<int64_t>();
    st.seed = s.at("seed").get<uint64_t>();
    st.lora_dropout = s.value("lora_dropout", 0.0);  // checkpoints from before dropout trained with none
    optimizer.set_steps(s.at("optimizer_steps").get<int64_t>());
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::Corrupt, state_path + ": " + e.what());
  }
  read_adapter_weights(dir + "/adapters.safetensors", params);
  const std::string opt_path = dir + "/optimizer.safetensors";
  const auto f = SafetensorsFile::open(opt_path);
  auto& m = optimizer.m();
  auto& v = optimizer.v();
  for (size_t k = 0; k < m.size(); ++k)
    for (auto [vec, which] : {std::pair{&m[k], "m"}, std::pair{&v[k], "v"}}) {
      const std::string name = moment_name(k, which);
      if (!f->has(name)) throw Error(ErrorKind::Corrupt, opt_path + " has no " + name);
      const Tensor t = f->get(name);
      if (t.dtype() != DType::F32 || t.numel() != static_cast<int64_t>(vec->size()))
        throw Error(ErrorKind::Corrupt, opt_path + ": " + name + " does not fit this run's parameters");
      std::memcpy(vec->data(), t.raw(), vec->size() * 4);
    }
  return st;
}

}  // namespace lathe::train
