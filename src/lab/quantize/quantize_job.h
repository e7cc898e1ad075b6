// The `quantize` job kind: config {model, out, bits, group_size, recipe, shard_bytes, eval_tokens}, checked
// (fields and paths) before the job is queued, run by quantize_checkpoint in the job's child process.
#pragma once
#include "jobs/kinds.h"

namespace lathe::lab {

jobs::JobKind quantize_kind();

}  // namespace lathe::lab
