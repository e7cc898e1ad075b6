// libFuzzer target: the KV file v2 prefix + header parser (cache/kv_file.h parse_kv_header). Bit 0 of the
// first byte picks the mode: 0 parses the input as a whole file as it is; 1 takes the rest as the JSON header
// and frames it with a valid prefix and hash, so mutations reach the JSON checks behind the hash. Either way
// the parser must return a header or throw lathe::Error — never crash, hang or read outside the input.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cache/content_hash.h"
#include "cache/kv_file.h"
#include "common/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  try {
    if ((data[0] & 1) == 0) {
      lathe::parse_kv_header(data + 1, size - 1, size - 1);
      return 0;
    }
    const uint8_t* json = data + 1;
    const size_t n = size - 1;
    const uint64_t start =
        (lathe::kKvFilePrefixBytes + n + lathe::kKvFileAlign - 1) / lathe::kKvFileAlign * lathe::kKvFileAlign;
    std::vector<uint8_t> file(lathe::kKvFilePrefixBytes + n);
    std::memcpy(file.data(), lathe::kKvFileMagic, sizeof lathe::kKvFileMagic);
    for (int i = 0; i < 4; ++i) {
      file[8 + static_cast<size_t>(i)] = static_cast<uint8_t>(n >> (8 * i));
      file[12 + static_cast<size_t>(i)] = static_cast<uint8_t>(start >> (8 * i));
    }
    if (n > 0) std::memcpy(file.data() + lathe::kKvFilePrefixBytes, json, n);
    const uint64_t h = lathe::hash64_concat(file.data() + 8, 8, json, n);
    for (int i = 0; i < 8; ++i) file[16 + static_cast<size_t>(i)] = static_cast<uint8_t>(h >> (8 * i));
    // Only the prefix and header are read; the tensors are said to fill 1 GiB after the data start.
    lathe::parse_kv_header(file.data(), file.size(), start + (uint64_t{1} << 30));
  } catch (const lathe::Error&) {
  }
  return 0;
}
