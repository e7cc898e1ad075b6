// The `fuse` job kind: config {model, adapter, out, dequantize, shard_bytes}, checked (fields and paths) before
// the job is queued, run by fuse_adapter in the job's child process.
#pragma once
#include "jobs/kinds.h"

namespace lathe::lab {

jobs::JobKind fuse_kind();

}  // namespace lathe::lab
