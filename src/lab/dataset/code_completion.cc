#include "lab/dataset/code_completion.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "lab/train/train_data.h"

namespace lathe::dataset {
namespace dataset_code_detail {

namespace fs = std::filesystem;

bool starts_block(const std::string& line) {
  return line.starts_with("def ") || line.starts_with("async def ") || line.starts_with("class ");
}

bool blank(const std::string& line) { return line.find_first_not_of(" \t\r") == std::string::npos; }

// Inside `root` (both canonical): root itself or below it.
bool inside(const fs::path& root, const fs::path& p) {
  auto r = root.begin(), q = p.begin();
  for (; r != root.end(); ++r, ++q)
    if (q == p.end() || *r != *q) return false;
  return true;
}

}  // namespace dataset_code_detail

std::vector<jobs::json> split_python_source(const std::string& source, uint64_t& rng_state) {
  using namespace dataset_code_detail;
  std::vector<std::string> lines;
  {
    std::istringstream in(source);
    std::string l;
    while (std::getline(in, l)) {
      if (!l.empty() && l.back() == '\r') l.pop_back();
      lines.push_back(std::move(l));
    }
  }
  std::vector<jobs::json> rows;
  size_t i = 0;
  while (i < lines.size()) {
    if (!starts_block(lines[i])) {
      ++i;
      continue;
    }
    const size_t def_line = i;
    size_t begin = i;
    while (begin > 0 && lines[begin - 1].starts_with("@")) --begin;  // its decorators
    size_t end = i + 1;
    while (end < lines.size() && (blank(lines[end]) || lines[end][0] == ' ' || lines[end][0] == '\t' ||
                                  lines[end][0] == ')' || lines[end][0] == ']' || lines[end][0] == '}'))
      ++end;
    size_t last = end;  // drop trailing blank lines
    while (last > def_line + 1 && blank(lines[last - 1])) --last;
    i = end;
    const size_t n = last - begin;
    // The header (decorators and the def line) always stays in the prompt; at least one line completes.
    const size_t header = def_line - begin + 1;
    if (header >= n) continue;
    train::SplitMix64 rng(rng_state);
    const uint64_t draw = rng.next();
    rng_state = rng.state();
    const size_t cut = header + static_cast<size_t>(draw % (n - header));  // lines in the prompt: [header, n)
    std::string prompt, completion;
    for (size_t k = begin; k < begin + cut; ++k) prompt += lines[k] + "\n";
    for (size_t k = begin + cut; k < last; ++k) completion += lines[k] + "\n";
    if (blank(completion)) continue;
    rows.push_back({{"prompt", prompt}, {"completion", completion}});
  }
  return rows;
}

Generated code_completion_rows(const std::string& dir, uint64_t seed, const CodeWalkLimits& limits,
                               const Progress& progress) {
  using namespace dataset_code_detail;
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw Error(ErrorKind::InvalidArgument, "config field 'dir': " + dir + " is not a folder");
  const fs::path root = fs::canonical(dir, ec);
  if (ec) throw Error(ErrorKind::InvalidArgument, "config field 'dir': " + dir + ": " + ec.message());

  Generated g;
  std::vector<fs::path> files;
  int64_t seen = 0;
  fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied, ec), end;
  if (ec) throw Error(ErrorKind::Io, "config field 'dir': cannot read " + dir + ": " + ec.message());
  for (; it != end; it.increment(ec)) {
    if (ec) break;
    if (++seen > limits.max_entries) break;
    if (it.depth() >= limits.max_depth) it.disable_recursion_pending();
    const fs::directory_entry& e = *it;
    const std::string name = e.path().filename().string();
    if (name.starts_with(".") || name == "__pycache__" || name == "node_modules" || name == "site-packages") {
      if (e.is_directory(ec)) it.disable_recursion_pending();  // .git, .venv, caches: not the project's code
      continue;
    }
    if (e.path().extension() != ".py") continue;
    if (e.is_symlink(ec)) {
      const fs::path target = fs::canonical(e.path(), ec);
      if (ec || !inside(root, target) || !fs::is_regular_file(target, ec)) {
        ++g.skipped;  // a link leaving the folder (or dangling) is never read
        continue;
      }
    } else if (!e.is_regular_file(ec)) {
      continue;
    }
    files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  if (static_cast<int64_t>(files.size()) > limits.max_files) files.resize(static_cast<size_t>(limits.max_files));

  uint64_t rng_state = seed, total_bytes = 0;
  const int64_t n_files = static_cast<int64_t>(files.size());
  for (int64_t k = 0; k < n_files; ++k) {
    const fs::path& path = files[static_cast<size_t>(k)];
    const uintmax_t size = fs::file_size(path, ec);
    if (ec || size > limits.max_file_bytes || total_bytes + size > limits.max_total_bytes) {
      ++g.skipped;
    } else {
      std::ifstream in(path, std::ios::binary);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      total_bytes += text.size();
      auto rows = split_python_source(text, rng_state);
      if (rows.empty()) ++g.skipped;
      for (auto& r : rows) {
        if (static_cast<int64_t>(g.rows.size()) >= kMaxDatasetRows) break;
        g.rows.push_back(std::move(r));
      }
    }
    if (progress) progress(k + 1, n_files);
  }
  return g;
}

}  // namespace lathe::dataset
