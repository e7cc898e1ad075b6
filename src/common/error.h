// Typed errors: every failure carries a kind so the server can map it to one HTTP status in one place.
#pragma once
#include <stdexcept>
#include <string>

namespace lathe {

enum class ErrorKind {
  InvalidArgument,  // the caller asked for something malformed or out of range
  NotFound,         // a file, tensor or route that does not exist
  Corrupt,          // a file exists but its contents are inconsistent
  Unsupported,      // well-formed but not something lathe implements
  Io,               // the operating system refused (open, mmap, write, disk full)
  Internal,         // a bug in lathe
};

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// Throws Error(Internal) when an invariant does not hold; for programmer errors, not user input.
#define LATHE_CHECK(cond, msg)                                                                          \
  do {                                                                                                  \
    if (!(cond)) throw ::lathe::Error(::lathe::ErrorKind::Internal, std::string(msg) + " (" #cond ")"); \
  } while (0)

}  // namespace lathe
