#include "server/json_fields.h"

#include <cmath>

#include "io/json_guard.h"
#include "server/api_error.h"

namespace lathe::server {
namespace {

std::string format_number(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

}  // namespace

JsonFields::JsonFields(const nlohmann::ordered_json& object, std::string prefix)
    : j_(object), prefix_(std::move(prefix)) {}

const nlohmann::ordered_json* JsonFields::get(const char* name) const {
  auto it = j_.find(name);
  if (it == j_.end() || it->is_null()) return nullptr;
  return &*it;
}

bool JsonFields::has(const char* name) const { return get(name) != nullptr; }

std::optional<double> JsonFields::number(const char* name, double min, double max) const {
  const nlohmann::ordered_json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_number()) throw invalid_field(field(name), field(name) + " must be a number");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < min || x > max)
    throw invalid_field(field(name), field(name) + " must be between " + format_number(min) + " and " +
                                         format_number(max) + ", got " + v->dump());
  return x;
}

std::optional<int64_t> JsonFields::integer(const char* name, int64_t min, int64_t max) const {
  const nlohmann::ordered_json* v = get(name);
  if (!v) return std::nullopt;
  // 3.0 is accepted as 3: JSON has one number type and some clients write integers as floats.
  bool integral = v->is_number_integer();
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // A whole number past what a double holds exactly (2^70) is an integer out of range, not a fraction.
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) >= 9.0e15)
      throw invalid_field(field(name), field(name) + " must be an integer in [" + std::to_string(min) + ", " +
                                           std::to_string(max) + "]");
    integral = std::isfinite(d) && d == std::floor(d);
  }
  if (!integral) throw invalid_field(field(name), field(name) + " must be an integer");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : (v->is_number_float() ? static_cast<int64_t>(v->get<double>()) : v->get<int64_t>());
  if (x < min) throw invalid_field(field(name), field(name) + " must be at least " + std::to_string(min));
  if (x > max) throw invalid_field(field(name), field(name) + " must be at most " + std::to_string(max));
  return x;
}

std::optional<bool> JsonFields::boolean(const char* name) const {
  const nlohmann::ordered_json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) throw invalid_field(field(name), field(name) + " must be of type bool");
  return v->get<bool>();
}

std::optional<std::string> JsonFields::string(const char* name) const {
  const nlohmann::ordered_json* v = get(name);
  if (!v) return std::nullopt;
  if (!v->is_string()) throw invalid_field(field(name), field(name) + " must be a string");
  return v->get<std::string>();
}

const nlohmann::ordered_json* JsonFields::object(const char* name) const {
  const nlohmann::ordered_json* v = get(name);
  if (v && !v->is_object()) throw invalid_field(field(name), field(name) + " must be an object");
  return v;
}

const nlohmann::ordered_json* JsonFields::array(const char* name) const {
  const nlohmann::ordered_json* v = get(name);
  if (v && !v->is_array()) throw invalid_field(field(name), field(name) + " must be an array");
  return v;
}

std::string string_member(const nlohmann::ordered_json& obj, const char* key, const std::string& fallback,
                          const std::string& field) {
  if (!obj.is_object()) return fallback;
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) throw invalid_field(field, field + " must be a string");
  return it->get<std::string>();
}

nlohmann::ordered_json parse_json_body(const std::string& body) {
  // The limits pass first: a DOM parse of hostile nesting or key counts would exhaust the stack or the CPU.
  if (auto err = io::check_json(body, io::request_json_limits()))
    throw ApiError(400, "request body is not valid JSON: " + *err);
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(body);
  } catch (const nlohmann::ordered_json::exception& e) {
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; clients only need the rest.
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    throw ApiError(400, "request body is not valid JSON: " + what);
  }
  if (!j.is_object()) throw ApiError(400, "request body must be a JSON object");
  return j;
}

}  // namespace lathe::server
