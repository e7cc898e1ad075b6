#include "server/logprobs_format.h"

namespace lathe::server {
namespace {

using ojson = nlohmann::ordered_json;

ojson token_text(const Tokenizer& tok, int32_t id, float logprob) {
  const std::string text = tok.decode(std::span<const int32_t>(&id, 1), false);
  ojson bytes = ojson::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return {{"token", text}, {"logprob", logprob}, {"bytes", std::move(bytes)}};
}

}  // namespace

ojson openai_logprob_entry(const Tokenizer& tok, int32_t id, const SampleResult& s, int top) {
  ojson e = token_text(tok, id, s.logprob);
  ojson alts = ojson::array();
  for (size_t i = 0; i < s.top.size() && static_cast<int>(i) < top; ++i)
    alts.push_back(token_text(tok, s.top[i].id, s.top[i].logprob));
  e["top_logprobs"] = std::move(alts);
  return e;
}

ojson legacy_completion_logprobs(const ojson& content, size_t& offset) {
  ojson tokens = ojson::array(), lps = ojson::array(), tops = ojson::array(), offsets = ojson::array();
  for (const ojson& e : content) {
    const std::string t = e["token"].get<std::string>();
    tokens.push_back(t);
    lps.push_back(e["logprob"]);
    ojson top = ojson::object();
    for (const ojson& a : e["top_logprobs"]) top[a["token"].get<std::string>()] = a["logprob"];
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += t.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

}  // namespace lathe::server
