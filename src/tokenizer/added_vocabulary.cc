#include "tokenizer/added_vocabulary.h"

#include "common/limits.h"

#include "tokenizer/unicode.h"
#include "tokenizer/utf8.h"

namespace lathe {

AddedVocabulary::AddedVocabulary(const JsonAt& list, const Normalizer* normalizer) {
  const size_t n = list.size();
  tokens_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const JsonAt t = list.at(i);
    AddedToken tok;
    const int64_t id = t.at("id").integer();
    if (id < 0 || id > limits::kTokenizerMaxId)
      t.at("id").fail("a token id must be an integer from 0 to " + std::to_string(limits::kTokenizerMaxId));
    tok.id = static_cast<int32_t>(id);
    tok.content = t.str("content");
    if (tok.content.empty()) t.at("content").fail("an added token cannot be empty");
    tok.special = t.boolean_or("special", false);
    tok.lstrip = t.boolean_or("lstrip", false);
    tok.rstrip = t.boolean_or("rstrip", false);
    tok.single_word = t.boolean_or("single_word", false);
    tok.normalized = t.boolean_or("normalized", !tok.special);
    by_id_[tok.id] = tokens_.size();
    by_content_[tok.content] = tok.id;
    tokens_.push_back(std::move(tok));
  }
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const AddedToken& tok = tokens_[i];
    if (tok.normalized && normalizer) {
      const std::string key = normalizer->normalize(tok.content);
      if (!key.empty()) normalized_.add(key, static_cast<int32_t>(i));
    } else if (tok.normalized) {
      normalized_.add(tok.content, static_cast<int32_t>(i));
    } else {
      raw_.add(tok.content, static_cast<int32_t>(i));
    }
  }
}

const AddedToken* AddedVocabulary::find(int32_t id) const {
  const auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::token_to_id(std::string_view content) const {
  const auto it = by_content_.find(std::string(content));
  if (it == by_content_.end()) return std::nullopt;
  return it->second;
}

void AddedVocabulary::Matcher::add(const std::string& key, int32_t token_index) {
  int32_t node = 0;
  for (char c : key) {
    const auto b = static_cast<uint8_t>(c);
    int32_t child = -1;
    for (const auto& [byte, idx] : nodes_[node].children)
      if (byte == b) child = idx;
    if (child < 0) {
      child = static_cast<int32_t>(nodes_.size());
      nodes_[node].children.emplace_back(b, child);
      nodes_.emplace_back();
    }
    node = child;
  }
  if (nodes_[node].token < 0) nodes_[node].token = token_index;  // the first of duplicate contents wins
}

int32_t AddedVocabulary::Matcher::longest_at(std::string_view text, size_t pos, size_t& end) const {
  int32_t node = 0, found = -1;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    int32_t child = -1;
    for (const auto& [byte, idx] : nodes_[node].children)
      if (byte == b) {
        child = idx;
        break;
      }
    if (child < 0) break;
    node = child;
    if (nodes_[node].token >= 0) {
      found = nodes_[node].token;
      end = i + 1;
    }
  }
  return found;
}

std::vector<Segment> AddedVocabulary::Matcher::split(std::string_view text,
                                                     const std::vector<AddedToken>& tokens) const {
  std::vector<Segment> out;
  if (nodes_[0].children.empty()) {
    if (!text.empty()) out.push_back({text, -1});
    return out;
  }
  std::array<bool, 256> first{};
  for (const auto& [byte, idx] : nodes_[0].children) first[byte] = true;
  size_t plain_from = 0;  // start of the text not yet emitted
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = 0;
    const int32_t t = first[static_cast<uint8_t>(text[pos])] ? longest_at(text, pos, end) : -1;
    if (t < 0) {
      ++pos;
      continue;
    }
    const AddedToken& tok = tokens[t];
    size_t start = pos;
    if (tok.single_word) {
      size_t before = 0;
      const bool word_before = start > 0 && unicode::is_word_char(utf8::prev(text, start, before));
      size_t after = end;
      const bool word_after = end < text.size() && unicode::is_word_char(utf8::next(text, after));
      if (word_before || word_after) {
        pos = end;  // the reference's match iterator resumes after a rejected match
        continue;
      }
    }
    if (tok.lstrip) {
      while (start > plain_from) {
        size_t before = 0;
        if (!unicode::is_whitespace(utf8::prev(text, start, before))) break;
        start = before;
      }
    }
    if (tok.rstrip) {
      while (end < text.size()) {
        size_t after = end;
        if (!unicode::is_whitespace(utf8::next(text, after))) break;
        end = after;
      }
    }
    if (start > plain_from) out.push_back({text.substr(plain_from, start - plain_from), -1});
    out.push_back({std::string_view(), tok.id});
    plain_from = pos = end;
  }
  if (plain_from < text.size()) out.push_back({text.substr(plain_from), -1});
  return out;
}

}  // namespace lathe
