#include "lab/dataset/csv_reader.h"

#include "common/error.h"

namespace lathe::dataset {
namespace dataset_csv_detail {

[[noreturn]] void fail(const std::string& what, size_t line, const std::string& why) {
  throw Error(ErrorKind::InvalidArgument, what + ", line " + std::to_string(line) + ": " + why);
}

}  // namespace dataset_csv_detail

std::vector<CsvRecord> parse_csv(const std::string& text, const std::string& what, size_t max_records) {
  using dataset_csv_detail::fail;
  std::vector<CsvRecord> out;
  const size_t n = text.size();
  size_t i = 0, line = 1;
  if (n >= 3 && text.compare(0, 3, "\xEF\xBB\xBF") == 0) i = 3;  // a UTF-8 byte order mark
  while (i < n) {
    CsvRecord rec;
    rec.line = line;
    while (true) {  // one field per pass
      std::string field;
      if (i < n && text[i] == '"') {
        const size_t opened = line;
        ++i;
        while (true) {
          if (i >= n) fail(what, opened, "a quoted field is never closed");
          const char c = text[i];
          if (c == '"') {
            if (i + 1 < n && text[i + 1] == '"') {
              field += '"';
              i += 2;
              continue;
            }
            ++i;
            break;
          }
          if (c == '\n') ++line;
          field += c;
          ++i;
        }
        if (i < n && text[i] != ',' && text[i] != '\n' && !(text[i] == '\r' && (i + 1 == n || text[i + 1] == '\n')))
          fail(what, line, "text after a closing quote (a quote inside a field is written \"\")");
      } else {
        while (i < n && text[i] != ',' && text[i] != '\n') {
          if (text[i] == '"') fail(what, line, "a quote inside an unquoted field (quote the whole field)");
          if (text[i] == '\r' && (i + 1 == n || text[i + 1] == '\n')) break;
          field += text[i++];
        }
      }
      rec.fields.push_back(std::move(field));
      if (i < n && text[i] == ',') {
        ++i;
        continue;
      }
      if (i < n && text[i] == '\r') ++i;
      if (i < n && text[i] == '\n') {
        ++i;
        ++line;
      }
      break;
    }
    if (out.size() >= max_records) fail(what, rec.line, "more than " + std::to_string(max_records) + " records");
    out.push_back(std::move(rec));
  }
  return out;
}

}  // namespace lathe::dataset
