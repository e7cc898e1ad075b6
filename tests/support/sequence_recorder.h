// A SequenceSink that keeps what a scheduled sequence produced, for the scheduler's tests.
#pragma once
#include <cstdint>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace lathe::testutil {

struct Recorder : SequenceSink {
  std::vector<int32_t> ids;
  std::vector<float> logprobs;
  std::string text;
  std::optional<GenerateResult> result;
  std::exception_ptr error;
  void on_token(const GeneratedToken& t) override {
    if (t.id >= 0) {
      ids.push_back(t.id);
      logprobs.push_back(t.sample.logprob);
    }
    text += t.text;
  }
  void on_finish(GenerateResult r) override { result = std::move(r); }
  void on_error(std::exception_ptr e) override { error = e; }
  bool done() const { return result.has_value() || error; }
};

}  // namespace lathe::testutil
