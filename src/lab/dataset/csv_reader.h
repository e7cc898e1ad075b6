// RFC 4180 CSV: fields split by commas, records by CRLF or LF; a field in double quotes may hold commas, line
// breaks and doubled quotes (""). Strict: a quote inside an unquoted field, text after a closing quote, or a
// quote left open is an error naming the line.
#pragma once
#include <string>
#include <vector>

namespace lathe::dataset {

struct CsvRecord {
  std::vector<std::string> fields;
  size_t line = 0;  // the line the record starts on (1-based)
};

// `what` names the input in errors ("config field 'csv'"). Throws InvalidArgument "<what>, line N: ...".
// A trailing line break does not make an empty record; blank lines in between give a record of one empty field.
std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& what, size_t max_records);

}  // namespace lathe::dataset
