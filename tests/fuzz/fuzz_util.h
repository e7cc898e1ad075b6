// Shared by the libFuzzer targets: the input as text, and the errors a target treats as a clean rejection.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace lathe::fuzz {

inline std::string text(const uint8_t* data, size_t size) {
  return std::string(reinterpret_cast<const char*>(data), size);
}

}  // namespace lathe::fuzz

// Runs `body`; lathe's typed errors (and the server's ApiError, which derives from std::exception) are the
// expected answers to bad input. Anything else escaping (or a crash, leak, hang) is a finding.
#define LATHE_FUZZ_EXPECTED_ERRORS(body) \
  try {                                  \
    body;                                \
  } catch (const ::lathe::Error&) {      \
  }
