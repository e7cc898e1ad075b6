#include "lab/dataset/dataset_job.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "common/error.h"
#include "lab/dataset/code_completion.h"
#include "lab/dataset/dataset_output.h"
#include "lab/dataset/dpo_pairs.h"
#include "lab/dataset/format_conversion.h"
#include "lab/dataset/llm_client.h"
#include "lab/dataset/llm_templates.h"
#include "lab/dataset/qa_pairs.h"
#include "lab/dataset/templates.h"

namespace lathe::dataset {
namespace dataset_job_detail {

const TemplateDef& template_of(const json& config) {
  if (!config.is_object()) throw Error(ErrorKind::InvalidArgument, "the config of a dataset job must be an object");
  const auto it = config.find("template");
  if (it == config.end() || it->is_null()) {
    std::string known;
    for (const auto& t : templates()) known += (known.empty() ? "" : ", ") + t.id;
    throw Error(ErrorKind::InvalidArgument, "config field 'template' is required (templates: " + known + ")");
  }
  if (!it->is_string()) throw Error(ErrorKind::InvalidArgument, "config field 'template' must be a string");
  return find_template(it->get<std::string>());
}

CodeWalkLimits code_limits(const TemplateDef& t, const json& config) {
  CodeWalkLimits l;
  l.max_files = static_cast<int64_t>(number_field(t, config, "max_files"));
  return l;
}

KeyMapping key_mapping(const TemplateDef& t, const json& config) {
  return {text_field(t, config, "user_key"), text_field(t, config, "assistant_key"),
          text_field(t, config, "system_key")};
}

ChatParams chat_params(const TemplateDef& t, const json& config) {
  ChatParams p;
  p.max_tokens = static_cast<int>(number_field(t, config, "max_tokens"));
  p.temperature = number_field(t, config, "temperature");
  return p;
}

}  // namespace dataset_job_detail

void validate_dataset_config(const json& config) {
  using namespace dataset_job_detail;
  const TemplateDef& t = template_of(config);
  if (t.id == "hf_dataset_import")
    throw Error(ErrorKind::Unsupported,
                "the hf_dataset_import template needs the network, which lathe never uses: download the dataset as "
                "JSONL and make it with the format_conversion template instead");
  check_template_fields(t, config);
  const auto out = config.find("out");
  if (out != config.end() && !out->is_null() && !out->is_string())
    throw Error(ErrorKind::InvalidArgument, "config field 'out' must be a string");
  check_output_dir(jobs::string_field(config, "out"));
  // Inputs that need no model are read now, so that a malformed one is the request's error, not a failed job.
  if (t.id == "sft_qa_pairs") {
    parse_qa_pairs(text_field(t, config, "pairs"), text_field(t, config, "system_prompt"));
  } else if (t.id == "dpo_pref_pairs") {
    if (parse_dpo_csv(text_field(t, config, "csv")).rows.empty())
      throw Error(ErrorKind::InvalidArgument, "config field 'csv' holds no complete prompt,chosen,rejected row");
  } else if (t.id == "code_completion") {
    const std::string dir = text_field(t, config, "dir");
    std::error_code ec;
    if (!std::filesystem::is_directory(dir, ec))
      throw Error(ErrorKind::InvalidArgument, "config field 'dir': " + dir + " is not a folder");
  } else if (t.id == "format_conversion") {
    const std::string path = text_field(t, config, "path");
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec))
      throw Error(ErrorKind::InvalidArgument, "config field 'path': " + path + " is not a file");
    if (std::filesystem::file_size(path, ec) > kMaxConvertBytes)
      throw Error(ErrorKind::InvalidArgument, "config field 'path': " + path + " is larger than " +
                                                  std::to_string(kMaxConvertBytes >> 20) +
                                                  " MiB, the most one job converts (split the file)");
  } else if (t.needs_llm) {
    llm_row_budget(t, config);
    job_llm_client();  // Unsupported without a server to call
  }
}

jobs::JobResult run_dataset(const jobs::Emit& emit, const json& config) {
  using namespace dataset_job_detail;
  validate_dataset_config(config);
  const TemplateDef& t = template_of(config);
  const std::string out = jobs::string_field(config, "out");
  emit(jobs::stage_event("starting", 0.0, "template " + t.id));

  // Generation takes progress 0.05 .. 0.9; reported when the percentage moves (LLM rows: every row).
  int last_pct = -1;
  const Progress progress = [&](int64_t done, int64_t total) {
    if (total <= 0) return;
    const double frac = std::min(1.0, static_cast<double>(done) / static_cast<double>(total));
    const int pct = static_cast<int>(std::floor(frac * 100));
    if (pct == last_pct && !t.needs_llm && done != total) return;
    last_pct = pct;
    json e = jobs::stage_event("generating", 0.05 + 0.85 * frac,
                               std::to_string(done) + "/" + std::to_string(total) +
                                   (t.id == "format_conversion" ? " bytes"
                                    : t.id == "code_completion" ? " files"
                                                                : " rows"));
    e["done"] = done;
    e["total"] = total;
    emit(e);
  };

  Generated g;
  if (t.id == "sft_qa_pairs") {
    g = parse_qa_pairs(text_field(t, config, "pairs"), text_field(t, config, "system_prompt"));
    progress(static_cast<int64_t>(g.rows.size()), static_cast<int64_t>(g.rows.size()));
  } else if (t.id == "dpo_pref_pairs") {
    g = parse_dpo_csv(text_field(t, config, "csv"));
    progress(static_cast<int64_t>(g.rows.size()), static_cast<int64_t>(g.rows.size()));
  } else if (t.id == "code_completion") {
    emit(jobs::stage_event("loading", 0.02, "reading " + text_field(t, config, "dir")));
    g = code_completion_rows(text_field(t, config, "dir"), static_cast<uint64_t>(number_field(t, config, "seed")),
                             code_limits(t, config), progress);
  } else if (t.id == "format_conversion") {
    emit(jobs::stage_event("loading", 0.02, "reading " + text_field(t, config, "path")));
    g = convert_jsonl(text_field(t, config, "path"), key_mapping(t, config), progress);
  } else if (t.needs_llm) {
    const LlmClient client = job_llm_client();
    const ChatParams params = chat_params(t, config);
    const ToolChatFn tool_chat = [&](const json& messages, const json& tools, bool require_call) {
      return client.chat_message(messages, params,
                                 {{"tools", tools}, {"tool_choice", require_call ? "required" : "auto"}});
    };
    g = run_llm_template(
        t, config, [&](const json& messages) { return client.chat(messages, params); }, progress, tool_chat);
  } else {
    throw Error(ErrorKind::Unsupported, "dataset: the " + t.id + " template cannot run here");
  }
  if (g.rows.empty())
    throw Error(ErrorKind::InvalidArgument, "dataset: the " + t.id + " template produced no rows (" +
                                                std::to_string(g.skipped) + " inputs skipped); nothing was written");
  const int64_t rows = static_cast<int64_t>(g.rows.size());
  emit(jobs::stage_event("writing", 0.95, std::to_string(rows) + " rows to " + out));
  const Split split = split_rows(std::move(g.rows));
  write_dataset(out, split);
  const json summary = {{"rows", rows},
                        {"train", static_cast<int64_t>(split.train.size())},
                        {"valid", static_cast<int64_t>(split.valid.size())},
                        {"skipped", g.skipped},
                        {"template", t.id},
                        {"output_format", t.output_format}};
  json done = jobs::stage_event("done", 1.0, "wrote " + out);
  done["output_dir"] = out;
  emit(done);
  return {out, summary};
}

}  // namespace lathe::dataset

namespace lathe::lab {

jobs::JobKind dataset_kind() {
  jobs::JobKind k;
  k.name = "dataset";
  k.path_fields = {"out", "dir", "path"};
  k.description =
      "training data from a template (Q/A pairs, preference CSV, code, JSONL conversion, or the served "
      "model) -> train.jsonl + valid.jsonl";
  k.validate = [](const jobs::json& c) { dataset::validate_dataset_config(c); };
  k.run = [](const jobs::Emit& emit, const jobs::json& c) { return dataset::run_dataset(emit, c); };
  return k;
}

}  // namespace lathe::lab
