// POST /v1/chat/completions and POST /v1/completions: OpenAI's shapes (mlx_lm.server's logprobs shape), stream
// and non-stream.
#include <httplib.h>

#include "server/connection.h"
#include "server/generation_flow.h"
#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/sse.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

json usage_json(const GenerationOutcome& o) {
  return {{"prompt_tokens", o.prompt_tokens},
          {"completion_tokens", o.completion_tokens},
          {"total_tokens", o.prompt_tokens + o.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

json tool_calls_json(const std::vector<ToolCall>& calls, bool with_index) {
  json out = json::array();
  for (size_t i = 0; i < calls.size(); ++i) {
    json c = {{"id", calls[i].id},
              {"type", "function"},
              {"function", {{"name", calls[i].name}, {"arguments", calls[i].arguments}}}};
    if (with_index) c["index"] = i;
    out.push_back(std::move(c));
  }
  return out;
}

// Common state of one streamed or non-streamed generation request.
struct Generation {
  std::shared_ptr<GenerationJob> job;
  std::shared_ptr<PreparedGeneration> prepared;
  std::string id;
  int64_t created;
};

Generation start(ServerContext& ctx, PreparedGeneration prepared, const std::string& id_prefix) {
  Generation g;
  g.prepared = std::make_shared<PreparedGeneration>(std::move(prepared));
  g.id = id_prefix + random_hex(24);
  g.created = unix_now();
  g.job = submit(ctx, *g.prepared, current_request_id());
  return g;
}

// Runs a generation inside a chunked response: frames from `on_delta`, then `finish` frames, then [DONE].
template <typename DeltaFrames, typename FinalFrames>
void stream(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, Generation g,
            DeltaFrames delta_frames, FinalFrames final_frames, std::string first_frame) {
  set_sse_headers(res);
  const std::string addr = req.remote_addr;
  const int port = req.remote_port;
  res.set_chunked_content_provider(
      "text/event-stream",
      [&ctx, g, addr, port, delta_frames, final_frames, first_frame](size_t, httplib::DataSink& sink) {
        ConnectionWatch watch(addr, port);
        bool alive = first_frame.empty() || sse_send(sink, first_frame);
        if (!alive) g.job->cancel();
        try {
          const GenerationOutcome o = drive(
              ctx, *g.job, *g.prepared,
              [&](const OutputDelta& d) {
                for (const std::string& f : delta_frames(g, d))
                  if (alive) alive = sse_send(sink, f);
                return alive;
              },
              [&] { return watch.closed(); });
          if (o.finish_reason == "cancelled" || !alive) return false;
          for (const std::string& f : final_frames(g, o))
            if (!sse_send(sink, f)) return false;
          sse_send(sink, "data: [DONE]\n\n");
        } catch (const std::exception& e) {
          const ApiError err = api_error_from(e);
          sse_send(sink, sse_frame(openai_error_body(err)));
          return false;
        }
        sink.done();
        return true;
      },
      [job = g.job](bool) { job->cancel(); });  // released early: the client is gone
}

GenerationOutcome run_blocking(ServerContext& ctx, const httplib::Request& req, Generation& g) {
  ConnectionWatch watch(req.remote_addr, req.remote_port);
  return drive(
      ctx, *g.job, *g.prepared, [](const OutputDelta&) { return true; }, [&] { return watch.closed(); });
}

json chunk(const Generation& g, const std::string& model, json delta, json finish_reason = nullptr) {
  return {{"id", g.id},
          {"object", "chat.completion.chunk"},
          {"created", g.created},
          {"model", model},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}}})}};
}

void chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  const ChatRequest request = parse_openai_chat(body, ctx.options().defaults);
  Generation g = start(ctx, prepare_chat(ctx, request), "chatcmpl-");
  const std::string model = ctx.model_id();
  if (g.prepared->settings.stream) {
    auto deltas = [model](const Generation& gen, const OutputDelta& d) {
      std::vector<std::string> frames;
      if (!d.reasoning.empty()) frames.push_back(sse_frame(chunk(gen, model, {{"reasoning", d.reasoning}})));
      if (!d.content.empty()) frames.push_back(sse_frame(chunk(gen, model, {{"content", d.content}})));
      return frames;
    };
    auto finals = [model](const Generation& gen, const GenerationOutcome& o) {
      std::vector<std::string> frames;
      if (!o.output.tool_calls.empty())
        frames.push_back(sse_frame(chunk(gen, model, {{"tool_calls", tool_calls_json(o.output.tool_calls, true)}})));
      json last = chunk(gen, model, json::object(), o.finish_reason);
      last["usage"] = usage_json(o);
      frames.push_back(sse_frame(last));
      return frames;
    };
    stream(ctx, req, res, g, deltas, finals, sse_frame(chunk(g, model, {{"role", "assistant"}, {"content", ""}})));
    return;
  }
  const GenerationOutcome o = run_blocking(ctx, req, g);
  json message = {{"role", "assistant"}};
  const bool calls = !o.output.tool_calls.empty();
  message["content"] = calls && o.output.content.empty() ? json(nullptr) : json(o.output.content);
  if (!o.output.reasoning.empty()) message["reasoning"] = o.output.reasoning;
  if (calls) message["tool_calls"] = tool_calls_json(o.output.tool_calls, false);
  json choice = {{"index", 0}, {"message", message}, {"finish_reason", o.finish_reason}};
  if (!o.logprobs.is_null()) choice["logprobs"] = o.logprobs;
  write_json(res, {{"id", g.id},
                   {"object", "chat.completion"},
                   {"created", g.created},
                   {"model", model},
                   {"choices", json::array({choice})},
                   {"usage", usage_json(o)}});
}

void completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  GenerationSettings settings = parse_generation_settings(body, ctx.options().defaults, ApiSurface::OpenAI);
  auto p = body.find("prompt");
  if (p == body.end()) throw invalid_field("prompt", "prompt is required");
  Generation g = start(ctx, prepare_completion(ctx, *p, std::move(settings)), "cmpl-");
  const std::string model = ctx.model_id();
  auto text_chunk = [model](const Generation& gen, const std::string& text, json finish) {
    return json{
        {"id", gen.id},
        {"object", "text_completion"},
        {"created", gen.created},
        {"model", model},
        {"choices",
         json::array({{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}}})}};
  };
  if (g.prepared->settings.stream) {
    auto deltas = [text_chunk](const Generation& gen, const OutputDelta& d) {
      return std::vector<std::string>{sse_frame(text_chunk(gen, d.content, nullptr))};
    };
    auto finals = [text_chunk](const Generation& gen, const GenerationOutcome& o) {
      json last = text_chunk(gen, "", o.finish_reason);
      last["usage"] = usage_json(o);
      return std::vector<std::string>{sse_frame(last)};
    };
    stream(ctx, req, res, g, deltas, finals, "");
    return;
  }
  const GenerationOutcome o = run_blocking(ctx, req, g);
  json choice = {{"index", 0}, {"text", o.output.content}, {"finish_reason", o.finish_reason}};
  if (!o.logprobs.is_null()) choice["logprobs"] = o.logprobs;
  write_json(res, {{"id", g.id},
                   {"object", "text_completion"},
                   {"created", g.created},
                   {"model", model},
                   {"choices", json::array({choice})},
                   {"usage", usage_json(o)}});
}

}  // namespace

std::vector<Route> openai_routes(ServerContext& ctx) {
  return {
      {"POST", "/v1/chat/completions",
       [&ctx](const httplib::Request& q, httplib::Response& r) { chat_completions(ctx, q, r); }},
      {"POST", "/v1/completions", [&ctx](const httplib::Request& q, httplib::Response& r) { completions(ctx, q, r); }},
  };
}

}  // namespace lathe::server
