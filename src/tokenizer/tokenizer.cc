#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "common/error.h"
#include "io/json_guard.h"
#include "io/mapped_file.h"
#include "tokenizer/tokenizer_cache.h"
#include "tokenizer/utf8.h"

namespace lathe {
namespace {

std::string read_file(const std::filesystem::path& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw Error(ErrorKind::NotFound, "cannot open " + path.string());
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

nlohmann::json parse(std::string_view text, const char* file) {
  if (auto err = io::check_json_limits(text, io::file_json_limits()))
    throw Error(ErrorKind::Corrupt, std::string(file) + ": " + *err);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(ErrorKind::Corrupt,
                std::string(file) + ": JSON syntax error at byte " + std::to_string(e.byte) + ": " + e.what());
  }
}

// bos_token & co. are either a string or an AddedToken object {"content": ...}.
std::string token_string(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return {};
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) return (*it)["content"];
  throw Error(ErrorKind::Corrupt,
              std::string("tokenizer_config.json: ") + key + ": expected a string or {\"content\": ...}");
}

SpecialTokensConfig parse_config(std::string_view text) {
  SpecialTokensConfig c;
  if (text.empty()) return c;
  const nlohmann::json j = parse(text, "tokenizer_config.json");
  if (!j.is_object()) throw Error(ErrorKind::Corrupt, "tokenizer_config.json: (root): expected an object");
  c.bos_token = token_string(j, "bos_token");
  c.eos_token = token_string(j, "eos_token");
  c.pad_token = token_string(j, "pad_token");
  c.unk_token = token_string(j, "unk_token");
  try {
    c.add_bos_token = j.value("add_bos_token", false);
    c.add_eos_token = j.value("add_eos_token", false);
  } catch (const nlohmann::json::exception& e) {
    throw Error(ErrorKind::Corrupt, std::string("tokenizer_config.json: add_bos_token/add_eos_token: ") + e.what());
  }
  return c;
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::load(const std::filesystem::path& dir) {
  const auto path = dir / "tokenizer.json";
  if (!std::filesystem::exists(path)) throw Error(ErrorKind::NotFound, "cannot open " + path.string());
  const auto config_path = dir / "tokenizer_config.json";
  const std::string config = std::filesystem::exists(config_path) ? read_file(config_path) : std::string();
  if (auto cached = read_tokenizer_cache(path)) {
    TokenizerJson parsed = parse_tokenizer_json(cached->rest_json);
    parsed.tables.prebuilt = std::move(cached->index);
    return from_parsed(std::move(parsed), config);
  }
  // Mapped, not read: a real tokenizer.json is ~10 MB, parsed once, straight from the page cache.
  const auto mapped = MappedFile::open(path.string());
  TokenizerJson parsed =
      parse_tokenizer_json(std::string_view(reinterpret_cast<const char*>(mapped->data()), mapped->size()));
  const bool cache = mapped->size() >= kTokenizerCacheMinBytes;
  const std::string rest = cache ? parsed.doc.dump() : std::string();
  auto t = from_parsed(std::move(parsed), config);
  if (cache) {
    std::string image;
    t->model_->save_index(image);
    write_tokenizer_cache(path, rest, image);
  }
  return t;
}

std::unique_ptr<Tokenizer> Tokenizer::from_json(std::string_view tokenizer_json, std::string_view config_json) {
  return from_parsed(parse_tokenizer_json(tokenizer_json), config_json);
}

std::unique_ptr<Tokenizer> Tokenizer::from_parsed(TokenizerJson parsed, std::string_view config_json) {
  const nlohmann::json& doc = parsed.doc;
  const JsonAt root(doc, "");
  if (!doc.is_object()) root.fail("expected an object");
  std::unique_ptr<Tokenizer> t(new Tokenizer());

  const JsonAt model = root.at("model");
  const std::string type = model.str_or("type", "BPE");
  if (type != "BPE") model.at("type").unsupported("model type '" + type + "' is not supported (only BPE)");
  t->model_ = std::make_unique<Bpe>(model, std::move(parsed.tables));

  const nlohmann::json null_json;
  auto member = [&](const char* key) { return root.has(key) ? root.at(key) : JsonAt(null_json, key); };
  t->normalizer_ = make_normalizer(member("normalizer"));
  t->pre_tokenizer_ = make_pre_tokenizer(member("pre_tokenizer"));
  t->post_processor_ = make_post_processor(member("post_processor"));
  t->decoder_ = make_decoder(member("decoder"));
  if (root.has("added_tokens")) t->added_ = AddedVocabulary(root.at("added_tokens"), t->normalizer_.get());
  t->config_ = parse_config(config_json);

  int64_t max_id = t->model_->max_id();
  for (const AddedToken& a : t->added_.tokens()) max_id = std::max<int64_t>(max_id, a.id);
  t->vocab_size_ = static_cast<size_t>(max_id + 1);
  return t;
}

void Tokenizer::encode_pieces(std::string_view text, FunctionRef<void(int32_t)> special, WordSink word) const {
  std::string repaired;
  if (!utf8::is_valid(text)) {
    repaired = utf8::repair(text);
    text = repaired;
  }
  bool at_text_start = true;
  for (const Segment& raw : added_.split_raw(text)) {
    if (raw.id >= 0) {
      special(raw.id);
      at_text_start = false;
      continue;
    }
    // Only a normalizer needs the run as a string of its own (it rewrites it); else it is read where it lies.
    std::string normalized;
    std::string_view plain = raw.text;
    if (normalizer_ && !normalizer_->leaves_unchanged(raw.text)) {
      normalized = normalizer_->normalize(std::string(raw.text));
      plain = normalized;
    }
    for (const Segment& seg : added_.split_normalized(plain)) {
      if (seg.id >= 0)
        special(seg.id);
      else if (pre_tokenizer_)
        pre_tokenizer_->split(seg.text, at_text_start, word);
      else
        word(seg.text);
      at_text_start = false;
    }
    at_text_start = false;
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  encode_pieces(
      text, [&](int32_t id) { ids.push_back(id); }, [&](std::string_view w) { model_->encode_word(w, ids); });
  if (add_special && post_processor_) ids = post_processor_->process(std::move(ids));
  return ids;
}

size_t Tokenizer::encode_capped(std::string_view text, size_t max_ids, std::vector<int32_t>& ids) const {
  ids.clear();
  if (ids.capacity() > max_ids) std::vector<int32_t>().swap(ids);
  ids.reserve(std::min(text.size() / 3 + 4, max_ids));
  size_t count = 0;
  // Appends what fits under the cap, growing `ids` as a vector would but never past the cap; the rest is counted.
  auto keep = [&](const int32_t* p, size_t n) {
    count += n;
    n = std::min(n, max_ids - ids.size());
    if (n == 0) return;
    if (ids.size() + n > ids.capacity()) ids.reserve(std::min(max_ids, std::max(ids.size() + n, 2 * ids.capacity())));
    ids.insert(ids.end(), p, p + n);
  };
  std::vector<int32_t> word_ids;  // one word's, so that a word straddling the cap never lands whole in `ids`
  encode_pieces(
      text, [&](int32_t id) { keep(&id, 1); },
      [&](std::string_view w) {
        word_ids.clear();
        model_->encode_word(w, word_ids);
        keep(word_ids.data(), word_ids.size());
      });
  return count;
}

size_t Tokenizer::encode_special_capped(std::string_view text, size_t max_ids, std::vector<int32_t>& ids) const {
  const size_t count = encode_capped(text, max_ids, ids);
  if (!post_processor_) return count;
  if (count > ids.size()) return count + post_processor_->process({}).size();  // past the cap: counted only
  ids = post_processor_->process(std::move(ids));
  const size_t all = ids.size();
  if (all > max_ids) {
    ids.resize(max_ids);
    ids.shrink_to_fit();
  }
  return all;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (const AddedToken* a = added_.find(id)) {
      if (!(skip_special && a->special)) tokens.push_back(a->content);
    } else if (const std::string* t = model_->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  std::string text;
  if (decoder_) {
    for (const std::string& piece : decoder_->decode_chain(std::move(tokens))) text += piece;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];  // the reference's fallback
  }
  return text;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  if (auto id = added_.token_to_id(token)) return id;
  return model_->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  if (const AddedToken* a = added_.find(id)) return a->content;
  if (const std::string* t = model_->id_to_token(id)) return *t;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  const AddedToken* a = added_.find(id);
  return a && a->special;
}

std::optional<int32_t> Tokenizer::lookup(const std::string& token) const {
  if (token.empty()) return std::nullopt;
  return token_to_id(token);
}

}  // namespace lathe
