#include "lab/dataset/templates.h"

#include <cmath>

#include "common/error.h"
#include "jobs/kinds.h"
#include "lab/dataset/text_file.h"

namespace lathe::dataset {
namespace dataset_templates_detail {

FieldDef text(const std::string& name, const std::string& label, const std::string& hint, bool required,
              json def = nullptr) {
  FieldDef f;
  f.name = name;
  f.type = FieldType::Text;
  f.label = label;
  f.hint = hint;
  f.required = required;
  f.default_value = std::move(def);
  return f;
}

FieldDef textarea(const std::string& name, const std::string& label, const std::string& hint, bool required) {
  FieldDef f = text(name, label, hint, required);
  f.type = FieldType::Textarea;
  return f;
}

FieldDef number(const std::string& name, const std::string& label, const std::string& hint, double def, double lo,
                double hi, bool integer) {
  FieldDef f;
  f.name = name;
  f.type = FieldType::Number;
  f.label = label;
  f.hint = hint;
  f.default_value = integer ? json(static_cast<int64_t>(def)) : json(def);
  f.min = lo;
  f.max = hi;
  f.integer = integer;
  return f;
}

// The sampling fields every LLM-driven template takes.
void add_llm_fields(TemplateDef& t) {
  t.fields.push_back(
      number("max_tokens", "Max tokens", "longest reply the model may write per call", 512, 1, 8192, true));
  t.fields.push_back(
      number("temperature", "Temperature", "sampling temperature of every call (0: greedy)", 0.7, 0, 2, false));
}

std::vector<TemplateDef> build() {
  std::vector<TemplateDef> v;
  {
    TemplateDef t{
        "sft_qa_pairs", "Q&A pairs", "Question/answer pairs written as 'Q: ...' / 'A: ...' blocks, one chat row each",
        "messages",     false,       {}};
    t.fields.push_back(textarea("pairs", "Q/A pairs",
                                "a line 'Q: question', then a line 'A: answer' (questions and answers may run over "
                                "several lines; the next Q: starts a new pair)",
                                true));
    t.fields.push_back(
        textarea("system_prompt", "System prompt", "optional system message put first in every row", false));
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"dpo_pref_pairs",
                  "Preference pairs (CSV)",
                  "CSV with the header prompt,chosen,rejected (RFC 4180 quoting) -> DPO/ORPO rows",
                  "dpo",
                  false,
                  {}};
    t.fields.push_back(textarea("csv", "CSV",
                                "header prompt,chosen,rejected; quote fields holding commas, quotes (doubled) or "
                                "line breaks",
                                true));
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"code_completion",
                  "Code completion",
                  "Walks a folder's .py files and splits each top-level def/class at a random line -> "
                  "prompt/completion rows",
                  "prompt_completion",
                  false,
                  {}};
    t.fields.push_back(text("dir", "Source folder",
                            "folder read recursively for .py files (symlinks leaving it are "
                            "skipped)",
                            true));
    t.fields.push_back(number("seed", "Seed", "seed of the split points", 0, 0, 4294967295.0, true));
    t.fields.push_back(number("max_files", "Max files", "stop after this many .py files", 200, 1, 10000, true));
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"format_conversion",
                  "Format conversion",
                  "An existing JSONL file with its own keys -> chat (messages) rows; rows missing a key are skipped",
                  "messages",
                  false,
                  {}};
    t.fields.push_back(text("path", "JSONL file", "path of the file to convert", true));
    t.fields.push_back(text("user_key", "User key", "key holding the user's message", true, "instruction"));
    t.fields.push_back(text("assistant_key", "Assistant key", "key holding the assistant's reply", true, "output"));
    t.fields.push_back(text("system_key", "System key", "optional key holding a system message", false));
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"hf_dataset_import",
                  "Hugging Face import",
                  "Rows of a Hugging Face Hub dataset (needs the network: not offered by lathe; download the data "
                  "and use format_conversion)",
                  "text",
                  false,
                  {}};
    t.fields.push_back(text("dataset", "Dataset", "owner/name on the Hub", true));
    t.fields.push_back(text("split", "Split", "split to read", false, "train"));
    t.fields.push_back(text("column", "Column", "text column", false, "text"));
    t.fields.push_back(number("max_rows", "Max rows", "rows to import", 1000, 1, 1000000, true));
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"self_instruct",
                  "Self-instruct",
                  "The served model writes new instructions in the manner of seed tasks, then answers each -> chat "
                  "rows",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("seed_tasks", "Seed tasks", "one example instruction per line", true));
    t.fields.push_back(number("count", "Rows", "instructions to generate", 20, 1, 1000, true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"style_transfer",
                  "Style transfer",
                  "The served model rewrites each passage in a target style -> chat rows (passage in, rewrite out)",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("passages", "Passages", "texts to rewrite, separated by blank lines", true));
    t.fields.push_back(text("style", "Style", "the target style, e.g. 'formal business English'", true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"multi_turn_chat",
                  "Multi-turn chat",
                  "Conversations on each topic: the served model plays the assistant and a simulated user asking "
                  "follow-ups -> chat rows",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("topics", "Opening messages", "one opening user message per line", true));
    t.fields.push_back(number("turns", "Turns", "assistant replies per conversation", 3, 1, 8, true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"rag_qa",
                  "RAG question answering",
                  "The served model asks questions about each passage and answers them from it; the passage goes "
                  "in the system message -> chat rows",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("passages", "Passages", "reference passages, separated by blank lines", true));
    t.fields.push_back(
        number("questions_per_passage", "Questions per passage", "questions asked of each passage", 2, 1, 10, true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"cot_synthesis",
                  "Chain-of-thought synthesis",
                  "The served model reasons step by step, then answers; the reasoning goes in <think>...</think> "
                  "inside the assistant turn -> chat rows",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("questions", "Questions", "one question per line", true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"tool_use_traces",
                  "Tool-use traces",
                  "For each task the served model calls one of the tools, stands in for the tool to mock its result, "
                  "then answers from it -> chat rows with tool calls and their tools (OpenAI shape)",
                  "messages",
                  true,
                  {}};
    t.fields.push_back(textarea("tools", "Tools",
                                "a JSON array of OpenAI function tools: [{\"type\": \"function\", \"function\": "
                                "{\"name\": …, \"description\": …, \"parameters\": {…}}}]",
                                true));
    t.fields.push_back(textarea("tasks", "Tasks", "one user request per line, each needing a tool", true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  {
    TemplateDef t{"prompt_reconstruction",
                  "Prompt reconstruction",
                  "For each target text the served model infers the prompt that asks for it and writes a generic "
                  "draft; the target is kept verbatim as the chosen reply -> DPO rows",
                  "dpo",
                  true,
                  {}};
    t.fields.push_back(
        textarea("targets", "Target texts", "texts in the wanted voice, separated by blank lines", true));
    add_llm_fields(t);
    v.push_back(std::move(t));
  }
  return v;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace dataset_templates_detail

const char* field_type_name(FieldType t) {
  switch (t) {
    case FieldType::Text: return "text";
    case FieldType::Textarea: return "textarea";
    case FieldType::Number: return "number";
  }
  return "text";
}

const FieldDef* TemplateDef::field(const std::string& name) const {
  for (const auto& f : fields)
    if (f.name == name) return &f;
  return nullptr;
}

const std::vector<TemplateDef>& templates() {
  static const std::vector<TemplateDef> all = dataset_templates_detail::build();
  return all;
}

const TemplateDef& find_template(const std::string& id) {
  std::string known;
  for (const auto& t : templates()) {
    if (t.id == id) return t;
    known += (known.empty() ? "" : ", ") + t.id;
  }
  throw Error(ErrorKind::InvalidArgument, "config field 'template': unknown dataset template '" + id.substr(0, 64) +
                                              "' (templates: " + known + ")");
}

json to_json(const FieldDef& f) {
  json j = {{"name", f.name}, {"type", field_type_name(f.type)}, {"label", f.label},
            {"hint", f.hint}, {"required", f.required},          {"default", f.default_value}};
  if (f.type == FieldType::Textarea) j["file_field"] = file_field_name(f);  // the same text from a server file
  if (f.type == FieldType::Number) {
    j["min"] = f.min;
    j["max"] = f.max;
    j["integer"] = f.integer;
  }
  return j;
}

json to_json(const TemplateDef& t) {
  json fields = json::array();
  for (const auto& f : t.fields) fields.push_back(to_json(f));
  return {{"id", t.id},
          {"label", t.label},
          {"description", t.description},
          {"output_format", t.output_format},
          {"needs_llm", t.needs_llm},
          {"fields", fields}};
}

json templates_json() {
  json list = json::array();
  for (const auto& t : templates()) list.push_back(to_json(t));
  return {{"templates", list}};
}

void check_template_fields(const TemplateDef& t, const json& config) {
  using namespace dataset_templates_detail;
  std::vector<std::string> known = {"template", "out"};
  for (const auto& f : t.fields) {
    known.push_back(f.name);
    if (f.type == FieldType::Textarea) known.push_back(file_field_name(f));
  }
  jobs::check_fields(config, "dataset (template " + t.id + ")", known);
  for (const auto& f : t.fields) {
    const auto it = config.find(f.name);
    const bool absent = it == config.end() || it->is_null();
    if (f.type == FieldType::Textarea) {
      const std::string file_key = file_field_name(f);
      const auto file = config.find(file_key);
      if (file != config.end() && !file->is_null()) {
        if (!absent)
          throw Error(ErrorKind::InvalidArgument,
                      "config fields '" + f.name + "' and '" + file_key + "' are both given: send the text or a file");
        if (!file->is_string())
          throw Error(ErrorKind::InvalidArgument, "config field '" + file_key + "' must be a string (a file path)");
        const std::string text = read_text_file(file->get<std::string>(), "config field '" + file_key + "'");
        if (f.required && blank(text))
          throw Error(ErrorKind::InvalidArgument, "config field '" + file_key + "': the file holds no text");
        continue;
      }
    }
    if (f.type == FieldType::Number) {
      if (absent) continue;  // every number field has a default
      const double v = jobs::number_field(config, f.name, 0, f.min, f.max);
      if (f.integer && v != std::floor(v))
        throw Error(ErrorKind::InvalidArgument, "config field '" + f.name + "' must be a whole number");
      continue;
    }
    if (absent) {
      if (f.required && !f.default_value.is_string())
        throw Error(ErrorKind::InvalidArgument,
                    "config field '" + f.name + "' is required by the " + t.id + " template (" + f.label + ")");
      continue;
    }
    if (!it->is_string()) throw Error(ErrorKind::InvalidArgument, "config field '" + f.name + "' must be a string");
    if (f.required && blank(it->get<std::string>()))
      throw Error(ErrorKind::InvalidArgument,
                  "config field '" + f.name + "' must not be empty (" + f.label + " of the " + t.id + " template)");
  }
}

std::string file_field_name(const FieldDef& f) { return f.name + "_file"; }

std::string text_field(const TemplateDef& t, const json& config, const std::string& name) {
  if (const auto file = config.find(name + "_file"); file != config.end() && file->is_string())
    return read_text_file(file->get<std::string>(), "config field '" + name + "_file'");
  const auto it = config.find(name);
  if (it != config.end() && it->is_string()) return it->get<std::string>();
  const FieldDef* f = t.field(name);
  return f && f->default_value.is_string() ? f->default_value.get<std::string>() : std::string();
}

double number_field(const TemplateDef& t, const json& config, const std::string& name) {
  const auto it = config.find(name);
  if (it != config.end() && it->is_number()) return it->get<double>();
  const FieldDef* f = t.field(name);
  return f && f->default_value.is_number() ? f->default_value.get<double>() : 0.0;
}

}  // namespace lathe::dataset
