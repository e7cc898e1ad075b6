#include "lab/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>

#include "common/error.h"
#include "common/os_error.h"
#include "io/mapped_file.h"

namespace lathe::lab {
namespace checkpoint_writer_detail {

namespace fs = std::filesystem;

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

}  // namespace checkpoint_writer_detail

WrittenCheckpoint write_checkpoint(const CheckpointWrite& w, std::vector<OutputTensor> tensors) {
  using namespace checkpoint_writer_detail;
  std::sort(tensors.begin(), tensors.end(),
            [](const OutputTensor& a, const OutputTensor& b) { return a.name < b.name; });

  // Shards: greedy in name order, a new one when the next tensor would pass shard_bytes.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, tensor_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t b = tensors[i].bytes();
    if (in_shard > 0 && in_shard + b > w.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    tensor_bytes += b;
  }

  TempDirGuard tmp;
  const std::string out = fs::absolute(w.output).lexically_normal().string();
  tmp.path = out + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp.path, ec);
  if (!fs::create_directory(tmp.path, ec))  // no error code: something is still there (EEXIST)
    throw OsError(w.job + ": cannot create the output folder " + tmp.path, ec ? ec.value() : EEXIST);

  jobs::json weight_map = jobs::json::object();
  for (size_t s = 0; s < shards.size(); ++s) {
    const std::string file = shard_name(s, shards.size());
    SafetensorsWriter sw;
    sw.set_metadata("format", "mlx");
    for (size_t i : shards[s]) {
      OutputTensor& t = tensors[i];
      weight_map[t.name] = file;
      sw.add(t.name, t.dtype, t.shape, std::move(t.fill));
    }
    if (w.on_shard) w.on_shard(file, s, shards.size());
    sw.write(tmp.path + "/" + file);
  }

  const std::string config_text = w.config.dump(4);
  write_file_atomic(tmp.path + "/config.json", config_text.data(), config_text.size());
  const std::string index_text = jobs::json{
      {"metadata", {{"total_size", tensor_bytes}, {"total_parameters", w.parameters}}},
      {"weight_map", weight_map}}.dump(4);
  write_file_atomic(tmp.path + "/model.safetensors.index.json", index_text.data(), index_text.size());
  for (const char* aux : kAuxFiles) {
    const fs::path from = fs::path(w.source) / aux;
    if (!fs::exists(from, ec)) continue;
    const auto mapped = MappedFile::open(from.string());
    write_file_atomic(tmp.path + "/" + aux, mapped->data(), mapped->size());
  }
  fsync_path(tmp.path, true);
  if (fs::exists(out, ec)) throw Error(ErrorKind::InvalidArgument, w.job + ": " + out + " appeared while writing");
  fs::rename(tmp.path, out, ec);
  if (ec) throw OsError(w.job + ": cannot rename " + tmp.path + " to " + out, ec.value());
  tmp.keep = true;
  fsync_path(fs::path(out).parent_path().string(), true);

  WrittenCheckpoint r;
  r.path = out;
  r.shards = shards.size();
  for (const auto& e : fs::directory_iterator(out, ec))
    if (e.is_regular_file()) r.bytes += e.file_size();
  return r;
}

void require_weights(const std::string& job, const std::string& what, const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(fs::path(dir) / "model.safetensors", ec) &&
      !fs::exists(fs::path(dir) / "model.safetensors.index.json", ec))
    throw Error(ErrorKind::NotFound,
                job + ": " + what + " " + dir + " has no model.safetensors or model.safetensors.index.json");
}

void require_new_output(const std::string& job, const std::string& output) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::exists(output, ec))
    throw Error(ErrorKind::InvalidArgument, job + ": the output " + output + " already exists (choose a new --out)");
  const fs::path parent = fs::absolute(output, ec).parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(ErrorKind::NotFound, job + ": the output's parent directory " + parent.string() + " does not exist");
  if (::access(parent.c_str(), W_OK) != 0)  // EACCES, EROFS, …: the errno says which
    throw OsError(errno, job + ": the output's parent directory " + parent.string() + " is not writable");
}

}  // namespace lathe::lab
