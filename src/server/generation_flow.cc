#include "server/generation_flow.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <new>
#include <random>
#include <utility>

#include "chat/reasoning_splitter.h"
#include "chat/tool_calls.h"
#include "server/api_error.h"
#include "server/http_server.h"
#include "server/logprobs_format.h"

namespace lathe::server {
namespace {

// Fits the token budget into the model's context; a prompt that already fills it is the client's error.
// param: the request field that holds the prompt (messages for chat, prompt for completions).
// `count`: the prompt's length where p.prompt holds only its first ids (encode_chat_text's cap); else its size.
void fit_context(ServerContext& ctx, PreparedGeneration& p, const char* param, int64_t count = -1) {
  const int64_t limit = ctx.context_length();
  if (p.prompt.empty()) throw ApiError(400, "the prompt is empty");
  if (limit <= 0) return;
  const int64_t n = count >= 0 ? count : static_cast<int64_t>(p.prompt.size());
  if (n >= limit)
    throw ApiError(400,
                   "the prompt is " + std::to_string(n) + " tokens; the model's context is " + std::to_string(limit),
                   param, "context_length_exceeded");
  p.settings.max_tokens = static_cast<int>(std::min<int64_t>(p.settings.max_tokens, limit - n));
}

nlohmann::ordered_json token_entry(const Tokenizer& tok, int32_t id, float logprob) {
  return {{"id", id}, {"token", tok.id_to_token(id).value_or("")}, {"logprob", logprob}};
}

// Prefill: the rendered conversation ends right after the last message's text (the template's end-of-turn
// markup after it is dropped), so the model continues that text.
void cut_after_final_message(std::string& text, const std::string& content) {
  const size_t at = content.empty() ? std::string::npos : text.rfind(content);
  if (at == std::string::npos)
    throw ApiError(400, "the final assistant message cannot be continued with this chat template", "messages");
  text.resize(at + content.size());
}

}  // namespace

PreparedGeneration prepare_chat(ServerContext& ctx, ChatRequest request, bool fit) {
  const ChatTemplate* tmpl = ctx.session().chat_template();
  if (!tmpl) throw ApiError(400, "the served model has no chat template; use /v1/completions");
  // The prefill's text, kept aside: the messages themselves move into the template's values.
  std::string final_content;
  if (request.continue_final && !request.messages.empty()) {
    const nlohmann::ordered_json& last = request.messages.back();
    if (last.contains("content") && last["content"].is_string()) final_content = last["content"].get<std::string>();
  }
  ChatTemplateInput in;
  in.messages = std::move(request.messages);
  in.add_generation_prompt = !request.continue_final;
  in.cancel = &ctx.stopping();
  in.kwargs = ctx.options().chat_template_args.is_object() ? ctx.options().chat_template_args
                                                           : nlohmann::ordered_json::object();
  for (const auto& [k, v] : request.template_kwargs.items()) in.kwargs[k] = v;
  if (request.tools.is_array() && !request.tools.empty()) in.tools = normalize_tool_schemas(request.tools);
  std::string text;
  try {
    text = tmpl->render(std::move(in));
  } catch (const std::bad_alloc&) {
    throw;  // the server's memory, not the conversation: 503 insufficient_memory (server/api_error.h)
  } catch (const std::exception& e) {
    if (ctx.stopping().load()) throw ApiError(503, "the server is shutting down", std::string(), "shutting_down");
    // The template rejected the conversation (raise_exception, wrong roles): the client's to fix.
    throw ApiError(400, std::string("prompt build failed: ") + e.what(), "messages");
  }
  if (request.continue_final) cut_after_final_message(text, final_content);
  PreparedGeneration p;
  // Ids past the context would only be counted and refused: they are counted, not kept.
  const int64_t limit = ctx.context_length();
  ModelBundle::ChatTokens tokens =
      ctx.session().encode_chat_text(text, limit > 0 ? static_cast<size_t>(limit) : SIZE_MAX);
  p.prompt = std::move(tokens.ids);
  p.settings = std::move(request.settings);
  p.think_tags = ctx.think_tags();
  p.start_in_reasoning = p.think_tags && prompt_ends_inside_think(text);
  p.tools = std::move(request.tools);
  p.prompt_count = static_cast<int64_t>(tokens.count);
  if (fit) fit_context(ctx, p, "messages", p.prompt_count);
  return p;
}

PreparedGeneration prepare_completion(ServerContext& ctx, const nlohmann::ordered_json& prompt,
                                      GenerationSettings settings) {
  PreparedGeneration p;
  int64_t count = -1;
  if (prompt.is_string() && !prompt.get<std::string>().empty()) {
    // As for chat: ids past the context would only be counted and refused.
    const int64_t limit = ctx.context_length();
    ModelBundle::ChatTokens tokens =
        ctx.session().text_prompt(prompt.get<std::string>(), limit > 0 ? static_cast<size_t>(limit) : SIZE_MAX);
    p.prompt = std::move(tokens.ids);
    count = static_cast<int64_t>(tokens.count);
  } else if (prompt.is_array() && !prompt.empty()) {
    // Token ids, used as given (no BOS added): clients that tokenize themselves know what they sent.
    const int64_t vocab = ctx.session().model().config().vocab_size;
    for (size_t i = 0; i < prompt.size(); ++i) {
      const auto& id = prompt[i];
      if (id.is_string() || id.is_array())  // OpenAI's batch forms
        throw invalid_field("prompt", "prompt[" + std::to_string(i) +
                                          "] is a prompt of its own: this server takes one prompt per request (a "
                                          "string, or an array of token ids)");
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || (vocab > 0 && id.get<int64_t>() >= vocab))
        throw invalid_field("prompt", "prompt[" + std::to_string(i) + "] is not a token id of this model (0.." +
                                          std::to_string(vocab - 1) + ")");
      p.prompt.push_back(static_cast<int32_t>(id.get<int64_t>()));
    }
  } else {
    throw invalid_field("prompt", "prompt must be a non-empty string or a non-empty array of token ids");
  }
  p.settings = std::move(settings);
  fit_context(ctx, p, "prompt", count);
  return p;
}

std::shared_ptr<GenerationJob> submit(ServerContext& ctx, const PreparedGeneration& p, const std::string& request_id) {
  GenerateOptions o;
  o.max_tokens = p.settings.max_tokens;
  o.sampling = p.settings.sampling;
  o.stop = p.settings.stop;
  o.top_logprobs = p.settings.top_logprobs;
  o.logprob = p.settings.logprobs || p.settings.top_logprobs > 0;
  o.adapters = select_adapters(ctx, p.settings.adapter, p.settings.model);
  o.cache_salt = p.settings.cache_salt;
  o.ignore_eos = p.settings.ignore_eos;
  return ctx.engine().submit(p.prompt, std::move(o), request_id);
}

GenerationOutcome drive(ServerContext& ctx, GenerationJob& job, const PreparedGeneration& p,
                        const std::function<bool(const OutputDelta&)>& on_delta,
                        const std::function<bool()>& client_gone, const std::function<bool()>& flush) {
  OutputRouter router(p.think_tags, p.start_in_reasoning, p.tools);
  const auto& eos = ctx.session().eos_ids();
  const Tokenizer& tok = ctx.session().tokenizer();
  const bool openai_lp = p.settings.logprobs_format == LogprobsFormat::OpenAI;
  const bool want_logprobs = (openai_lp || !p.settings.stream) && (p.settings.logprobs || p.settings.top_logprobs > 0);
  nlohmann::ordered_json lp_content = nlohmann::ordered_json::array();
  nlohmann::ordered_json lp_pending = nlohmann::ordered_json::array();  // streamed with the next content delta
  std::vector<TokenEvent> events;
  bool finished = false;
  while (!finished) {
    events.clear();
    finished = job.wait(events, job.started() ? GenerationJob::kCoalesce : std::chrono::milliseconds(50));
    for (const TokenEvent& e : events) {
      const bool is_eos = e.id >= 0 && std::find(eos.begin(), eos.end(), e.id) != eos.end();
      if (want_logprobs && openai_lp && e.id >= 0 && !is_eos) {
        (p.settings.stream ? lp_pending : lp_content)
            .push_back(openai_logprob_entry(tok, e.id, e.sample, p.settings.top_logprobs));
      } else if (want_logprobs && e.id >= 0 && !is_eos) {
        if (p.settings.top_logprobs > 0 && !e.sample.top.empty()) {
          nlohmann::ordered_json entry = token_entry(tok, e.sample.top[0].id, e.sample.top[0].logprob);
          nlohmann::ordered_json top = nlohmann::ordered_json::array();
          for (const TokenLogprob& t : e.sample.top) top.push_back(token_entry(tok, t.id, t.logprob));
          entry["top_logprobs"] = std::move(top);
          lp_content.push_back(std::move(entry));
        } else {
          lp_content.push_back({{"id", e.id}, {"logprob", e.sample.logprob}});
        }
      }
      if (e.text.empty()) continue;
      OutputDelta d = router.push(e.text);
      if (!d.content.empty() && !lp_pending.empty())
        d.logprobs = std::exchange(lp_pending, nlohmann::ordered_json::array());
      if (!d.empty() && !on_delta(d)) job.cancel();
    }
    if (flush && !events.empty() && !flush()) job.cancel();
    if (!finished && !job.cancelled() && client_gone()) job.cancel();
  }
  if (job.error()) std::rethrow_exception(job.error());
  OutputDelta tail = router.finish();
  if (!tail.empty() && (!job.cancelled() || job.stopped_by_server())) on_delta(tail);
  if (flush) flush();

  const GenerateResult& r = job.result();
  GenerationOutcome out;
  out.output = router.result();
  out.prompt_tokens = static_cast<int>(p.prompt.size());
  out.completion_tokens = static_cast<int>(r.tokens.size());
  out.cached_tokens = r.cached_tokens;
  if (job.stopped_by_server())  // shutdown: the client still gets a complete response
    out.finish_reason = out.output.tool_calls.empty() ? "stop" : "tool_calls";
  else if (r.finish_reason == "cancelled" || job.cancelled())
    out.finish_reason = "cancelled";
  else if (!out.output.tool_calls.empty())
    out.finish_reason = "tool_calls";
  else
    out.finish_reason = r.finish_reason;
  if (want_logprobs && !lp_content.empty()) out.logprobs = {{"content", std::move(lp_content)}};
  return out;
}

}  // namespace lathe::server
