// POST /v1/messages: Anthropic's Messages API over the shared generation flow, with its content blocks,
// stop reasons and streaming event sequence.
#include <httplib.h>

#include "server/anthropic_request.h"
#include "server/connection.h"
#include "server/generation_flow.h"
#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/sse.h"

namespace lathe::server {
namespace {

using json = nlohmann::json;

std::string stop_reason(const GenerationOutcome& o, const std::string& stop_sequence) {
  if (o.finish_reason == "tool_calls") return "tool_use";
  if (o.finish_reason == "length") return "max_tokens";
  return stop_sequence.empty() ? "end_turn" : "stop_sequence";
}

json tool_input(const ToolCall& c) {
  try {
    return json::parse(c.arguments);
  } catch (const json::parse_error&) {
    return {{"_raw", c.arguments}};
  }
}

json usage(const GenerationOutcome& o) {
  json u = {{"input_tokens", o.prompt_tokens}, {"output_tokens", o.completion_tokens}};
  if (o.cached_tokens > 0) u["cache_read_input_tokens"] = o.cached_tokens;
  return u;
}

// Tracks the open content block while streaming, so reasoning and text each get their own block.
class BlockStream {
 public:
  std::vector<std::string> delta(const OutputDelta& d) {
    std::vector<std::string> f;
    if (!d.reasoning.empty()) {
      open(f, "thinking");
      f.push_back(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", index_},
                                                {"delta", {{"type", "thinking_delta"}, {"thinking", d.reasoning}}}}));
    }
    if (!d.content.empty()) {
      open(f, "text");
      f.push_back(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", index_},
                                                {"delta", {{"type", "text_delta"}, {"text", d.content}}}}));
    }
    return f;
  }
  std::vector<std::string> finish(const GenerationOutcome& o, const std::string& stop_sequence) {
    std::vector<std::string> f;
    if (!had_text_ && o.output.tool_calls.empty()) open(f, "text");  // an empty reply is one empty text block
    close(f);
    for (const ToolCall& c : o.output.tool_calls) {
      ++index_;
      f.push_back(event(
          "content_block_start",
          {{"type", "content_block_start"},
           {"index", index_},
           {"content_block", {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}}}}));
      f.push_back(
          event("content_block_delta", {{"type", "content_block_delta"},
                                        {"index", index_},
                                        {"delta", {{"type", "input_json_delta"}, {"partial_json", c.arguments}}}}));
      f.push_back(event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}}));
    }
    f.push_back(
        event("message_delta", {{"type", "message_delta"},
                                {"delta",
                                 {{"stop_reason", stop_reason(o, stop_sequence)},
                                  {"stop_sequence", stop_sequence.empty() ? json(nullptr) : json(stop_sequence)}}},
                                {"usage", usage(o)}}));
    f.push_back(event("message_stop", {{"type", "message_stop"}}));
    return f;
  }

 private:
  static std::string event(const std::string& name, const json& data) { return sse_frame(data, name); }
  void open(std::vector<std::string>& f, const std::string& type) {
    if (open_ == type) return;
    close(f);
    index_ = started_ ? index_ + 1 : 0;
    started_ = true;
    open_ = type;
    if (type == "text") had_text_ = true;
    json block =
        type == "thinking" ? json{{"type", "thinking"}, {"thinking", ""}} : json{{"type", "text"}, {"text", ""}};
    f.push_back(
        event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", block}}));
  }
  void close(std::vector<std::string>& f) {
    if (open_.empty()) return;
    if (open_ == "thinking")
      f.push_back(event("content_block_delta", {{"type", "content_block_delta"},
                                                {"index", index_},
                                                {"delta", {{"type", "signature_delta"}, {"signature", ""}}}}));
    f.push_back(event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_}}));
    open_.clear();
  }
  std::string open_;
  int index_ = 0;
  bool started_ = false, had_text_ = false;
};

void messages(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  const ChatRequest request = parse_anthropic_messages(body, ctx.options().defaults);
  auto prepared = std::make_shared<PreparedGeneration>(prepare_chat(ctx, request));
  const std::string id = "msg_" + random_hex(24);
  auto job = submit(ctx, *prepared, ctx.next_request_id());
  const std::string model = ctx.model_id();

  if (prepared->settings.stream) {
    set_sse_headers(res);
    const std::string addr = req.remote_addr;
    const int port = req.remote_port;
    res.set_chunked_content_provider(
        "text/event-stream",
        [&ctx, job, prepared, id, model, addr, port](size_t, httplib::DataSink& sink) {
          ConnectionWatch watch(addr, port);
          BlockStream blocks;
          json start = {{"type", "message_start"},
                        {"message",
                         {{"id", id},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"content", json::array()},
                          {"model", model},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", {{"input_tokens", prepared->prompt.size()}, {"output_tokens", 0}}}}}};
          bool alive = sse_send(sink, sse_frame(start, "message_start"));
          if (!alive) job->cancel();
          try {
            const GenerationOutcome o = drive(
                ctx, *job, *prepared,
                [&](const OutputDelta& d) {
                  for (const std::string& f : blocks.delta(d))
                    if (alive) alive = sse_send(sink, f);
                  return alive;
                },
                [&] { return watch.closed(); });
            if (o.finish_reason == "cancelled" || !alive) return false;
            for (const std::string& f : blocks.finish(o, job->result().stop_sequence))
              if (!sse_send(sink, f)) return false;
          } catch (const std::exception& e) {
            const ApiError err = api_error_from(e);
            sse_send(sink, sse_frame(anthropic_error_body(err), "error"));
            return false;
          }
          sink.done();
          return true;
        },
        [job](bool) { job->cancel(); });
    return;
  }

  ConnectionWatch watch(req.remote_addr, req.remote_port);
  const GenerationOutcome o = drive(
      ctx, *job, *prepared, [](const OutputDelta&) { return true; }, [&] { return watch.closed(); });
  json content = json::array();
  if (!o.output.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", o.output.reasoning}, {"signature", ""}});
  if (!o.output.content.empty() || o.output.tool_calls.empty())
    content.push_back({{"type", "text"}, {"text", o.output.content}});
  for (const ToolCall& c : o.output.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c)}});
  const std::string stop_seq = job->result().stop_sequence;
  write_json(res, {{"id", id},
                   {"type", "message"},
                   {"role", "assistant"},
                   {"content", content},
                   {"model", model},
                   {"stop_reason", stop_reason(o, stop_seq)},
                   {"stop_sequence", stop_seq.empty() ? json(nullptr) : json(stop_seq)},
                   {"usage", usage(o)}});
}

}  // namespace

std::vector<Route> anthropic_routes(ServerContext& ctx) {
  return {{"POST", "/v1/messages", [&ctx](const httplib::Request& q, httplib::Response& r) { messages(ctx, q, r); }}};
}

}  // namespace lathe::server
