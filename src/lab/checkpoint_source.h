// Reading a safetensors checkpoint folder for a job that rewrites it (quantize, fuse): config.json, and every
// tensor with the shard that holds it (model.safetensors, or the shards model.safetensors.index.json names).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "jobs/job_types.h"

namespace lathe::lab {

struct SourceTensor {
  std::string name;
  std::shared_ptr<SafetensorsFile> file;
  TensorInfo info;
};

// Throws Error(Corrupt) naming the file when it is not valid JSON.
jobs::json read_json_file(const std::string& path);
// Every tensor of the checkpoint in dir; throws Corrupt for an index without a weight_map, a shard name with a
// '/', or a tensor stored twice.
std::vector<SourceTensor> open_checkpoint_tensors(const std::string& dir);
// num_hidden_layers (of text_config for VLM wrappers); 0 when absent.
int num_layers_of(const jobs::json& config);

}  // namespace lathe::lab
