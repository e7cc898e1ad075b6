#include "server/api_error.h"

#include <cerrno>
#include <new>
#include <system_error>

#include "common/error.h"
#include "common/os_error.h"

namespace lathe::server {
namespace {

StorageFault fault_of_errno(int e) {
  switch (e) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG: return StorageFault::Full;
    case EROFS: return StorageFault::ReadOnly;
    case EACCES:
    case EPERM: return StorageFault::Denied;
    default: return StorageFault::None;
  }
}

// The errno an error carries (an OsError's, a std::system_error's of the generic or system category), 0 if none.
int errno_carried_by(const std::exception& e) {
  if (const auto* os = dynamic_cast<const OsError*>(&e)) return os->os_errno();
  if (const auto* sys = dynamic_cast<const std::system_error*>(&e)) {  // std::filesystem_error among them
    const auto& cat = sys->code().category();
    if (cat == std::generic_category() || cat == std::system_category()) return sys->code().value();
  }
  return 0;
}

}  // namespace

// Only the code is read, never the message: an error that carries no errno is not known to be a storage fault.
StorageFault storage_fault_of(const std::exception& e) { return fault_of_errno(errno_carried_by(e)); }

ApiError api_error_from(const std::exception& e) {
  if (const auto* api = dynamic_cast<const ApiError*>(&e)) return *api;
  // The host ran out of memory (ENOMEM; a std::bad_alloc from operator new): a condition of the moment, not a
  // fault of the request or a bug.
  if (errno_carried_by(e) == ENOMEM || dynamic_cast<const std::bad_alloc*>(&e))
    return ApiError(503, std::string("the server is out of memory; the request may be retried: ") + e.what(), {},
                    "insufficient_memory");
  // The message is kept as it is (it names what could not be written, as it always did): the status and the
  // lead say what kind of fault it is.
  switch (storage_fault_of(e)) {
    case StorageFault::Full:
      return ApiError(
          507,
          std::string("insufficient storage (the disk or quota that holds the server's files is full): ") + e.what(),
          {}, "insufficient_storage");
    case StorageFault::ReadOnly:
      return ApiError(500, std::string("the server's storage is read-only: ") + e.what(), {}, "storage_read_only");
    case StorageFault::Denied:
      return ApiError(500, std::string("the server may not access its storage (permission denied): ") + e.what(), {},
                      "storage_permission_denied");
    case StorageFault::None: break;
  }
  if (const auto* err = dynamic_cast<const Error*>(&e)) {
    switch (err->kind()) {
      case ErrorKind::InvalidArgument:
      case ErrorKind::Unsupported: return ApiError(400, err->what());
      case ErrorKind::NotFound: return ApiError(404, err->what());
      // The host refused something (a read, a write, memory): its words, not "internal error".
      case ErrorKind::Io: return ApiError(500, std::string("I/O error: ") + err->what(), {}, "io_error");
      default: break;
    }
  }
  if (const auto* sys = dynamic_cast<const std::system_error*>(&e))
    return ApiError(500, std::string("I/O error: ") + sys->what(), {}, "io_error");
  // A JSON type error escaping request translation is a malformed request, not a fault of ours.
  if (dynamic_cast<const nlohmann::ordered_json::type_error*>(&e))
    return ApiError(400, std::string("a request field has the wrong type: ") + e.what());
  return ApiError(500, std::string("internal error: ") + e.what());
}

std::string openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 429: return "rate_limit_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 529: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::ordered_json openai_error_body(const ApiError& e) {
  nlohmann::ordered_json err = {
      {"message", e.what()}, {"type", openai_error_type(e.status())}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param().empty()) err["param"] = e.param();
  if (!e.code().empty()) err["code"] = e.code();
  return {{"error", err}};
}

nlohmann::ordered_json anthropic_error_body(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status())}, {"message", e.what()}}}};
}

}  // namespace lathe::server
