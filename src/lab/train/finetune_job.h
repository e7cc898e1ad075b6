// The `finetune` job kind: config as train_config.h (model_dir, data_dir, adapter_path, method, ...), checked
// before the job is queued (a 400 naming the field), run in the `lathe job-run` child. It resumes from the last
// checkpoint in adapter_path, so a zombie job re-queued after a server restart continues where it stopped.
#pragma once
#include "jobs/kinds.h"
#include "lab/train/train_config.h"

namespace lathe::lab {

jobs::JobKind finetune_kind();
// The whole run in this process: load, data, init, train, write; the summary is the done event's.
jobs::JobResult run_finetune(const train::TrainConfig& config, const jobs::Emit& emit);

}  // namespace lathe::lab
