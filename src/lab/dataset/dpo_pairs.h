// dpo_pref_pairs: CSV with the header prompt,chosen,rejected -> {"prompt", "chosen", "rejected"} rows.
#pragma once
#include <string>

#include "lab/dataset/generated.h"

namespace lathe::dataset {

// The header names the three columns in any order (case and surrounding spaces ignored; no others). Every record
// must have as many fields as the header (an error naming its line); a record with an empty prompt, chosen or
// rejected is skipped and counted, and so is a blank line.
Generated parse_dpo_csv(const std::string& csv);

}  // namespace lathe::dataset
