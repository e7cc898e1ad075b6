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
  stream_choices(ctx, req, res, {std::move(g)}, {std::move(framer)}, nullptr);
}

void stream_choices(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, std::vector<Generation> gs,
                    std::vector<std::shared_ptr<StreamFramer>> framers, ClosingFrames closing) {
  set_sse_headers(res);
  const std::string addr = req.remote_addr;
  const int port = req.remote_port;
  auto cancel_all = [gs] {
    for (const Generation& g : gs) g.job->cancel();
  };
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, gs, framers, closing, cancel_all, addr, port](size_t, httplib::DataSink& sink) {
        ConnectionWatch watch(addr, port);
        bool alive = true;
        std::vector<GenerationOutcome> outcomes;
        for (size_t i = 0; i < gs.size(); ++i) {
          const Generation& g = gs[i];
          StreamFramer& framer = *framers[i];
          for (const std::string& f : framer.opening(g))
            if (alive) alive = sse_send(sink, f);
          if (!alive) {
            cancel_all();
            return false;
          }
          try {
            // A wake of the HTTP thread often brings several tokens (the engine wakes it at most every
            // GenerationJob::kCoalesce): their events go out in one write, a syscall and a TCP segment for all.
            std::string pending;
            const GenerationOutcome o = drive(
                ctx, *g.job, *g.prepared,
                [&](const OutputDelta& d) {
                  for (const std::string& f : framer.delta(g, d)) pending += f;
                  return alive;
                },
                [&] { return watch.closed(); },
                [&] {
                  if (alive && !pending.empty()) alive = sse_send(sink, pending);
                  pending.clear();
                  return alive;
                });
            if (g.job->shut_down() && alive) {
              // The client is still reading: it gets an error event that says why, then a clean end of stream.
              sse_send(sink, framer.error(shutdown_error(o)));
              cancel_all();
              sink.done();
              return true;
            }
            if (o.finish_reason == "cancelled" || !alive) {
              cancel_all();
              return false;
            }
            for (const std::string& f : framer.finish(g, o))
              if (!sse_send(sink, f)) {
                cancel_all();
                return false;
              }
            outcomes.push_back(o);
          } catch (const std::exception& e) {
            sse_send(sink, framer.error(api_error_from(e)));
            cancel_all();
            return false;
          }
        }
        if (closing)
          for (const std::string& f : closing(outcomes))
            if (!sse_send(sink, f)) return false;
        if (const std::string t = framers.front()->trailer(); !t.empty()) sse_send(sink, t);
        sink.done();
        return true;
      },
      [cancel_all](bool) { cancel_all(); });  // released early: the client is gone
}

GenerationOutcome run_blocking(ServerContext& ctx, const httplib::Request& req, Generation& g) {
  ConnectionWatch watch(req.remote_addr, req.remote_port);
  GenerationOutcome o = drive(
      ctx, *g.job, *g.prepared, [](const OutputDelta&) { return true; }, [&] { return watch.closed(); });
  if (g.job->shut_down()) throw shutdown_error(o);
  return o;
}

}  // namespace lathe::server
