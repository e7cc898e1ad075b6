// The dataset templates' text inputs, which come from a web form: Q/A blocks, preference CSV, and the RFC 4180
// reader under it. The first byte picks the parser. The CSV reader is also checked for a round trip: every
// record it returns, written back with every field quoted, must read back to the same fields.
#include <stdexcept>

#include "common/error.h"
#include "fuzz_util.h"
#include "lab/dataset/csv_reader.h"
#include "lab/dataset/dpo_pairs.h"
#include "lab/dataset/qa_pairs.h"

namespace {

std::string quoted_csv(const std::vector<lathe::dataset::CsvRecord>& records) {
  std::string out;
  for (size_t r = 0; r < records.size(); ++r) {
    if (r) out += '\n';
    const auto& fields = records[r].fields;
    for (size_t f = 0; f < fields.size(); ++f) {
      if (f) out += ',';
      out += '"';
      for (char c : fields[f]) out += c == '"' ? std::string("\"\"") : std::string(1, c);
      out += '"';
    }
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text = lathe::fuzz::text(data + 1, size - 1);
  LATHE_FUZZ_EXPECTED_ERRORS({
    switch (data[0] % 3) {
      case 0: (void)lathe::dataset::parse_qa_pairs(text, data[0] & 0x80 ? "be brief" : ""); break;
      case 1: (void)lathe::dataset::parse_dpo_csv(text); break;
      default: {
        const auto records = lathe::dataset::parse_csv(text, "fuzz input", 256);
        const auto again = lathe::dataset::parse_csv(quoted_csv(records), "round trip", 256);
        if (again.size() != records.size()) throw std::logic_error("CSV round trip changed the record count");
        for (size_t i = 0; i < records.size(); ++i)
          if (again[i].fields != records[i].fields) throw std::logic_error("CSV round trip changed a record");
      }
    }
  });
  return 0;
}
