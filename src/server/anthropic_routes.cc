// POST /v1/messages: Anthropic's Messages API over the shared generation flow, with its content blocks,
// stop reasons and streaming event sequence.
#include <httplib.h>

#include "server/anthropic_request.h"
#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/model_names.h"
#include "server/sse.h"
#include "server/streaming.h"
#include "server/structured_output.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

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

// The Messages event sequence. Tracks the open content block, so reasoning and text each get their own block.
class MessagesFramer : public StreamFramer {
 public:
  explicit MessagesFramer(std::string model) : model_(std::move(model)) {}
  std::vector<std::string> opening(const Generation& g) override {
    const json start = {{"type", "message_start"},
                        {"message",
                         {{"id", g.id},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"content", json::array()},
                          {"model", model_},
                          {"stop_reason", nullptr},
                          {"stop_sequence", nullptr},
                          {"usage", {{"input_tokens", g.prepared->prompt.size()}, {"output_tokens", 0}}}}}};
    return {sse_frame(start, "message_start")};
  }
  std::vector<std::string> delta(const Generation&, const OutputDelta& d) override {
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
  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    const std::string stop_sequence = g.job->result().stop_sequence;
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
  std::string error(const ApiError& e) override { return sse_frame(anthropic_error_body(e), "error"); }

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
  std::string model_;
  std::string open_;
  int index_ = 0;
  bool started_ = false, had_text_ = false;
};

void messages(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  json body = take_json_body(req);
  check_model_name(ctx, body);
  ChatRequest request = take_anthropic_messages(body, ctx.options().defaults);
  PreparedGeneration prepared = prepare_chat(ctx, std::move(request));
  attach_structured_output(ctx, prepared);
  Generation g = start_generation(ctx, std::move(prepared), "msg_");
  const std::string model = ctx.model_id();
  if (g.prepared->settings.stream) return stream_generation(ctx, req, res, g, std::make_shared<MessagesFramer>(model));
  const GenerationOutcome o = run_blocking(ctx, req, g);
  json content = json::array();
  if (!o.output.reasoning.empty())
    content.push_back({{"type", "thinking"}, {"thinking", o.output.reasoning}, {"signature", ""}});
  if (!o.output.content.empty() || o.output.tool_calls.empty())
    content.push_back({{"type", "text"}, {"text", o.output.content}});
  for (const ToolCall& c : o.output.tool_calls)
    content.push_back({{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", tool_input(c)}});
  const std::string stop_seq = g.job->result().stop_sequence;
  write_json(res, {{"id", g.id},
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
