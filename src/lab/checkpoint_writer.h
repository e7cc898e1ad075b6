// Writing a checkpoint folder as mlx_lm.convert lays it out, for the jobs that produce one (quantize, fuse):
// tensors sorted by name in shards of at most shard_bytes (model.safetensors, or model-0000i-of-0000n with
// model.safetensors.index.json), config.json, and the tokenizer and generation files copied from the source.
// Everything goes under <out>.tmp-<pid> first and is renamed to <out> at the end; on any failure the temporary
// folder is removed, so nothing partial ever appears under the final name.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/safetensors.h"
#include "jobs/job_types.h"

namespace lathe::lab {

struct OutputTensor {
  std::string name;
  DType dtype;
  Shape shape;
  SafetensorsWriter::Fill fill;  // writes bytes() bytes; called once per tensor, in name order
  uint64_t bytes() const { return static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype); }
};

struct CheckpointWrite {
  std::string job;     // names the job in error messages ("quantize", "fuse")
  std::string source;  // the folder whose tokenizer and generation files are copied
  std::string output;  // the folder to create (must not exist when the rename comes)
  uint64_t shard_bytes = uint64_t{5} << 30;
  jobs::json config;        // written as config.json
  uint64_t parameters = 0;  // the index's metadata.total_parameters
  // Called before each shard is written (file name, index from 0, count): progress events.
  std::function<void(const std::string& file, size_t i, size_t n)> on_shard;
};

struct WrittenCheckpoint {
  std::string path;  // absolute
  size_t shards = 0;
  uint64_t bytes = 0;  // the files written, all together
};

WrittenCheckpoint write_checkpoint(const CheckpointWrite& w, std::vector<OutputTensor> tensors);

// Checks a job's options make before anything is read: `dir` holds a checkpoint's weights (model.safetensors or
// its index; `what` names it in the message, as "quantize: the source"), and `output` is a new folder whose
// parent exists and is writable (the errno says why not). `job` prefixes the messages.
void require_weights(const std::string& job, const std::string& what, const std::string& dir);
void require_new_output(const std::string& job, const std::string& output);

}  // namespace lathe::lab
