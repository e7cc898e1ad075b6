// format_conversion: a JSONL file with keys of its own -> {"messages": [(system), user, assistant]} rows.
#pragma once
#include <cstdint>
#include <string>

#include "lab/dataset/generated.h"

namespace lathe::dataset {

constexpr uint64_t kMaxConvertBytes = uint64_t{512} << 20;

struct KeyMapping {
  std::string user, assistant, system;  // system: empty for none
};

// Each non-blank line must be a JSON object (else InvalidArgument "<path>, line N: ..."); a row whose user or
// assistant value (or, when a system key is given, system value) is missing, not a string or blank is skipped and
// counted. Lines longer than train::kMaxDataLineBytes and files over kMaxConvertBytes are refused.
// progress(bytes read, file size).
Generated convert_jsonl(const std::string& path, const KeyMapping& keys, const Progress& progress = {});

}  // namespace lathe::dataset
