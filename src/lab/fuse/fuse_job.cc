#include "lab/fuse/fuse_job.h"

#include "lab/fuse/fuser.h"

namespace lathe::lab {

jobs::JobKind fuse_kind() {
  jobs::JobKind k;
  k.name = "fuse";
  k.path_fields = {"model", "adapter", "out"};
  k.description = "LoRA adapter folded into its base's weights -> a new checkpoint (re-quantized, or dense)";
  k.validate = [](const jobs::json& c) { validate_fuse_paths(parse_fuse_options(c)); };
  k.run = [](const jobs::Emit& emit, const jobs::json& c) { return fuse_adapter(parse_fuse_options(c), emit); };
  return k;
}

}  // namespace lathe::lab
