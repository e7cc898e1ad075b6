// The dataset job through a real `lathe serve` (the demo model, which answers in upper case): the templates
// route behind the API key, configs refused with a 400 naming the field before anything is queued, a Q/A job and
// an LLM-driven style_transfer job run to done in their `lathe job-run` children (the latter calling the server
// back over loopback with the key it was handed in the environment), their folders holding train.jsonl and
// valid.jsonl, and the key written nowhere in the job's row or log.
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/served_lathe.h"

namespace lathe {
namespace dataset_e2e {

namespace fs = std::filesystem;
using json = nlohmann::ordered_json;
const std::string kKey = "dataset-sekret-key";

struct Server : testutil::ServedLathe {
  explicit Server(const std::string& data_dir) : ServedLathe(data_dir, kKey) { read_timeout_s = 60; }
};

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag) {
    path = fs::temp_directory_path() / ("lathe_dataset_e2e_" + tag + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

json wait_done(const Server& s, const std::string& id) {
  json job;
  for (int i = 0; i < 3000; ++i) {
    auto r = s.client().Get("/api/jobs/" + id);
    if (r && r->status == 200) {
      job = json::parse(r->body)["job"];
      const std::string st = job["status"];
      if (st != "queued" && st != "running") return job;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(40));
  }
  return job;
}

std::vector<json> read_jsonl(const fs::path& p) {
  std::vector<json> rows;
  std::ifstream in(p);
  std::string line;
  while (std::getline(in, line)) rows.push_back(json::parse(line));
  return rows;
}

std::string slurp(const std::string& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(DatasetJobHttp, TemplatesValidationAndJobsCallingTheServedModel) {
  TempDir d("api");
  Server s((d.path / "jobs").string());
  ASSERT_GT(s.port, 0);

  auto r = s.client(false).Get("/api/dataset/templates");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = s.client().Get("/api/dataset/templates");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json templates = json::parse(r->body)["templates"];
  bool style = false;
  for (const auto& t : templates)
    if (t["id"] == "style_transfer") style = t["needs_llm"] == true && t["fields"][0]["name"] == "passages";
  EXPECT_TRUE(style) << templates.dump();

  auto post = [&](const json& config) {
    return s.client().Post("/api/jobs", json{{"kind", "dataset"}, {"config", config}}.dump(), "application/json");
  };
  r = post({{"template", "poems"}, {"out", (d.path / "x").string()}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("unknown dataset template 'poems'"), std::string::npos) << r->body;
  r = post({{"template", "hf_dataset_import"}, {"dataset", "a/b"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("format_conversion"), std::string::npos) << r->body;
  r = post(
      {{"template", "dpo_pref_pairs"}, {"out", (d.path / "x").string()}, {"csv", "prompt,chosen,rejected\n\"a,b,c\n"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("line 2: a quoted field is never closed"), std::string::npos) << r->body;
  r = post({{"template", "sft_qa_pairs"}, {"out", "/proc/self/ds"}, {"pairs", "Q: a\nA: b"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("\"param\":\"config\""), std::string::npos) << r->body;
  EXPECT_NE(r->body.find("is not writable: "), std::string::npos) << r->body;
  r = s.client().Get("/api/jobs?kind=dataset");
  ASSERT_TRUE(r);
  EXPECT_TRUE(json::parse(r->body)["jobs"].empty());  // nothing was queued

  // A Q/A job.
  const fs::path qa = d.path / "qa";
  r = post(
      {{"template", "sft_qa_pairs"}, {"out", qa.string()}, {"pairs", "Q: one\nA: 1\nQ: two\nA: 2\nQ: three\nA: 3"}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  json job = wait_done(s, json::parse(r->body)["job"]["id"]);
  ASSERT_EQ(job["status"], "done") << job.dump();
  EXPECT_EQ(read_jsonl(qa / "train.jsonl").size(), 2u);
  EXPECT_EQ(read_jsonl(qa / "valid.jsonl").size(), 1u);

  // An LLM-driven job: the child calls this server's /v1/chat/completions with the key from its environment.
  const fs::path styled = d.path / "styled";
  r = post({{"template", "style_transfer"},
            {"out", styled.string()},
            {"passages", "hello world\n\ngood morning to you"},
            {"style", "loud"},
            {"temperature", 0},
            {"max_tokens", 64}});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  const std::string id = json::parse(r->body)["job"]["id"];
  job = wait_done(s, id);
  ASSERT_EQ(job["status"], "done") << job.dump();
  EXPECT_EQ(job["output_path"], styled.string());
  const auto train = read_jsonl(styled / "train.jsonl"), valid = read_jsonl(styled / "valid.jsonl");
  ASSERT_EQ(train.size(), 1u);
  ASSERT_EQ(valid.size(), 1u);
  for (const auto& row : {train[0], valid[0]}) {
    const json& m = row["messages"];
    ASSERT_EQ(m.size(), 2u);
    const std::string reply = m[1]["content"];
    EXPECT_FALSE(reply.empty());
    size_t upper = 0;
    for (unsigned char c : reply) {
      EXPECT_FALSE(std::islower(c)) << reply;  // the demo model answers in upper case
      upper += std::isupper(c) ? 1 : 0;
    }
    EXPECT_GT(upper, 3u) << reply;
  }
  EXPECT_NE(valid[0]["messages"][0]["content"].get<std::string>().find("good morning to you"), std::string::npos);

  // Tool-use traces: a forced call (the server's grammar), its result mocked, the answer; rows carry their tools.
  const fs::path traces = d.path / "traces";
  const json tools = json::array({{{"type", "function"},
                                   {"function",
                                    {{"name", "get_weather"},
                                     {"parameters",
                                      {{"type", "object"},
                                       {"properties", {{"city", {{"type", "string"}, {"maxLength", 12}}}}},
                                       {"required", {"city"}}}}}}}});
  r = post({{"template", "tool_use_traces"},
            {"out", traces.string()},
            {"tools", tools.dump()},
            {"tasks", "weather in Oslo?\nweather in Rome?"},
            {"temperature", 0},
            {"max_tokens", 128}});  // the demo model spells a call byte by byte
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 201) << r->body;
  job = wait_done(s, json::parse(r->body)["job"]["id"]);
  ASSERT_EQ(job["status"], "done") << job.dump();
  for (const auto& row : read_jsonl(traces / "train.jsonl")) {
    EXPECT_EQ(row["tools"], tools);
    const json& m = row["messages"];
    ASSERT_EQ(m.size(), 4u) << row.dump();
    EXPECT_EQ(m[1]["tool_calls"][0]["function"]["name"], "get_weather");
    const json args = json::parse(m[1]["tool_calls"][0]["function"]["arguments"].get<std::string>());
    EXPECT_TRUE(args["city"].is_string()) << args.dump();  // the schema held
    EXPECT_EQ(m[2]["role"], "tool");
    EXPECT_FALSE(m[3]["content"].get<std::string>().empty());
  }
  r = post({{"template", "tool_use_traces"}, {"out", (d.path / "t2").string()}, {"tools", "[]"}, {"tasks", "x"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_NE(r->body.find("'tools'"), std::string::npos) << r->body;

  // The summary, the stage events, and no key in the row or the log.
  r = s.client().Get("/api/jobs/" + id + "/events?follow=0");
  ASSERT_TRUE(r);
  EXPECT_NE(r->body.find(R"("summary":{"rows":2,"train":1,"valid":1,"skipped":0)"), std::string::npos) << r->body;
  EXPECT_NE(r->body.find(R"("stage":"generating")"), std::string::npos);
  EXPECT_EQ(r->body.find(kKey), std::string::npos);
  EXPECT_EQ(job.dump().find(kKey), std::string::npos);
  EXPECT_EQ(slurp(job["log_path"]).find(kKey), std::string::npos);
}

}  // namespace dataset_e2e
}  // namespace lathe
