#include "lab/fuse/fuse_options.h"

#include <filesystem>

#include "common/error.h"
#include "jobs/kinds.h"
#include "lab/checkpoint_writer.h"

namespace lathe::lab {

namespace fs = std::filesystem;

FuseOptions parse_fuse_options(const jobs::json& c) {
  jobs::check_fields(c, "fuse", {"model", "adapter", "out", "dequantize", "shard_bytes"});
  FuseOptions o;
  o.model = jobs::string_field(c, "model");
  o.adapter = jobs::string_field(c, "adapter");
  o.output = jobs::string_field(c, "out");
  if (c.contains("dequantize")) {
    if (!c["dequantize"].is_boolean())
      throw Error(ErrorKind::InvalidArgument, "fuse: 'dequantize' must be true or false");
    o.dequantize = c["dequantize"].get<bool>();
  }
  o.shard_bytes = static_cast<uint64_t>(jobs::number_field(c, "shard_bytes", 5.0 * (1ull << 30), 1 << 20, 1e15));
  validate_fuse_options(o);
  return o;
}

void validate_fuse_options(const FuseOptions& o) {
  if (o.model.empty()) throw Error(ErrorKind::InvalidArgument, "fuse: 'model' (the base checkpoint) is required");
  if (o.adapter.empty()) throw Error(ErrorKind::InvalidArgument, "fuse: 'adapter' (the adapter folder) is required");
  if (o.output.empty()) throw Error(ErrorKind::InvalidArgument, "fuse: 'out' (the output directory) is required");
}

void validate_fuse_paths(const FuseOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.model, ec))
    throw Error(ErrorKind::NotFound, "fuse: the base model " + o.model + " is not a directory");
  if (!fs::exists(fs::path(o.model) / "config.json", ec))
    throw Error(ErrorKind::NotFound, "fuse: the base model " + o.model + " has no config.json");
  require_weights("fuse", "the base model", o.model);
  if (!fs::is_directory(o.adapter, ec))
    throw Error(ErrorKind::NotFound, "fuse: the adapter " + o.adapter + " is not a directory");
  require_new_output("fuse", o.output);
}

}  // namespace lathe::lab
