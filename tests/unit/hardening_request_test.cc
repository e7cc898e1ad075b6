// Hostile request bodies (issue #12): every one is a quick 400 that says what is wrong, never a crash, a
// quadratic parse or a 500.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "common/limits.h"
#include "io/json_guard.h"
#include "server/api_error.h"
#include "server/generation_settings.h"
#include "server/json_fields.h"
#include "server/openai_request.h"

namespace lathe::server {
namespace {

using json = nlohmann::ordered_json;
using Clock = std::chrono::steady_clock;

// The ApiError parse_json_body throws for `body` (status 0 when it parses).
ApiError body_error(const std::string& body) {
  try {
    parse_json_body(body);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "");
}

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string nested(const std::string& open, const std::string& close, int levels, const std::string& inner) {
  std::string s;
  for (int i = 0; i < levels; ++i) s += open;
  s += inner;
  for (int i = 0; i < levels; ++i) s += close;
  return s;
}

TEST(HardeningRequest, DeepNestingIsA400) {
  // 20k levels of arrays in a field the template reads crashed the server (SIGSEGV); 15k passed.
  const std::string body =
      R"({"model":"m","messages":[{"role":"user","content":"hi","extra":)" + nested("[", "]", 20000, "1") + "}]}";
  const ApiError e = body_error(body);
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("nested deeper than"), std::string::npos) << e.what();
  // Objects count too, and the limit itself is accepted.
  EXPECT_EQ(body_error(R"({"a":)" + nested(R"({"b":)", "}", 20000, "1") + "}").status(), 400);
  EXPECT_EQ(body_error(R"({"a":)" + nested("[", "]", limits::kJsonMaxDepth - 1, "1") + "}").status(), 0);
}

TEST(HardeningRequest, ToolCallArgumentsGetTheBodyLimits) {
  // Arguments arrive as a JSON string, which the body's pass sees as flat text: 200k nested brackets in one
  // crashed the server (SIGSEGV) once parsed and handed to the template.
  auto status = [](const std::string& arguments) {
    const json body = {
        {"messages",
         {{{"role", "user"}, {"content", "x"}},
          {{"role", "assistant"},
           {"tool_calls",
            {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", arguments}}}}}}}}}};
    try {
      parse_openai_chat(body, ServerDefaults{});
    } catch (const ApiError& e) {
      EXPECT_NE(std::string(e.what()).find("messages[1].tool_calls[0].function.arguments"), std::string::npos);
      return e.status();
    }
    return 0;
  };
  EXPECT_EQ(status(nested("[", "]", 200000, "")), 400);
  EXPECT_EQ(status(nested(R"({"a":)", "}", 200000, "1")), 400);
  EXPECT_EQ(status(nested("[", "]", limits::kJsonMaxDepth - 1, "")), 0);
  EXPECT_EQ(status(R"({"city":"Paris"})"), 0);
}

TEST(HardeningRequest, ManyKeysAreRefusedQuickly) {
  // 100k keys took 25.8 s of CPU in ordered_json's duplicate checks.
  std::string body = "{";
  for (int i = 0; i < 100000; ++i) body += (i ? ",\"k" : "\"k") + std::to_string(i) + "\":1";
  body += "}";
  const auto t0 = Clock::now();
  const ApiError e = body_error(body);
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("keys"), std::string::npos) << e.what();
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST(HardeningRequest, OutOfRangeNumberIsA400) {
  // 1e999 was a 500 (nlohmann's out_of_range escaped as an internal error).
  const ApiError e = body_error(R"({"model":"m","temperature":1e999})");
  EXPECT_EQ(e.status(), 400);
  EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
}

TEST(HardeningRequest, AWholeNumberPastInt64IsOutOfRangeNotAFraction) {
  auto error = [](const char* body) {
    try {
      parse_generation_settings(parse_json_body(body), ServerDefaults{}, ApiSurface::OpenAI);
    } catch (const ApiError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(R"({"seed":1180591620717411303424})"),
            "seed must be an integer in [-9223372036854775808, 9223372036854775807]");
  EXPECT_EQ(error(R"({"seed":1.5})"), "seed must be an integer");
  EXPECT_EQ(error(R"({"seed":18446744073709551615})"), "");  // a uint64 is taken (as INT64_MAX)
  EXPECT_EQ(error(R"({"top_k":3.0})"), "");
}

TEST(HardeningRequest, LogitBiasIsBoundedAndCheckedAgainstTheVocabulary) {
  ServerDefaults d;
  d.vocab_size = 1000;
  auto status = [&](const json& body) {
    try {
      parse_generation_settings(body, d, ApiSurface::OpenAI);
    } catch (const ApiError& e) {
      return e.status();
    }
    return 0;
  };
  EXPECT_EQ(status({{"logit_bias", {{"999", 5}}}}), 0);
  EXPECT_EQ(status({{"logit_bias", {{"1000", 5}}}}), 400);  // ids >= vocab were accepted
  json many = json::object();
  for (size_t i = 0; i <= limits::kLogitBiasMaxEntries; ++i) many[std::to_string(i)] = 1;
  d.vocab_size = 1 << 20;
  const auto t0 = Clock::now();
  EXPECT_EQ(status({{"logit_bias", many}}), 400);
  EXPECT_LT(seconds_since(t0), 1.0);
}

TEST(HardeningRequest, JsonGuardCountsValues) {
  io::JsonLimits l{10, 10, 5};
  EXPECT_FALSE(io::check_json("[1,2,3,4]", l));
  EXPECT_TRUE(io::check_json("[1,2,3,4,5]", l));  // 6 values with the array
  EXPECT_TRUE(io::check_json("[1,", l));          // syntax errors are reported too
}

}  // namespace
}  // namespace lathe::server
