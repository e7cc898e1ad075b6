// LoRA adapters over HTTP ([lora]): GET/POST /v1/adapters, DELETE /v1/adapters/{id}, GET /v1/adapters/available
// (a scan of the --adapter-dir stores), vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter, and the
// request-side selection (`adapter`, or `model` naming mounted adapters). Mounts read only inside the stores or
// the directories given with --adapter: a path is resolved (symlinks included) before it is checked.
#include <httplib.h>
#include <limits.h>
#include <stdlib.h>

#include <filesystem>

#include "common/error.h"
#include "common/limits.h"
#include "engine/kv_budget.h"
#include "io/path_within.h"
#include "lora/adapter_file.h"
#include "server/http_server.h"
#include "server/json_fields.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;
namespace fs = std::filesystem;

constexpr size_t kMaxScanEntries = 20000;  // directory entries one /available scan visits
constexpr int kMaxScanDepth = 6;

std::string string_field(const json& j, const char* name, bool required) {
  if (!j.contains(name) || j[name].is_null()) {
    if (required) throw ApiError(400, std::string(name) + ": field required", name);
    return "";
  }
  if (!j[name].is_string()) throw ApiError(400, std::string(name) + " must be a string", name);
  return j[name].get<std::string>();
}

std::string real_path(const std::string& p) {
  char buf[PATH_MAX];
  if (!::realpath(p.c_str(), buf)) return "";
  return buf;
}

// The directory a mount request may read: `path` relative to a store (or absolute inside one), or one of the
// --adapter directories. No ".." components, whatever they would resolve to.
std::string confined_dir(ServerContext& ctx, const std::string& path) {
  if (path.empty() || path.size() > 4096) throw ApiError(400, "path must be 1..4096 characters", "path");
  for (const auto& part : fs::path(path))
    if (part == "..") throw ApiError(400, "path '" + path + "' must not contain '..'", "path");
  std::vector<std::string> candidates;
  if (fs::path(path).is_absolute())
    candidates.push_back(path);
  else
    for (const auto& store : ctx.options().adapter_stores) candidates.push_back(store + "/" + path);
  for (const auto& c : candidates) {
    const std::string rp = real_path(c);
    if (rp.empty()) {
      // An absolute path outside the stores gets the same answer whether or not it exists.
      bool in_store = !fs::path(path).is_absolute();
      for (const auto& store : ctx.options().adapter_stores)
        in_store = in_store || io::path_within(c, real_path(store));
      if (!in_store)
        throw ApiError(403, "path '" + path + "' is outside the adapter stores (serve --adapter-dir)", "path");
      continue;
    }
    for (const auto& store : ctx.options().adapter_stores)
      if (io::path_within(rp, real_path(store))) return rp;
    for (const auto& given : ctx.options().adapter_paths)
      if (rp == real_path(given)) return rp;
    throw ApiError(403, "path '" + path + "' is outside the adapter stores (serve --adapter-dir)", "path");
  }
  if (ctx.options().adapter_stores.empty() && !fs::path(path).is_absolute())
    throw ApiError(400, "no adapter stores are configured (serve --adapter-dir DIR)", "path");
  throw ApiError(404, "no adapter at '" + path + "' in the adapter stores", "path");
}

json info_json(const lora::AdapterInfo& a, const std::string& default_spec) {
  bool is_default = false;
  for (size_t start = 0; start <= default_spec.size();) {
    const size_t end = std::min(default_spec.find('+', start), default_spec.size());
    if (default_spec.substr(start, end - start) == a.id) is_default = true;
    start = end + 1;
  }
  return {{"id", a.id},
          {"object", "adapter"},
          {"path", a.dir},
          {"format", a.format},
          {"rank", a.rank},
          {"scale", a.scale},
          {"base_model", a.base_model},
          {"modules", a.modules},
          {"skipped_modules", a.skipped},
          {"bytes", a.weights_bytes},
          {"device_bytes", a.device_bytes},
          {"content_hash", a.content_hash},
          {"default", is_default}};
}

lora::AdapterInfo mount(ServerContext& ctx, uint64_t budget, const std::string& id_in, const std::string& path) {
  const std::string dir = confined_dir(ctx, path);
  std::string id = id_in;
  if (id.empty()) id = fs::path(dir).filename().string();
  try {
    // 30 mounts of one 50 MB adapter under 30 ids held 1 GB. Two mounts at once may both pass: the overshoot is
    // bounded by the requests in flight.
    uint64_t mounted = 0;
    for (const auto& a : ctx.adapters().list()) mounted += a.weights_bytes;
    const uint64_t bytes = lora::read_adapter_config(dir).weights_bytes;
    if (mounted + bytes > budget)
      throw ApiError(409,
                     "mounting '" + id + "' (" + std::to_string(bytes >> 20) +
                         " MiB) would take the mounted adapters to " + std::to_string((mounted + bytes) >> 20) +
                         " MiB, over their budget of " + std::to_string(budget >> 20) +
                         " MiB (a quarter of the memory available at start); unmount some",
                     "path");
    return ctx.adapters().mount(id, dir);
  } catch (const Error& e) {
    // The client chose these files: damaged ones are a bad request naming the fault, not a server error.
    if (e.kind() == ErrorKind::Corrupt) throw ApiError(400, e.what(), "path");
    throw;
  }
}

// Every folder under the stores with adapter weights, what its config says, and whether it fits this model.
json scan_stores(ServerContext& ctx) {
  json data = json::array();
  size_t visited = 0;
  for (const auto& store : ctx.options().adapter_stores) {
    std::error_code ec;
    fs::recursive_directory_iterator it(store, fs::directory_options::skip_permission_denied, ec), end;
    for (; !ec && it != end && visited < kMaxScanEntries; it.increment(ec), ++visited) {
      if (it.depth() >= kMaxScanDepth) it.disable_recursion_pending();
      if (!it->is_directory(ec) || !fs::exists(it->path() / "adapter_config.json", ec)) continue;
      const std::string dir = it->path().string();
      json e = {{"id", fs::relative(it->path(), store, ec).string()}, {"path", dir}};
      try {
        const lora::AdapterConfig c = lora::read_adapter_config(dir);
        e["format"] = c.format;
        e["rank"] = c.rank;
        e["scale"] = c.scale;
        e["base_model"] = lora::base_model_name(c.base_model);
        e["bytes"] = c.weights_bytes;
        const std::string why = ctx.adapters().misfit(dir);
        e["fits"] = why.empty();
        if (!why.empty()) e["reason"] = why;
      } catch (const std::exception& ex) {
        e["fits"] = false;
        e["reason"] = ex.what();
      }
      bool mounted = false;
      for (const auto& a : ctx.adapters().list()) mounted = mounted || real_path(a.dir) == real_path(dir);
      e["mounted"] = mounted;
      data.push_back(std::move(e));
    }
  }
  return {{"object", "list"}, {"data", data}};
}

}  // namespace

std::shared_ptr<const lora::ForwardContext> select_adapters(ServerContext& ctx, const std::string& adapter,
                                                            const std::string& model) {
  lora::AdapterManager& m = ctx.adapters();
  std::string spec = adapter;
  if (spec.empty() && !model.empty() && model != ctx.model_id()) {
    const bool all_mounted = [&] {  // "model": "<adapter id>" (or "a+b") selects it, as vLLM does
      size_t start = 0;
      while (start <= model.size()) {
        const size_t end = std::min(model.find_first_of("+,", start), model.size());
        if (!m.mounted(model.substr(start, end - start))) return false;
        start = end + 1;
      }
      return true;
    }();
    if (all_mounted) spec = model;
  }
  const lora::Selection sel = m.resolve(spec);
  if (sel.slot < 0) return nullptr;
  return std::make_shared<const lora::ForwardContext>(sel.context());
}

std::vector<Route> adapter_routes(ServerContext& ctx) {
  const uint64_t budget = std::max<uint64_t>(limits::kMountedAdaptersMinBudgetBytes,
                                             static_cast<uint64_t>(std::max<int64_t>(0, default_kv_cache_bytes())) / 2);
  std::vector<Route> r;
  r.push_back({"GET", "/v1/adapters", [&ctx](const httplib::Request&, httplib::Response& res) {
                 const std::string def = ctx.adapters().default_spec();
                 json data = json::array();
                 for (const auto& a : ctx.adapters().list()) data.push_back(info_json(a, def));
                 write_json(res, {{"object", "list"}, {"data", data}, {"default", def}});
               }});
  r.push_back({"POST", "/v1/adapters", [&ctx, budget](const httplib::Request& req, httplib::Response& res) {
                 const json body = parse_json_body(req.body);
                 const lora::AdapterInfo a =
                     mount(ctx, budget, string_field(body, "id", false), string_field(body, "path", true));
                 if (body.contains("default") && body["default"].is_boolean() && body["default"].get<bool>())
                   ctx.adapters().set_default(a.id);
                 write_json(res, info_json(a, ctx.adapters().default_spec()));
               }});
  r.push_back({"GET", "/v1/adapters/available",
               [&ctx](const httplib::Request&, httplib::Response& res) { write_json(res, scan_stores(ctx)); }});
  r.push_back({"DELETE", "/v1/adapters/",
               [&ctx](const httplib::Request& req, httplib::Response& res) {
                 const std::string id = req.path.substr(std::string("/v1/adapters/").size());
                 ctx.adapters().unmount(id);
                 write_json(res, {{"id", id}, {"object", "adapter"}, {"deleted", true}});
               },
               /*prefix=*/true});
  // vLLM's runtime LoRA endpoints (plain-text answers, as vLLM gives).
  r.push_back({"POST", "/v1/load_lora_adapter", [&ctx, budget](const httplib::Request& req, httplib::Response& res) {
                 const json body = parse_json_body(req.body);
                 const std::string name = string_field(body, "lora_name", true);
                 mount(ctx, budget, name, string_field(body, "lora_path", true));
                 res.set_content("Success: LoRA adapter '" + name + "' added successfully.", "text/plain");
               }});
  r.push_back({"POST", "/v1/unload_lora_adapter", [&ctx](const httplib::Request& req, httplib::Response& res) {
                 const json body = parse_json_body(req.body);
                 const std::string name = string_field(body, "lora_name", true);
                 ctx.adapters().unmount(name);
                 res.set_content("Success: LoRA adapter '" + name + "' removed successfully.", "text/plain");
               }});
  return r;
}

}  // namespace lathe::server
