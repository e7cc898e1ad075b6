#include "lab/dataset/format_conversion.h"

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "common/error.h"
#include "common/os_error.h"
#include "lab/train/train_data.h"

namespace lathe::dataset {
namespace dataset_convert_detail {

bool usable(const jobs::json& row, const std::string& key, std::string* out) {
  const auto it = row.find(key);
  if (it == row.end() || !it->is_string()) return false;
  *out = it->get<std::string>();
  return out->find_first_not_of(" \t\r\n") != std::string::npos;
}

}  // namespace dataset_convert_detail

Generated convert_jsonl(const std::string& path, const KeyMapping& keys, const Progress& progress) {
  using dataset_convert_detail::usable;
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw Error(ErrorKind::InvalidArgument, "config field 'path': " + path + " is not a file");
  const uint64_t size = fs::file_size(path, ec);
  if (size > kMaxConvertBytes)
    throw Error(ErrorKind::InvalidArgument, "config field 'path': " + path + " holds " + std::to_string(size) +
                                                " bytes; at most " + std::to_string(kMaxConvertBytes) +
                                                " are converted in one job (split the file)");
  std::unique_ptr<FILE, int (*)(FILE*)> f(std::fopen(path.c_str(), "rb"), &std::fclose);
  if (!f) throw OsError("config field 'path': cannot open " + path, errno);

  Generated g;
  std::string line;
  uint64_t read = 0;
  size_t line_no = 0;
  bool eof = false;
  while (!eof) {
    line.clear();
    int c;
    while ((c = getc_unlocked(f.get())) != EOF && c != '\n') {
      if (line.size() >= train::kMaxDataLineBytes)
        throw Error(ErrorKind::InvalidArgument, path + ", line " + std::to_string(line_no + 1) + ": longer than " +
                                                    std::to_string(train::kMaxDataLineBytes) + " bytes");
      line += static_cast<char>(c);
    }
    eof = c == EOF;
    if (eof && std::ferror(f.get())) throw OsError("cannot read " + path, errno);
    ++line_no;
    read += line.size() + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    jobs::json row;
    try {
      row = jobs::json::parse(line);
    } catch (const std::exception& e) {
      throw Error(ErrorKind::InvalidArgument, path + ", line " + std::to_string(line_no) + ": not JSON (" +
                                                  std::string(e.what()).substr(0, 200) + ")");
    }
    if (!row.is_object())
      throw Error(ErrorKind::InvalidArgument,
                  path + ", line " + std::to_string(line_no) + ": a row must be a JSON object");
    std::string user, assistant, system;
    if (!usable(row, keys.user, &user) || !usable(row, keys.assistant, &assistant) ||
        (!keys.system.empty() && !usable(row, keys.system, &system))) {
      ++g.skipped;
    } else {
      if (static_cast<int64_t>(g.rows.size()) >= kMaxDatasetRows)
        throw Error(ErrorKind::InvalidArgument,
                    path + ": more than " + std::to_string(kMaxDatasetRows) + " rows (split the file)");
      jobs::json messages = jobs::json::array();
      if (!keys.system.empty()) messages.push_back({{"role", "system"}, {"content", system}});
      messages.push_back({{"role", "user"}, {"content", user}});
      messages.push_back({{"role", "assistant"}, {"content", assistant}});
      g.rows.push_back({{"messages", std::move(messages)}});
    }
    if (progress && line_no % 1024 == 0)
      progress(static_cast<int64_t>(std::min(read, size)), static_cast<int64_t>(size));
  }
  if (progress) progress(static_cast<int64_t>(size), static_cast<int64_t>(size));
  return g;
}

}  // namespace lathe::dataset
