// sft_qa_pairs: "Q: ..." / "A: ..." blocks -> {"messages": [(system), user, assistant]} rows.
#pragma once
#include <string>

#include "lab/dataset/generated.h"

namespace lathe::dataset {

// A line starting with "Q:" opens a pair, one starting with "A:" its answer; the lines after either (up to the
// next Q: or A:) continue it, so answers and questions may span lines. Blank lines between pairs are ignored.
// Throws InvalidArgument naming the line for text before the first Q:, an A: with no Q:, a Q: with no A:, two
// A:s for one Q:, or an empty question or answer.
Generated parse_qa_pairs(const std::string& text, const std::string& system_prompt);

}  // namespace lathe::dataset
