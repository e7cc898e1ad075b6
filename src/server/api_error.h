// Errors a client sees: an HTTP status, a type, a message and the offending field, rendered once per surface
// (OpenAI's {"error":{…}} or Anthropic's {"type":"error","error":{…}}).
#pragma once
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

namespace lathe::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, const std::string& message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status_(status), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& param() const { return param_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string param_;
  std::string code_;
};

// 400 naming the request field that is wrong.
inline ApiError invalid_field(const std::string& field, const std::string& message) {
  return ApiError(400, message, field);
}

// Maps a typed engine error (bad input vs. internal fault) to the status a client should see. An errno of ENOMEM
// (an OsError's: a failed mmap, a device or pinned-host allocation) and a std::bad_alloc are 503
// insufficient_memory (the request may be retried); storage faults (storage_fault_of) are 507 (full) or a 500 that
// says so; other I/O errors a 500 with their own message (not "internal error": they are the host's, not a bug).
ApiError api_error_from(const std::exception& e);

// What the operating system said about the server's storage, from an OsError's errno (common/os_error.h: the
// job store gives SQLite's codes as errnos) or a std::system_error's code. The message is never read.
enum class StorageFault {
  None,      // not a storage fault (or not known to be one: an error without an errno)
  Full,      // ENOSPC, EDQUOT, EFBIG (a file-size limit); SQLITE_FULL
  ReadOnly,  // EROFS; SQLITE_READONLY
  Denied,    // EACCES, EPERM; SQLITE_PERM
};
StorageFault storage_fault_of(const std::exception& e);

// OpenAI's error type names by status (invalid_request_error, authentication_error, …).
std::string openai_error_type(int status);
std::string anthropic_error_type(int status);

nlohmann::ordered_json openai_error_body(const ApiError& e);
nlohmann::ordered_json anthropic_error_body(const ApiError& e);

}  // namespace lathe::server
