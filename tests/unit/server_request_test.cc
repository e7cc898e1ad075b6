// Request validation and translation of the HTTP surfaces: each bad field is a 400 that names it, and OpenAI /
// Anthropic bodies turn into the same template-ready conversation.
#include <gtest/gtest.h>

#include <tuple>

#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/generation_settings.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;

// The status and field of the ApiError `f` throws (0 and "" when it does not throw).
template <typename F>
std::pair<int, std::string> error_of(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.param()};
  }
  return {0, ""};
}

GenerationSettings openai(const json& body) { return parse_generation_settings(body, {}, ApiSurface::OpenAI); }

TEST(ServerRequest, SettingsPrecedenceAndDefaults) {
  ServerDefaults d;
  d.max_tokens = 77;
  d.sampling.temperature = 0.5f;
  const auto s = parse_generation_settings(json::object(), d, ApiSurface::OpenAI);
  EXPECT_EQ(s.max_tokens, 77);
  EXPECT_FLOAT_EQ(s.sampling.temperature, 0.5f);
  const auto t = parse_generation_settings({{"max_tokens", 5}, {"max_completion_tokens", 9}, {"temperature", 0}}, d,
                                           ApiSurface::OpenAI);
  EXPECT_EQ(t.max_tokens, 9);
  EXPECT_FLOAT_EQ(t.sampling.temperature, 0.0f);
}

TEST(ServerRequest, WrongTypesAndRangesNameTheField) {
  EXPECT_EQ(error_of([] { openai({{"temperature", "hot"}}); }), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(error_of([] { openai({{"temperature", -1}}); }), std::make_pair(400, std::string("temperature")));
  EXPECT_EQ(error_of([] { openai({{"top_p", 1.5}}); }), std::make_pair(400, std::string("top_p")));
  EXPECT_EQ(error_of([] { openai({{"top_k", 2.5}}); }), std::make_pair(400, std::string("top_k")));
  EXPECT_EQ(error_of([] { openai({{"max_tokens", 0}}); }), std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of([] { openai({{"stream", "yes"}}); }), std::make_pair(400, std::string("stream")));
  EXPECT_EQ(error_of([] { openai({{"seed", "x"}}); }), std::make_pair(400, std::string("seed")));
  EXPECT_EQ(error_of([] { openai({{"stop", 3}}); }), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(error_of([] { openai({{"stop", {"a", "b", "c", "d", "e"}}}); }), std::make_pair(400, std::string("stop")));
  EXPECT_EQ(error_of([] { openai({{"logit_bias", {{"abc", 1}}}}); }), std::make_pair(400, std::string("logit_bias")));
  EXPECT_EQ(error_of([] { openai({{"n", 9}}); }), std::make_pair(400, std::string("n")));
  EXPECT_EQ(error_of([] { openai({{"n", 0}}); }), std::make_pair(400, std::string("n")));
}

TEST(ServerRequest, LogprobsChecksUseMlxMessages) {
  ServerDefaults mlx;
  mlx.logprobs_format = LogprobsFormat::Mlx;
  auto message = [](const json& body, const ServerDefaults& d) {
    try {
      parse_generation_settings(body, d, ApiSurface::OpenAI);
    } catch (const ApiError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message({{"logprobs", 1}}, mlx), "logprobs must be of type bool");
  EXPECT_EQ(message({{"top_logprobs", "3"}}, mlx), "top_logprobs must be of type int");
  EXPECT_EQ(message({{"top_logprobs", -2}}, mlx), "top_logprobs must be at least 0");
  EXPECT_EQ(message({{"top_logprobs", 12}}, mlx), "top_logprobs must be at most 11");
  EXPECT_EQ(parse_generation_settings({{"top_logprobs", 11}}, mlx, ApiSurface::OpenAI).top_logprobs, 11);
  EXPECT_EQ(parse_generation_settings({{"top_logprobs", -1}}, mlx, ApiSurface::OpenAI).top_logprobs, 0);  // unset
  // OpenAI's range is 0-20: -1 is not "unset" there.
  EXPECT_EQ(message({{"top_logprobs", -1}}, {}), "top_logprobs must be between 0 and 20");
  EXPECT_EQ(message({{"top_logprobs", -5}}, {}), "top_logprobs must be between 0 and 20");
  EXPECT_EQ(error_of([] { openai({{"top_logprobs", -1}}); }), std::make_pair(400, std::string("top_logprobs")));
  // OpenAI's format: up to 20; chat's logprobs stays a bool.
  EXPECT_EQ(message({{"top_logprobs", 21}}, {}), "top_logprobs must be at most 20");
  EXPECT_EQ(openai({{"top_logprobs", 20}}).top_logprobs, 20);
  EXPECT_EQ(message({{"logprobs", 3}}, {}), "logprobs must be of type bool");
}

TEST(ServerRequest, StructuredOutputFields) {
  using Kind = StructuredOutput::Kind;
  EXPECT_EQ(openai({{"response_format", {{"type", "json_object"}}}}).structured.kind, Kind::JsonObject);
  EXPECT_EQ(openai({{"response_format", {{"type", "text"}}}}).structured.kind, Kind::None);
  const auto js =
      openai({{"response_format",
               {{"type", "json_schema"}, {"json_schema", {{"name", "x"}, {"schema", {{"type", "object"}}}}}}}});
  EXPECT_EQ(js.structured.kind, Kind::JsonSchema);
  EXPECT_EQ(js.structured.schema["type"], "object");
  EXPECT_EQ(openai({{"grammar", "root ::= \"a\""}}).structured.kind, Kind::Gbnf);
  EXPECT_EQ(openai({{"json_schema", {{"type", "string"}}}}).structured.field, "json_schema");
  EXPECT_EQ(error_of([] {
              openai({{"response_format", {{"type", "xml"}}}});
            }),
            std::make_pair(400, std::string("response_format.type")));
  EXPECT_EQ(error_of([] { openai({{"grammar", 5}}); }), std::make_pair(400, std::string("grammar")));
}

TEST(ServerRequest, StopAndLogitBiasParse) {
  const auto s = openai({{"stop", {"x", "", "yy"}}, {"logit_bias", {{"5", -100}, {"7", 2.5}}}});
  EXPECT_EQ(s.stop, (std::vector<std::string>{"x", "yy"}));
  EXPECT_FLOAT_EQ(s.sampling.logit_bias.at(5), -100.0f);
  EXPECT_FLOAT_EQ(s.sampling.logit_bias.at(7), 2.5f);
  EXPECT_EQ(openai({{"stop", "END"}}).stop, std::vector<std::string>{"END"});
}

TEST(ServerRequest, BodyMustBeAJsonObject) {
  EXPECT_EQ(error_of([] { parse_json_body("{\"a\":"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_json_body("[1,2]"); }).first, 400);
  EXPECT_EQ(error_of([] { parse_json_body("{\"a\":\"\xff\"}"); }).first, 400);  // invalid UTF-8
  EXPECT_EQ(error_of([] { parse_json_body("{\"a\":1}"); }).first, 0);
}

TEST(ServerRequest, OpenAIMessagesAreNormalised) {
  const json body = {
      {"messages",
       {{{"role", "developer"}, {"content", "be brief"}},
        {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "hi "}}, {{"type", "text"}, {"text", "there"}}}}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "call_1"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}}},
      {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}};
  const ChatRequest r = parse_openai_chat(body, {});
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "hi there");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);
  EXPECT_TRUE(r.tools.is_array());
  json none = body;
  none["tool_choice"] = "none";
  EXPECT_TRUE(parse_openai_chat(none, {}).tools.is_null());
}

TEST(ServerRequest, OpenAIMessageErrors) {
  EXPECT_EQ(error_of([] { parse_openai_chat(json::object(), {}); }), std::make_pair(400, std::string("messages")));
  EXPECT_EQ(error_of([] { parse_openai_chat({{"messages", json::array()}}, {}); }).first, 400);
  EXPECT_EQ(error_of([] {
              parse_openai_chat({{"messages", {{{"role", "robot"}, {"content", "x"}}}}}, {});
            }),
            std::make_pair(400, std::string("messages[0].role")));
  EXPECT_EQ(error_of([] {
              parse_openai_chat({{"messages", {{{"role", "user"}, {"content", 5}}}}}, {});
            }),
            std::make_pair(400, std::string("messages[0].content")));
  const json bad_args = {
      {"messages",
       {{{"role", "assistant"},
         {"tool_calls", {{{"type", "function"}, {"function", {{"name", "f"}, {"arguments", "{oops"}}}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_openai_chat(bad_args, {}); }),
            std::make_pair(400, std::string("messages[0].tool_calls[0].function.arguments")));
}

TEST(ServerRequest, DeprecatedFunctionsAreToolsInTheirOldSpelling) {
  const json fn = {{"name", "get_weather"},
                   {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}};
  const json body = {{"messages",
                      {{{"role", "user"}, {"content", "weather?"}},
                       {{"role", "assistant"},
                        {"content", nullptr},
                        {"function_call", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}},
                       {{"role", "function"}, {"name", "get_weather"}, {"content", "sunny"}}}},
                     {"functions", {fn}},
                     {"function_call", {{"name", "get_weather"}}}};
  const ChatRequest r = parse_openai_chat(body, {});
  EXPECT_TRUE(r.legacy_functions);
  ASSERT_TRUE(r.tools.is_array());
  EXPECT_EQ(r.tools[0]["type"], "function");
  EXPECT_EQ(r.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.settings.structured.kind, StructuredOutput::Kind::ToolCall);
  EXPECT_EQ(r.settings.structured.tool_name, "get_weather");
  EXPECT_EQ(r.settings.structured.field, "function_call");
  // The old turns read as the tool turns a template knows.
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.messages[1]["tool_calls"][0]["function"]["arguments"]["city"], "Oslo");
  EXPECT_FALSE(r.messages[1].contains("function_call"));
  EXPECT_EQ(r.messages[2]["role"], "tool");
  EXPECT_EQ(r.messages[2]["name"], "get_weather");
  // "none" keeps the functions out of the prompt, as tool_choice "none" keeps tools out; "auto" forces nothing.
  json none = body;
  none["function_call"] = "none";
  EXPECT_TRUE(parse_openai_chat(none, {}).tools.is_null());
  json any = body;
  any["function_call"] = "auto";
  EXPECT_EQ(parse_openai_chat(any, {}).settings.structured.kind, StructuredOutput::Kind::None);
  // Today's spelling is untouched.
  EXPECT_FALSE(parse_openai_chat({{"messages", {{{"role", "user"}, {"content", "x"}}}}}, {}).legacy_functions);
}

TEST(ServerRequest, DeprecatedFunctionsErrorsNameTheirField) {
  const json msgs = {{{"role", "user"}, {"content", "x"}}};
  const json fn = {{"name", "f"}};
  EXPECT_EQ(error_of([&] {
              parse_openai_chat(
                  {{"messages", msgs}, {"functions", {fn}}, {"tools", {{{"type", "function"}, {"function", fn}}}}}, {});
            }),
            std::make_pair(400, std::string("functions")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat({{"messages", msgs}, {"functions", fn}}, {});
            }),
            std::make_pair(400, std::string("functions")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat({{"messages", msgs}, {"functions", {{{"name", 5}}}}}, {});
            }),
            std::make_pair(400, std::string("functions[0]")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat({{"messages", msgs}, {"functions", {{{"name", "f"}, {"parameters", "object"}}}}}, {});
            }),
            std::make_pair(400, std::string("functions[0].parameters")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat({{"messages", msgs}, {"functions", {fn}}, {"function_call", "always"}}, {});
            }),
            std::make_pair(400, std::string("function_call")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat(
                  {{"messages", msgs}, {"functions", {fn}}, {"function_call", "auto"}, {"tool_choice", "auto"}}, {});
            }),
            std::make_pair(400, std::string("function_call")));
  EXPECT_EQ(error_of([] {
              parse_openai_chat({{"messages", {{{"role", "function"}, {"content", "sunny"}}}}}, {});
            }),
            std::make_pair(400, std::string("messages[0].name")));
  EXPECT_EQ(error_of([] {
              parse_openai_chat(
                  {{"messages", {{{"role", "assistant"}, {"function_call", {{"name", "f"}, {"arguments", "{oops"}}}}}}},
                  {});
            }),
            std::make_pair(400, std::string("messages[0].function_call.arguments")));
}

TEST(ServerRequest, NonStringTypesAreClientErrors) {
  const json part = {{"messages", {{{"role", "user"}, {"content", {{{"type", 5}, {"text", "x"}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_openai_chat(part, {}); }),
            std::make_pair(400, std::string("messages[0].content[0].type")));
  const json block = {{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", true}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_anthropic_messages(block, {}); }).first, 400);
  const json result = {
      {"max_tokens", 5},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", 7}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_anthropic_messages(result, {}); }).first, 400);
  EXPECT_EQ(error_of([] { openai({{"logit_bias", {{"5", 1e300}}}}); }), std::make_pair(400, std::string("logit_bias")));
}

TEST(ServerRequest, ThinkingResolution) {
  const json base = {{"messages", {{{"role", "user"}, {"content", "x"}}}}};
  json b = base;
  b["reasoning_effort"] = "none";
  EXPECT_EQ(parse_openai_chat(b, {}).template_kwargs["enable_thinking"], false);
  b["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_EQ(parse_openai_chat(b, {}).template_kwargs["enable_thinking"], true);  // explicit kwargs win
  b["reasoning_effort"] = "extreme";
  EXPECT_EQ(error_of([&] { parse_openai_chat(b, {}); }).second, "reasoning_effort");
}

TEST(ServerRequest, AnthropicTranslation) {
  const json body = {
      {"max_tokens", 10},
      {"system", {{{"type", "text"}, {"text", "sys a"}}, {{"type", "text"}, {"text", "sys b"}}}},
      {"stop_sequences", {"END"}},
      {"messages",
       {{{"role", "user"}, {"content", "hello"}},
        {{"role", "assistant"},
         {"content",
          {{{"type", "thinking"}, {"thinking", "hmm"}},
           {{"type", "text"}, {"text", "calling"}},
           {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "f"}, {"input", {{"q", "x"}}}}}}},
        {{"role", "user"},
         {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "result"}}}}}}},
      {"tools", {{{"name", "f"}, {"input_schema", {{"type", "object"}}}}, {{"type", "web_search_20250305"}}}}};
  const ChatRequest r = parse_anthropic_messages(body, {});
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["content"], "sys a\nsys b");
  EXPECT_EQ(r.messages[2]["content"], "calling");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["q"], "x");
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "toolu_1");
  EXPECT_EQ(r.tools.size(), 1u);
  EXPECT_EQ(r.settings.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.settings.max_tokens, 10);
}

// The status, param and message of the ApiError `f` throws.
template <typename F>
std::tuple<int, std::string, std::string> tool_schema_error_of(F f) {
  try {
    f();
  } catch (const ApiError& e) {
    return {e.status(), e.param(), e.what()};
  }
  return {0, "", ""};
}

TEST(ServerRequest, InvalidToolSchemasAre400sNamingToolAndPath) {
  const json hi = {{{"role", "user"}, {"content", "hi"}}};
  const auto openai_with = [&](const json& params, const json& choice = nullptr) {
    json body = {{"messages", hi},
                 {"tools",
                  {{{"type", "function"}, {"function", {{"name", "ok"}, {"parameters", {{"type", "object"}}}}}},
                   {{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", params}}}}}}};
    if (!choice.is_null()) body["tool_choice"] = choice;
    return tool_schema_error_of([&] { parse_openai_chat(body, {}); });
  };
  // parameters that are not a schema object at all.
  for (const json& p : {json("object"), json(5), json::array({1}), json(true)}) {
    const auto [status, param, message] = openai_with(p);
    EXPECT_EQ(status, 400) << p;
    EXPECT_EQ(param, "tools[1].function.parameters");
    EXPECT_EQ(message.rfind("Invalid schema for function 'get_weather': tools[1].function.parameters must be", 0), 0u)
        << message;
  }
  // A fault deep inside, named by its path, whether or not tool_choice would compile a grammar.
  const json deep = json::parse(R"({"type": "object", "properties": {"loc": {"type": "object",
      "properties": {"lat": {"type": "float"}}}}})");
  for (const json& choice : {json(nullptr), json("none"), json("auto"), json("required")}) {
    const auto [status, param, message] = openai_with(deep, choice);
    EXPECT_EQ(status, 400) << choice;
    EXPECT_EQ(param, "tools[1].function.parameters");
    EXPECT_NE(message.find("Invalid schema for function 'get_weather': "
                           "tools[1].function.parameters.properties.loc.properties.lat.type: type \"float\""),
              std::string::npos)
        << message;
  }
  const auto [st, pa, msg] = openai_with(json::parse(R"({"properties": {"a": {"$ref": "#/$defs/A"}}})"));
  EXPECT_EQ(st, 400);
  EXPECT_NE(msg.find("properties.a.$ref: $ref \"#/$defs/A\" cannot be resolved"), std::string::npos) << msg;
  // null parameters are no parameters; a schema with keywords no grammar enforces is still a schema.
  EXPECT_EQ(std::get<0>(openai_with(nullptr)), 0);
  EXPECT_EQ(std::get<0>(openai_with(json::parse(R"({"type": "object", "properties": {"s": {"type": "string",
      "pattern": "^a+$", "format": "email"}}, "if": {"required": ["s"]}, "then": {"minProperties": 1}})"))),
            0);

  // Anthropic input_schema, under tool_choice none too.
  const auto anthropic_with = [&](const json& schema, const json& choice = nullptr) {
    json body = {
        {"max_tokens", 5},
        {"messages", hi},
        {"tools",
         {{{"type", "web_search_20250305"}, {"name", "web_search"}}, {{"name", "lookup"}, {"input_schema", schema}}}}};
    if (!choice.is_null()) body["tool_choice"] = choice;
    return tool_schema_error_of([&] { parse_anthropic_messages(body, {}); });
  };
  const json bad_required = {{"type", "object"}, {"properties", {{"q", {{"type", "string"}}}}}, {"required", "q"}};
  for (const json& choice : {json(nullptr), json{{"type", "none"}}}) {
    const auto [status, param, message] = anthropic_with(bad_required, choice);
    EXPECT_EQ(status, 400);
    EXPECT_EQ(param, "tools[1].input_schema");
    EXPECT_EQ(message.rfind("Invalid schema for tool 'lookup': tools[1].input_schema.required: required must be", 0),
              0u)
        << message;
  }
  EXPECT_EQ(std::get<0>(anthropic_with("object")), 400);
  EXPECT_EQ(std::get<0>(anthropic_with({{"type", "object"}, {"properties", {{"q", {{"type", "string"}}}}}})), 0);
}

TEST(ServerRequest, AnthropicRequiresMaxTokensAndMessages) {
  EXPECT_EQ(error_of([] {
              parse_anthropic_messages({{"messages", {{{"role", "user"}, {"content", "x"}}}}}, {});
            }),
            std::make_pair(400, std::string("max_tokens")));
  EXPECT_EQ(error_of([] {
              parse_anthropic_messages({{"max_tokens", 5}, {"messages", json::array()}}, {});
            }).first,
            400);
}

TEST(ServerRequest, OpenAIUnknownPartsAreNamedNotDropped) {
  const auto chat_with = [](const json& part) {
    return json{{"messages", {{{"role", "user"}, {"content", json::array({part})}}}}};
  };
  EXPECT_EQ(error_of([&] {
              parse_openai_chat(chat_with({{"type", "video"}}), {});
            }),
            std::make_pair(400, std::string("messages[0].content[0].type")));
  EXPECT_EQ(error_of([&] {
              parse_openai_chat(chat_with({{"type", "input_audio"}}), {});
            }),
            std::make_pair(400, std::string("messages[0].content[0]")));
  const json refusal = {{"messages",
                         {{{"role", "user"}, {"content", "x"}},
                          {{"role", "assistant"}, {"content", {{{"type", "refusal"}, {"refusal", "no."}}}}}}}};
  EXPECT_EQ(parse_openai_chat(refusal, {}).messages[1]["content"], "no.");
}

TEST(ServerRequest, AnthropicUnknownBlocksAreNamedNotDropped) {
  const json video = {{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "video"}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_anthropic_messages(video, {}); }),
            std::make_pair(400, std::string("messages[0].content[0].type")));
  // Only reasoning blocks: nothing left to answer is the client's error, not a template failure.
  const json thinking_only = {
      {"max_tokens", 5},
      {"system", "sys"},
      {"messages", {{{"role", "user"}, {"content", {{{"type", "thinking"}, {"thinking", "hmm"}}}}}}}};
  EXPECT_EQ(error_of([&] { parse_anthropic_messages(thinking_only, {}); }),
            std::make_pair(400, std::string("messages")));
}

TEST(ServerRequest, ErrorBodiesPerSurface) {
  const ApiError e(400, "temperature must be a number", "temperature");
  const json o = openai_error_body(e);
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_EQ(o["error"]["param"], "temperature");
  EXPECT_TRUE(o["error"]["code"].is_null());
  const json a = anthropic_error_body(ApiError(500, "boom"));
  EXPECT_EQ(a["type"], "error");
  EXPECT_EQ(a["error"]["type"], "api_error");
}

}  // namespace
}  // namespace lathe::server
