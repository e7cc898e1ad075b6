// Training data: <data_dir>/train.jsonl (+ optional valid.jsonl), one JSON object a line, the format detected per
// row (mlx-bun / mlx-lm semantics):
//  - {"messages": [...]}: rendered with the model's chat template; the supervised tokens are those after the
//    render of the messages before the last assistant turn with add_generation_prompt (only the final assistant
//    turn; longest common token prefix, clamped so at least one token is supervised);
//  - {"prompt", "completion"}: raw string concatenation, loss on the completion;
//  - {"text"}: loss on every token;
//  - {"prompt", "chosen", "rejected"} (DPO, ORPO): prompt is a raw string or a message list (rendered with
//    add_generation_prompt, thinking off); chosen / rejected appended as raw text.
// SFT rows are right-truncated to max_seq_length, preference rows left-truncated (the prompt's head goes first).
// A bad row is an InvalidArgument naming file:line.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lab/train/lora_gradient.h"

namespace lathe::train {

enum class RowFormat { Messages, PromptCompletion, Text, Preference };
const char* row_format_name(RowFormat f);

// What the data loader needs from a model: its tokenizer and chat template, as functions so tests can use a
// byte-level stand-in. render is empty when the model has no chat template (messages rows are then an error).
struct TextCodec {
  std::function<std::vector<int32_t>(const std::string& text)> encode;  // with the tokenizer's special tokens
  // tools: null, or the row's tool schemas (OpenAI function tools), rendered as the template renders a request's.
  std::function<std::string(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                            bool add_generation_prompt)>
      render;
  int32_t bos_id = -1;
};

struct Example {
  RowFormat format = RowFormat::Text;
  TrainSequence seq;       // SFT rows; the chosen branch of a preference row
  TrainSequence rejected;  // preference rows only
  int64_t prompt_len = 0;  // tokens before the first target (preference rows: shared by both branches)
  std::string where;       // "file:line"
  int64_t length() const { return static_cast<int64_t>(seq.ids.size() + rejected.ids.size()); }
};

struct LoadReport {
  int64_t rows = 0, skipped_no_targets = 0, truncated = 0;
};

// Limits on data input (files come from users and from HTTP job configs).
constexpr size_t kMaxDataLineBytes = 64 << 20;
constexpr int64_t kMaxDataRows = 10'000'000;

// Parses one row; throws InvalidArgument starting with `where`. preference: the method is DPO or ORPO (rows
// must then be preference rows, and preference rows need it).
Example parse_row(const std::string& line, const std::string& where, const TextCodec& codec, int64_t max_seq,
                  bool preference, bool* truncated);

// Reads a whole JSONL file. Blank lines are skipped; rows with no target left after truncation are skipped and
// counted. Throws NotFound for a missing file, InvalidArgument naming file:line for a bad row, and
// InvalidArgument when no usable row remains.
std::vector<Example> load_jsonl(const std::string& path, const TextCodec& codec, int64_t max_seq, bool preference,
                                LoadReport* report = nullptr);

struct Dataset {
  std::vector<Example> train, valid;  // valid is empty without valid.jsonl
  LoadReport train_report, valid_report;
};
Dataset load_dataset(const std::string& data_dir, const TextCodec& codec, int64_t max_seq, bool preference);

// The format of a data file's first row ("messages", "prompt-completion", "text", "preference" or "unknown").
std::string inspect_format(const std::string& path);

// Length-bucketed batches (mlx-lm iterate_batches): examples sorted by length, cut into contiguous windows of
// batch_size (a short tail window joins when nothing else is left), the window order shuffled per epoch from
// (seed, epoch). batch(i) is a pure function of i, so a resumed run sees the same batches.
class BatchPlan {
 public:
  BatchPlan(const std::vector<Example>& examples, int64_t batch_size, uint64_t seed);
  int64_t batches_per_epoch() const { return static_cast<int64_t>(windows_.size()); }
  // The example indices of the i-th batch of the infinite stream (i >= 0).
  std::vector<size_t> batch(int64_t i) const;

 private:
  std::vector<std::vector<size_t>> windows_;
  uint64_t seed_;
};

// A small, portable PRNG (splitmix64): the same numbers on every platform and standard library.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t next();
  double uniform();  // [0, 1)
  uint64_t state() const { return state_; }

 private:
  uint64_t state_;
};

}  // namespace lathe::train
