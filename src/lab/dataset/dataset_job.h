// The `dataset` job kind: config {template: ID, out: DIR, ...the template's fields}, checked before the job is
// queued (template, fields, inputs that can be read without the model, the output folder, and for LLM-driven
// templates a server to call), run in the job's child: generate the rows, split 90/10, write DIR/train.jsonl and
// DIR/valid.jsonl whole. The done summary is {rows, train, valid, skipped}.
#pragma once
#include "jobs/kinds.h"

namespace lathe::dataset {

void validate_dataset_config(const jobs::json& config);
jobs::JobResult run_dataset(const jobs::Emit& emit, const jobs::json& config);

}  // namespace lathe::dataset

namespace lathe::lab {

jobs::JobKind dataset_kind();

}  // namespace lathe::lab
