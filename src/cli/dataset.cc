// lathe dataset --template ID --out DIR [--set KEY=VALUE ...] [--set-file KEY=PATH ...]: the dataset job in the
// foreground (progress on stderr, the summary as JSON on stdout). --list prints the templates and their fields.
// Templates that call the served model need a server: submit those to `lathe serve` (POST /api/jobs).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "cli/verbs.h"
#include "common/error.h"
#include "jobs/job_format.h"
#include "lab/dataset/dataset_job.h"
#include "lab/dataset/templates.h"
#include "lab/dataset/text_file.h"

namespace lathe::cli {
namespace cli_dataset_detail {

struct Flags {
  std::string template_id, out;
  std::vector<std::string> sets, set_files;
  bool list = false;
};

std::pair<std::string, std::string> split_assignment(const std::string& s, const char* flag) {
  const size_t eq = s.find('=');
  if (eq == std::string::npos || eq == 0)
    throw Error(ErrorKind::InvalidArgument, std::string(flag) + " takes KEY=VALUE, got '" + s + "'");
  return {s.substr(0, eq), s.substr(eq + 1)};
}

// A number field's value as a JSON number when it reads as one whole (else the string, which validation names).
jobs::json typed_value(const dataset::TemplateDef& t, const std::string& key, const std::string& text) {
  const dataset::FieldDef* f = t.field(key);
  if (f && f->type == dataset::FieldType::Number && !text.empty()) {
    char* end = nullptr;
    const double v = std::strtod(text.c_str(), &end);
    if (end && *end == '\0') return v;
  }
  return text;
}

std::string read_input_file(const std::string& path) { return dataset::read_text_file(path, "--set-file"); }

void print_templates() {
  for (const auto& t : dataset::templates()) {
    std::printf("%s%s — %s\n", t.id.c_str(), t.needs_llm ? " (needs a server)" : "", t.description.c_str());
    for (const auto& f : t.fields)
      std::printf("    %-22s %-8s %s%s\n", f.name.c_str(), dataset::field_type_name(f.type), f.hint.c_str(),
                  f.required ? " [required]" : "");
  }
}

}  // namespace cli_dataset_detail

Verb add_dataset(CLI::App& app) {
  using namespace cli_dataset_detail;
  auto f = std::make_shared<Flags>();
  CLI::App* cmd = app.add_subcommand("dataset", "make a training dataset (train.jsonl + valid.jsonl) from a template");
  cmd->fallthrough();
  cmd->add_option("--template", f->template_id, "template id (see --list)");
  cmd->add_option("--out", f->out, "output folder (must not exist, or be empty)");
  cmd->add_option("--set", f->sets, "a template field, KEY=VALUE (repeatable)");
  cmd->add_option("--set-file", f->set_files, "a template field read from a file, KEY=PATH (repeatable)");
  cmd->add_flag("--list", f->list, "list the templates and their fields");
  return {cmd, [f] {
            if (f->list) {
              print_templates();
              return 0;
            }
            if (f->template_id.empty()) throw Error(ErrorKind::InvalidArgument, "--template is required (see --list)");
            const dataset::TemplateDef& t = dataset::find_template(f->template_id);
            jobs::json config = {{"template", f->template_id}, {"out", f->out}};
            for (const auto& s : f->sets) {
              const auto [key, value] = split_assignment(s, "--set");
              config[key] = typed_value(t, key, value);
            }
            for (const auto& s : f->set_files) {
              const auto [key, path] = split_assignment(s, "--set-file");
              config[key] = read_input_file(path);
            }
            const jobs::Emit emit = jobs::terminal_emit(::isatty(2) != 0);
            const jobs::JobResult r = dataset::run_dataset(emit, config);
            std::printf("%s\n", r.summary.dump(2).c_str());
            return 0;
          }};
}

}  // namespace lathe::cli
