// POST /v1/chat/completions and POST /v1/completions: OpenAI's shapes (mlx_lm.server's logprobs shape), stream
// and non-stream.
#include <httplib.h>

#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/openai_request.h"
#include "server/sse.h"
#include "server/streaming.h"

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

json chunk(const Generation& g, const std::string& model, json delta, json finish_reason = nullptr) {
  return {{"id", g.id},
          {"object", "chat.completion.chunk"},
          {"created", g.created},
          {"model", model},
          {"choices", json::array({{{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}}})}};
}

json text_chunk(const Generation& g, const std::string& model, const std::string& text, json finish_reason) {
  return {{"id", g.id},
          {"object", "text_completion"},
          {"created", g.created},
          {"model", model},
          {"choices",
           json::array(
               {{{"index", 0}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}}})}};
}

// The non-stream reply around one choice.
json envelope(const Generation& g, const char* object, const std::string& model, json choice,
              const GenerationOutcome& o) {
  if (!o.logprobs.is_null()) choice["logprobs"] = o.logprobs;
  return {{"id", g.id},
          {"object", object},
          {"created", g.created},
          {"model", model},
          {"choices", json::array({std::move(choice)})},
          {"usage", usage_json(o)}};
}

// Streams of both OpenAI endpoints end with usage in the last chunk, then "data: [DONE]".
class OpenAiFramer : public StreamFramer {
 public:
  std::string error(const ApiError& e) override { return sse_frame(openai_error_body(e)); }
  std::string trailer() override { return "data: [DONE]\n\n"; }
};

// chat.completion.chunk: the role chunk, reasoning/content deltas, one tool_calls chunk, the finish chunk.
class ChatFramer : public OpenAiFramer {
 public:
  explicit ChatFramer(std::string model) : model_(std::move(model)) {}
  std::vector<std::string> opening(const Generation& g) override {
    return {sse_frame(chunk(g, model_, {{"role", "assistant"}, {"content", ""}}))};
  }
  std::vector<std::string> delta(const Generation& g, const OutputDelta& d) override {
    std::vector<std::string> frames;
    if (!d.reasoning.empty()) frames.push_back(sse_frame(chunk(g, model_, {{"reasoning", d.reasoning}})));
    if (!d.content.empty()) frames.push_back(sse_frame(chunk(g, model_, {{"content", d.content}})));
    return frames;
  }
  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    std::vector<std::string> frames;
    if (!o.output.tool_calls.empty())
      frames.push_back(sse_frame(chunk(g, model_, {{"tool_calls", tool_calls_json(o.output.tool_calls, true)}})));
    json last = chunk(g, model_, json::object(), o.finish_reason);
    last["usage"] = usage_json(o);
    frames.push_back(sse_frame(last));
    return frames;
  }

 private:
  std::string model_;
};

// text_completion chunks: one per delta, then the finish chunk.
class CompletionFramer : public OpenAiFramer {
 public:
  explicit CompletionFramer(std::string model) : model_(std::move(model)) {}
  std::vector<std::string> opening(const Generation&) override { return {}; }
  std::vector<std::string> delta(const Generation& g, const OutputDelta& d) override {
    return {sse_frame(text_chunk(g, model_, d.content, nullptr))};
  }
  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    json last = text_chunk(g, model_, "", o.finish_reason);
    last["usage"] = usage_json(o);
    return {sse_frame(last)};
  }

 private:
  std::string model_;
};

void chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  const ChatRequest request = parse_openai_chat(body, ctx.options().defaults);
  Generation g = start_generation(ctx, prepare_chat(ctx, request), "chatcmpl-");
  const std::string model = ctx.model_id();
  if (g.prepared->settings.stream) return stream_generation(ctx, req, res, g, std::make_shared<ChatFramer>(model));
  const GenerationOutcome o = run_blocking(ctx, req, g);
  json message = {{"role", "assistant"}};
  const bool calls = !o.output.tool_calls.empty();
  message["content"] = calls && o.output.content.empty() ? json(nullptr) : json(o.output.content);
  if (!o.output.reasoning.empty()) message["reasoning"] = o.output.reasoning;
  if (calls) message["tool_calls"] = tool_calls_json(o.output.tool_calls, false);
  write_json(res, envelope(g, "chat.completion", model,
                           {{"index", 0}, {"message", message}, {"finish_reason", o.finish_reason}}, o));
}

void completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  GenerationSettings settings = parse_generation_settings(body, ctx.options().defaults, ApiSurface::OpenAI);
  auto p = body.find("prompt");
  if (p == body.end()) throw invalid_field("prompt", "prompt is required");
  Generation g = start_generation(ctx, prepare_completion(ctx, *p, std::move(settings)), "cmpl-");
  const std::string model = ctx.model_id();
  if (g.prepared->settings.stream)
    return stream_generation(ctx, req, res, g, std::make_shared<CompletionFramer>(model));
  const GenerationOutcome o = run_blocking(ctx, req, g);
  write_json(res, envelope(g, "text_completion", model,
                           {{"index", 0}, {"text", o.output.content}, {"finish_reason", o.finish_reason}}, o));
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
