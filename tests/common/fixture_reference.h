// Test helpers for the reference fixtures (tests/fixtures/models/<name>): prompts and greedy continuation from
// reference.json, reference logits from reference.safetensors as Tensors, and the parity comparison (max |Δ|
// against 1e-3·max(1, max|ref|), argmax agreement per position) over Tensors. Builds on support/fixtures.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/mapped_file.h"
#include "io/safetensors.h"
#include "support/fixtures.h"
#include "tensor/ops.h"

namespace lathe::testing {

inline std::string fixture_dir(const std::string& name) { return test::model_dir(name); }

struct Reference {
  nlohmann::json json;
  std::shared_ptr<SafetensorsFile> logits;

  static Reference load(const std::string& name) {
    Reference r;
    r.json = nlohmann::json::parse(read_text_file(fixture_dir(name) + "/reference.json"));
    r.logits = SafetensorsFile::open(fixture_dir(name) + "/reference.safetensors");
    return r;
  }
  std::vector<int32_t> prompt(const std::string& key) const { return json["prompts"][key].get<std::vector<int32_t>>(); }
  std::vector<int32_t> greedy() const { return json["greedy_continuation"].get<std::vector<int32_t>>(); }
  Tensor logits_of(const std::string& key) const { return logits->get("logits_" + key); }
};

struct Diff {
  double max_abs = 0, max_ref = 0;
  int64_t rows = 0, argmax_agree = 0;
  int64_t near_ties = 0;  // rows whose argmax differs but whose pick is within twice the row's error of the best
  bool ok() const { return max_abs <= 1e-3 * std::max(1.0, max_ref) && argmax_agree == rows; }
  // ok(), except that a flip between tokens the reference itself separates by less than the error is allowed.
  bool ok_up_to_near_ties() const {
    return max_abs <= 1e-3 * std::max(1.0, max_ref) && argmax_agree + near_ties == rows;
  }
};

// got and ref: [T, vocab] (any float dtype).
inline Diff compare_logits(const Tensor& got, const Tensor& ref) {
  Diff d;
  const std::vector<float> g = got.to_floats(), r = ref.to_floats();
  const int64_t T = ref.dim(0), V = ref.dim(1);
  d.rows = T;
  if (got.dim(0) != T || got.dim(1) != V) {
    d.max_abs = INFINITY;
    return d;
  }
  for (int64_t t = 0; t < T; ++t) {
    const float* gr = g.data() + t * V;
    const float* rr = r.data() + t * V;
    double row_err = 0;
    for (int64_t v = 0; v < V; ++v) {
      row_err = std::max(row_err, static_cast<double>(std::fabs(gr[v] - rr[v])));
      d.max_ref = std::max(d.max_ref, static_cast<double>(std::fabs(rr[v])));
    }
    d.max_abs = std::max(d.max_abs, row_err);
    const int64_t ga = std::max_element(gr, gr + V) - gr, ra = std::max_element(rr, rr + V) - rr;
    if (ga == ra)
      ++d.argmax_agree;
    else if (static_cast<double>(rr[ra] - rr[ga]) <= 2 * row_err)
      ++d.near_ties;
  }
  return d;
}

// Rows of [1, V] (or [n, V]) tensors stacked into one [T, V] f32 tensor.
inline Tensor stack_rows(const std::vector<Tensor>& rows) {
  std::vector<float> all;
  int64_t V = 0, T = 0;
  for (const Tensor& r : rows) {
    const std::vector<float> f = r.to_floats();
    all.insert(all.end(), f.begin(), f.end());
    V = r.dim(1);
    T += r.dim(0);
  }
  return Tensor::from_floats(all, {T, V});
}

}  // namespace lathe::testing
