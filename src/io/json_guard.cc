#include "io/json_guard.h"

#include <vector>

#include "common/limits.h"

namespace lathe::io {
namespace {

// The SAX interface nlohmann calls for each token; returning false stops the parse at once.
class LimitCounter {
 public:
  explicit LimitCounter(const JsonLimits& limits) : limits_(limits) {}

  bool null() { return value(); }
  bool boolean(bool) { return value(); }
  bool number_integer(nlohmann::json::number_integer_t) { return value(); }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return value(); }
  bool number_float(nlohmann::json::number_float_t, const std::string&) { return value(); }
  bool string(std::string&) { return value(); }
  bool binary(nlohmann::json::binary_t&) { return value(); }
  bool start_object(size_t) { return open(); }
  bool key(std::string&) {
    if (++keys_.back() > limits_.max_object_keys)
      return fail("an object has more than " + std::to_string(limits_.max_object_keys) + " keys");
    return true;
  }
  bool end_object() { return close(); }
  bool start_array(size_t) { return open(); }
  bool end_array() { return close(); }
  bool parse_error(size_t position, const std::string&, const nlohmann::json::exception& e) {
    std::string what = e.what();
    // nlohmann prefixes "[json.exception.parse_error.101] "; the rest is what a reader needs.
    if (auto p = what.find("] "); p != std::string::npos) what = what.substr(p + 2);
    if (e.id == 406) what = "a number is out of range (" + what + ") at byte " + std::to_string(position);
    error_ = what;
    return false;
  }

  const std::optional<std::string>& error() const { return error_; }
  bool limit_hit() const { return limit_hit_; }

 private:
  bool value() {
    if (++values_ > limits_.max_values)
      return fail("more than " + std::to_string(limits_.max_values) + " values in one document");
    return true;
  }
  bool open() {
    if (!value()) return false;
    if (keys_.size() >= limits_.max_depth)
      return fail("nested deeper than " + std::to_string(limits_.max_depth) + " levels");
    keys_.push_back(0);
    return true;
  }
  bool close() {
    keys_.pop_back();
    return true;
  }
  bool fail(std::string message) {
    error_ = std::move(message);
    limit_hit_ = true;
    return false;
  }

  JsonLimits limits_;
  std::vector<size_t> keys_;  // keys seen per open container (arrays count none)
  size_t values_ = 0;
  std::optional<std::string> error_;
  bool limit_hit_ = false;
};

template <typename J>
J parse_checked(std::string_view text, const JsonLimits& limits, ErrorKind kind, const std::string& what) {
  if (auto err = check_json(text, limits)) throw Error(kind, what + ": " + *err);
  try {
    return J::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(kind, what + ": " + e.what());
  }
}

}  // namespace

JsonLimits request_json_limits() {
  return {static_cast<size_t>(limits::kJsonMaxDepth), limits::kJsonMaxObjectKeys, limits::kJsonRequestMaxValues};
}

JsonLimits file_json_limits() {
  return {limits::kJsonFileMaxDepth, limits::kJsonFileMaxObjectKeys, limits::kJsonFileMaxValues};
}

std::optional<std::string> check_json(std::string_view text, const JsonLimits& limits) {
  LimitCounter counter(limits);
  const bool ok = nlohmann::json::sax_parse(text, &counter, nlohmann::json::input_format_t::json, true);
  if (counter.error()) return counter.error();
  if (!ok) return std::string("not valid JSON");
  return std::nullopt;
}

std::optional<std::string> check_json_limits(std::string_view text, const JsonLimits& limits) {
  LimitCounter counter(limits);
  nlohmann::json::sax_parse(text, &counter, nlohmann::json::input_format_t::json, true);
  if (counter.limit_hit()) return counter.error();
  return std::nullopt;
}

nlohmann::json parse_json_checked(std::string_view text, const JsonLimits& limits, ErrorKind kind,
                                  const std::string& what) {
  return parse_checked<nlohmann::json>(text, limits, kind, what);
}

nlohmann::ordered_json parse_ordered_json_checked(std::string_view text, const JsonLimits& limits, ErrorKind kind,
                                                  const std::string& what) {
  return parse_checked<nlohmann::ordered_json>(text, limits, kind, what);
}

}  // namespace lathe::io
