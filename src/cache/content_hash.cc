#include "cache/content_hash.h"

#include <xxhash.h>

#include <cstdio>

#include "common/error.h"

namespace lathe {

uint64_t hash64(const void* data, size_t size) { return XXH3_64bits(data, size); }

uint64_t hash64_concat(const void* a, size_t a_size, const void* b, size_t b_size) {
  XXH3_state_t* s = XXH3_createState();
  LATHE_CHECK(s != nullptr, "XXH3_createState failed");
  XXH3_64bits_reset(s);
  XXH3_64bits_update(s, a, a_size);
  XXH3_64bits_update(s, b, b_size);
  const uint64_t h = XXH3_64bits_digest(s);
  XXH3_freeState(s);
  return h;
}

std::string hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool parse_hex64(std::string_view s, uint64_t* out) {
  if (s.size() != 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9')
      d = c - '0';
    else if (c >= 'a' && c <= 'f')
      d = c - 'a' + 10;
    else
      return false;
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

struct Digest128::State {
  XXH3_state_t* s = nullptr;
};

Digest128::Digest128() : state_(std::make_unique<State>()) {
  state_->s = XXH3_createState();
  LATHE_CHECK(state_->s != nullptr, "XXH3_createState failed");
  XXH3_128bits_reset(state_->s);
}

Digest128::~Digest128() { XXH3_freeState(state_->s); }

Digest128& Digest128::add(const void* data, size_t size) {
  const uint64_t n = size;
  XXH3_128bits_update(state_->s, &n, sizeof n);
  if (size > 0) XXH3_128bits_update(state_->s, data, size);
  return *this;
}

Digest128& Digest128::add_int(int64_t v) { return add(&v, sizeof v); }

std::string Digest128::hex() const {
  const XXH128_hash_t h = XXH3_128bits_digest(state_->s);
  return hex64(h.high64) + hex64(h.low64);
}

}  // namespace lathe
