// A checkpoint directory's weights: one model.safetensors, or shards listed by model.safetensors.index.json.
// Names are canonicalised by dropping a leading "language_model." (MLX vision-language wrappers), so model
// code asks for "model.layers.0...." whatever the layout.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"

namespace lathe {

class Checkpoint {
 public:
  static Checkpoint open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool has(const std::string& name) const { return where_.count(name) != 0; }
  Tensor get(const std::string& name) const;           // throws NotFound naming the checkpoint
  std::string file_of(const std::string& name) const;  // the shard holding it, for error messages
  std::vector<std::string> names() const;
  size_t total_file_bytes() const;

 private:
  std::string dir_;
  std::vector<std::shared_ptr<SafetensorsFile>> files_;
  std::map<std::string, std::pair<size_t, std::string>> where_;  // canonical name -> (file index, stored name)
};

std::string canonical_tensor_name(const std::string& stored);

}  // namespace lathe
