#include "lab/dataset/dpo_pairs.h"

#include <algorithm>
#include <array>
#include <cctype>

#include "common/error.h"
#include "lab/dataset/csv_reader.h"

namespace lathe::dataset {
namespace dataset_dpo_detail {

std::string header_name(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  std::string t = s.substr(b, e - b);
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return t;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace dataset_dpo_detail

Generated parse_dpo_csv(const std::string& csv) {
  using namespace dataset_dpo_detail;
  const std::string what = "config field 'csv'";
  const auto records = parse_csv(csv, what, static_cast<size_t>(kMaxDatasetRows) + 1);
  if (records.empty())
    throw Error(ErrorKind::InvalidArgument, what + ": empty (need the header prompt,chosen,rejected)");
  const std::array<std::string, 3> names = {"prompt", "chosen", "rejected"};
  std::array<size_t, 3> col = {SIZE_MAX, SIZE_MAX, SIZE_MAX};
  const CsvRecord& header = records.front();
  for (size_t c = 0; c < header.fields.size(); ++c) {
    const std::string h = header_name(header.fields[c]);
    const auto it = std::find(names.begin(), names.end(), h);
    if (it == names.end())
      throw Error(ErrorKind::InvalidArgument, what + ", line " + std::to_string(header.line) + ": unknown column '" +
                                                  h.substr(0, 64) + "' (the header is prompt,chosen,rejected)");
    const size_t k = static_cast<size_t>(it - names.begin());
    if (col[k] != SIZE_MAX)
      throw Error(ErrorKind::InvalidArgument,
                  what + ", line " + std::to_string(header.line) + ": column '" + h + "' appears twice");
    col[k] = c;
  }
  for (size_t k = 0; k < 3; ++k)
    if (col[k] == SIZE_MAX)
      throw Error(ErrorKind::InvalidArgument, what + ", line " + std::to_string(header.line) + ": no '" + names[k] +
                                                  "' column (the header is prompt,chosen,rejected)");
  Generated g;
  for (size_t r = 1; r < records.size(); ++r) {
    const CsvRecord& rec = records[r];
    if (rec.fields.size() == 1 && blank(rec.fields[0])) {
      ++g.skipped;
      continue;
    }
    if (rec.fields.size() != header.fields.size())
      throw Error(ErrorKind::InvalidArgument, what + ", line " + std::to_string(rec.line) + ": " +
                                                  std::to_string(rec.fields.size()) + " fields where the header has " +
                                                  std::to_string(header.fields.size()));
    const std::string& p = rec.fields[col[0]];
    const std::string& c = rec.fields[col[1]];
    const std::string& j = rec.fields[col[2]];
    if (blank(p) || blank(c) || blank(j)) {
      ++g.skipped;
      continue;
    }
    g.rows.push_back({{"prompt", p}, {"chosen", c}, {"rejected", j}});
  }
  return g;
}

}  // namespace lathe::dataset
