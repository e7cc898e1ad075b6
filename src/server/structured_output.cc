#include "server/structured_output.h"

#include <list>
#include <mutex>

#include "chat/grammar/gbnf.h"
#include "chat/grammar/grammar_constraint.h"
#include "chat/grammar/json_schema.h"
#include "common/error.h"
#include "server/api_error.h"
#include "tokenizer/tokenizer.h"

namespace lathe::server {

std::string tool_call_gbnf(const nlohmann::ordered_json& tools, const std::string& name) {
  if (!tools.is_array() || tools.empty())
    throw invalid_field("tool_choice", "tool_choice asks for a tool call but the request has no tools");
  grammar::JsonSchemaGrammar g;
  std::string calls;
  for (size_t i = 0; i < tools.size(); ++i) {
    const auto& fn = tools[i]["function"];
    const std::string fname = fn["name"].get<std::string>();
    if (!name.empty() && fname != name) continue;
    const nlohmann::ordered_json params =
        fn.contains("parameters") && !fn["parameters"].is_null() ? fn["parameters"] : nlohmann::ordered_json::object();
    const std::string args = g.add(params, "tools[" + std::to_string(i) + "].function.parameters");
    // Qwen/Hermes markup, as chat/tool_calls.h parses it.
    const std::string call =
        grammar::gbnf_literal("{\"name\": " + nlohmann::ordered_json(fname).dump() + ", \"arguments\": ") + " " + args +
        " " + grammar::gbnf_literal("}");
    calls += (calls.empty() ? "" : " | ") + call;
  }
  if (calls.empty()) throw invalid_field("tool_choice", "tool_choice names \"" + name + "\", which is not in tools");
  return g.gbnf(grammar::gbnf_literal("<tool_call>\n") + " ( " + calls + " ) " +
                grammar::gbnf_literal("\n</tool_call>"));
}

namespace {

// Compiled constraints by grammar text, so a schema sent again reuses its grammar and the masks its earlier
// generations computed (clients send the same schema with every request).
std::shared_ptr<const TokenConstraint> constraint_for(ServerContext& ctx, const std::string& text,
                                                      int32_t start_after) {
  static std::mutex mu;
  static std::list<std::pair<std::string, std::shared_ptr<const TokenConstraint>>> recent;  // most recent first
  constexpr size_t kKeep = 16;
  const std::string key = std::to_string(start_after) + ":" + text;
  {
    std::lock_guard<std::mutex> lock(mu);
    for (auto it = recent.begin(); it != recent.end(); ++it)
      if (it->first == key) {
        recent.splice(recent.begin(), recent, it);
        return it->second;
      }
  }
  auto g = std::make_shared<const grammar::Grammar>(grammar::parse_gbnf(text));
  grammar::ConstraintOptions o;
  o.eos_ids = ctx.session().eos_ids();
  o.start_after = start_after;
  auto c = std::make_shared<const grammar::GrammarConstraint>(
      std::move(g), grammar::TokenTrie::of(ctx.session().tokenizer()), std::move(o));
  std::lock_guard<std::mutex> lock(mu);
  recent.emplace_front(key, c);
  if (recent.size() > kKeep) recent.pop_back();
  return c;
}

}  // namespace

void attach_structured_output(ServerContext& ctx, PreparedGeneration& p) {
  const StructuredOutput& so = p.settings.structured;
  if (so.kind == StructuredOutput::Kind::None) return;
  std::string text;
  try {
    switch (so.kind) {
      case StructuredOutput::Kind::Gbnf: text = so.gbnf; break;
      case StructuredOutput::Kind::JsonObject: text = grammar::json_object_gbnf(); break;
      case StructuredOutput::Kind::JsonSchema: text = grammar::json_schema_to_gbnf(so.schema, so.field); break;
      case StructuredOutput::Kind::ToolCall: text = tool_call_gbnf(p.tools, so.tool_name); break;
      case StructuredOutput::Kind::None: return;
    }
    const Tokenizer& tok = ctx.session().tokenizer();
    const int32_t start_after = p.start_in_reasoning ? tok.token_to_id("</think>").value_or(-1) : -1;
    p.settings.sampling.constraint = constraint_for(ctx, text, start_after);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::InvalidArgument) throw;
    // Schema errors already start with their path (the field), and GBNF errors with "grammar": name it once.
    const std::string what = e.what(), field = so.field;
    const bool named =
        what.compare(0, field.size(), field) == 0 && (what.size() == field.size() || what[field.size()] == ':' ||
                                                      what[field.size()] == '.' || what[field.size()] == ' ');
    throw invalid_field(so.field, named ? what : field + ": " + what);
  }
}

}  // namespace lathe::server
