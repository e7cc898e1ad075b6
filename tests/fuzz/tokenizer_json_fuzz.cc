// tokenizer.json → Tokenizer, then a round trip through encode and decode.
#include "common/error.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  LATHE_FUZZ_EXPECTED_ERRORS({
    auto tok = lathe::Tokenizer::from_json(lathe::fuzz::text(data, size));
    const std::vector<int32_t> ids = tok->encode("Hello, world! 123 <|im_start|> héllo");
    (void)tok->decode(ids);
  });
  return 0;
}
