// The dataset templates (mlx-bun's 13, minus tool_use_traces and verified_code): what each makes, whether it
// needs the served model, and the fields of its form. GET /api/dataset/templates serves this list and the web UI
// builds its forms from it, so the fields here are exactly the config keys a `dataset` job takes besides
// `template` and `out`.
#pragma once
#include <string>
#include <vector>

#include "jobs/job_types.h"

namespace lathe::dataset {

using json = jobs::json;

enum class FieldType { Text, Textarea, Number };
const char* field_type_name(FieldType t);

struct FieldDef {
  std::string name;
  FieldType type = FieldType::Text;
  std::string label, hint;
  bool required = false;
  json default_value = nullptr;  // a string for text fields, a number for number fields, null for none
  // Number fields only: the accepted range, and whether the value must be a whole number.
  double min = 0, max = 0;
  bool integer = false;
};

struct TemplateDef {
  std::string id, label, description;
  std::string output_format;  // "messages", "dpo", "prompt_completion" or "text": the rows train.jsonl holds
  bool needs_llm = false;
  std::vector<FieldDef> fields;
  const FieldDef* field(const std::string& name) const;
};

const std::vector<TemplateDef>& templates();
// The template `id`; throws InvalidArgument listing the known ones.
const TemplateDef& find_template(const std::string& id);

json to_json(const FieldDef& f);
json to_json(const TemplateDef& t);
// {"templates": [...]}: the body of GET /api/dataset/templates.
json templates_json();

// Checks a dataset job's template fields: none unknown (besides template and out), required ones present and not
// blank, text fields strings, number fields numbers in range (whole where they must be). Throws InvalidArgument
// naming the field. A textarea field NAME may come instead as NAME_file, a path on the server read with
// read_text_file (text_file.h), for text larger than a job config holds; giving both is an error.
void check_template_fields(const TemplateDef& t, const json& config);
// "NAME_file": the key that gives a textarea field's text as a server-side file.
std::string file_field_name(const FieldDef& f);
// A field's value, or its default: text fields as strings (read from NAME_file when given; "" when absent with
// no default), number fields as doubles. Assumes check_template_fields passed.
std::string text_field(const TemplateDef& t, const json& config, const std::string& name);
double number_field(const TemplateDef& t, const json& config, const std::string& name);

}  // namespace lathe::dataset
