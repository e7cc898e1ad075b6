// config.json → ModelConfig: the JSON limits pass, then every key's type and range checks.
#include "common/error.h"
#include "fuzz_util.h"
#include "io/json_guard.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  LATHE_FUZZ_EXPECTED_ERRORS({
    const nlohmann::json j = lathe::io::parse_json_checked(lathe::fuzz::text(data, size), lathe::io::file_json_limits(),
                                                           lathe::ErrorKind::Corrupt, "config.json");
    lathe::ModelConfig c = lathe::parse_model_config(j, "fuzz");
    for (int64_t i = 0; i < c.num_layers; ++i) (void)c.rope_for_layer(i);
  });
  return 0;
}
