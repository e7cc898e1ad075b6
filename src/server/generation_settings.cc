#include "server/generation_settings.h"

#include <cerrno>
#include <cstdlib>

#include "common/limits.h"
#include "server/api_error.h"
#include "server/json_fields.h"

namespace lathe::server {
namespace {

constexpr int64_t kMaxTokensLimit = 1 << 20;
// OpenAI `n`: each choice is a row of the batch and a queue slot.
constexpr int64_t kMaxChoices = 8;
constexpr int kMaxTopLogprobsMlx = 11;
constexpr int kMaxTopLogprobsOpenAI = 20;
constexpr size_t kMaxStops = 4;

// mlx_lm.server's exact checks and messages, run before anything else; in OpenAI's format top_logprobs goes
// to 20. (/v1/completions turns its legacy integer `logprobs` into these fields first.)
void parse_logprobs(const nlohmann::ordered_json& body, GenerationSettings& s) {
  const bool openai = s.logprobs_format == LogprobsFormat::OpenAI;
  const int kMaxTopLogprobs = openai ? kMaxTopLogprobsOpenAI : kMaxTopLogprobsMlx;
  if (auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) throw invalid_field("logprobs", "logprobs must be of type bool");
    s.logprobs = it->get<bool>();
  }
  if (auto it = body.find("top_logprobs"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer()) throw invalid_field("top_logprobs", "top_logprobs must be of type int");
    const int64_t k = it->get<int64_t>();
    if (!openai && k == -1) return;  // mlx_lm.server's "unset"; OpenAI's range is 0-20, so there it is an error
    if (k < 0 && openai) throw invalid_field("top_logprobs", "top_logprobs must be between 0 and 20");
    if (k < 0) throw invalid_field("top_logprobs", "top_logprobs must be at least 0");
    if (k > kMaxTopLogprobs)
      throw invalid_field("top_logprobs", "top_logprobs must be at most " + std::to_string(kMaxTopLogprobs));
    s.top_logprobs = static_cast<int>(k);
  }
}

void parse_logit_bias(const nlohmann::ordered_json& body, int64_t vocab_size, SamplingParams& p) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return;
  const char* msg = "logit_bias must be a dict of int to float";
  if (!it->is_object()) throw invalid_field("logit_bias", msg);
  if (it->size() > limits::kLogitBiasMaxEntries)
    throw invalid_field("logit_bias", "logit_bias has " + std::to_string(it->size()) + " entries; at most " +
                                          std::to_string(limits::kLogitBiasMaxEntries) + " are accepted");
  for (const auto& [key, value] : it->items()) {
    errno = 0;
    char* end = nullptr;
    const long id = std::strtol(key.c_str(), &end, 10);
    if (key.empty() || *end != '\0' || errno != 0 || id < 0 || id > INT32_MAX || !value.is_number())
      throw invalid_field("logit_bias", msg);
    if (!(value.get<double>() >= -100 && value.get<double>() <= 100))
      throw invalid_field("logit_bias", "logit_bias values must be between -100 and 100");
    if (vocab_size > 0 && id >= vocab_size)
      throw invalid_field("logit_bias", "logit_bias token id " + key + " is not in the vocabulary (ids are 0 to " +
                                            std::to_string(vocab_size - 1) + ")");
    p.logit_bias[static_cast<int32_t>(id)] = value.get<float>();
  }
}

std::vector<std::string> parse_stop(const nlohmann::ordered_json& body, const char* name) {
  std::vector<std::string> out;
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return out;
  const std::string field = name;
  if (it->is_string()) {
    if (!it->get<std::string>().empty()) out.push_back(it->get<std::string>());
    return out;
  }
  if (!it->is_array()) throw invalid_field(field, field + " must be a string or an array of strings");
  for (const auto& s : *it) {
    if (!s.is_string()) throw invalid_field(field, field + " must be a string or an array of strings");
    if (!s.get<std::string>().empty()) out.push_back(s.get<std::string>());
  }
  if (it->size() > kMaxStops && name == std::string("stop"))
    throw invalid_field(field, "stop accepts at most 4 sequences");
  if (it->size() > limits::kStopSequencesMax)
    throw invalid_field(field, field + " accepts at most " + std::to_string(limits::kStopSequencesMax) + " sequences");
  return out;
}

// OpenAI's response_format, then llama-server's json_schema and grammar fields.
StructuredOutput parse_structured(const nlohmann::ordered_json& body) {
  StructuredOutput out;
  if (auto it = body.find("response_format"); it != body.end() && !it->is_null()) {
    if (!it->is_object() || !it->contains("type") || !(*it)["type"].is_string())
      throw invalid_field("response_format", "response_format must be an object with a type");
    const std::string type = (*it)["type"].get<std::string>();
    if (type == "json_object") {
      out.kind = StructuredOutput::Kind::JsonObject;
      out.field = "response_format";
    } else if (type == "json_schema") {
      auto js = it->find("json_schema");
      if (js == it->end() || !js->is_object())
        throw invalid_field("response_format.json_schema", "response_format.json_schema must be an object");
      auto schema = js->find("schema");
      if (schema == js->end() || schema->is_null()) {
        out.schema = nlohmann::ordered_json::object();  // OpenAI: no schema means any JSON
      } else {
        if (!schema->is_object() && !schema->is_boolean())
          throw invalid_field("response_format.json_schema.schema",
                              "response_format.json_schema.schema must be an object");
        out.schema = *schema;
      }
      out.kind = StructuredOutput::Kind::JsonSchema;
      out.field = "response_format.json_schema.schema";
    } else if (type != "text") {
      throw invalid_field("response_format.type", "response_format.type must be text, json_object or json_schema");
    }
  }
  if (auto it = body.find("json_schema"); it != body.end() && !it->is_null()) {
    if (!it->is_object() && !it->is_boolean()) throw invalid_field("json_schema", "json_schema must be an object");
    out.kind = StructuredOutput::Kind::JsonSchema;
    out.schema = *it;
    out.field = "json_schema";
  }
  if (auto it = body.find("grammar"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) throw invalid_field("grammar", "grammar must be a string (GBNF)");
    if (!it->get<std::string>().empty()) {
      out.kind = StructuredOutput::Kind::Gbnf;
      out.gbnf = it->get<std::string>();
      out.field = "grammar";
    }
  }
  return out;
}

}  // namespace

GenerationSettings parse_generation_settings(const nlohmann::ordered_json& body, const ServerDefaults& defaults,
                                             ApiSurface surface) {
  GenerationSettings s;
  s.logprobs_format = defaults.logprobs_format;
  if (surface == ApiSurface::OpenAI) parse_logprobs(body, s);
  const JsonFields f(body);
  s.stream = f.boolean("stream").value_or(false);
  s.ignore_eos = f.boolean("ignore_eos").value_or(false);
  s.max_tokens = defaults.max_tokens;
  if (surface == ApiSurface::Anthropic) {
    if (!f.has("max_tokens")) throw invalid_field("max_tokens", "max_tokens: field required");
    s.max_tokens = static_cast<int>(*f.integer("max_tokens", 1, kMaxTokensLimit));
  } else if (auto n = f.integer("max_completion_tokens", 1, kMaxTokensLimit)) {
    f.integer("max_tokens", 1, kMaxTokensLimit);  // still type-checked
    s.max_tokens = static_cast<int>(*n);
  } else if (auto m = f.integer("max_tokens", 1, kMaxTokensLimit)) {
    s.max_tokens = static_cast<int>(*m);
  }
  if (surface == ApiSurface::OpenAI) {
    if (auto n = f.integer("n", 1, kMaxChoices)) s.n = static_cast<int>(*n);
  } else if (auto n = f.integer("n", 1, 1); n && *n != 1) {
    throw invalid_field("n", "n must be 1");
  }
  s.adapter = f.string("adapter").value_or("");  // [lora] "a", "a+b", "a,b" or "none"
  s.model = f.string("model").value_or("");
  s.cache_salt = f.string("cache_salt").value_or("");  // as vLLM: tenants with different salts share nothing
  constexpr size_t kMaxCacheSaltBytes = 1024;          // only its digest is kept
  if (s.cache_salt.size() > kMaxCacheSaltBytes)
    throw invalid_field("cache_salt", "cache_salt is longer than " + std::to_string(kMaxCacheSaltBytes) + " bytes");

  SamplingParams& p = s.sampling;
  p = defaults.sampling;
  if (auto v = f.number("temperature", 0, 100)) p.temperature = static_cast<float>(*v);
  if (auto v = f.number("top_p", 0, 1)) p.top_p = static_cast<float>(*v);
  if (auto v = f.integer("top_k", 0, 1 << 24)) p.top_k = static_cast<int>(*v);
  if (auto v = f.number("min_p", 0, 1)) p.min_p = static_cast<float>(*v);
  if (auto v = f.number("xtc_probability", 0, 1)) p.xtc_probability = static_cast<float>(*v);
  if (auto v = f.number("xtc_threshold", 0, 0.5)) p.xtc_threshold = static_cast<float>(*v);
  if (auto v = f.number("repetition_penalty", 1e-6, 100)) p.repetition_penalty = static_cast<float>(*v);
  if (auto v = f.integer("repetition_context_size", 0, 1 << 24)) p.repetition_context_size = static_cast<int>(*v);
  if (auto v = f.number("presence_penalty", -2, 2)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = f.integer("presence_context_size", 0, 1 << 24)) p.presence_context_size = static_cast<int>(*v);
  if (auto v = f.number("frequency_penalty", -2, 2)) p.frequency_penalty = static_cast<float>(*v);
  if (auto v = f.integer("frequency_context_size", 0, 1 << 24)) p.frequency_context_size = static_cast<int>(*v);
  if (auto v = f.integer("seed", INT64_MIN, INT64_MAX)) p.seed = static_cast<uint64_t>(*v);
  if (surface == ApiSurface::OpenAI) {
    parse_logit_bias(body, defaults.vocab_size, p);
    s.structured = parse_structured(body);
  }
  s.stop = parse_stop(body, surface == ApiSurface::Anthropic ? "stop_sequences" : "stop");
  try {
    p.validate();
  } catch (const std::exception& e) {
    throw ApiError(400, e.what());
  }
  return s;
}

}  // namespace lathe::server
