// The dataset job ([lab] dataset): the template registry and its field checks, every non-LLM template's parser
// (Q/A blocks, RFC 4180 CSV, .py walking with symlinks leaving the folder, JSONL key mapping) with its errors
// naming the line, the 90/10 split, the output written whole, the LLM-driven templates' row shapes against a
// stand-in model, and generated folders loading in the fine-tune's own data loader.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "chat/chat_template.h"
#include "common/error.h"
#include "common/os_error.h"
#include "lab/dataset/code_completion.h"
#include "lab/dataset/csv_reader.h"
#include "lab/dataset/dataset_job.h"
#include "lab/dataset/dataset_output.h"
#include "lab/dataset/dpo_pairs.h"
#include "lab/dataset/format_conversion.h"
#include "lab/dataset/llm_templates.h"
#include "lab/dataset/qa_pairs.h"
#include "lab/dataset/templates.h"
#include "lab/train/train_data.h"
#include "support/test_dir.h"
#include "support/text_codec_util.h"

namespace lathe::dataset {
namespace {

namespace fs = std::filesystem;

struct Scratch : testutil::TestDir {
  Scratch() : TestDir("dataset") {}
};

// The error message of f(), or "" when it does not throw an Error of `kind`.
template <typename F>
std::string error_of(F f, ErrorKind kind = ErrorKind::InvalidArgument) {
  try {
    f();
  } catch (const Error& e) {
    if (e.kind() == kind) return e.what();
    return std::string("wrong kind: ") + error_kind_name(e.kind()) + ": " + e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> rows;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) rows.push_back(json::parse(line));
  return rows;
}

using testutil::test_codec;

TEST(DatasetTemplates, RegistryListsEveryTemplateWithTypedFields) {
  const json all = templates_json();
  std::set<std::string> ids;
  for (const auto& t : all["templates"]) {
    ids.insert(t["id"].get<std::string>());
    ASSERT_TRUE(t["fields"].is_array());
    EXPECT_FALSE(t["label"].get<std::string>().empty());
    EXPECT_TRUE(t["needs_llm"].is_boolean());
    for (const auto& f : t["fields"]) {
      const std::string type = f["type"];
      EXPECT_TRUE(type == "text" || type == "textarea" || type == "number") << type;
      for (const char* key : {"name", "label", "hint", "required", "default"}) EXPECT_TRUE(f.contains(key)) << key;
      if (type == "number") {
        EXPECT_TRUE(f["default"].is_number()) << f.dump();
      }
    }
  }
  for (const char* id :
       {"sft_qa_pairs", "dpo_pref_pairs", "code_completion", "format_conversion", "hf_dataset_import", "self_instruct",
        "style_transfer", "multi_turn_chat", "rag_qa", "cot_synthesis", "prompt_reconstruction"})
    EXPECT_EQ(ids.count(id), 1u) << id;
  EXPECT_TRUE(find_template("rag_qa").needs_llm);
  EXPECT_FALSE(find_template("sft_qa_pairs").needs_llm);
  EXPECT_EQ(find_template("dpo_pref_pairs").output_format, "dpo");
}

TEST(DatasetTemplates, ConfigsAreCheckedFieldByField) {
  Scratch d;
  const std::string out = d.str("out");
  const json good = {{"template", "sft_qa_pairs"}, {"out", out}, {"pairs", "Q: hi\nA: hello"}};
  EXPECT_NO_THROW(validate_dataset_config(good));

  std::string e = error_of([&] { validate_dataset_config({{"template", "poems"}, {"out", out}}); });
  EXPECT_TRUE(contains(e, "unknown dataset template 'poems'")) << e;
  EXPECT_TRUE(contains(e, "sft_qa_pairs, dpo_pref_pairs")) << e;
  e = error_of([&] { validate_dataset_config({{"out", out}}); });
  EXPECT_TRUE(contains(e, "'template' is required")) << e;
  e = error_of([&] { validate_dataset_config({{"template", "sft_qa_pairs"}, {"out", out}}); });
  EXPECT_TRUE(contains(e, "'pairs' is required")) << e;
  e = error_of([&] { validate_dataset_config({{"template", "sft_qa_pairs"}, {"out", out}, {"pairs", "  \n"}}); });
  EXPECT_TRUE(contains(e, "'pairs' must not be empty")) << e;
  e = error_of([&] { validate_dataset_config({{"template", "sft_qa_pairs"}, {"out", out}, {"pairs", 3}}); });
  EXPECT_TRUE(contains(e, "'pairs' must be a string")) << e;
  json extra = good;
  extra["colour"] = "red";
  e = error_of([&] { validate_dataset_config(extra); });
  EXPECT_TRUE(contains(e, "unknown field 'colour'")) << e;
  EXPECT_TRUE(contains(e, "system_prompt")) << e;  // the fields it takes
  e = error_of([&] {
    validate_dataset_config({{"template", "code_completion"}, {"out", out}, {"dir", d.str()}, {"max_files", 2.5}});
  });
  EXPECT_TRUE(contains(e, "'max_files' must be a whole number")) << e;
  e = error_of([&] {
    validate_dataset_config({{"template", "code_completion"}, {"out", out}, {"dir", d.str()}, {"max_files", "9"}});
  });
  EXPECT_TRUE(contains(e, "'max_files' must be a number")) << e;
  e = error_of([&] {
    validate_dataset_config({{"template", "code_completion"}, {"out", out}, {"dir", d.str()}, {"max_files", 0}});
  });
  EXPECT_TRUE(contains(e, "'max_files' must be in [1, 10000]")) << e;
  e = error_of(
      [&] {
        validate_dataset_config({{"template", "code_completion"}, {"out", out}, {"dir", d.str("nope")}});
      },
      ErrorKind::InvalidArgument);
  EXPECT_TRUE(contains(e, "'dir'")) << e;
  // Inputs are parsed before queuing: a bad one is the request's error.
  e = error_of([&] { validate_dataset_config({{"template", "sft_qa_pairs"}, {"out", out}, {"pairs", "A: x"}}); });
  EXPECT_TRUE(contains(e, "line 1")) << e;
}

TEST(DatasetTemplates, OutputFolderAndUnavailableTemplatesAreRefusedUpFront) {
  Scratch d;
  const json base = {{"template", "sft_qa_pairs"}, {"pairs", "Q: a\nA: b"}};
  json c = base;
  std::string e = error_of([&] { validate_dataset_config(c); });
  EXPECT_TRUE(contains(e, "'out'")) << e;
  fs::create_directories(d.path / "full");
  std::ofstream(d.path / "full" / "x") << "x";
  c["out"] = d.str("full");
  e = error_of([&] { validate_dataset_config(c); });
  EXPECT_TRUE(contains(e, "already exists")) << e;
  fs::create_directories(d.path / "empty");
  c["out"] = d.str("empty");
  EXPECT_NO_THROW(validate_dataset_config(c));
  c["out"] = d.str("no/such/parent");
  e = error_of([&] { validate_dataset_config(c); });
  EXPECT_TRUE(contains(e, "does not exist")) << e;
  c["out"] = "/proc/self/ds";  // even root may not create folders there
  try {
    validate_dataset_config(c);
    ADD_FAILURE() << "an unwritable parent passed";
  } catch (const OsError& err) {
    EXPECT_TRUE(contains(err.what(), "is not writable: ")) << err.what();  // the OS's reason follows
  }

  e = error_of(
      [&] {
        validate_dataset_config({{"template", "hf_dataset_import"}, {"dataset", "a/b"}});
      },
      ErrorKind::Unsupported);
  EXPECT_TRUE(contains(e, "format_conversion")) << e;
  ::unsetenv("LATHE_JOB_API_URL");
  e = error_of(
      [&] {
        validate_dataset_config(
            {{"template", "style_transfer"}, {"out", d.str("o")}, {"passages", "some text"}, {"style", "terse"}});
      },
      ErrorKind::Unsupported);
  EXPECT_TRUE(contains(e, "lathe serve")) << e;
}

TEST(DatasetQaPairs, BlocksBecomeChatRowsAndBadOnesNameTheirLine) {
  const Generated g =
      parse_qa_pairs("Q: What is 2+2?\nA: Four.\n\nq: Name two colours\nA: Red,\n\nand blue.\n", "Be brief.");
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.rows[0].dump(), json({{"messages",
                                     {{{"role", "system"}, {"content", "Be brief."}},
                                      {{"role", "user"}, {"content", "What is 2+2?"}},
                                      {{"role", "assistant"}, {"content", "Four."}}}}})
                                  .dump());
  EXPECT_EQ(g.rows[1]["messages"][2]["content"], "Red,\n\nand blue.");
  EXPECT_EQ(parse_qa_pairs("Q: a\nA: b", "").rows[0]["messages"].size(), 2u);  // no system prompt

  EXPECT_TRUE(contains(error_of([] { parse_qa_pairs("hello\nQ: a\nA: b", ""); }), "line 1: text before"));
  EXPECT_TRUE(contains(error_of([] { parse_qa_pairs("Q: a\nA: b\nA: c", ""); }), "line 3: a second 'A:'"));
  EXPECT_TRUE(contains(error_of([] { parse_qa_pairs("Q: a\nA: b\n\nQ: c\n\nQ: d\nA: e", ""); }),
                       "line 4: the question has no 'A:'"));
  EXPECT_TRUE(contains(error_of([] { parse_qa_pairs("Q: a\nA:   \n", ""); }), "line 2: the answer is empty"));
}

TEST(DatasetCsv, Rfc4180QuotingAndErrorsNamingTheLine) {
  const auto recs = parse_csv("a,b,c\r\n\"x, y\",\"say \"\"hi\"\"\",\"two\nlines\"\n1,,3", "csv", 100);
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[1].fields, (std::vector<std::string>{"x, y", "say \"hi\"", "two\nlines"}));
  EXPECT_EQ(recs[1].line, 2u);
  EXPECT_EQ(recs[2].line, 4u);  // after the line break inside quotes
  EXPECT_EQ(recs[2].fields, (std::vector<std::string>{"1", "", "3"}));
  EXPECT_TRUE(contains(error_of([] { parse_csv("a,b\n\"open,b\nc,d\n", "csv", 100); }),
                       "csv, line 2: a quoted field is never closed"));
  EXPECT_TRUE(contains(error_of([] { parse_csv("a,b\nx,\"q\"z\n", "csv", 100); }), "line 2: text after a closing"));
  EXPECT_TRUE(contains(error_of([] { parse_csv("a,b\n\n\nx,y\"z\n", "csv", 100); }), "line 4: a quote inside"));
  EXPECT_TRUE(contains(error_of([] { parse_csv("a\nb\nc\n", "csv", 2); }), "more than 2 records"));
}

TEST(DatasetDpo, HeaderColumnsInAnyOrderAndShortRecordsAreErrors) {
  const Generated g = parse_dpo_csv(
      "Rejected, prompt ,chosen\n\"no, thanks\",\"Say \"\"yes\"\"\",\"yes\nindeed\"\n,p,c\n\nbad,\"p2\",good\n");
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.rows[0].dump(),
            json({{"prompt", "Say \"yes\""}, {"chosen", "yes\nindeed"}, {"rejected", "no, thanks"}}).dump());
  EXPECT_EQ(g.skipped, 2);  // an empty rejected, a blank line
  EXPECT_TRUE(contains(error_of([] { parse_dpo_csv("prompt,chosen\na,b\n"); }), "no 'rejected' column"));
  EXPECT_TRUE(contains(error_of([] { parse_dpo_csv("prompt,chosen,rejected,score\n"); }), "unknown column 'score'"));
  EXPECT_TRUE(contains(error_of([] { parse_dpo_csv("prompt,chosen,rejected\na,b,c\n\"x\ny\",b\n"); }),
                       "line 3: 2 fields where the header has 3"));
}

TEST(DatasetCode, TopLevelBlocksSplitAtSeededLinesAndLinksOutsideAreSkipped) {
  Scratch d;
  fs::create_directories(d.path / "src" / "pkg");
  fs::create_directories(d.path / "outside");
  std::ofstream(d.path / "src" / "a.py") << "import os\n\n@cache\ndef f(x):\n    y = x + 1\n    z = y * 2\n"
                                            "    return z\n\nX = 3\n\nclass C:\n    def m(self):\n        return 1\n";
  std::ofstream(d.path / "src" / "pkg" / "b.py") << "def g():\n    return 2\n";
  std::ofstream(d.path / "src" / "notes.txt") << "def h():\n    pass\n";
  std::ofstream(d.path / "outside" / "secret.py") << "def secret():\n    return 'key'\n";
  fs::create_symlink(d.path / "outside" / "secret.py", d.path / "src" / "leak.py");
  fs::create_directory_symlink(d.path / "outside", d.path / "src" / "linkdir");
  fs::create_symlink(d.path / "src" / "pkg" / "b.py", d.path / "src" / "inside.py");
  fs::create_directories(d.path / "src" / ".venv" / "lib");
  std::ofstream(d.path / "src" / ".venv" / "lib" / "dep.py") << "def dep():\n    return 0\n";

  const Generated g = code_completion_rows(d.str("src"), 7, {});
  // a.py: f and C; inside.py -> b.py: g; pkg/b.py: g. The link leaving the folder is skipped; linkdir is not
  // followed, .venv not entered.
  ASSERT_EQ(g.rows.size(), 4u);
  EXPECT_EQ(g.skipped, 1);
  for (const auto& r : g.rows) {
    const std::string p = r["prompt"], c = r["completion"];
    EXPECT_FALSE(contains(p + c, "secret"));
    EXPECT_FALSE(contains(p + c, "dep"));
    EXPECT_FALSE(c.empty());
    EXPECT_TRUE(p.starts_with("@cache\ndef f(x):\n") || p.starts_with("class C:\n") || p.starts_with("def g():\n"))
        << p;
  }
  EXPECT_EQ(g.rows[0]["prompt"].get<std::string>() + g.rows[0]["completion"].get<std::string>(),
            "@cache\ndef f(x):\n    y = x + 1\n    z = y * 2\n    return z\n");
  // The same seed, the same cuts; max_files bounds the walk.
  EXPECT_EQ(code_completion_rows(d.str("src"), 7, {}).rows, g.rows);
  bool differs = false;
  for (uint64_t s = 0; s < 8 && !differs; ++s) differs = code_completion_rows(d.str("src"), s, {}).rows != g.rows;
  EXPECT_TRUE(differs);
  CodeWalkLimits one;
  one.max_files = 1;
  EXPECT_EQ(code_completion_rows(d.str("src"), 7, one).rows.size(), 2u);  // a.py only
  CodeWalkLimits tiny;
  tiny.max_file_bytes = 30;
  EXPECT_EQ(code_completion_rows(d.str("src"), 7, tiny).rows.size(), 2u);  // a.py is skipped
  EXPECT_TRUE(contains(error_of([&] { code_completion_rows(d.str("none"), 0, {}); }), "'dir'"));
}

TEST(DatasetConvert, KeysAreMappedRowsMissingThemSkippedAndBadLinesNamed) {
  Scratch d;
  const fs::path p = d.path / "in.jsonl";
  std::ofstream(p) << R"({"q": "hi", "a": "hello", "s": "sys"})"
                   << "\n\n"
                   << R"({"q": "no answer"})"
                   << "\n"
                   << R"({"q": "n", "a": 5})"
                   << "\n"
                   << R"({"q": "two", "a": "2"})"
                   << "\n";
  Generated g = convert_jsonl(p.string(), {"q", "a", ""});
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.skipped, 2);
  EXPECT_EQ(g.rows[1]["messages"][1]["content"], "2");
  g = convert_jsonl(p.string(), {"q", "a", "s"});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0]["messages"][0], json({{"role", "system"}, {"content", "sys"}}));
  std::ofstream(p, std::ios::app) << "{\"q\": oops}\n";
  EXPECT_TRUE(contains(error_of([&] { convert_jsonl(p.string(), {"q", "a", ""}); }), "in.jsonl, line 6: not JSON"));
  std::ofstream(d.path / "arr.jsonl") << "[1,2]\n";
  EXPECT_TRUE(contains(error_of([&] {
                         convert_jsonl(d.str("arr.jsonl"), {"q", "a", ""});
                       }),
                       "line 1: a row must be a JSON object"));
}

TEST(DatasetOutput, SplitIsNinetyTenInOrderAndValidNeverEmpty) {
  auto rows = [](int n) {
    std::vector<json> v;
    for (int i = 0; i < n; ++i) v.push_back({{"text", std::to_string(i)}});
    return v;
  };
  Split s = split_rows(rows(1));
  EXPECT_EQ(s.train.size(), 1u);
  ASSERT_EQ(s.valid.size(), 1u);
  EXPECT_EQ(s.valid[0]["text"], "0");
  s = split_rows(rows(5));  // floor(4.5) = 4
  EXPECT_EQ(s.train.size(), 4u);
  EXPECT_EQ(s.valid.size(), 1u);
  s = split_rows(rows(25));
  EXPECT_EQ(s.train.size(), 22u);
  ASSERT_EQ(s.valid.size(), 3u);
  EXPECT_EQ(s.train.back()["text"], "21");
  EXPECT_EQ(s.valid.front()["text"], "22");
  s = split_rows(rows(10));
  EXPECT_EQ(s.train.size(), 9u);
  EXPECT_EQ(s.valid.size(), 1u);
  EXPECT_TRUE(contains(error_of([&] { split_rows({}); }), "no rows"));
}

TEST(DatasetJob, RunsWritesWholeFoldersThatTheFinetuneLoaderReads) {
  Scratch d;
  std::vector<json> events;
  const jobs::Emit emit = [&](const json& e) { events.push_back(e); };
  std::string pairs;
  for (int i = 0; i < 12; ++i) pairs += "Q: question " + std::to_string(i) + "\nA: answer\nover lines\n\n";
  const json config = {{"template", "sft_qa_pairs"}, {"out", d.str("qa")}, {"pairs", pairs}};
  const jobs::JobResult r = run_dataset(emit, config);
  EXPECT_EQ(r.output_path.value_or(""), d.str("qa"));
  EXPECT_EQ(r.summary["rows"], 12);
  EXPECT_EQ(r.summary["train"], 10);
  EXPECT_EQ(r.summary["valid"], 2);
  EXPECT_EQ(r.summary["skipped"], 0);
  EXPECT_EQ(read_jsonl(d.path / "qa" / "train.jsonl").size(), 10u);
  EXPECT_EQ(read_jsonl(d.path / "qa" / "valid.jsonl")[1]["messages"][0]["content"], "question 11");
  for (const auto& entry : fs::directory_iterator(d.path))  // no temporary folder left beside it
    EXPECT_FALSE(entry.path().filename().string().starts_with(".")) << entry.path();
  bool generating = false, done_stage = false;
  for (const auto& e : events) {
    if (e["stage"] == "generating") generating = e["done"] == 12 && e["total"] == 12;
    if (e["stage"] == "done") done_stage = e["progress"] == 1.0;
  }
  EXPECT_TRUE(generating);
  EXPECT_TRUE(done_stage);

  const train::TextCodec codec = test_codec();
  train::Dataset ds = train::load_dataset(d.str("qa"), codec, 256, false);
  EXPECT_EQ(ds.train.size(), 10u);
  EXPECT_EQ(ds.valid.size(), 2u);
  EXPECT_EQ(ds.train[0].format, train::RowFormat::Messages);

  run_dataset(emit,
              {{"template", "dpo_pref_pairs"}, {"out", d.str("dpo")}, {"csv", "prompt,chosen,rejected\np,c,r\n"}});
  ds = train::load_dataset(d.str("dpo"), codec, 256, /*preference=*/true);
  ASSERT_EQ(ds.train.size(), 1u);
  EXPECT_EQ(ds.train[0].format, train::RowFormat::Preference);
  EXPECT_EQ(ds.valid.size(), 1u);  // the last row again

  fs::create_directories(d.path / "code");
  std::ofstream(d.path / "code" / "m.py") << "def f(a, b):\n    c = a + b\n    return c\n";
  run_dataset(emit, {{"template", "code_completion"}, {"out", d.str("cc")}, {"dir", d.str("code")}, {"seed", 3}});
  ds = train::load_dataset(d.str("cc"), codec, 256, false);
  EXPECT_EQ(ds.train[0].format, train::RowFormat::PromptCompletion);

  std::ofstream(d.path / "conv.jsonl") << R"({"instruction": "i", "output": "o"})"
                                       << "\n{\"x\": 1}\n";
  const auto conv =
      run_dataset(emit, {{"template", "format_conversion"}, {"out", d.str("conv")}, {"path", d.str("conv.jsonl")}});
  EXPECT_EQ(conv.summary["skipped"], 1);
  EXPECT_EQ(train::load_dataset(d.str("conv"), codec, 256, false).train[0].format, train::RowFormat::Messages);

  // No rows: the job fails and writes nothing.
  std::ofstream(d.path / "none.jsonl") << "{\"x\": 1}\n";
  const std::string e = error_of([&] {
    run_dataset(emit, {{"template", "format_conversion"}, {"out", d.str("none")}, {"path", d.str("none.jsonl")}});
  });
  EXPECT_TRUE(contains(e, "produced no rows (1 inputs skipped)")) << e;
  EXPECT_FALSE(fs::exists(d.path / "none"));
}

// A textarea's text may come from a file on the server (NAME_file): for inputs past a job config's 16 KiB.
TEST(DatasetJob, TextareaFieldsReadFromServerFiles) {
  Scratch d;
  std::string pairs;
  for (int i = 0; i < 2000; ++i)
    pairs += "Q: question " + std::to_string(i) + "\nA: answer " + std::to_string(i) + "\n";
  ASSERT_GT(pairs.size(), 16u * 1024);
  std::ofstream(d.path / "qa.txt") << pairs;
  const json config = {{"template", "sft_qa_pairs"}, {"out", d.str("qa")}, {"pairs_file", d.str("qa.txt")}};
  validate_dataset_config(config);
  const jobs::JobResult r = run_dataset([](const json&) {}, config);
  EXPECT_EQ(r.summary["rows"], 2000);
  EXPECT_EQ(read_jsonl(d.path / "qa" / "valid.jsonl").back()["messages"][1]["content"], "answer 1999");

  auto refused = [&](const json& extra) {
    json c = {{"template", "sft_qa_pairs"}, {"out", d.str("qa2")}};
    c.update(extra);
    return error_of([&] { validate_dataset_config(c); });
  };
  EXPECT_TRUE(contains(refused({{"pairs", "Q: a\nA: b"}, {"pairs_file", d.str("qa.txt")}}), "both given")) << "both";
  EXPECT_TRUE(contains(refused({{"pairs_file", d.str("missing.txt")}}), "missing.txt cannot be read (No such file"));
  EXPECT_TRUE(contains(refused({{"pairs_file", d.str("")}}), "is not a regular file"));  // the folder itself
  EXPECT_TRUE(contains(refused({{"pairs_file", 3}}), "'pairs_file' must be a string"));
  // A FIFO with no writer is refused at once, not waited on.
  ASSERT_EQ(::mkfifo(d.str("fifo").c_str(), 0600), 0);
  EXPECT_TRUE(contains(refused({{"pairs_file", d.str("fifo")}}), "is not a regular file"));
  std::ofstream(d.path / "blank.txt") << "\n  \n";
  EXPECT_TRUE(contains(refused({{"pairs_file", d.str("blank.txt")}}), "holds no text"));
  // The registry tells forms which key takes the file.
  const json all = templates_json();  // named: a range over a temporary's member would outlive the temporary
  for (const auto& t : all["templates"])
    for (const auto& f : t["fields"])
      EXPECT_EQ(f.contains("file_field"), f["type"] == "textarea") << t["id"] << " " << f["name"];
}

TEST(DatasetLlm, TemplatesBuildTheirRowsFromTheModelsReplies) {
  int calls = 0;
  const ChatFn echo = [&](const json& messages) {  // the demo model's manner: the last message, upper-cased
    ++calls;
    std::string s = messages.back()["content"];
    for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return "  " + s + "\n";
  };
  auto run = [&](const json& config) {
    const TemplateDef& t = find_template(config["template"]);
    check_template_fields(t, config);
    int64_t last_done = 0, last_total = 0;
    Generated g = run_llm_template(t, config, echo, [&](int64_t d, int64_t n) {
      last_done = d;
      last_total = n;
    });
    EXPECT_EQ(last_done, last_total);
    EXPECT_EQ(last_total, llm_row_budget(t, config));
    return g;
  };
  Generated g = run({{"template", "style_transfer"}, {"passages", "one text\n\nanother\ntext"}, {"style", "loud"}});
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.rows[1]["messages"][1]["content"], "REWRITE THE FOLLOWING TEXT IN THIS STYLE: LOUD.\n\nANOTHER\nTEXT");

  g = run({{"template", "self_instruct"}, {"seed_tasks", "write a poem\nsum two numbers"}, {"count", 3}});
  ASSERT_EQ(g.rows.size(), 3u);
  EXPECT_EQ(g.rows[0]["messages"][0]["role"], "user");
  EXPECT_EQ(g.rows[0]["messages"][1]["role"], "assistant");

  g = run({{"template", "multi_turn_chat"}, {"topics", "hello there"}, {"turns", 3}});
  ASSERT_EQ(g.rows.size(), 1u);
  const json& m = g.rows[0]["messages"];
  ASSERT_EQ(m.size(), 6u);  // three assistant replies, each after a user turn
  EXPECT_EQ(m[1]["content"], "HELLO THERE");
  for (size_t i = 0; i < m.size(); ++i) EXPECT_EQ(m[i]["role"], i % 2 ? "assistant" : "user");

  g = run({{"template", "rag_qa"}, {"passages", "the sky is blue"}, {"questions_per_passage", 1}});
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.rows[0]["messages"][0]["role"], "system");
  EXPECT_TRUE(contains(g.rows[0]["messages"][0]["content"], "the sky is blue"));

  g = run({{"template", "cot_synthesis"}, {"questions", "why is the sky blue"}});
  ASSERT_EQ(g.rows.size(), 1u);
  const std::string cot = g.rows[0]["messages"][1]["content"];
  EXPECT_TRUE(cot.starts_with("<think>\n")) << cot;
  EXPECT_TRUE(contains(cot, "\n</think>\n\n")) << cot;

  g = run({{"template", "prompt_reconstruction"}, {"targets", "Kept verbatim.\n\nAnd this."}});
  ASSERT_EQ(g.rows.size(), 2u);
  EXPECT_EQ(g.rows[0]["chosen"], "Kept verbatim.");
  EXPECT_TRUE(g.rows[0].contains("prompt") && g.rows[0].contains("rejected"));

  // An empty reply skips its row.
  const ChatFn silent = [](const json&) { return std::string("   "); };
  const TemplateDef& t = find_template("cot_synthesis");
  const json c = {{"template", "cot_synthesis"}, {"questions", "a\nb"}};
  g = run_llm_template(t, c, silent, {});
  EXPECT_TRUE(g.rows.empty());
  EXPECT_EQ(g.skipped, 2);
  EXPECT_TRUE(contains(error_of([&] { llm_row_budget(t, {{"questions", " \n"}}); }), "holds no input"));
  EXPECT_GT(calls, 10);
}

TEST(DatasetLlm, ToolUseTracesCallMockAndAnswerInTheOpenAIShape) {
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "get_weather",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])");
  const json config = {
      {"template", "tool_use_traces"}, {"tools", tools.dump()}, {"tasks", "weather in Oslo?\nskip me"}};
  const TemplateDef& t = find_template("tool_use_traces");
  check_template_fields(t, config);
  EXPECT_EQ(llm_row_budget(t, config), 2);
  std::vector<json> offered;
  const ToolChatFn tool_chat = [&](const json& messages, const json& given, bool require_call) {
    offered.push_back(given);
    if (!require_call) return json{{"role", "assistant"}, {"content", " It is 20 degrees in Oslo. "}};
    if (messages.back()["content"] == "skip me") return json{{"role", "assistant"}, {"content", "no call"}};
    return json{{"role", "assistant"},
                {"content", nullptr},
                {"tool_calls",
                 {{{"id", "c9"},
                   {"type", "function"},
                   {"function", {{"name", "get_weather"}, {"arguments", R"({"city": "Oslo"})"}}}}}}};
  };
  std::string mocked_for;
  const ChatFn mock = [&](const json& messages) {
    mocked_for = messages[0]["content"].get<std::string>() + " | " + messages[1]["content"].get<std::string>();
    return std::string(R"({"temp": 20})");
  };
  const Generated g = run_llm_template(t, config, mock, {}, tool_chat);
  ASSERT_EQ(g.rows.size(), 1u);
  EXPECT_EQ(g.skipped, 1);  // the task whose reply made no call
  EXPECT_TRUE(contains(mocked_for, "'get_weather'")) << mocked_for;
  EXPECT_TRUE(contains(mocked_for, R"({"city": "Oslo"})")) << mocked_for;
  const json& row = g.rows[0];
  EXPECT_EQ(row["tools"], tools);
  const json& m = row["messages"];
  ASSERT_EQ(m.size(), 4u);
  EXPECT_EQ(m[0]["content"], "weather in Oslo?");
  EXPECT_EQ(m[1]["tool_calls"][0]["id"], "c9");
  EXPECT_EQ(m[1]["tool_calls"][0]["function"]["arguments"], R"({"city": "Oslo"})");  // a string, as OpenAI writes
  EXPECT_EQ(m[2]["role"], "tool");
  EXPECT_EQ(m[2]["tool_call_id"], "c9");
  EXPECT_EQ(m[2]["content"], R"({"temp": 20})");
  EXPECT_EQ(m[3]["content"], "It is 20 degrees in Oslo.");
  for (const json& o : offered) EXPECT_EQ(o, tools);
  // The row trains: its tools and call reach the template, the answer is the target.
  bool trunc = false;
  const train::Example e = train::parse_row(row.dump(), "f:1", test_codec(), 4096, false, &trunc);
  EXPECT_EQ(e.format, train::RowFormat::Messages);

  for (const std::string bad : {"not json", "[]", R"([{"type": "function"}])", R"({"a": 1})"}) {
    json c = config;
    c["tools"] = bad;
    EXPECT_TRUE(contains(error_of([&] { llm_row_budget(t, c); }), "'tools'")) << bad;
  }
}

}  // namespace
}  // namespace lathe::dataset
