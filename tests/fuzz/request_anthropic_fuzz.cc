// Anthropic /v1/messages bodies → the template-ready conversation and generation parameters.
#include "common/error.h"
#include "fuzz_util.h"
#include "server/anthropic_request.h"
#include "server/api_error.h"
#include "server/json_fields.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lathe::server;
  ServerDefaults defaults;
  defaults.vocab_size = 1000;
  try {
    parse_anthropic_messages(parse_json_body(lathe::fuzz::text(data, size)), defaults);
  } catch (const ApiError&) {
  } catch (const lathe::Error&) {
  }
  return 0;
}
