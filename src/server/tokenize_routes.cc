// /tokenize takes llama-server's {content, add_special, with_pieces} or vLLM's {prompt | messages,
// add_special_tokens, add_generation_prompt} and answers {tokens, count, max_model_len} (llama-server reads
// tokens; with_pieces gives [{id, piece}]). /detokenize takes {tokens} and answers {content, prompt} (the
// llama-server and vLLM names of the same text).
#include "server/tokenize_routes.h"

#include <httplib.h>

#include "server/anthropic_request.h"
#include "server/json_fields.h"
#include "server/model_names.h"
#include "server/openai_request.h"
#include "tokenizer/tokenizer.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

constexpr size_t kMaxDetokenize = 1 << 20;

void tokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  json body = take_json_body(req);
  check_model_name(ctx, body);
  const JsonFields f(body);
  const Tokenizer& tok = ctx.session().tokenizer();
  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    body.erase("model");  // checked above; the rest reads as a chat request (its messages are taken out)
    ChatRequest r = take_openai_chat(body, ctx.options().defaults);
    ids = prepare_chat(ctx, std::move(r)).prompt;
  } else {
    const char* field = body.contains("content") ? "content" : "prompt";
    auto text = f.string(field);
    if (!text) throw invalid_field(field, "content (llama-server), prompt or messages (vLLM) is required");
    const bool special =
        f.boolean("add_special")
            .value_or(f.boolean("add_special_tokens")
                          .value_or(std::string(field) ==
                                    "prompt"));  // vLLM adds special tokens by default, llama-server does not
    ids = special ? ctx.session().text_prompt(*text) : tok.encode(*text, false);
  }
  // Written straight to text: a JSON DOM of the answer took ~80 bytes per token (~800 with pieces), so a 4 MB
  // body of one-byte tokens peaked at 3.2 GB.
  const bool pieces = f.boolean("with_pieces").value_or(false);
  std::string out = "{\"tokens\":[";
  out.reserve(out.size() + ids.size() * (pieces ? 24 : 7) + 64);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) out += ',';
    if (!pieces) {
      out += std::to_string(ids[i]);
      continue;
    }
    out += "{\"id\":" + std::to_string(ids[i]) + ",\"piece\":";
    out += dump_json(json(tok.decode(std::span<const int32_t>(&ids[i], 1), false)));  // a lone byte is U+FFFD
    out += '}';
  }
  out +=
      "],\"count\":" + std::to_string(ids.size()) + ",\"max_model_len\":" + std::to_string(ctx.context_length()) + "}";
  res.status = 200;
  res.body = std::move(out);  // set_content would copy it
  res.set_header("Content-Type", "application/json");
}

void detokenize(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  check_model_name(ctx, body);
  auto it = body.find("tokens");
  if (it == body.end() || !it->is_array()) throw invalid_field("tokens", "tokens must be an array of token ids");
  if (it->size() > kMaxDetokenize) throw invalid_field("tokens", "tokens holds more than 1048576 ids");
  const Tokenizer& tok = ctx.session().tokenizer();
  const int64_t vocab = static_cast<int64_t>(tok.vocab_size());
  std::vector<int32_t> ids;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& v = (*it)[i];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      throw invalid_field("tokens", "tokens[" + std::to_string(i) + "] is not a token id of this model (0.." +
                                        std::to_string(vocab - 1) + ")");
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  const std::string text = tok.decode(ids, false);
  write_json(res, {{"content", text}, {"prompt", text}});
}

// Anthropic's count_tokens: the prompt the same request to /v1/messages would run on, counted whole even past the
// context (a client asks to learn whether it fits).
void count_tokens(ServerContext& ctx, const httplib::Request& req, httplib::Response& res) {
  json body = take_json_body(req);
  check_model_name(ctx, body);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  if (!body.contains("max_tokens")) body["max_tokens"] = 1;  // not part of count_tokens' request
  ChatRequest r = take_anthropic_messages(body, ctx.options().defaults);
  write_json(res, {{"input_tokens", prepare_chat(ctx, std::move(r), false).prompt_count}});
}

}  // namespace

std::vector<Route> tokenize_routes(ServerContext& ctx) {
  return {
      {"POST", "/tokenize", [&ctx](const httplib::Request& q, httplib::Response& r) { tokenize(ctx, q, r); }},
      {"POST", "/detokenize", [&ctx](const httplib::Request& q, httplib::Response& r) { detokenize(ctx, q, r); }},
      {"POST", "/v1/messages/count_tokens",
       [&ctx](const httplib::Request& q, httplib::Response& r) { count_tokens(ctx, q, r); }},
  };
}

}  // namespace lathe::server
