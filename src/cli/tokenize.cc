// lathe tokenize: text -> token ids as a JSON array, or (--decode) a JSON id array -> text.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/verbs.h"
#include "common/error.h"
#include "tokenizer/tokenizer.h"

namespace lathe::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string input;
  bool special = false;
  bool decode = false;
  bool skip_special = false;
};

std::string read_input(const std::string& arg) {
  if (arg != "-") return arg;
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

std::vector<int32_t> parse_id_array(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::InvalidArgument, "--decode: input is not JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_array()) throw Error(ErrorKind::InvalidArgument, "--decode: expected a JSON array of token ids");
  std::vector<int32_t> ids;
  for (size_t i = 0; i < j.size(); ++i) {
    if (!j[i].is_number_integer() || j[i].get<int64_t>() < 0 || j[i].get<int64_t>() > INT32_MAX)
      throw Error(ErrorKind::InvalidArgument, "--decode: element " + std::to_string(i) + " is not a token id");
    ids.push_back(static_cast<int32_t>(j[i].get<int64_t>()));
  }
  return ids;
}

int run(const TokenizeOptions& o) {
  const std::unique_ptr<Tokenizer> tok = Tokenizer::load(o.tokenizer);
  const std::string input = read_input(o.input);
  if (o.decode) {
    const std::string text = tok->decode(parse_id_array(input), o.skip_special);
    std::fwrite(text.data(), 1, text.size(), stdout);  // exactly the text: no newline added
    return 0;
  }
  std::printf("%s\n", nlohmann::json(tok->encode(input, o.special)).dump().c_str());
  return 0;
}

}  // namespace

Verb add_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand("tokenize", "encode text to token ids (JSON array), or decode ids to text");
  cmd->add_option("--tokenizer", o->tokenizer, "directory holding tokenizer.json (and tokenizer_config.json)")
      ->required();
  cmd->add_flag("--special", o->special, "add the post-processor's special tokens (e.g. <bos>)");
  cmd->add_flag("--decode", o->decode, "read a JSON array of ids and print the text");
  cmd->add_flag("--skip-special", o->skip_special, "with --decode: leave special tokens out of the text");
  cmd->add_option("input", o->input, "the text (or, with --decode, the JSON id array); - reads stdin")->required();
  return {cmd, [o] { return run(*o); }};
}

}  // namespace lathe::cli
