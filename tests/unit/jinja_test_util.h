// Renders a template string with JSON variables, for the Jinja engine's unit tests.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "chat/jinja/template.h"

namespace lathe::jinja::testing {

inline std::string render(const std::string& source,
                          const nlohmann::ordered_json& vars = nlohmann::ordered_json::object()) {
  ValueDict context;
  for (const auto& [k, v] : vars.items()) context.set(k, from_json(v));
  return Template(source).render(context);
}

}  // namespace lathe::jinja::testing
