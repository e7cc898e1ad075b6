#include "server/streaming.h"

#include <httplib.h>

#include "server/connection.h"
#include "server/http_server.h"
#include "server/sse.h"

namespace lathe::server {
namespace {

ApiError shutdown_error(const GenerationOutcome& o) {
  return ApiError(
      503, "the server is shutting down: generation stopped after " + std::to_string(o.completion_tokens) + " tokens",
      std::string(), "shutting_down");
}

}  // namespace

Generation start_generation(ServerContext& ctx, PreparedGeneration prepared, const std::string& id_prefix) {
  Generation g;
  g.prepared = std::make_shared<PreparedGeneration>(std::move(prepared));
  g.id = id_prefix + random_hex(24);
  g.created = unix_now();
  g.job = submit(ctx, *g.prepared, current_request_id());
  return g;
}

void stream_generation(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, Generation g,
                       std::shared_ptr<StreamFramer> framer) {
  set_sse_headers(res);
  const std::string addr = req.remote_addr;
  const int port = req.remote_port;
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, g, framer, addr, port](size_t, httplib::DataSink& sink) {
        ConnectionWatch watch(addr, port);
        bool alive = true;
        for (const std::string& f : framer->opening(g))
          if (alive) alive = sse_send(sink, f);
        if (!alive) g.job->cancel();
        try {
          const GenerationOutcome o = drive(
              ctx, *g.job, *g.prepared,
              [&](const OutputDelta& d) {
                for (const std::string& f : framer->delta(g, d))
                  if (alive) alive = sse_send(sink, f);
                return alive;
              },
              [&] { return watch.closed(); });
          if (g.job->shut_down() && alive) {
            // The client is still reading: it gets an error event that says why, then a clean end of stream.
            sse_send(sink, framer->error(shutdown_error(o)));
            sink.done();
            return true;
          }
          if (o.finish_reason == "cancelled" || !alive) return false;
          for (const std::string& f : framer->finish(g, o))
            if (!sse_send(sink, f)) return false;
          if (const std::string t = framer->trailer(); !t.empty()) sse_send(sink, t);
        } catch (const std::exception& e) {
          sse_send(sink, framer->error(api_error_from(e)));
          return false;
        }
        sink.done();
        return true;
      },
      [job = g.job](bool) { job->cancel(); });  // released early: the client is gone
}

GenerationOutcome run_blocking(ServerContext& ctx, const httplib::Request& req, Generation& g) {
  ConnectionWatch watch(req.remote_addr, req.remote_port);
  GenerationOutcome o = drive(
      ctx, *g.job, *g.prepared, [](const OutputDelta&) { return true; }, [&] { return watch.closed(); });
  if (g.job->shut_down()) throw shutdown_error(o);
  return o;
}

}  // namespace lathe::server
