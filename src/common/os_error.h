// An Io error that knows the errno behind it, so that the server can tell a full disk (ENOSPC, EDQUOT: 507)
// from a read-only or forbidden one (EROFS, EACCES) without reading the message (server/api_error.h).
#pragma once
#include <cstring>
#include <string>

#include "common/error.h"

namespace lathe {

class OsError : public Error {
 public:
  // The message is `what` + ": " + strerror(err), as lathe's I/O errors have always been worded.
  OsError(const std::string& what, int err) : Error(ErrorKind::Io, what + ": " + std::strerror(err)), os_errno_(err) {}
  // An errno-like code with a message of its own (SQLite's "database or disk is full" is ENOSPC).
  OsError(int err, const std::string& message) : Error(ErrorKind::Io, message), os_errno_(err) {}
  int os_errno() const { return os_errno_; }

 private:
  int os_errno_;
};

}  // namespace lathe
