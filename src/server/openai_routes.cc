// POST /v1/chat/completions and POST /v1/completions: OpenAI's shapes (mlx_lm.server's logprobs shape), stream
// and non-stream.
#include <httplib.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/logprobs_format.h"
#include "server/model_names.h"
#include "server/openai_request.h"
#include "server/sse.h"
#include "server/streaming.h"
#include "server/structured_output.h"

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

// A request in the deprecated `functions` spelling gets its (first) call as function_call, as OpenAI answers it.
json legacy_function_call_json(const std::vector<ToolCall>& calls) {
  return {{"name", calls.front().name}, {"arguments", calls.front().arguments}};
}
std::string legacy_finish_reason(const std::string& reason) {
  return reason == "tool_calls" ? "function_call" : reason;
}

json chunk(const Generation& g, const std::string& model, json delta, json finish_reason = nullptr, int index = 0) {
  return {
      {"id", g.id},
      {"object", "chat.completion.chunk"},
      {"created", g.created},
      {"model", model},
      {"choices", json::array({{{"index", index}, {"delta", std::move(delta)}, {"finish_reason", finish_reason}}})}};
}

json text_chunk(const Generation& g, const std::string& model, const std::string& text, json finish_reason,
                int index = 0) {
  return {
      {"id", g.id},
      {"object", "text_completion"},
      {"created", g.created},
      {"model", model},
      {"choices",
       json::array(
           {{{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", std::move(finish_reason)}}})}};
}

// One request's usage over all its choices: the prompt once, every choice's completion tokens.
GenerationOutcome total_usage(const std::vector<GenerationOutcome>& outs) {
  GenerationOutcome total;
  for (const GenerationOutcome& o : outs) {
    total.prompt_tokens = o.prompt_tokens;
    total.cached_tokens = std::max(total.cached_tokens, o.cached_tokens);
    total.completion_tokens += o.completion_tokens;
  }
  return total;
}

// The non-stream reply around its choices (choice i with outcome i).
json envelope(const Generation& g, const char* object, const std::string& model, std::vector<json> choices,
              const std::vector<GenerationOutcome>& outs) {
  json list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    if (!outs[i].logprobs.is_null()) choices[i]["logprobs"] = outs[i].logprobs;
    list.push_back(std::move(choices[i]));
  }
  return {{"id", g.id},     {"object", object},           {"created", g.created},
          {"model", model}, {"choices", std::move(list)}, {"usage", usage_json(total_usage(outs))}};
}

// Cancels every choice's job when the request ends early (an error, a client gone) — finished jobs ignore it.
struct CancelChoices {
  const std::vector<Generation>& gs;
  ~CancelChoices() {
    for (const Generation& g : gs) g.job->cancel();
  }
};

// The request's `n` choices, each its own row of the engine's batch. With a seed, choice i samples with
// seed + i, so the choices differ and a rerun gives the same ones. They share one id and creation time.
std::vector<Generation> start_choices(ServerContext& ctx, PreparedGeneration prepared, const std::string& prefix) {
  const int n = prepared.settings.n;
  std::vector<Generation> gs;
  try {
    for (int i = 0; i < n; ++i) {
      PreparedGeneration p = i + 1 < n ? prepared : std::move(prepared);
      if (i > 0 && p.settings.sampling.seed) p.settings.sampling.seed = *p.settings.sampling.seed + i;
      gs.push_back(start_generation(ctx, std::move(p), prefix));
      if (i > 0) {
        gs.back().id = gs.front().id;
        gs.back().created = gs.front().created;
      }
    }
  } catch (...) {  // a full queue refuses the whole request: the choices already queued are withdrawn
    for (const Generation& g : gs) g.job->cancel();
    throw;
  }
  return gs;
}

// Streams of both OpenAI endpoints end with the finish chunk, then (when stream_options.include_usage) a chunk
// with `choices: []` and usage, then "data: [DONE]", as OpenAI sends them.
class OpenAiFramer : public StreamFramer {
 public:
  explicit OpenAiFramer(bool include_usage) : include_usage_(include_usage) {}
  std::string error(const ApiError& e) override { return sse_frame(openai_error_body(e)); }
  std::string trailer() override { return "data: [DONE]\n\n"; }

 protected:
  void usage_chunk(json last, const GenerationOutcome& o, std::vector<std::string>& frames) const {
    if (!include_usage_) return;
    last["choices"] = json::array();
    last["usage"] = usage_json(o);
    frames.push_back(sse_frame(last));
  }

 private:
  bool include_usage_;
};

bool include_usage(const json& body) {
  auto so = body.find("stream_options");
  if (so == body.end() || so->is_null()) return false;
  if (!so->is_object()) throw invalid_field("stream_options", "stream_options must be an object");
  auto iu = so->find("include_usage");
  if (iu == so->end() || iu->is_null()) return false;
  if (!iu->is_boolean())
    throw invalid_field("stream_options.include_usage", "stream_options.include_usage must be a bool");
  return iu->get<bool>();
}

// chat.completion.chunk: the role chunk, reasoning/content deltas, one tool_calls chunk, the finish chunk.
class ChatFramer : public OpenAiFramer {
 public:
  ChatFramer(std::string model, bool include_usage, int index = 0, bool legacy_functions = false)
      : OpenAiFramer(include_usage), model_(std::move(model)), index_(index), legacy_(legacy_functions) {}
  std::vector<std::string> opening(const Generation& g) override {
    return {sse_frame(chunk(g, model_, {{"role", "assistant"}, {"content", ""}}, nullptr, index_))};
  }
  std::vector<std::string> delta(const Generation& g, const OutputDelta& d) override {
    std::vector<std::string> frames;
    // reasoning_content is what vLLM/DeepSeek clients and LangChain read; reasoning is mlx_lm.server's name.
    if (!d.reasoning.empty())
      frames.push_back(sse_frame(
          chunk(g, model_, {{"reasoning", d.reasoning}, {"reasoning_content", d.reasoning}}, nullptr, index_)));
    if (!d.content.empty()) {
      json c = chunk(g, model_, {{"content", d.content}}, nullptr, index_);
      if (!d.logprobs.is_null()) c["choices"][0]["logprobs"] = {{"content", d.logprobs}, {"refusal", nullptr}};
      frames.push_back(sse_frame(c));
    }
    return frames;
  }
  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    std::vector<std::string> frames;
    const bool calls = !o.output.tool_calls.empty();
    if (calls && legacy_)
      frames.push_back(sse_frame(
          chunk(g, model_, {{"function_call", legacy_function_call_json(o.output.tool_calls)}}, nullptr, index_)));
    else if (calls)
      frames.push_back(
          sse_frame(chunk(g, model_, {{"tool_calls", tool_calls_json(o.output.tool_calls, true)}}, nullptr, index_)));
    const std::string reason = legacy_ ? legacy_finish_reason(o.finish_reason) : o.finish_reason;
    frames.push_back(sse_frame(chunk(g, model_, json::object(), reason, index_)));
    usage_chunk(chunk(g, model_, json::object()), o, frames);
    return frames;
  }

 private:
  std::string model_;
  int index_;
  bool legacy_;
};

// text_completion chunks: one per delta, then the finish chunk.
class CompletionFramer : public OpenAiFramer {
 public:
  CompletionFramer(std::string model, bool include_usage, int index = 0)
      : OpenAiFramer(include_usage), model_(std::move(model)), index_(index) {}
  std::vector<std::string> opening(const Generation&) override { return {}; }
  std::vector<std::string> delta(const Generation& g, const OutputDelta& d) override {
    json c = text_chunk(g, model_, d.content, nullptr, index_);
    if (!d.logprobs.is_null()) c["choices"][0]["logprobs"] = legacy_completion_logprobs(d.logprobs, offset_);
    return {sse_frame(c)};
  }
  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    std::vector<std::string> frames = {sse_frame(text_chunk(g, model_, "", o.finish_reason, index_))};
    usage_chunk(text_chunk(g, model_, "", nullptr), o, frames);
    return frames;
  }

 private:
  std::string model_;
  int index_;
  size_t offset_ = 0;  // text_offset of the next streamed token
};

// Streams n choices: each framer without usage, then one usage chunk over all of them (when asked).
// extra: the framer's own arguments after (model, usage, index).
template <typename Framer, typename... Extra>
void stream_n(ServerContext& ctx, const httplib::Request& req, httplib::Response& res, std::vector<Generation> gs,
              const std::string& model, bool usage, json (*usage_base)(const Generation&, const std::string&),
              Extra... extra) {
  if (gs.size() == 1)
    return stream_generation(ctx, req, res, std::move(gs.front()), std::make_shared<Framer>(model, usage, 0, extra...));
  std::vector<std::shared_ptr<StreamFramer>> framers;
  for (size_t i = 0; i < gs.size(); ++i)
    framers.push_back(std::make_shared<Framer>(model, false, static_cast<int>(i), extra...));
  const Generation first = gs.front();
  ClosingFrames closing = nullptr;
  if (usage)
    closing = [first, model, usage_base](const std::vector<GenerationOutcome>& outs) {
      json last = usage_base(first, model);
      last["choices"] = json::array();
      last["usage"] = usage_json(total_usage(outs));
      return std::vector<std::string>{sse_frame(last)};
    };
  stream_choices(ctx, req, res, std::move(gs), std::move(framers), std::move(closing));
}

json chat_usage_base(const Generation& g, const std::string& model) { return chunk(g, model, json::object()); }
json text_usage_base(const Generation& g, const std::string& model) { return text_chunk(g, model, "", nullptr); }

void chat_completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  json body = take_json_body(req);
  check_model_name(ctx, body);
  ChatRequest request = take_openai_chat(body, ctx.options().defaults);
  const bool legacy = request.legacy_functions;
  const bool usage = include_usage(body);
  PreparedGeneration prepared = prepare_chat(ctx, std::move(request));
  attach_structured_output(ctx, prepared);
  std::vector<Generation> gs = start_choices(ctx, std::move(prepared), "chatcmpl-");
  const std::string model = ctx.model_id();
  if (gs.front().prepared->settings.stream)
    return stream_n<ChatFramer>(ctx, req, res, std::move(gs), model, usage, &chat_usage_base, legacy);
  CancelChoices guard{gs};
  std::vector<GenerationOutcome> outs;
  std::vector<json> choices;
  for (Generation& g : gs) {
    const GenerationOutcome& o = outs.emplace_back(run_blocking(ctx, req, g));
    json message = {{"role", "assistant"}};
    const bool calls = !o.output.tool_calls.empty();
    message["content"] = calls && o.output.content.empty() ? json(nullptr) : json(o.output.content);
    if (!o.output.reasoning.empty()) {
      message["reasoning"] = o.output.reasoning;
      message["reasoning_content"] = o.output.reasoning;
    }
    if (calls && legacy)
      message["function_call"] = legacy_function_call_json(o.output.tool_calls);
    else if (calls)
      message["tool_calls"] = tool_calls_json(o.output.tool_calls, false);
    choices.push_back({{"index", choices.size()},
                       {"message", message},
                       {"finish_reason", legacy ? legacy_finish_reason(o.finish_reason) : o.finish_reason}});
  }
  write_json(res, envelope(gs.front(), "chat.completion", model, std::move(choices), outs));
}

void completions(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  json body = parse_json_body(req.body);
  // The legacy integer `logprobs` (that many alternatives per token, 0-20) is OpenAI's completions spelling.
  if (auto lp = body.find("logprobs");
      ctx.options().defaults.logprobs_format == LogprobsFormat::OpenAI && lp != body.end() && lp->is_number_integer()) {
    const int64_t k = lp->get<int64_t>();
    if (k < 0 || k > 20) throw invalid_field("logprobs", "logprobs must be between 0 and 20");
    body["logprobs"] = true;
    if (!body.contains("top_logprobs")) body["top_logprobs"] = k;
  }
  check_model_name(ctx, body);
  GenerationSettings settings = parse_generation_settings(body, ctx.options().defaults, ApiSurface::OpenAI);
  const bool usage = include_usage(body);
  auto p = body.find("prompt");
  if (p == body.end()) throw invalid_field("prompt", "prompt is required");
  PreparedGeneration prepared = prepare_completion(ctx, *p, std::move(settings));
  attach_structured_output(ctx, prepared);
  std::vector<Generation> gs = start_choices(ctx, std::move(prepared), "cmpl-");
  const std::string model = ctx.model_id();
  if (gs.front().prepared->settings.stream)
    return stream_n<CompletionFramer>(ctx, req, res, std::move(gs), model, usage, &text_usage_base);
  CancelChoices guard{gs};
  std::vector<GenerationOutcome> outs;
  std::vector<json> choices;
  for (Generation& g : gs) {
    GenerationOutcome& o = outs.emplace_back(run_blocking(ctx, req, g));
    if (g.prepared->settings.logprobs_format == LogprobsFormat::OpenAI && !o.logprobs.is_null()) {
      size_t offset = 0;
      o.logprobs = legacy_completion_logprobs(o.logprobs["content"], offset);
    }
    choices.push_back({{"index", choices.size()}, {"text", o.output.content}, {"finish_reason", o.finish_reason}});
  }
  write_json(res, envelope(gs.front(), "text_completion", model, std::move(choices), outs));
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
