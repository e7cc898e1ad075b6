#include "server/api_error.h"

#include "common/error.h"

namespace lathe::server {

ApiError api_error_from(const std::exception& e) {
  if (const auto* api = dynamic_cast<const ApiError*>(&e)) return *api;
  if (const auto* err = dynamic_cast<const Error*>(&e)) {
    switch (err->kind()) {
      case ErrorKind::InvalidArgument:
      case ErrorKind::Unsupported: return ApiError(400, err->what());
      case ErrorKind::NotFound: return ApiError(404, err->what());
      default: break;
    }
  }
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
