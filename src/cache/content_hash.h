// xxHash (XXH3) for the prompt cache: 64-bit checksums of KV file headers and tensors, 128-bit digests for
// cache identities, printed as fixed-width lowercase hex.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace lathe {

uint64_t hash64(const void* data, size_t size);
// The hash of a followed by b (as if concatenated).
uint64_t hash64_concat(const void* a, size_t a_size, const void* b, size_t b_size);
std::string hex64(uint64_t v);  // 16 hex digits, zero-padded
// Parses exactly 16 hex digits; false on anything else.
bool parse_hex64(std::string_view s, uint64_t* out);

// Streaming 128-bit digest. Each add() is framed with its length, so ("ab","c") and ("a","bc") differ.
class Digest128 {
 public:
  Digest128();
  ~Digest128();
  Digest128(const Digest128&) = delete;
  Digest128& operator=(const Digest128&) = delete;
  Digest128& add(const void* data, size_t size);
  Digest128& add(std::string_view s) { return add(s.data(), s.size()); }
  Digest128& add_int(int64_t v);
  std::string hex() const;  // 32 hex digits

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace lathe
