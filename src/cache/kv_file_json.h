// The JSON form of a KV file header (internal to kv_file*.cc).
#pragma once
#include <nlohmann/json.hpp>

#include "cache/kv_file.h"

namespace lathe {

nlohmann::ordered_json kv_header_json(const KvFileHeader& h);

}  // namespace lathe
