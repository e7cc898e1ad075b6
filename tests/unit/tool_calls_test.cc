// Tool calls in model output: parse_tool_calls, ToolMarkupGate and normalize_tool_schemas.
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "chat/tool_calls.h"

namespace lathe {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {
      "type": "object",
      "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "note": {"type": ["string", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "zip": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "string"}]}
      }}}},
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
  ])");
}

json args_of(const ToolCall& call) { return json::parse(call.arguments); }

// ---- JSON form ----

TEST(ToolCallParse, JsonNameArguments) {
  const ParsedOutput out = parse_tool_calls(
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
      weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris","days":3})");
  EXPECT_EQ(out.content, "");
}

TEST(ToolCallParse, JsonArgumentsAsString) {
  const ParsedOutput out = parse_tool_calls(
      R"(<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}</tool_call>)", weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Oslo"})");
}

TEST(ToolCallParse, JsonFunctionWrapper) {
  const ParsedOutput out =
      parse_tool_calls(R"(<tool_call>{"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}</tool_call>)",
                       weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Rome"})");
}

TEST(ToolCallParse, JsonMissingOrEmptyArgumentsIsEmptyObject) {
  for (const char* text :
       {R"(<tool_call>{"name": "now"}</tool_call>)", R"(<tool_call>{"name": "now", "arguments": null}</tool_call>)",
        R"(<tool_call>{"name": "now", "arguments": ""}</tool_call>)",
        R"(<tool_call>{"name": "now", "arguments": {}}</tool_call>)"}) {
    const ParsedOutput out = parse_tool_calls(text, weather_tools());
    ASSERT_EQ(out.calls.size(), 1u) << text;
    EXPECT_EQ(out.calls[0].arguments, "{}") << text;
  }
}

TEST(ToolCallParse, JsonParametersKeyAccepted) {
  const ParsedOutput out = parse_tool_calls(
      R"(<tool_call>{"name": "get_weather", "parameters": {"city": "Lima"}}</tool_call>)", weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Lima"})");
}

TEST(ToolCallParse, ArgumentsKeepModelKeyOrderAndUnicode) {
  const ParsedOutput out = parse_tool_calls(
      R"(<tool_call>{"name": "get_weather", "arguments": {"zip": "75001", "city": "Zürich"}}</tool_call>)",
      weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{\"zip\":\"75001\",\"city\":\"Zürich\"}");
}

TEST(ToolCallParse, MultipleBlocksAndSurroundingContent) {
  const ParsedOutput out = parse_tool_calls(
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\n",
      weather_tools());
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[1].name, "now");
  EXPECT_EQ(out.content, "Let me check.");
  EXPECT_NE(out.calls[0].id, out.calls[1].id);
}

TEST(ToolCallParse, UnclosedLastBlockIsStillParsed) {
  const ParsedOutput out = parse_tool_calls("<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n", weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "now");
}

// ---- XML form (Qwen3-Coder / Qwen3.5) ----

TEST(ToolCallParse, XmlParametersTypedBySchema) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n"
      "<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n5\n</parameter>\n"
      "<parameter=metric>\ntrue\n</parameter>\n"
      "<parameter=tags>\n[\"a\", \"b\"]\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].name, "get_weather");
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"New York","days":5,"metric":true,"tags":["a","b"]})");
}

TEST(ToolCallParse, XmlStringTypedValuesKeepRawText) {
  // "42" for a string parameter must stay a string; ["string","null"] and anyOf[string,null] count as string.
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n42\n</parameter>\n"
      "<parameter=note>\nnull\n</parameter>\n<parameter=zip>\n01234\n</parameter>\n</function>\n</tool_call>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  const json args = args_of(out.calls[0]);
  EXPECT_EQ(args["city"], "42");
  EXPECT_EQ(args["note"], "null");
  EXPECT_EQ(args["zip"], "01234");
}

TEST(ToolCallParse, XmlNonStringValuesFallBackToText) {
  const std::string text =
      "<tool_call><function=get_weather><parameter=days>\nfive\n</parameter>"
      "<parameter=limit>\n7\n</parameter><parameter=extra>\n{\"k\": 1}\n</parameter></function></tool_call>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  const json args = args_of(out.calls[0]);
  EXPECT_EQ(args["days"], "five");   // integer schema, not JSON → the text
  EXPECT_EQ(args["limit"], 7);       // anyOf[integer,string] is not string-only → JSON first
  EXPECT_EQ(args["extra"]["k"], 1);  // a key the schema doesn't list → JSON first
}

TEST(ToolCallParse, XmlTrimsExactlyOneNewlineEachSide) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n  two lines\nhere  \n\n</parameter>\n"
      "</function>\n</tool_call>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(args_of(out.calls[0])["city"], "\n  two lines\nhere  \n");
}

TEST(ToolCallParse, XmlNoParameters) {
  const ParsedOutput out = parse_tool_calls("<tool_call>\n<function=now>\n</function>\n</tool_call>", weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, "{}");
}

TEST(ToolCallParse, XmlToleratesMissingClosingTags) {
  const std::string text =
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2\n</function>\n</tool_call>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Paris","days":2})");
  const ParsedOutput cut = parse_tool_calls("<tool_call>\n<function=now>\n", weather_tools());
  ASSERT_EQ(cut.calls.size(), 1u);
  // Only the first value lacks its close tag: it must not run on into the next parameter.
  const ParsedOutput first = parse_tool_calls(
      "<function=get_weather><parameter=city>Oslo<parameter=days>3</parameter></function>", weather_tools());
  ASSERT_EQ(first.calls.size(), 1u);
  EXPECT_EQ(first.calls[0].arguments, R"({"city":"Oslo","days":3})");
}

TEST(ToolCallParse, BareFunctionFormWithoutToolCallBlocks) {
  const std::string text =
      "Checking.\n<function=get_weather>\n<parameter=city>\nKyiv\n</parameter>\n</function>\n"
      "<function=now>\n</function>";
  const ParsedOutput out = parse_tool_calls(text, weather_tools());
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[0].arguments, R"({"city":"Kyiv"})");
  EXPECT_EQ(out.calls[1].name, "now");
  EXPECT_EQ(out.content, "Checking.");
}

TEST(ToolCallParse, MixedJsonAndXmlBlocks) {
  const ParsedOutput out = parse_tool_calls(
      "<tool_call>{\"name\":\"now\"}</tool_call><tool_call><function=get_weather><parameter=days>1</parameter>"
      "</function></tool_call>",
      weather_tools());
  ASSERT_EQ(out.calls.size(), 2u);
  EXPECT_EQ(out.calls[1].arguments, R"({"days":1})");
}

// ---- fallback ----

TEST(ToolCallParse, NoMarkupKeepsTextUnchanged) {
  const ParsedOutput out = parse_tool_calls("  Just an answer.\n", weather_tools());
  EXPECT_TRUE(out.calls.empty());
  EXPECT_EQ(out.content, "  Just an answer.\n");
}

TEST(ToolCallParse, FallbackOnErrorsKeepsWholeText) {
  const std::vector<std::string> bad = {
      "Hi <tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": }</tool_call>",  // bad JSON
      "<tool_call>{\"name\": \"unknown_tool\", \"arguments\": {}}</tool_call>",             // unknown name
      "<tool_call>{\"arguments\": {}}</tool_call>",                                         // no name
      "<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>",                     // arguments not an object
      "<tool_call>{\"name\": \"now\", \"arguments\": \"{oops\"}</tool_call>",               // bad string arguments
      "<tool_call></tool_call>",                                                            // empty block
      "<tool_call>plain words</tool_call>",                                                 // neither form
      "<tool_call><function=></function></tool_call>",                                      // empty name
      "<tool_call><function=now>junk</function></tool_call>",                               // text between tags
      "<tool_call><function=now></function> trailing</tool_call>",                          // text after </function>
      "<tool_call><function=nope></function></tool_call>",                                  // unknown XML name
      "<function=nope>\n</function>",                                                       // unknown bare name
      // One bad block spoils them all.
      "<tool_call>{\"name\": \"now\"}</tool_call><tool_call>{\"name\": \"nope\"}</tool_call>",
  };
  for (const std::string& text : bad) {
    const ParsedOutput out = parse_tool_calls(text, weather_tools());
    EXPECT_TRUE(out.calls.empty()) << text;
    EXPECT_EQ(out.content, text);
  }
}

TEST(ToolCallParse, EmptyOrNullToolsNeverYieldCalls) {
  const std::string text = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  for (const json& tools : {json(), json::array(), json::object()}) {
    const ParsedOutput out = parse_tool_calls(text, tools);
    EXPECT_TRUE(out.calls.empty());
    EXPECT_EQ(out.content, text);
  }
}

TEST(ToolCallParse, FlatToolDeclarationsAccepted) {
  const json tools = json::parse(R"([{"name": "now", "parameters": {"type": "object"}}])");
  const ParsedOutput out = parse_tool_calls("<tool_call>{\"name\": \"now\"}</tool_call>", tools);
  ASSERT_EQ(out.calls.size(), 1u);
}

TEST(ToolCallParse, CallIdsAreCallUnderscoreEightHex) {
  // "call_" + 8 lowercase hex digits (checked by hand: std::regex trips GCC 12 warnings in the sanitizer build).
  auto shaped = [](const std::string& id) {
    return id.size() == 13 && id.rfind("call_", 0) == 0 &&
           id.find_first_not_of("0123456789abcdef", 5) == std::string::npos;
  };
  std::set<std::string> ids;
  for (int i = 0; i < 50; ++i) {
    const ParsedOutput out = parse_tool_calls("<tool_call>{\"name\": \"now\"}</tool_call>", weather_tools());
    ASSERT_EQ(out.calls.size(), 1u);
    EXPECT_TRUE(shaped(out.calls[0].id)) << out.calls[0].id;
    ids.insert(out.calls[0].id);
  }
  EXPECT_GT(ids.size(), 45u);  // random, so a rare collision is allowed
}

TEST(ToolCallParse, IdsFromManyThreads) {
  std::vector<std::thread> threads;
  std::vector<std::string> ids(8);
  for (size_t t = 0; t < ids.size(); ++t) {
    threads.emplace_back([&ids, t] {
      ids[t] = parse_tool_calls("<tool_call>{\"name\": \"now\"}</tool_call>", weather_tools()).calls.at(0).id;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_GT(std::set<std::string>(ids.begin(), ids.end()).size(), 6u);
}

// ---- ToolMarkupGate ----

std::string gate_all(const std::vector<std::string>& chunks, bool* triggered = nullptr) {
  ToolMarkupGate gate;
  std::string out;
  for (const std::string& c : chunks) out += gate.push(c);
  out += gate.flush();
  if (triggered) *triggered = gate.triggered();
  return out;
}

TEST(ToolMarkupGate, PassesPlainText) {
  bool triggered = true;
  EXPECT_EQ(gate_all({"Hello ", "world"}, &triggered), "Hello world");
  EXPECT_FALSE(triggered);
}

TEST(ToolMarkupGate, StopsAtToolCallMarker) {
  ToolMarkupGate gate;
  EXPECT_EQ(gate.push("Sure. <tool_call>\n{\"name\""), "Sure. ");
  EXPECT_TRUE(gate.triggered());
  EXPECT_EQ(gate.push("more text"), "");
  EXPECT_EQ(gate.flush(), "");
}

TEST(ToolMarkupGate, StopsAtFunctionMarker) {
  bool triggered = false;
  EXPECT_EQ(gate_all({"Ok\n<function=get_weather>\n"}, &triggered), "Ok\n");
  EXPECT_TRUE(triggered);
}

TEST(ToolMarkupGate, HoldsPartialMarker) {
  ToolMarkupGate gate;
  EXPECT_EQ(gate.push("text <tool_"), "text ");
  EXPECT_FALSE(gate.triggered());
  EXPECT_EQ(gate.push("call>"), "");
  EXPECT_TRUE(gate.triggered());
}

TEST(ToolMarkupGate, ReleasesFalseAlarm) {
  ToolMarkupGate gate;
  EXPECT_EQ(gate.push("a <func"), "a ");
  EXPECT_EQ(gate.push("k> b <"), "<funck> b ");
  EXPECT_EQ(gate.flush(), "<");
  EXPECT_FALSE(gate.triggered());
}

TEST(ToolMarkupGate, ByteAtATimeMatchesWhole) {
  for (const std::string text :
       {"abc <tool_call>{}</tool_call>", "x <functio", "<<tool_call", "a<function b", "plain <b>html</b>"}) {
    std::vector<std::string> bytes;
    for (char c : text) bytes.emplace_back(1, c);
    bool whole_triggered = false, bytes_triggered = false;
    EXPECT_EQ(gate_all(bytes, &bytes_triggered), gate_all({text}, &whole_triggered)) << text;
    EXPECT_EQ(bytes_triggered, whole_triggered) << text;
  }
}

// ---- normalize_tool_schemas ----

TEST(NormalizeToolSchemas, InfersMissingTypes) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
    "properties": {
      "unit": {"enum": ["c", "f"]},
      "level": {"enum": [1, 2]},
      "ratio": {"enum": [0.5]},
      "flag": {"const": true},
      "opt": {"properties": {"x": {}}},
      "list": {"items": {"description": "no type"}},
      "maybe": {"anyOf": [{"type": "null"}, {"type": "integer"}]},
      "either": {"oneOf": [{"enum": ["a"]}, {"type": "number"}]},
      "free": {"description": "anything"},
      "dict": {"type": "object", "additionalProperties": {"items": {}}},
      "tuple": {"type": "array", "items": [{}, {"const": null}]},
      "typed": {"type": "integer", "enum": ["not", "changed"]}
    }}}}])");
  const json out = normalize_tool_schemas(tools);
  const json& params = out[0]["function"]["parameters"];
  const json& p = params["properties"];
  EXPECT_EQ(params["type"], "object");
  EXPECT_EQ(p["unit"]["type"], "string");
  EXPECT_EQ(p["level"]["type"], "integer");
  EXPECT_EQ(p["ratio"]["type"], "number");
  EXPECT_EQ(p["flag"]["type"], "boolean");
  EXPECT_EQ(p["opt"]["type"], "object");
  EXPECT_EQ(p["opt"]["properties"]["x"]["type"], "string");
  EXPECT_EQ(p["list"]["type"], "array");
  EXPECT_EQ(p["list"]["items"]["type"], "string");
  EXPECT_EQ(p["maybe"]["type"], "integer");
  EXPECT_EQ(p["either"]["oneOf"][0]["type"], "string");
  EXPECT_EQ(p["either"]["type"], "string");
  EXPECT_EQ(p["free"]["type"], "string");
  EXPECT_EQ(p["dict"]["additionalProperties"]["type"], "array");
  EXPECT_EQ(p["dict"]["additionalProperties"]["items"]["type"], "string");
  EXPECT_EQ(p["tuple"]["items"][0]["type"], "string");
  EXPECT_EQ(p["tuple"]["items"][1]["type"], "null");
  EXPECT_EQ(p["typed"]["type"], "integer");
  // Nothing but "type" is added.
  EXPECT_FALSE(p["free"].contains("properties"));
  EXPECT_FALSE(p["maybe"].contains("items"));
  EXPECT_EQ(p["typed"], json::parse(R"({"type": "integer", "enum": ["not", "changed"]})"));
}

TEST(NormalizeToolSchemas, AllOfAndDefs) {
  const json tools = json::parse(R"([{"function": {"name": "f", "parameters": {"type": "object",
    "properties": {"a": {"allOf": [{"$ref": "#/$defs/x"}, {"type": "string"}]}},
    "$defs": {"x": {"minLength": 1}}}}}])");
  const json out = normalize_tool_schemas(tools);
  const json& params = out[0]["function"]["parameters"];
  EXPECT_EQ(params["properties"]["a"]["type"], "string");
  EXPECT_EQ(params["$defs"]["x"]["type"], "string");
}

TEST(NormalizeToolSchemas, EmptyParametersBecomeObject) {
  const json out = normalize_tool_schemas(json::parse(R"([{"type": "function", "function": {"name": "f",
    "parameters": {}}}, {"type": "function", "function": {"name": "g"}}])"));
  EXPECT_EQ(out[0]["function"]["parameters"]["type"], "object");
  EXPECT_FALSE(out[1]["function"].contains("parameters"));
}

TEST(NormalizeToolSchemas, LeavesNonArraysAndOddEntriesAlone) {
  EXPECT_EQ(normalize_tool_schemas(json()), json());
  EXPECT_EQ(normalize_tool_schemas(json::object()), json::object());
  const json odd = json::parse(R"([1, "x", {"function": "not an object"}, {"function": {"parameters": true}}])");
  EXPECT_EQ(normalize_tool_schemas(odd), odd);
}

TEST(NormalizeToolSchemas, OrderedJsonKeepsKeyOrder) {
  const ojson tools = ojson::parse(R"([{"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"zeta": {}, "alpha": {"type": "string"}}}}}])");
  const ojson out = normalize_tool_schemas(tools);
  EXPECT_EQ(out[0]["function"]["parameters"]["properties"].dump(),
            R"({"zeta":{"type":"string"},"alpha":{"type":"string"}})");
}

}  // namespace
}  // namespace lathe
