// Whether a resolved path names a folder or one of its descendants, by whole path components ("/a/bc" is not
// inside "/a/b"). Both paths must already be resolved (realpath, weakly_canonical): no "..", no symlinks.
#pragma once
#include <string>

namespace lathe::io {

inline bool path_within(const std::string& path, const std::string& root) {
  if (root.empty()) return false;
  if (path == root) return true;
  return path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
         (root.back() == '/' || path[root.size()] == '/');
}

}  // namespace lathe::io
