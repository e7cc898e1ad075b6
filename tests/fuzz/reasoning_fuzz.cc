// Model output → reasoning and content (<think> splitting), fed in uneven pieces as a stream would.
#include "chat/reasoning_splitter.h"
#include "common/error.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text = lathe::fuzz::text(data + 1, size - 1);
  const size_t step = 1 + data[0] % 13;
  LATHE_FUZZ_EXPECTED_ERRORS({
    lathe::ReasoningSplitter s((data[0] & 0x80) != 0);
    for (size_t i = 0; i < text.size(); i += step) (void)s.push(std::string_view(text).substr(i, step));
    (void)s.flush();
  });
  return 0;
}
