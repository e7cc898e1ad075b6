#include "tokenizer/flat_index.h"

#include <cstring>

namespace lathe {

uint64_t TokenIndex::hash(std::string_view s) {
  // FNV-1a over 8-byte words, then a final mix: tokens are short, so this is a handful of multiplies.
  uint64_t h = 0xcbf29ce484222325ull ^ s.size();
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    std::memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0x100000001b3ull;
  }
  uint64_t tail = 0;
  std::memcpy(&tail, s.data() + i, s.size() - i);
  h = (h ^ tail) * 0x100000001b3ull;
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

void TokenIndex::reserve(size_t n) {
  entries_.reserve(n);
  arena_.reserve(n * 8);
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap > slots_.size()) {
    slots_.assign(cap, Slot{0, -1});
    mask_ = cap - 1;
    for (size_t e = 0; e < entries_.size(); ++e) {
      const std::string_view key = std::string_view(arena_).substr(entries_[e].offset, entries_[e].length);
      const uint64_t h = hash(key);
      slots_[slot_of(key, h)] = Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(e)};
    }
  }
}

size_t TokenIndex::slot_of(std::string_view key, uint64_t h) const {
  const uint32_t tag = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    if (s.entry < 0) return i;
    if (s.tag != tag) continue;
    const Entry& en = entries_[static_cast<size_t>(s.entry)];
    if (en.length == key.size() && std::memcmp(arena_.data() + en.offset, key.data(), key.size()) == 0) return i;
  }
}

void TokenIndex::grow() { reserve(slots_.empty() ? 8 : slots_.size()); }

void TokenIndex::insert_or_assign(std::string_view key, int32_t id) {
  if ((entries_.size() + 1) * 2 > slots_.size()) grow();
  const uint64_t h = hash(key);
  const size_t slot = slot_of(key, h);
  if (slots_[slot].entry >= 0) {
    entries_[static_cast<size_t>(slots_[slot].entry)].id = id;
    return;
  }
  slots_[slot] = Slot{static_cast<uint32_t>(h >> 32), static_cast<int32_t>(entries_.size())};
  entries_.push_back(Entry{static_cast<uint32_t>(arena_.size()), static_cast<uint32_t>(key.size()), id});
  arena_.append(key);
}

const int32_t* TokenIndex::find(std::string_view key) const {
  if (slots_.empty()) return nullptr;
  const int32_t e = slots_[slot_of(key, hash(key))].entry;
  return e < 0 ? nullptr : &entries_[static_cast<size_t>(e)].id;
}

void TokenIndex::save(std::string& out) const {
  const std::vector<char> arena(arena_.begin(), arena_.end());
  append_array(out, arena);
  append_array(out, entries_);
  append_array(out, slots_);
}

bool TokenIndex::load(std::string_view& in) {
  std::vector<char> arena;
  if (!take_array(in, arena) || !take_array(in, entries_) || !take_array(in, slots_)) return false;
  arena_.assign(arena.begin(), arena.end());
  if (slots_.empty() || (slots_.size() & (slots_.size() - 1))) return false;
  mask_ = slots_.size() - 1;
  // Every reference must stay inside the arrays, or a damaged image could read out of bounds.
  for (const Entry& e : entries_)
    if (uint64_t{e.offset} + e.length > arena_.size() || e.id < 0 || e.id >= (1 << 26)) return false;
  for (const Slot& sl : slots_)
    if (sl.entry >= static_cast<int64_t>(entries_.size())) return false;
  return entries_.size() * 2 <= slots_.size();
}

}  // namespace lathe
