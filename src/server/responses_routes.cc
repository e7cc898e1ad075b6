// POST /v1/responses (OpenAI Responses, the default surface of @ai-sdk/openai): input items and instructions are
// translated into a chat request (so validation, templates, structured outputs and tools are the chat path's),
// the reply comes back as output items, streamed as response.* events; previous_response_id splices a stored
// conversation in front of the new input.
#include <httplib.h>

#include "server/http_server.h"
#include "server/json_fields.h"
#include "server/model_names.h"
#include "server/openai_request.h"
#include "server/responses_routes.h"
#include "server/responses_store.h"
#include "server/sse.h"
#include "server/streaming.h"
#include "server/structured_output.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

std::string text_of(const json& content, const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) throw invalid_field(at, at + " must be a string or an array of content parts");
  std::string text;
  for (size_t i = 0; i < content.size(); ++i) text += content_part_text(content[i], at + "[" + std::to_string(i) + "]");
  return text;
}

// Responses input items → chat messages (system text gathered into one leading system message).
void translate_input(const json& input, json& messages, std::string& system) {
  if (input.is_string()) {
    messages.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) throw invalid_field("input", "input must be a string or an array of items");
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string at = "input[" + std::to_string(i) + "]";
    if (!item.is_object()) throw invalid_field(at, at + " must be an object");
    const std::string type = item.value("type", item.contains("role") ? "message" : "");
    if (type == "message") {
      const std::string role = item.value("role", "user");
      const std::string text = text_of(item.contains("content") ? item["content"] : json(""), at + ".content");
      if (role == "system" || role == "developer") {
        system += (system.empty() ? "" : "\n\n") + text;
      } else if (role == "user" || role == "assistant") {
        messages.push_back({{"role", role}, {"content", text}});
      } else {
        throw invalid_field(at + ".role", at + ".role must be user, assistant, system or developer");
      }
    } else if (type == "function_call") {
      const std::string id = item.value("call_id", item.value("id", ""));
      json call = {{"id", id},
                   {"type", "function"},
                   {"function", {{"name", item.value("name", "")}, {"arguments", item.value("arguments", "{}")}}}};
      if (!messages.empty() && messages.back()["role"] == "assistant" && messages.back().contains("tool_calls"))
        messages.back()["tool_calls"].push_back(std::move(call));
      else
        messages.push_back({{"role", "assistant"}, {"content", nullptr}, {"tool_calls", json::array({call})}});
    } else if (type == "function_call_output") {
      const json& out = item.contains("output") ? item["output"] : json("");
      messages.push_back({{"role", "tool"},
                          {"tool_call_id", item.value("call_id", "")},
                          {"content", out.is_string() ? out.get<std::string>() : out.dump()}});
    } else if (type == "reasoning") {
      continue;  // past reasoning is the template's business
    } else {
      throw invalid_field(at + ".type", at + ".type \"" + type + "\" is not supported");
    }
  }
}

// The chat body the Responses request means.
json chat_body(const json& body, json messages) {
  json chat = json::object();
  chat["messages"] = std::move(messages);
  for (const char* k : {"temperature", "top_p", "top_k", "min_p", "seed", "stream", "logit_bias", "repetition_penalty",
                        "presence_penalty", "frequency_penalty", "stop", "parallel_tool_calls"})
    if (body.contains(k)) chat[k] = body[k];
  if (body.contains("max_output_tokens"))
    chat["max_tokens"] = body["max_output_tokens"];
  else if (body.contains("max_tokens"))
    chat["max_tokens"] = body["max_tokens"];
  // As chat completions checks it: a tools value that is not an array is a 400 naming the field (null is none).
  if (const json* t = JsonFields(body).array("tools")) {
    json tools = json::array();
    for (size_t i = 0; i < t->size(); ++i) {
      const json& tool = (*t)[i];
      const std::string at = "tools[" + std::to_string(i) + "]";
      // An entry that is not a tool at all is a 400 naming it, as chat completions answers; a hosted tool (web
      // search, file search: a {"type": ...} this server has no runner for) is left out, its index still counted.
      if (!tool.is_object()) throw invalid_field(at, at + " must be an object with a \"type\"");
      if (!tool.contains("type") || !tool["type"].is_string())
        throw invalid_field(at + ".type", at + ".type must be a string");
      if (tool["type"] != "function") continue;
      if (!tool.contains("name") || !tool["name"].is_string())
        throw invalid_field(at + ".name", at + ".name must be a string");
      json fn = {{"name", tool["name"]}};
      if (tool.contains("description")) fn["description"] = tool["description"];
      if (tool.contains("parameters") && !tool["parameters"].is_null()) {
        // Named here, where the client's indices and field names are (the chat body renumbers them).
        check_tool_schema(tool["parameters"], tool["name"].get<std::string>(), at + ".parameters", "function");
        fn["parameters"] = tool["parameters"];
      }
      tools.push_back({{"type", "function"}, {"function", fn}});
    }
    if (!tools.empty()) chat["tools"] = tools;
  }
  if (auto c = body.find("tool_choice"); c != body.end() && !c->is_null()) {
    if (c->is_object() && c->value("type", "") == "function")
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", c->value("name", "")}}}};
    else
      chat["tool_choice"] = *c;
  }
  // text.format is response_format, flattened: {type:"json_schema", name, schema, strict}.
  if (auto text = body.find("text"); text != body.end() && text->is_object() && text->contains("format")) {
    const json& f = (*text)["format"];
    if (f.is_object() && f.value("type", "") == "json_schema")
      chat["response_format"] = {
          {"type", "json_schema"},
          {"json_schema",
           {{"name", f.value("name", "schema")}, {"schema", f.contains("schema") ? f["schema"] : json()}}}};
    else if (f.is_object())
      chat["response_format"] = f;
  }
  return chat;
}

std::string reasoning_words(const std::string& r) {
  size_t n = 0;
  bool in = false;
  for (char c : r) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (!space && !in) ++n;
    in = !space;
  }
  return std::to_string(std::max<size_t>(n, 1));
}

struct ResponseIds {
  std::string reasoning = "rs_" + random_hex(24), message = "msg_" + random_hex(24);
};

json output_items(const GenerationOutcome& o, const ResponseIds& ids) {
  json out = json::array();
  if (!o.output.reasoning.empty())
    out.push_back({{"type", "reasoning"},
                   {"id", ids.reasoning},
                   {"summary", json::array({{{"type", "summary_text"}, {"text", o.output.reasoning}}})}});
  if (!o.output.content.empty() || o.output.tool_calls.empty())
    out.push_back(
        {{"type", "message"},
         {"id", ids.message},
         {"status", "completed"},
         {"role", "assistant"},
         {"content",
          json::array({{{"type", "output_text"}, {"text", o.output.content}, {"annotations", json::array()}}})}});
  for (const ToolCall& c : o.output.tool_calls)
    out.push_back({{"type", "function_call"},
                   {"id", "fc_" + c.id.substr(c.id.find('_') + 1)},
                   {"call_id", c.id},
                   {"name", c.name},
                   {"arguments", c.arguments},
                   {"status", "completed"}});
  return out;
}

json response_object(const Generation& g, const std::string& model, const json& previous, const std::string& status,
                     json output, const GenerationOutcome* o, const std::string& instructions) {
  json r = {{"id", g.id},
            {"object", "response"},
            {"created_at", g.created},
            {"status", status},
            {"model", model},
            {"output", std::move(output)},
            {"previous_response_id", previous},
            {"instructions", instructions.empty() ? json(nullptr) : json(instructions)},
            {"store", true},
            {"truncation", "disabled"},
            {"parallel_tool_calls", true},
            {"text", {{"format", {{"type", "text"}}}}},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"usage", nullptr}};
  if (o) {
    if (status == "incomplete") r["incomplete_details"] = {{"reason", "max_output_tokens"}};
    r["usage"] = {
        {"input_tokens", o->prompt_tokens},
        {"output_tokens", o->completion_tokens},
        {"total_tokens", o->prompt_tokens + o->completion_tokens},
        {"input_tokens_details", {{"cached_tokens", o->cached_tokens}}},
        {"output_tokens_details",
         {{"reasoning_tokens", o->output.reasoning.empty() ? 0 : std::stoi(reasoning_words(o->output.reasoning))}}}};
  }
  return r;
}

std::string status_of(const GenerationOutcome& o) { return o.finish_reason == "length" ? "incomplete" : "completed"; }

// The reply as chat messages, for the store (what the next turn's template sees).
json reply_messages(const GenerationOutcome& o) {
  json m = {{"role", "assistant"}, {"content", o.output.content}};
  if (!o.output.tool_calls.empty()) {
    json calls = json::array();
    for (const ToolCall& c : o.output.tool_calls)
      calls.push_back(
          {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
    m["tool_calls"] = calls;
  }
  return json::array({m});
}

struct Turn {
  json previous;  // previous_response_id or null
  std::string instructions;
  json messages;  // effective messages without the system one
};

class ResponsesFramer : public StreamFramer {
 public:
  ResponsesFramer(std::string model, Turn turn, ResponsesStore& store)
      : model_(std::move(model)), turn_(std::move(turn)), store_(store) {}

  std::vector<std::string> opening(const Generation& g) override {
    const json r =
        response_object(g, model_, turn_.previous, "in_progress", json::array(), nullptr, turn_.instructions);
    return {event("response.created", {{"response", r}}), event("response.in_progress", {{"response", r}})};
  }

  std::vector<std::string> delta(const Generation&, const OutputDelta& d) override {
    std::vector<std::string> f;
    if (!d.reasoning.empty()) {
      if (!reasoning_open_) {
        reasoning_open_ = true;
        f.push_back(event("response.output_item.added",
                          {{"output_index", index_},
                           {"item", {{"type", "reasoning"}, {"id", ids_.reasoning}, {"summary", json::array()}}}}));
        f.push_back(
            event("response.reasoning_summary_part.added", {{"item_id", ids_.reasoning},
                                                            {"output_index", index_},
                                                            {"summary_index", 0},
                                                            {"part", {{"type", "summary_text"}, {"text", ""}}}}));
      }
      reasoning_ += d.reasoning;
      f.push_back(
          event("response.reasoning_summary_text.delta",
                {{"item_id", ids_.reasoning}, {"output_index", index_}, {"summary_index", 0}, {"delta", d.reasoning}}));
    }
    if (!d.content.empty()) {
      close_reasoning(f);
      open_message(f);
      text_ += d.content;
      f.push_back(event("response.output_text.delta", {{"item_id", ids_.message},
                                                       {"output_index", index_},
                                                       {"content_index", 0},
                                                       {"delta", d.content},
                                                       {"logprobs", json::array()}}));
    }
    return f;
  }

  std::vector<std::string> finish(const Generation& g, const GenerationOutcome& o) override {
    std::vector<std::string> f;
    close_reasoning(f);
    if (o.output.tool_calls.empty()) open_message(f);
    if (message_open_) {
      const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
      f.push_back(event("response.output_text.done",
                        {{"item_id", ids_.message}, {"output_index", index_}, {"content_index", 0}, {"text", text_}}));
      f.push_back(event("response.content_part.done",
                        {{"item_id", ids_.message}, {"output_index", index_}, {"content_index", 0}, {"part", part}}));
      f.push_back(event("response.output_item.done", {{"output_index", index_},
                                                      {"item",
                                                       {{"type", "message"},
                                                        {"id", ids_.message},
                                                        {"status", "completed"},
                                                        {"role", "assistant"},
                                                        {"content", json::array({part})}}}}));
      ++index_;
    }
    const json items = output_items(o, ids_);
    for (const json& item : items) {
      if (item["type"] != "function_call") continue;
      json added = item;
      added["arguments"] = "";
      added["status"] = "in_progress";
      f.push_back(event("response.output_item.added", {{"output_index", index_}, {"item", added}}));
      f.push_back(event("response.function_call_arguments.delta",
                        {{"item_id", item["id"]}, {"output_index", index_}, {"delta", item["arguments"]}}));
      f.push_back(event("response.function_call_arguments.done",
                        {{"item_id", item["id"]}, {"output_index", index_}, {"arguments", item["arguments"]}}));
      f.push_back(event("response.output_item.done", {{"output_index", index_}, {"item", item}}));
      ++index_;
    }
    const json r = response_object(g, model_, turn_.previous, status_of(o), items, &o, turn_.instructions);
    json messages = turn_.messages;
    for (const json& m : reply_messages(o)) messages.push_back(m);
    store_.put(g.id, StoredResponse{std::move(messages), turn_.instructions});
    f.push_back(event(o.finish_reason == "length" ? "response.incomplete" : "response.completed", {{"response", r}}));
    return f;
  }

  std::string error(const ApiError& e) override {
    return event("error", {{"code", "server_error"}, {"message", e.what()}, {"param", nullptr}});
  }

 private:
  std::string event(const std::string& type, json data) {
    json out = {{"type", type}, {"sequence_number", seq_++}};
    for (auto& [k, v] : data.items()) out[k] = std::move(v);
    return sse_frame(out, type);
  }
  void close_reasoning(std::vector<std::string>& f) {
    if (!reasoning_open_) return;
    reasoning_open_ = false;
    f.push_back(
        event("response.reasoning_summary_text.done",
              {{"item_id", ids_.reasoning}, {"output_index", index_}, {"summary_index", 0}, {"text", reasoning_}}));
    f.push_back(
        event("response.reasoning_summary_part.done", {{"item_id", ids_.reasoning},
                                                       {"output_index", index_},
                                                       {"summary_index", 0},
                                                       {"part", {{"type", "summary_text"}, {"text", reasoning_}}}}));
    f.push_back(event("response.output_item.done",
                      {{"output_index", index_},
                       {"item",
                        {{"type", "reasoning"},
                         {"id", ids_.reasoning},
                         {"summary", json::array({{{"type", "summary_text"}, {"text", reasoning_}}})}}}}));
    ++index_;
  }
  void open_message(std::vector<std::string>& f) {
    if (message_open_) return;
    message_open_ = true;
    f.push_back(event("response.output_item.added", {{"output_index", index_},
                                                     {"item",
                                                      {{"type", "message"},
                                                       {"id", ids_.message},
                                                       {"status", "in_progress"},
                                                       {"role", "assistant"},
                                                       {"content", json::array()}}}}));
    f.push_back(event("response.content_part.added",
                      {{"item_id", ids_.message},
                       {"output_index", index_},
                       {"content_index", 0},
                       {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}}));
  }

  std::string model_;
  Turn turn_;
  ResponsesStore& store_;
  ResponseIds ids_;
  int seq_ = 0, index_ = 0;
  bool reasoning_open_ = false, message_open_ = false;
  std::string reasoning_, text_;
};

void responses(ServerContext& ctx, ResponsesStore& store, const httplib::Request& req, httplib::Response& res) {
  const json body = parse_json_body(req.body);
  if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
  check_model_name(ctx, body);
  Turn turn;
  turn.previous = nullptr;
  turn.messages = json::array();
  if (auto p = body.find("previous_response_id"); p != body.end() && !p->is_null()) {
    if (!p->is_string()) throw invalid_field("previous_response_id", "previous_response_id must be a string");
    auto stored = store.get(p->get<std::string>());
    if (!stored)
      throw ApiError(404, "previous response '" + p->get<std::string>() + "' is not stored here (or expired)",
                     "previous_response_id", "previous_response_not_found");
    turn.previous = *p;
    turn.messages = stored->messages;
    turn.instructions = stored->instructions;
  }
  if (auto i = body.find("instructions"); i != body.end() && !i->is_null()) {
    if (!i->is_string()) throw invalid_field("instructions", "instructions must be a string");
    turn.instructions = i->get<std::string>();
  }
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) throw invalid_field("input", "input is required");
  std::string system;
  translate_input(*input, turn.messages, system);
  const std::string sys = turn.instructions.empty() ? system
                          : system.empty()          ? turn.instructions
                                                    : turn.instructions + "\n\n" + system;
  json messages = json::array();
  if (!sys.empty()) messages.push_back({{"role", "system"}, {"content", sys}});
  for (const json& m : turn.messages) messages.push_back(m);
  if (messages.empty()) throw invalid_field("input", "input holds no messages");

  json chat = chat_body(body, std::move(messages));
  ChatRequest request = take_openai_chat(chat, ctx.options().defaults);
  PreparedGeneration prepared = prepare_chat(ctx, std::move(request));
  attach_structured_output(ctx, prepared);
  Generation g = start_generation(ctx, std::move(prepared), "resp_");
  const std::string model = ctx.model_id();
  if (g.prepared->settings.stream)
    return stream_generation(ctx, req, res, g, std::make_shared<ResponsesFramer>(model, std::move(turn), store));
  const GenerationOutcome o = run_blocking(ctx, req, g);
  const ResponseIds ids;
  json msgs = turn.messages;
  for (const json& m : reply_messages(o)) msgs.push_back(m);
  store.put(g.id, StoredResponse{std::move(msgs), turn.instructions});
  write_json(res, response_object(g, model, turn.previous, status_of(o), output_items(o, ids), &o, turn.instructions));
}

}  // namespace

std::vector<Route> responses_routes(ServerContext& ctx) {
  auto store = std::make_shared<ResponsesStore>();
  return {{"POST", "/v1/responses",
           [&ctx, store](const httplib::Request& q, httplib::Response& r) { responses(ctx, *store, q, r); }}};
}

}  // namespace lathe::server
