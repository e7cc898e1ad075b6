// The KV file round trip through the real binary: `lathe run --save-kv` then `--load-kv` generates exactly what
// a cold run generates; `lathe cache ls|verify|clear`; and kill -9 during saves never leaves a file under its
// final name that fails to verify or restores wrongly.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cache/kv_file.h"
#include "support/cli_run.h"
#include "support/fixtures.h"
#include "support/kv_test_util.h"

namespace lathe {
namespace {

// The binary at error log level, stderr merged (the tests read its refusals).
testutil::CliOutput lathe_cmd(const std::string& args) {
  return testutil::run_lathe("--log-level error " + args, true);
}

namespace fs = std::filesystem;

std::string ids_arg(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t i : ids) {
    if (!s.empty()) s += ',';
    s += std::to_string(i);
  }
  return s;
}

nlohmann::json run_json(const std::string& args) {
  const testutil::CliOutput o = lathe_cmd("run " + args + " --json");
  EXPECT_EQ(o.status, 0) << o.out;
  const size_t brace = o.out.rfind("\n{");
  return nlohmann::json::parse(o.out.substr(brace == std::string::npos ? 0 : brace + 1));
}

TEST(KvFileCli, LoadKvGeneratesWhatAColdRunGenerates) {
  kvtest::TempDir dir;
  const std::string file = dir.path + "/p.lkv";
  for (const std::string model : {"gemma3-bf16", "qwen3_5-q4g64"}) {
    for (const std::string kv : {"", " --kv-bits 4 --kv-group-size 32"}) {
      const std::string m = " --model " + test::model_dir(model) + kv + " --max-tokens 12 --ignore-eos";
      const std::vector<int32_t> ids = test::load_reference(model).prompts.at("long");
      const std::vector<int32_t> head(ids.begin(), ids.begin() + 30);
      const nlohmann::json cold = run_json("--ids " + ids_arg(ids) + m);
      const nlohmann::json saved = run_json("--ids " + ids_arg(head) + m + " --save-kv " + file);
      EXPECT_GT(saved["kv_saved_bytes"].get<int64_t>(), 0);
      // The full prompt extends the saved 30 tokens: 30 are restored, 10 run, and the output is the cold one.
      const nlohmann::json warm = run_json("--ids " + ids_arg(ids) + m + " --load-kv " + file + " --kv-verify");
      EXPECT_EQ(warm["kv_restored_tokens"], 30) << model << kv;
      EXPECT_EQ(warm["generated"], cold["generated"]) << model << kv;
      EXPECT_EQ(lathe_cmd("cache verify --file " + file).status, 0);
    }
  }
  // A file from another model is refused with the field named.
  run_json("--ids 1,2,3,4 --model " + test::model_dir("qwen3-bf16") + " --save-kv " + file);
  const testutil::CliOutput o =
      lathe_cmd("run --ids 1,2,3,4,5 --model " + test::model_dir("qwen3-q8g32") + " --load-kv " + file);
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.out.find("belongs elsewhere"), std::string::npos) << o.out;
}

// A file saved under adapters carries their content's namespace: it loads under the same adapter from another
// folder, and never without it or under another adapter.
TEST(KvFileCli, AFileSavedUnderAdaptersLoadsOnlyUnderTheSameContent) {
  kvtest::TempDir dir;
  const std::string file = dir.path + "/p.lkv", adapters = test::fixtures_dir() + "/adapters/";
  const std::string copy = dir.path + "/renamed-alpha";
  fs::create_directories(copy);
  for (const auto& e : fs::directory_iterator(adapters + "qwen3-alpha"))
    fs::copy_file(e.path(), copy / e.path().filename());
  const std::string m = " --model " + test::model_dir("qwen3-q4g64") + " --max-tokens 8 --ignore-eos";
  std::vector<int32_t> ids;
  for (int k = 0; k < 40; ++k) ids.push_back((5 + k * 13) % 600 + 1);
  const std::vector<int32_t> head(ids.begin(), ids.begin() + 30);
  const std::string alpha = " --adapter " + adapters + "qwen3-alpha";
  const nlohmann::json cold = run_json("--ids " + ids_arg(ids) + m + alpha);
  run_json("--ids " + ids_arg(head) + m + alpha + " --save-kv " + file);
  const nlohmann::json warm = run_json("--ids " + ids_arg(ids) + m + " --adapter " + copy + " --load-kv " + file);
  EXPECT_EQ(warm["kv_restored_tokens"], 30);
  EXPECT_EQ(warm["generated"], cold["generated"]);
  for (const std::string& other : {std::string(), " --adapter " + adapters + "qwen3-beta"}) {
    const testutil::CliOutput o = lathe_cmd("run --ids " + ids_arg(ids) + m + other + " --load-kv " + file);
    EXPECT_EQ(o.status, 2) << other << o.out;
    EXPECT_NE(o.out.find("belongs elsewhere: ns:"), std::string::npos) << o.out;
  }
}

TEST(KvFileCli, CacheLsVerifyClear) {
  kvtest::TempDir dir;
  const std::string id(32, 'a');
  const std::string base = dir.path + "/" + id + "/base";
  fs::create_directories(base);
  run_json("--ids 1,2,3,4,5 --model " + test::model_dir("qwen3-bf16") + " --save-kv " + base + "/one.lkv");
  run_json("--ids 5,6,7 --model " + test::model_dir("gemma3-bf16") + " --save-kv " + base + "/two.lkv");
  kvtest::write_bytes(base + "/three.lkv.tmp", {1});
  kvtest::write_bytes(dir.path + "/unrelated.txt", {1});

  testutil::CliOutput ls = lathe_cmd("cache ls --dir " + dir.path + " --json");
  ASSERT_EQ(ls.status, 0) << ls.out;
  nlohmann::json j = nlohmann::json::parse(ls.out);
  ASSERT_EQ(j["files"].size(), 3u);
  EXPECT_EQ(j["invalid"], 0);
  EXPECT_EQ(lathe_cmd("cache verify --dir " + dir.path).status, 0);

  std::vector<uint8_t> b = kvtest::read_bytes(base + "/two.lkv");
  b[b.size() - 1] ^= 0x40;  // the last tensor's last byte
  kvtest::write_bytes(base + "/two.lkv", b);
  EXPECT_EQ(lathe_cmd("cache ls --dir " + dir.path).status, 0);  // ls reads headers only
  testutil::CliOutput v = lathe_cmd("cache verify --dir " + dir.path);
  EXPECT_EQ(v.status, 1);
  EXPECT_NE(v.out.find("tensor hash mismatch"), std::string::npos) << v.out;
  EXPECT_EQ(lathe_cmd("cache verify --dir " + dir.path + " --delete-invalid").status, 1);
  EXPECT_FALSE(fs::exists(base + "/two.lkv"));

  EXPECT_EQ(lathe_cmd("cache clear --dir " + dir.path).status, 0);
  EXPECT_FALSE(fs::exists(dir.path + "/" + id));
  EXPECT_TRUE(fs::exists(dir.path + "/unrelated.txt"));
  EXPECT_NE(lathe_cmd("cache ls --dir " + dir.path + "/missing").status, 0);
}

// kill -9 a saving child at random moments: the final name holds either the previous complete file or the new
// complete one — each verifies and restores to a correct continuation — never a partial file.
TEST(KvFileCli, KillDuringSaveNeverLeavesAFileThatLoadsWrong) {
  kvtest::TempDir dir;
  const std::string file = dir.path + "/k.lkv";
  const std::string model = test::model_dir("gemma3-bf16");
  std::vector<int32_t> ids;
  for (int i = 0; i < 1500; ++i) ids.push_back(1 + (i * 37) % 200);
  const std::string ids_s = ids_arg(ids);
  const std::string bin = LATHE_BINARY;
  auto spawn = [&]() {
    const pid_t pid = fork();
    if (pid == 0) {
      const int devnull = ::open("/dev/null", O_WRONLY);
      ::dup2(devnull, 1);
      ::dup2(devnull, 2);
      ::execl(bin.c_str(), bin.c_str(), "--threads", "1", "run", "--model", model.c_str(), "--ids", ids_s.c_str(),
              "--max-tokens", "0", "--save-kv", file.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    return pid;
  };
  // How long one save run takes, to spread the kills over it.
  const auto t0 = std::chrono::steady_clock::now();
  int st = 0;
  ::waitpid(spawn(), &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0);
  const int64_t run_us =
      std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0).count();
  const KvFileHeader first = verify_kv_file(file);

  std::mt19937 rng(42);
  int killed = 0, mid_save = 0;
  for (int i = 0; i < 12; ++i) {
    fs::remove(file + ".tmp");  // an orphan of the last kill (a scan would remove it too)
    const pid_t pid = spawn();
    if (i % 2 == 0) {
      // At a random moment of the run.
      const int64_t at = static_cast<int64_t>(rng() % static_cast<uint32_t>(run_us + 1));
      std::this_thread::sleep_for(std::chrono::microseconds(at));
      if (::kill(pid, SIGKILL) == 0) ++killed;
      ::waitpid(pid, &st, 0);
    } else {
      // Once the .tmp exists (the save has begun), after a random few microseconds.
      bool done = false;
      while (!done && !fs::exists(file + ".tmp")) done = ::waitpid(pid, &st, WNOHANG) == pid;
      if (!done) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 400));
        if (::kill(pid, SIGKILL) == 0) ++killed;
        ::waitpid(pid, &st, 0);
      }
    }
    if (fs::exists(file + ".tmp")) ++mid_save;  // killed while writing
    ASSERT_TRUE(fs::exists(file)) << "the previous complete file disappeared";
    const KvFileHeader h = verify_kv_file(file);  // throws if partial or corrupt
    EXPECT_EQ(h.tokens, first.tokens);
  }
  EXPECT_GT(killed, 0);
  EXPECT_GT(mid_save, 0) << "no kill landed during a save";
  RecordProperty("killed_mid_save", mid_save);
  // The survivor restores: a cold run and a warm run from it generate the same.
  const std::vector<int32_t> more(ids.begin(), ids.end());
  std::vector<int32_t> ext = more;
  ext.push_back(5);
  ext.push_back(6);
  const std::string m = " --model " + model + " --max-tokens 6 --ignore-eos";
  const nlohmann::json cold = run_json("--ids " + ids_arg(ext) + m);
  const nlohmann::json warm = run_json("--ids " + ids_arg(ext) + m + " --load-kv " + file + " --kv-verify");
  EXPECT_EQ(warm["kv_restored_tokens"], static_cast<int>(ids.size()));
  EXPECT_EQ(warm["generated"], cold["generated"]);
}

}  // namespace
}  // namespace lathe
