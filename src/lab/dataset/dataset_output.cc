#include "lab/dataset/dataset_output.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "common/os_error.h"

namespace lathe::dataset {
namespace dataset_output_detail {

namespace fs = std::filesystem;

void write_file(const fs::path& path, const std::vector<json>& rows) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw OsError("dataset: cannot create " + path.string(), errno);
  std::string buf;
  auto flush = [&] {
    size_t done = 0;
    while (done < buf.size()) {
      const ssize_t n = ::write(fd, buf.data() + done, buf.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        ::close(fd);
        throw OsError("dataset: cannot write " + path.string(), err);
      }
      done += static_cast<size_t>(n);
    }
    buf.clear();
  };
  for (const json& row : rows) {
    buf += jsonl_line(row);
    if (buf.size() >= (1u << 20)) flush();
  }
  flush();
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    throw OsError("dataset: cannot write " + path.string(), err);
  }
  if (::close(fd) != 0) throw OsError("dataset: cannot write " + path.string(), errno);
}

}  // namespace dataset_output_detail

std::string jsonl_line(const json& row) { return row.dump(-1, ' ', false, json::error_handler_t::replace) + "\n"; }

Split split_rows(std::vector<json> rows) {
  if (rows.empty())
    throw Error(ErrorKind::InvalidArgument, "dataset: the template produced no rows; nothing was written");
  const size_t n = rows.size();
  const size_t n_train = std::max<size_t>(1, static_cast<size_t>(std::floor(0.9 * static_cast<double>(n))));
  Split s;
  s.valid.assign(rows.begin() + static_cast<std::ptrdiff_t>(n_train), rows.end());
  if (s.valid.empty()) s.valid.push_back(rows.back());
  rows.resize(n_train);
  s.train = std::move(rows);
  return s;
}

void check_output_dir(const std::string& out) {
  namespace fs = std::filesystem;
  if (out.empty()) throw Error(ErrorKind::InvalidArgument, "config field 'out' (the output folder) is required");
  std::error_code ec;
  const fs::path p = fs::absolute(out, ec);
  if (ec) throw Error(ErrorKind::InvalidArgument, "config field 'out': " + out + " is not a usable path");
  if (fs::exists(fs::symlink_status(p, ec))) {
    if (!fs::is_directory(fs::symlink_status(p, ec)) || !fs::is_empty(p, ec) || ec)
      throw Error(ErrorKind::InvalidArgument,
                  "config field 'out': " + out + " already exists (choose a new folder, or an empty one)");
  }
  const fs::path parent = p.lexically_normal().parent_path();
  if (!fs::is_directory(parent, ec))
    throw Error(ErrorKind::InvalidArgument,
                "config field 'out': the parent folder " + parent.string() + " does not exist");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)  // EACCES, EROFS, …: the errno says which
    throw OsError("config field 'out': the parent folder " + parent.string() + " is not writable", errno);
}

void write_dataset(const std::string& out, const Split& split) {
  namespace fs = std::filesystem;
  using dataset_output_detail::write_file;
  const fs::path final_path = fs::absolute(out).lexically_normal();
  const fs::path tmp =
      final_path.parent_path() / ("." + final_path.filename().string() + ".tmp-" + std::to_string(::getpid()));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (::mkdir(tmp.c_str(), 0755) != 0) throw OsError("dataset: cannot create " + tmp.string(), errno);
  try {
    write_file(tmp / "train.jsonl", split.train);
    write_file(tmp / "valid.jsonl", split.valid);
    // rename(2) replaces an empty folder and refuses a non-empty one (ENOTEMPTY): a folder filled meanwhile stays.
    if (::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw OsError("dataset: cannot move the finished dataset to " + final_path.string(), errno);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace lathe::dataset
