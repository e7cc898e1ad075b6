// A template's text read from a file instead of the form: `lathe dataset --set-file KEY=PATH` reads it on the
// client; a job's `<field>_file` (for any textarea field) names a file on the server, for inputs larger than a
// job config may hold.
#pragma once
#include <cstdint>
#include <string>

namespace lathe::dataset {

constexpr uint64_t kMaxTextFileBytes = uint64_t{64} << 20;

// The file's bytes. Throws InvalidArgument, starting with `what`, for a path that is not a regular file (a FIFO
// or device would block or never end), one that cannot be read (the OS's reason), or one over kMaxTextFileBytes.
std::string read_text_file(const std::string& path, const std::string& what);

}  // namespace lathe::dataset
