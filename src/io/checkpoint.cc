#include "io/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "common/error.h"
#include "io/json_guard.h"

namespace lathe {
namespace fs = std::filesystem;

std::string canonical_tensor_name(const std::string& stored) {
  static const std::string kPrefix = "language_model.";
  if (stored.rfind(kPrefix, 0) == 0) return stored.substr(kPrefix.size());
  return stored;
}

Checkpoint Checkpoint::open(const std::string& dir) {
  Checkpoint c;
  c.dir_ = dir;
  if (!fs::is_directory(dir)) throw Error(ErrorKind::NotFound, "model directory " + dir + " does not exist");
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shard_names;
  nlohmann::json weight_map;
  if (fs::exists(index)) {
    const nlohmann::json j = io::parse_json_checked(read_text_file(index.string()), io::file_json_limits(),
                                                    ErrorKind::Corrupt, index.string() + ": not valid JSON");
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error(ErrorKind::Corrupt, index.string() + ": missing the weight_map object");
    weight_map = j["weight_map"];
    std::set<std::string> seen;
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it) {
      if (!it.value().is_string())
        throw Error(ErrorKind::Corrupt, index.string() + ": weight_map entry '" + it.key() + "' is not a file name");
      std::string shard = it.value().get<std::string>();
      if (shard.find('/') != std::string::npos || shard.find("..") != std::string::npos)
        throw Error(ErrorKind::Corrupt, index.string() + ": shard name '" + shard + "' is not a plain file name");
      if (seen.insert(shard).second) shard_names.push_back(shard);
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("model", 0) == 0 && e.path().extension() == ".safetensors") shard_names.push_back(n);
    }
    std::sort(shard_names.begin(), shard_names.end());
    if (shard_names.empty())
      throw Error(ErrorKind::NotFound, dir + ": no model.safetensors (or model.safetensors.index.json) found");
  }
  for (const auto& shard : shard_names) {
    auto f = SafetensorsFile::open((fs::path(dir) / shard).string());
    const size_t idx = c.files_.size();
    c.files_.push_back(f);
    for (const auto& [name, info] : f->tensors()) {
      if (!weight_map.is_null()) {
        auto it = weight_map.find(name);
        if (it == weight_map.end() || it->get<std::string>() != shard) continue;  // the index decides
      }
      c.where_[canonical_tensor_name(name)] = {idx, name};
    }
  }
  if (!weight_map.is_null())
    for (auto it = weight_map.begin(); it != weight_map.end(); ++it)
      if (!c.where_.count(canonical_tensor_name(it.key())))
        throw Error(ErrorKind::Corrupt, index.string() + ": tensor '" + it.key() + "' is listed in shard " +
                                            it.value().get<std::string>() + " but that file does not contain it");
  return c;
}

Tensor Checkpoint::get(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error(ErrorKind::NotFound, dir_ + ": checkpoint has no tensor '" + name + "'");
  return files_[it->second.first]->get(it->second.second);
}

std::string Checkpoint::file_of(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) return dir_;
  return files_[it->second.first]->path();
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [n, w] : where_) out.push_back(n);
  return out;
}

size_t Checkpoint::total_file_bytes() const {
  size_t n = 0;
  for (const auto& f : files_) n += f->file_size();
  return n;
}

}  // namespace lathe
