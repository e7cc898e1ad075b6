#include "lab/quantize/quantize_options.h"

#include <filesystem>

#include "common/error.h"
#include "jobs/kinds.h"
#include "lab/checkpoint_writer.h"
#include "quant/affine.h"

namespace lathe::lab {
namespace {

namespace fs = std::filesystem;

struct Mixed {
  const char* name;
  int low, high;
};
constexpr Mixed kMixed[] = {{"mixed_2_6", 2, 6}, {"mixed_3_4", 3, 4}, {"mixed_3_6", 3, 6}, {"mixed_4_6", 4, 6}};

const Mixed* find_mixed(const std::string& recipe) {
  for (const auto& m : kMixed)
    if (recipe == m.name) return &m;
  return nullptr;
}

// The N of the first ".layers.N." in a tensor name (0 when there is none). By hand: std::regex trips GCC 12's
// maybe-uninitialized warnings in the sanitizer build.
int layer_index(const std::string& name) {
  const std::string key = ".layers.";
  for (size_t at = name.find(key); at != std::string::npos; at = name.find(key, at + 1)) {
    size_t i = at + key.size(), n = 0;
    int v = 0;
    while (i < name.size() && name[i] >= '0' && name[i] <= '9' && n < 9) v = v * 10 + (name[i++] - '0'), ++n;
    if (n > 0 && i < name.size() && name[i] == '.') return v;
  }
  return 0;
}

}  // namespace

QuantizeOptions parse_quantize_options(const jobs::json& c) {
  jobs::check_fields(c, "quantize", {"model", "out", "bits", "group_size", "recipe", "shard_bytes", "eval_tokens"});
  QuantizeOptions o;
  o.source = jobs::string_field(c, "model");
  o.output = jobs::string_field(c, "out");
  o.bits = static_cast<int>(jobs::number_field(c, "bits", 4, 2, 8));
  o.group_size = static_cast<int>(jobs::number_field(c, "group_size", 64, 32, 128));
  o.recipe = jobs::string_field(c, "recipe", "uniform");
  o.shard_bytes = static_cast<uint64_t>(jobs::number_field(c, "shard_bytes", 5.0 * (1ull << 30), 1 << 20, 1e15));
  o.eval_tokens = static_cast<int>(jobs::number_field(c, "eval_tokens", 64, 0, 4096));
  validate_quantize_options(o);
  return o;
}

void validate_quantize_options(const QuantizeOptions& o) {
  if (o.source.empty())
    throw Error(ErrorKind::InvalidArgument, "quantize: 'model' (the source checkpoint) is required");
  if (o.output.empty()) throw Error(ErrorKind::InvalidArgument, "quantize: 'out' (the output directory) is required");
  if (!quant::supported_bits(o.bits))
    throw Error(ErrorKind::InvalidArgument,
                "quantize: bits must be 2, 3, 4, 5, 6 or 8 (got " + std::to_string(o.bits) + ")");
  if (!quant::supported_group_size(o.group_size))
    throw Error(ErrorKind::InvalidArgument,
                "quantize: group_size must be 32, 64 or 128 (got " + std::to_string(o.group_size) + ")");
  if (o.recipe != "uniform" && o.recipe != "embed_8" && !find_mixed(o.recipe))
    throw Error(ErrorKind::InvalidArgument, "quantize: unknown recipe '" + o.recipe +
                                                "' (uniform, embed_8, mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6)");
}

void validate_quantize_paths(const QuantizeOptions& o) {
  std::error_code ec;
  if (!fs::is_directory(o.source, ec))
    throw Error(ErrorKind::NotFound, "quantize: the source " + o.source + " is not a directory");
  if (!fs::exists(fs::path(o.source) / "config.json", ec))
    throw Error(ErrorKind::NotFound, "quantize: the source " + o.source + " has no config.json");
  require_weights("quantize", "the source", o.source);
  require_new_output("quantize", o.output);
}

ModuleBits module_bits(const QuantizeOptions& o, const std::string& name, int num_layers) {
  const bool head = name.ends_with("lm_head");
  const bool embed = name.ends_with("embed_tokens");
  if (o.recipe == "embed_8" && (head || embed)) return {8, o.group_size};
  const Mixed* m = find_mixed(o.recipe);
  if (!m) return {o.bits, o.group_size};
  const int i = layer_index(name), n = num_layers;
  const bool more = i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
  if (head) return {m->high, o.group_size};
  if (more && (name.find("v_proj") != std::string::npos || name.find("down_proj") != std::string::npos))
    return {m->high, o.group_size};
  return {m->low, o.group_size};
}

}  // namespace lathe::lab
