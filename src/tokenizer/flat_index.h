// Open-addressing hash tables for the BPE vocabulary (token text → id) and merges (id pair → rank, new id).
// A real vocabulary has 150k+ entries of each; node-based maps spent most of tokenizer load time allocating
// and chasing nodes, where these keep everything in a few flat arrays.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace lathe {

// Raw images of trivially copyable arrays, for the tokenizer cache: a length, then the bytes.
template <typename T>
void append_array(std::string& out, const std::vector<T>& v) {
  const uint64_t n = v.size();
  out.append(reinterpret_cast<const char*>(&n), sizeof n);
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}
template <typename T>
bool take_array(std::string_view& in, std::vector<T>& v) {
  uint64_t n = 0;
  if (in.size() < sizeof n) return false;
  std::memcpy(&n, in.data(), sizeof n);
  in.remove_prefix(sizeof n);
  if (n > in.size() / sizeof(T)) return false;
  v.resize(n);
  std::memcpy(v.data(), in.data(), n * sizeof(T));
  in.remove_prefix(n * sizeof(T));
  return true;
}

class TokenIndex {
 public:
  void reserve(size_t n);
  // Adds or replaces (JSON objects keep the last duplicate key).
  void insert_or_assign(std::string_view key, int32_t id);
  const int32_t* find(std::string_view key) const;
  size_t size() const { return entries_.size(); }
  void save(std::string& out) const;
  bool load(std::string_view& in);  // false on a malformed image
  template <typename F>
  void for_each(F f) const {
    for (const Entry& e : entries_) f(std::string_view(arena_).substr(e.offset, e.length), e.id);
  }

 private:
  struct Entry {
    uint32_t offset, length;
    int32_t id;
  };
  static uint64_t hash(std::string_view s);
  size_t slot_of(std::string_view key, uint64_t h) const;  // the slot holding key, or the empty slot to use
  void grow();

  std::string arena_;
  std::vector<Entry> entries_;
  struct Slot {
    uint32_t tag;   // high bits of the key's hash: most probes of other keys stop here
    int32_t entry;  // index into entries_, -1 = empty
  };
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

template <typename Value>
class PairIndex {
 public:
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap > keys_.size()) rehash(cap);
  }
  void insert(uint64_t key, Value v) {  // keeps the first value for a key (lowest merge rank wins)
    if ((size_ + 1) * 2 > keys_.size()) rehash(keys_.empty() ? 16 : keys_.size() * 2);
    size_t i = mix(key) & (keys_.size() - 1);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == key) return;
      i = (i + 1) & (keys_.size() - 1);
    }
    keys_[i] = key;
    values_[i] = v;
    ++size_;
  }
  void save(std::string& out) const {
    append_array(out, keys_);
    append_array(out, values_);
  }
  bool load(std::string_view& in) {
    if (!take_array(in, keys_) || !take_array(in, values_) || keys_.size() != values_.size()) return false;
    if (keys_.empty() || (keys_.size() & (keys_.size() - 1))) return keys_.empty();
    size_ = 0;
    for (uint64_t k : keys_) size_ += k != kEmpty;
    return true;
  }
  const Value* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    for (size_t i = mix(key) & (keys_.size() - 1);; i = (i + 1) & (keys_.size() - 1)) {
      if (keys_[i] == key) return &values_[i];
      if (keys_[i] == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // never a key: ids are non-negative
  static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
  }
  void rehash(size_t cap) {
    std::vector<uint64_t> keys(cap, kEmpty);
    std::vector<Value> values(cap);
    for (size_t j = 0; j < keys_.size(); ++j) {
      if (keys_[j] == kEmpty) continue;
      size_t i = mix(keys_[j]) & (cap - 1);
      while (keys[i] != kEmpty) i = (i + 1) & (cap - 1);
      keys[i] = keys_[j];
      values[i] = values_[j];
    }
    keys_.swap(keys);
    values_.swap(values);
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t size_ = 0;
};

struct BpeMerge {
  int32_t rank;
  int32_t new_id;
};

// The BPE model's lookup tables, as built from tokenizer.json or read back from the tokenizer cache.
struct BpeIndex {
  TokenIndex vocab;
  PairIndex<BpeMerge> merges;
};

}  // namespace lathe
