// GET /api/dataset/templates: the dataset job's templates and the fields of their forms (lab/dataset/templates.h),
// behind the same API-key gate as the jobs routes. A dataset is made by POST /api/jobs {kind: "dataset", config}.
#include <httplib.h>

#include "lab/dataset/templates.h"
#include "server/http_server.h"

namespace lathe::server {

std::vector<Route> dataset_routes(ServerContext&) {
  std::vector<Route> r;
  r.push_back({"GET", "/api/dataset/templates", [](const httplib::Request&, httplib::Response& res) {
                 nlohmann::ordered_json body = {{"ok", true}};
                 body.update(dataset::templates_json());
                 write_json(res, body);
               }});
  return r;
}

}  // namespace lathe::server
