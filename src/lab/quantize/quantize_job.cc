#include "lab/quantize/quantize_job.h"

#include "lab/quantize/quantizer.h"

namespace lathe::lab {

jobs::JobKind quantize_kind() {
  jobs::JobKind k;
  k.name = "quantize";
  k.path_fields = {"model", "out"};
  k.description = "HF bf16/f16/f32 checkpoint -> MLX affine (bits 2-8, group 32/64/128, recipes)";
  k.validate = [](const jobs::json& c) { validate_quantize_paths(parse_quantize_options(c)); };
  k.run = [](const jobs::Emit& emit, const jobs::json& c) {
    return quantize_checkpoint(parse_quantize_options(c), emit);
  };
  return k;
}

}  // namespace lathe::lab
