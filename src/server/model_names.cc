#include "server/model_names.h"

#include <algorithm>

#include "server/api_error.h"

namespace lathe::server {

void check_model_name(const ServerContext& ctx, const nlohmann::ordered_json& body) {
  auto it = body.find("model");
  if (it == body.end() || it->is_null()) return;
  if (!it->is_string()) throw invalid_field("model", "model must be a string");
  const ServeOptions& o = ctx.options();
  if (o.accept_any_model) return;
  const std::string name = it->get<std::string>();
  if (name == o.model_id || std::find(o.model_names.begin(), o.model_names.end(), name) != o.model_names.end()) return;
  // [lora] "model": "<adapter id>" (or "a+b", "a,b") selects mounted adapters, as vLLM does.
  bool all_mounted = !name.empty();
  for (size_t start = 0; all_mounted && start <= name.size();) {
    const size_t end = std::min(name.find_first_of("+,", start), name.size());
    all_mounted = ctx.adapters().mounted(name.substr(start, end - start));
    start = end + 1;
  }
  if (all_mounted) return;
  std::string served;
  for (const std::string& n : o.model_names.empty() ? std::vector<std::string>{o.model_id} : o.model_names)
    served += (served.empty() ? "" : ", ") + n;
  throw ApiError(404,
                 "the model '" + name + "' does not exist here; this server serves: " + served +
                     " (start it with --alias NAME or --accept-any-model to take other names)",
                 "model", "model_not_found");
}

}  // namespace lathe::server
