#include "lab/quantize/kl_eval.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace lathe::lab {
namespace {

const char* const kPrompts[] = {
    ("The history of the printing press begins in the fifteenth century, when movable type changed how books were "
     "made and who could read them."),
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "Question: A train leaves at 9:40 and arrives at 11:15. How long is the journey? Answer: one hour and",
};

std::vector<double> log_softmax(const float* x, int64_t n) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, static_cast<double>(x[i]));
  double sum = 0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(x[i] - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = x[i] - lse;
  return out;
}

}  // namespace

jobs::json next_token_kl(const std::string& source_dir, const std::string& quantized_dir, int max_tokens) {
  try {
    auto src = load_model(source_dir);
    auto q = load_model(quantized_dir);
    std::shared_ptr<Tokenizer> tok;
    try {
      tok = Tokenizer::load(source_dir);
    } catch (const std::exception&) {
    }
    double sum = 0, mx = 0;
    int64_t positions = 0, agree = 0, prompts = 0;
    for (const char* text : kPrompts) {
      std::vector<int32_t> ids;
      if (tok) ids = tok->encode(text);
      const int64_t vocab_guess = std::max<int64_t>(2, src->config().get_int("vocab_size", 256));
      if (ids.empty())  // no tokenizer: a fixed pseudo-random id sequence
        for (int i = 0; i < max_tokens; ++i) ids.push_back(static_cast<int32_t>((i * 7919 + 13) % vocab_guess));
      if (static_cast<int>(ids.size()) > max_tokens) ids.resize(static_cast<size_t>(max_tokens));
      auto c1 = src->make_cache();
      auto c2 = q->make_cache();
      const Tensor a = src->forward(ids, c1, true), b = q->forward(ids, c2, true);
      const int64_t T = a.dim(0), V = a.dim(1);
      for (int64_t t = 0; t < T; ++t) {
        const auto p = log_softmax(a.data<float>() + t * V, V), r = log_softmax(b.data<float>() + t * V, V);
        double kl = 0;
        for (int64_t v = 0; v < V; ++v)
          kl += std::exp(p[static_cast<size_t>(v)]) * (p[static_cast<size_t>(v)] - r[static_cast<size_t>(v)]);
        sum += kl;
        mx = std::max(mx, kl);
        agree += std::max_element(p.begin(), p.end()) - p.begin() == std::max_element(r.begin(), r.end()) - r.begin();
        ++positions;
      }
      ++prompts;
    }
    return {{"mean_kl", positions ? sum / positions : 0.0},
            {"max_kl", mx},
            {"top1_agreement", positions ? static_cast<double>(agree) / positions : 0.0},
            {"positions", positions},
            {"prompts", prompts}};
  } catch (const std::exception& e) {
    return {{"error", std::string("not measured: ") + e.what()}};
  }
}

}  // namespace lathe::lab
