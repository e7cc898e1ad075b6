// OpenAI request bodies → generation parameters: parse with limits, translate chat and completion fields.
#include "common/error.h"
#include "fuzz_util.h"
#include "server/api_error.h"
#include "server/generation_settings.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace lathe::server;
  ServerDefaults defaults;
  defaults.vocab_size = 1000;
  try {
    const nlohmann::ordered_json body = parse_json_body(lathe::fuzz::text(data, size));
    try {
      parse_openai_chat(body, defaults);
    } catch (const ApiError&) {
    } catch (const lathe::Error&) {
    }
    parse_generation_settings(body, defaults, ApiSurface::OpenAI);
  } catch (const ApiError&) {
  } catch (const lathe::Error&) {
  }
  return 0;
}
