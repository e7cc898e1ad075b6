// A malformed tokenizer.json fails with a lathe::Error that names the construct and where it is.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace lathe {
namespace {

using nlohmann::json;

json minimal() {
  return json::parse(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": [["a", "b"]]}})");
}

// Loads `doc` and returns the error; fails the test when loading succeeds.
Error load_error(const std::string& doc) {
  try {
    Tokenizer::from_json(doc);
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "loading succeeded: " << doc;
  return Error(ErrorKind::Internal, "");
}

void expect_error(const json& doc, ErrorKind kind, std::initializer_list<const char*> fragments) {
  const Error e = load_error(doc.dump());
  EXPECT_EQ(e.kind(), kind) << e.what();
  for (const char* f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
}

TEST(TokenizerErrors, ANumberPastADoubleIsCorruptNotAnEscapedJsonError) {
  // Found by tokenizer_json_fuzz: nlohmann's out_of_range escaped the loader and terminated the process.
  const Error e = load_error(R"({"version": 4444444444444444444.44422E404444308, "model": {"type": "BPE"}})");
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_NE(std::string(e.what()).find("tokenizer.json: "), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("number overflow"), std::string::npos) << e.what();
}

TEST(TokenizerErrors, JsonSyntaxErrorGivesTheBytePosition) {
  const Error e = load_error(R"({"model": {"type": "BPE",, }})");
  EXPECT_EQ(e.kind(), ErrorKind::Corrupt);
  EXPECT_NE(std::string(e.what()).find("tokenizer.json: JSON syntax error at byte 26"), std::string::npos) << e.what();
}

TEST(TokenizerErrors, UnknownTypesNameTheirPath) {
  json doc = minimal();
  doc["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Digits"}}, {{"type", "Frobnicate"}}}}};
  expect_error(doc, ErrorKind::Unsupported, {"pre_tokenizer.pretokenizers[1].type", "Frobnicate"});
  doc = minimal();
  doc["normalizer"] = {{"type", "Sequence"}, {"normalizers", {{{"type", "Mystery"}}}}};
  expect_error(doc, ErrorKind::Unsupported, {"normalizer.normalizers[0].type", "Mystery"});
  doc = minimal();
  doc["decoder"] = {{"type", "Nope"}};
  expect_error(doc, ErrorKind::Unsupported, {"decoder.type", "Nope"});
  doc = minimal();
  doc["model"]["type"] = "Unigram";
  expect_error(doc, ErrorKind::Unsupported, {"model.type", "Unigram"});
}

TEST(TokenizerErrors, BadRegexGivesItsOffset) {
  json doc = minimal();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(ab"}}}, {"behavior", "Isolated"}};
  expect_error(doc, ErrorKind::Corrupt, {"pre_tokenizer.pattern.Regex", "invalid regex at offset 3"});
}

TEST(TokenizerErrors, MalformedMembersNameTheirPath) {
  json doc = minimal();
  doc["model"]["merges"] = json::parse(R"([["a", "b"], ["a", "zz"]])");
  expect_error(doc, ErrorKind::Corrupt, {"model.merges[1]", "zz"});
  doc = minimal();
  doc["model"].erase("vocab");
  expect_error(doc, ErrorKind::Corrupt, {"model.vocab", "missing"});
  doc = minimal();
  doc["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}}, {"behavior", "Sideways"}};
  expect_error(doc, ErrorKind::Corrupt, {"pre_tokenizer.behavior", "Sideways"});
  doc = minimal();
  doc["added_tokens"] = {{{"id", "seven"}, {"content", "<x>"}}};
  expect_error(doc, ErrorKind::Corrupt, {"added_tokens[0].id", "expected an integer"});
  doc = minimal();
  doc["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
  expect_error(doc, ErrorKind::Corrupt, {"pre_tokenizer.replacement", "single character"});
  doc = minimal();
  doc["post_processor"] = {{"type", "TemplateProcessing"},
                           {"single", {{{"SpecialToken", {{"id", "<bos>"}, {"type_id", 0}}}}}},
                           {"special_tokens", json::object()}};
  expect_error(doc, ErrorKind::Corrupt, {"post_processor.single[0]", "<bos>"});
}

TEST(TokenizerErrors, MissingDirectoryIsNotFound) {
  try {
    Tokenizer::load("/nonexistent/lathe-tokenizer");
    FAIL() << "loaded a missing tokenizer";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::NotFound);
    EXPECT_NE(std::string(e.what()).find("tokenizer.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace lathe
