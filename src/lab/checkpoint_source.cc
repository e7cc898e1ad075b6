#include "lab/checkpoint_source.h"

#include <filesystem>
#include <set>

#include "common/error.h"
#include "io/mapped_file.h"

namespace lathe::lab {

namespace fs = std::filesystem;
using jobs::json;

json read_json_file(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw Error(ErrorKind::Corrupt, path + ": not valid JSON: " + e.what());
  }
}

std::vector<SourceTensor> open_checkpoint_tensors(const std::string& dir) {
  std::vector<std::string> shards;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(index)) {
    const json j = read_json_file(index.string());
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

}  // namespace lathe::lab
