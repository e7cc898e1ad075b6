#include "lab/train/train_data.h"
#include "chat/tool_calls.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/log.h"
#include "io/json_guard.h"

namespace lathe::train {
namespace {

using ojson = nlohmann::ordered_json;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  throw Error(ErrorKind::InvalidArgument, where + ": " + what);
}

std::string string_member(const ojson& row, const char* key, const std::string& where) {
  const auto& v = row[key];
  if (!v.is_string()) bad(where, std::string("'") + key + "' must be a string");
  return v.get<std::string>();
}

size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

void check_messages(const ojson& messages, const std::string& where) {
  if (!messages.is_array() || messages.empty()) bad(where, "'messages' must be a non-empty list");
  for (const auto& m : messages)
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      bad(where, "every message needs a string 'role'");
}

// A messages row's optional "tools" (mlx-lm's column): OpenAI function tools, each an object with a function name.
ojson row_tools(const ojson& row, const std::string& where) {
  auto it = row.find("tools");
  if (it == row.end() || it->is_null()) return nullptr;
  if (!it->is_array()) bad(where, "'tools' must be a list of tool schemas");
  for (const auto& t : *it)
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object() || !t["function"].contains("name") ||
        !t["function"]["name"].is_string())
      bad(where, "every tool in 'tools' needs a function with a string name");
  return *it;
}

// Assistant tool calls as templates read them: arguments sent as a JSON string (as OpenAI writes them) become the
// object they hold.
ojson with_call_arguments(const ojson& messages, const std::string& where) {
  ojson out = messages;
  for (auto& m : out) {
    auto calls = m.find("tool_calls");
    if (calls == m.end() || calls->is_null()) continue;
    if (!calls->is_array()) bad(where, "'tool_calls' must be a list");
    for (auto& c : *calls) {
      if (!c.is_object() || !c.contains("function") || !c["function"].is_object())
        bad(where, "every tool call needs a function");
      if (auto why = parse_call_arguments(c["function"])) bad(where, "a tool call's arguments are " + *why);
    }
  }
  return out;
}

std::string render(const TextCodec& codec, const ojson& messages, const ojson& tools, bool add_generation_prompt,
                   const std::string& where) {
  if (!codec.render) bad(where, "a messages row needs a chat template and this model has none");
  try {
    return codec.render(messages, tools, add_generation_prompt);
  } catch (const std::exception& e) {
    bad(where, std::string("the chat template failed: ") + e.what());
  }
}

// ids with targets from prompt_len on.
TrainSequence make_sequence(std::vector<int32_t> ids, size_t prompt_len) {
  TrainSequence s;
  s.target.assign(ids.size(), 0);
  for (size_t j = std::max<size_t>(prompt_len, 1); j < ids.size(); ++j) s.target[j] = 1;
  s.ids = std::move(ids);
  return s;
}

// The prompt boundary for a full render and its prompt render: their common prefix, clamped so >= 1 target.
size_t boundary(const std::vector<int32_t>& full, const std::vector<int32_t>& prompt) {
  size_t p = common_prefix(full, prompt);
  if (full.size() >= 2 && p >= full.size()) p = full.size() - 1;
  return p;
}

void drop_duplicate_bos(std::vector<int32_t>& ids, int32_t bos) {
  if (bos >= 0 && ids.size() >= 2 && ids[0] == bos && ids[1] == bos) ids.erase(ids.begin());
}

Example sft_example(RowFormat format, std::vector<int32_t> full, size_t prompt_len, int64_t max_seq, bool* truncated) {
  if (static_cast<int64_t>(full.size()) > max_seq) {
    full.resize(static_cast<size_t>(max_seq));
    if (truncated) *truncated = true;
  }
  Example e;
  e.format = format;
  e.prompt_len = static_cast<int64_t>(std::min(prompt_len, full.size()));
  e.seq = make_sequence(std::move(full), prompt_len);
  return e;
}

// Left truncation of one branch: drop the prompt's head first; if the response alone is too long, keep the
// last max_seq tokens with no prompt.
TrainSequence left_truncate(const std::vector<int32_t>& prompt, const std::vector<int32_t>& response, int64_t max_seq,
                            bool* truncated) {
  std::vector<int32_t> ids;
  size_t p = prompt.size();
  const size_t total = prompt.size() + response.size();
  const size_t limit = static_cast<size_t>(max_seq);
  if (total <= limit) {
    ids = prompt;
  } else {
    if (truncated) *truncated = true;
    const size_t excess = total - limit;
    if (excess < prompt.size()) {
      ids.assign(prompt.begin() + static_cast<std::ptrdiff_t>(excess), prompt.end());
      p = ids.size();
    } else {
      ids.assign(response.end() - static_cast<std::ptrdiff_t>(limit), response.end());
      return make_sequence(std::move(ids), 0);
    }
  }
  ids.insert(ids.end(), response.begin(), response.end());
  return make_sequence(std::move(ids), p);
}

std::vector<int32_t> tail(const std::vector<int32_t>& full, size_t from) {
  return {full.begin() + static_cast<std::ptrdiff_t>(std::min(from, full.size())), full.end()};
}

}  // namespace

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::Messages: return "messages";
    case RowFormat::PromptCompletion: return "prompt-completion";
    case RowFormat::Text: return "text";
    case RowFormat::Preference: return "preference";
  }
  return "unknown";
}

Example parse_row(const std::string& line, const std::string& where, const TextCodec& codec, int64_t max_seq,
                  bool preference, bool* truncated) {
  ojson row;
  try {
    row = io::parse_ordered_json_checked(line, io::request_json_limits(), ErrorKind::InvalidArgument, "row");
  } catch (const Error& e) {
    bad(where, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!row.is_object()) bad(where, "a row must be a JSON object");
  const bool is_pref = row.contains("chosen") || row.contains("rejected");
  if (preference && !is_pref) bad(where, "DPO and ORPO need preference rows {\"prompt\", \"chosen\", \"rejected\"}");
  if (is_pref) {
    if (!preference) bad(where, "a preference row (chosen/rejected) needs --method dpo or orpo");
    if (!row.contains("prompt") || !row.contains("chosen") || !row.contains("rejected"))
      bad(where, "a preference row needs 'prompt', 'chosen' and 'rejected'");
    std::string prompt_text;
    if (row["prompt"].is_string()) {
      prompt_text = row["prompt"].get<std::string>();
    } else {
      check_messages(row["prompt"], where);
      prompt_text = render(codec, row["prompt"], nullptr, true, where);
    }
    const std::string chosen = string_member(row, "chosen", where);
    const std::string rejected = string_member(row, "rejected", where);
    if (chosen.empty() || rejected.empty()) bad(where, "'chosen' and 'rejected' must not be empty");
    std::vector<int32_t> prompt_ids = codec.encode(prompt_text);
    std::vector<int32_t> c_full = codec.encode(prompt_text + chosen);
    std::vector<int32_t> r_full = codec.encode(prompt_text + rejected);
    drop_duplicate_bos(prompt_ids, codec.bos_id);
    drop_duplicate_bos(c_full, codec.bos_id);
    drop_duplicate_bos(r_full, codec.bos_id);
    const size_t pc = boundary(c_full, prompt_ids), pr = boundary(r_full, prompt_ids);
    const size_t p = std::min(pc, pr);
    const std::vector<int32_t> prompt(c_full.begin(), c_full.begin() + static_cast<std::ptrdiff_t>(p));
    Example e;
    e.format = RowFormat::Preference;
    e.seq = left_truncate(prompt, tail(c_full, p), max_seq, truncated);
    e.rejected = left_truncate(prompt, tail(r_full, p), max_seq, truncated);
    e.prompt_len = static_cast<int64_t>(p);
    return e;
  }
  if (row.contains("messages")) {
    check_messages(row["messages"], where);
    const ojson messages = with_call_arguments(row["messages"], where);
    const ojson tools = row_tools(row, where);
    size_t last = messages.size();
    for (size_t i = messages.size(); i-- > 0;)
      if (messages[i]["role"] == "assistant") {
        last = i;
        break;
      }
    if (last == messages.size()) bad(where, "'messages' has no assistant turn to learn from");
    std::vector<int32_t> full = codec.encode(render(codec, messages, tools, false, where));
    ojson before = ojson::array();
    for (size_t i = 0; i < last; ++i) before.push_back(messages[i]);
    std::vector<int32_t> prompt =
        before.empty() ? std::vector<int32_t>{} : codec.encode(render(codec, before, tools, true, where));
    drop_duplicate_bos(full, codec.bos_id);
    drop_duplicate_bos(prompt, codec.bos_id);
    const size_t b = boundary(full, prompt);
    return sft_example(RowFormat::Messages, std::move(full), b, max_seq, truncated);
  }
  if (row.contains("completion") || row.contains("prompt")) {
    if (!row.contains("completion") || !row.contains("prompt"))
      bad(where, "a prompt-completion row needs both 'prompt' and 'completion'");
    const std::string prompt = string_member(row, "prompt", where);
    const std::string completion = string_member(row, "completion", where);
    if (completion.empty()) bad(where, "'completion' must not be empty");
    std::vector<int32_t> full = codec.encode(prompt + completion);
    const std::vector<int32_t> p = codec.encode(prompt);
    const size_t b = boundary(full, p);
    return sft_example(RowFormat::PromptCompletion, std::move(full), b, max_seq, truncated);
  }
  if (row.contains("text")) {
    const std::string text = string_member(row, "text", where);
    return sft_example(RowFormat::Text, codec.encode(text), 0, max_seq, truncated);
  }
  bad(where,
      "unknown row format (expected 'messages', 'prompt'+'completion', 'text', or 'prompt'/'chosen'/'rejected')");
}

std::vector<Example> load_jsonl(const std::string& path, const TextCodec& codec, int64_t max_seq, bool preference,
                                LoadReport* report) {
  if (max_seq < 2) throw Error(ErrorKind::InvalidArgument, "max_seq_length must be at least 2");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, "cannot open the data file " + path);
  LoadReport r;
  std::vector<Example> out;
  std::string line;
  int64_t lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    const std::string where = path + ":" + std::to_string(lineno);
    if (line.size() > kMaxDataLineBytes)
      bad(where, "the line is longer than " + std::to_string(kMaxDataLineBytes) + " bytes");
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (++r.rows > kMaxDataRows) bad(where, "more than " + std::to_string(kMaxDataRows) + " rows");
    bool truncated = false;
    Example e = parse_row(line, where, codec, max_seq, preference, &truncated);
    e.where = where;
    if (truncated) ++r.truncated;
    const auto has_target = [](const TrainSequence& s) {
      return std::find(s.target.begin(), s.target.end(), uint8_t{1}) != s.target.end();
    };
    if (!has_target(e.seq) || (e.format == RowFormat::Preference && !has_target(e.rejected))) {
      ++r.skipped_no_targets;
      continue;
    }
    out.push_back(std::move(e));
  }
  if (in.bad()) throw Error(ErrorKind::Io, "error reading " + path);
  if (out.empty())
    throw Error(ErrorKind::InvalidArgument, path + ": no usable rows (" + std::to_string(r.rows) + " rows, " +
                                                std::to_string(r.skipped_no_targets) + " with nothing to learn)");
  if (r.skipped_no_targets > 0)
    log::warn(path + ": skipped " + std::to_string(r.skipped_no_targets) + " rows with no target token");
  if (report) *report = r;
  return out;
}

Dataset load_dataset(const std::string& data_dir, const TextCodec& codec, int64_t max_seq, bool preference) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::is_directory(data_dir, ec))
    throw Error(ErrorKind::NotFound, "the data directory " + data_dir + " does not exist");
  const std::string train = (fs::path(data_dir) / "train.jsonl").string();
  if (!fs::exists(train, ec))
    throw Error(ErrorKind::NotFound, "the data directory " + data_dir + " has no train.jsonl");
  Dataset d;
  d.train = load_jsonl(train, codec, max_seq, preference, &d.train_report);
  const std::string valid = (fs::path(data_dir) / "valid.jsonl").string();
  if (fs::exists(valid, ec)) d.valid = load_jsonl(valid, codec, max_seq, preference, &d.valid_report);
  return d;
}

std::string inspect_format(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorKind::NotFound, "cannot open the data file " + path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (line.size() > kMaxDataLineBytes) return "unknown";
    const auto j = ojson::parse(line, nullptr, false);
    if (!j.is_object()) return "unknown";
    if (j.contains("chosen") && j.contains("rejected")) return "preference";
    if (j.contains("messages")) return "messages";
    if (j.contains("prompt") && j.contains("completion")) return "prompt-completion";
    if (j.contains("text")) return "text";
    return "unknown";
  }
  return "unknown";
}

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double SplitMix64::uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

BatchPlan::BatchPlan(const std::vector<Example>& examples, int64_t batch_size, uint64_t seed) : seed_(seed) {
  LATHE_CHECK(!examples.empty() && batch_size >= 1, "a batch plan needs examples and a batch size");
  std::vector<size_t> order(examples.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return examples[a].length() < examples[b].length(); });
  const size_t b = static_cast<size_t>(batch_size);
  for (size_t at = 0; at < order.size(); at += b)
    windows_.emplace_back(order.begin() + static_cast<std::ptrdiff_t>(at),
                          order.begin() + static_cast<std::ptrdiff_t>(std::min(at + b, order.size())));
  // mlx-lm drops the remainder; keep it only when it is all there is (fewer rows than one batch).
  if (windows_.size() > 1 && windows_.back().size() < b) windows_.pop_back();
}

std::vector<size_t> BatchPlan::batch(int64_t i) const {
  const int64_t n = batches_per_epoch();
  const int64_t epoch = i / n;
  std::vector<size_t> perm(static_cast<size_t>(n));
  for (size_t k = 0; k < perm.size(); ++k) perm[k] = k;
  SplitMix64 rng(seed_ * 0x100000001B3ull + static_cast<uint64_t>(epoch));
  for (size_t k = perm.size(); k > 1; --k) std::swap(perm[k - 1], perm[rng.next() % k]);
  return windows_[perm[static_cast<size_t>(i % n)]];
}

}  // namespace lathe::train
