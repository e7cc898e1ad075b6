#include "tokenizer/bpe.h"

#include <cstdio>
#include <queue>

#include "tokenizer/utf8.h"

namespace lathe {
namespace {

constexpr size_t kCacheCapacity = 200000;
constexpr size_t kCacheMaxWordBytes = 256;

// Splits a merges entry, either "a b" (legacy) or ["a", "b"].
std::pair<std::string, std::string> parse_merge(const JsonAt& entry) {
  if (entry.value().is_string()) {
    const std::string s = entry.str();
    const size_t sp = s.find(' ');
    if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
      entry.fail("a merge string must hold two tokens separated by one space");
    return {s.substr(0, sp), s.substr(sp + 1)};
  }
  if (!entry.value().is_array() || entry.value().size() != 2) entry.fail("a merge must be \"a b\" or [\"a\", \"b\"]");
  return {entry.at(size_t{0}).str(), entry.at(size_t{1}).str()};
}

}  // namespace

namespace {

// The tables from a JSON tree, for documents that did not come through parse_tokenizer_json.
void tables_from_tree(const JsonAt& model, BpeTables& t) {
  if (!t.vocab_captured) {
    const JsonAt vocab = model.at("vocab");
    if (!vocab.value().is_object()) vocab.fail("expected an object of token -> id");
    for (const auto& [token, id] : vocab.value().items()) {
      if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > INT32_MAX)
        JsonAt(id, vocab.path() + "[\"" + token + "\"]").fail("a token id must be a non-negative integer");
      t.vocab.emplace_back(token, id.get<int64_t>());
    }
  }
  if (!t.merges_captured) {
    const JsonAt merges = model.at("merges");
    const size_t n = merges.size();
    t.merges.reserve(n);
    for (size_t i = 0; i < n; ++i) t.merges.push_back(parse_merge(merges.at(i)));
  }
}

}  // namespace

Bpe::Bpe(const JsonAt& model, BpeTables tables) {
  if (!tables.error.empty()) JsonAt(model.value(), tables.error_path).fail(tables.error);
  const bool prebuilt = tables.prebuilt.has_value();
  if (prebuilt) {
    vocab_ = std::move(tables.prebuilt->vocab);
    merges_ = std::move(tables.prebuilt->merges);
  } else {
    tables_from_tree(model, tables);
    vocab_.reserve(tables.vocab.size());
    for (const auto& [token, id] : tables.vocab) vocab_.insert_or_assign(token, static_cast<int32_t>(id));
  }
  int64_t max_id = -1;
  vocab_.for_each([&](std::string_view, int32_t id) { max_id = std::max<int64_t>(max_id, id); });
  id_to_token_.resize(static_cast<size_t>(max_id + 1));
  vocab_.for_each([&](std::string_view token, int32_t id) { id_to_token_[id] = token; });

  if (model.has("continuing_subword_prefix")) prefix_ = model.str("continuing_subword_prefix");
  if (model.has("end_of_word_suffix")) suffix_ = model.str("end_of_word_suffix");
  byte_fallback_ = model.boolean_or("byte_fallback", false);
  fuse_unk_ = model.boolean_or("fuse_unk", false);
  ignore_merges_ = model.boolean_or("ignore_merges", false);
  if (model.has("dropout")) {
    const JsonAt dropout = model.at("dropout");
    if (!dropout.value().is_number()) dropout.fail("expected a number");
    if (dropout.value().get<double>() != 0.0) dropout.unsupported("BPE dropout is not supported");
  }
  if (model.has("unk_token")) {
    const JsonAt unk = model.at("unk_token");
    const int32_t* id = vocab_.find(unk.str());
    if (!id) unk.fail("unk_token '" + unk.str() + "' is not in the vocabulary");
    unk_id_ = *id;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    const int32_t* id = vocab_.find(std::string_view(name));
    byte_ids_[b] = id ? *id : -1;
  }

  if (prebuilt) return;
  merges_.reserve(tables.merges.size());
  std::string joined;
  for (size_t i = 0; i < tables.merges.size(); ++i) {
    const auto& [a, b] = tables.merges[i];
    const int32_t *ia = vocab_.find(a), *ib = vocab_.find(b);
    auto fail = [&](const std::string& what) {
      JsonAt(model.value(), "model.merges[" + std::to_string(i) + "]").fail(what);
    };
    if (!ia || !ib) fail("merge token '" + (!ia ? a : b) + "' is not in the vocabulary");
    const std::string_view tail =
        std::string_view(b).substr(!prefix_.empty() && b.compare(0, prefix_.size(), prefix_) == 0 ? prefix_.size() : 0);
    joined.assign(a);
    joined.append(tail);
    const int32_t* inew = vocab_.find(joined);
    if (!inew) fail("merged token '" + joined + "' is not in the vocabulary");
    merges_.insert(pair_key(*ia, *ib), Merge{static_cast<int32_t>(i), *inew});
  }
}

void Bpe::save_index(std::string& out) const {
  vocab_.save(out);
  merges_.save(out);
}

std::optional<int32_t> Bpe::token_to_id(std::string_view token) const {
  const int32_t* id = vocab_.find(token);
  if (!id) return std::nullopt;
  return *id;
}

const std::string* Bpe::id_to_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size() || id_to_token_[id].empty()) return nullptr;
  return &id_to_token_[id];
}

void Bpe::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (const int32_t* id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  if (cacheable) {
    std::shared_lock lock(cache_mutex_);
    const auto it = cache_.find(word);
    if (it != cache_.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out.size();
  merge_word(word, out);
  if (cacheable) {
    std::unique_lock lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity)
      cache_.emplace(std::string(word), std::vector<int32_t>(out.begin() + first, out.end()));
  }
}

void Bpe::merge_word(std::string_view word, std::vector<int32_t>& out) const {
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  std::vector<Symbol> symbols;
  symbols.reserve(word.size());
  auto push = [&](int32_t id) {
    const auto n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  bool last_was_unk = false;
  std::string piece;
  size_t i = 0;
  while (i < word.size()) {
    const size_t begin = i;
    utf8::next(word, i);
    std::string_view ch = word.substr(begin, i - begin);
    if ((!prefix_.empty() && begin > 0) || (!suffix_.empty() && i == word.size())) {
      piece.assign(begin > 0 ? prefix_ : std::string());
      piece.append(ch);
      if (i == word.size()) piece.append(suffix_);
      ch = piece;
    }
    if (const int32_t* id = vocab_.find(ch)) {
      push(*id);
      last_was_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : ch) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
      if (all) {
        for (char c : ch) push(byte_ids_[static_cast<uint8_t>(c)]);
        last_was_unk = false;
        continue;
      }
    }
    if (unk_id_) {
      if (!(fuse_unk_ && last_was_unk)) push(*unk_id_);
      last_was_unk = true;
    }
    // Without an unk token an unknown character is dropped, as the reference does.
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Candidate merges ordered by (rank, position); stale entries are skipped when popped.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
  auto consider = [&](int32_t left) {
    if (left < 0) return;
    const int32_t right = symbols[left].next;
    if (right < 0) return;
    if (const Merge* m = merges_.find(pair_key(symbols[left].id, symbols[right].id)))
      queue.push({m->rank, left, m->new_id});
  };
  for (int32_t k = 0; k + 1 < static_cast<int32_t>(symbols.size()); ++k) consider(k);
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = symbols[c.pos];
    if (!left.alive || left.next < 0) continue;
    const Symbol& right = symbols[left.next];
    const Merge* m = merges_.find(pair_key(left.id, right.id));
    if (!m || m->new_id != c.new_id) continue;  // the pair changed since it was queued
    const int32_t gone = left.next;
    left.id = c.new_id;
    left.next = right.next;
    symbols[gone].alive = false;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    consider(left.prev);
    consider(c.pos);
  }
  for (int32_t k = 0; k >= 0; k = symbols[k].next) out.push_back(symbols[k].id);
}

}  // namespace lathe
