// The finetune job kind end to end through the job runner's `lathe job-run` child on the tiny 4-bit qwen3
// fixture: a job runs to done with train/val metric events and writes its adapter; and a finetune job that a
// stopped server left behind (row still queued, a checkpoint on disk) is marked zombie at the next start,
// queued again with the same config, resumes from the checkpoint and ends with the adapter an uninterrupted
// run writes, byte for byte; and a run told to stop early ends done with the adapter of the steps it took.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "io/mapped_file.h"
#include "jobs/event_log.h"
#include "jobs/job_runner.h"
#include "support/fixtures.h"
#include "support/job_test_util.h"

namespace lathe::jobs {
namespace {

namespace fs = std::filesystem;

TEST(FinetuneJob, RunsToDoneAndAZombieResumesFromItsCheckpoint) {
  const fs::path root = fs::temp_directory_path() / ("lathe_finetune_job_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "data");
  {
    std::ofstream train(root / "data" / "train.jsonl"), valid(root / "data" / "valid.jsonl");
    const char* topics[] = {"cats", "stone", "music", "trees", "bread", "iron", "glass", "salt"};
    for (int i = 0; i < 8; ++i)
      (i < 6 ? train : valid) << R"({"prompt": "Question: what about )" << topics[i]
                              << R"(? Answer:", "completion": " yes"})"
                              << "\n";
  }
  json config = {{"model_dir", test::model_dir("qwen3-q4g64")},
                 {"data_dir", (root / "data").string()},
                 {"iters", 30},
                 {"batch_size", 2},
                 {"rank", 4},
                 {"learning_rate", 1e-2},
                 {"steps_per_eval", 15},
                 {"save_every", 10},
                 {"max_seq_length", 64}};

  // An uninterrupted run.
  config["adapter_path"] = (root / "straight").string();
  {
    JobRunner r({(root / "jobs1").string(), LATHE_BINARY, 500});
    const JobRow row = r.submit("finetune", config);
    const JobRow end = wait_terminal(*r.store(), row.id);
    ASSERT_EQ(end.status, JobStatus::Done) << end.error.value_or("");
    EXPECT_EQ(end.output_path.value_or(""), (root / "straight").string());
    const auto events = read_events(end.log_path).events;
    int train = 0, val = 0;
    for (const auto& e : events)
      if (e.value("type", "") == "metric") (e.value("kind", "") == "train" ? train : val)++;
    EXPECT_GE(train, 2);
    EXPECT_EQ(val, 3);  // steps 0, 15, 30
    EXPECT_LT(events.back()["summary"]["last_val_loss"].get<double>(),
              events.back()["summary"]["first_val_loss"].get<double>());
  }

  // The same run, killed after step 10's checkpoint: its row is left queued by a server that is gone.
  const fs::path resumed = root / "resumed";
  config["adapter_path"] = resumed.string();
  fs::create_directories(resumed / "checkpoints");
  fs::copy(root / "straight" / "checkpoints" / "step-00000010", resumed / "checkpoints" / "step-00000010",
           fs::copy_options::recursive);
  const std::string data_dir = (root / "jobs2").string();
  std::string left_id;
  {
    JobStore store(data_dir);
    left_id = store.create("finetune", config).id;
  }
  JobRunner r({data_dir, LATHE_BINARY, 500});
  EXPECT_EQ(r.store()->get(left_id)->status, JobStatus::Zombie);
  std::string again;
  for (const JobRow& row : r.store()->list())
    if (row.id != left_id) again = row.id;
  ASSERT_FALSE(again.empty()) << "the zombie finetune job was not queued again";
  const JobRow end = wait_terminal(*r.store(), again);
  ASSERT_EQ(end.status, JobStatus::Done) << end.error.value_or("");
  EXPECT_EQ(read_events(end.log_path).events.back()["summary"]["resumed_from"], 10);
  EXPECT_EQ(read_text_file((root / "straight" / "adapters.safetensors").string()),
            read_text_file((resumed / "adapters.safetensors").string()));
  fs::remove_all(root);
}

TEST(FinetuneJob, StopsEarlyAndKeepsTheAdapterOfTheStepsTaken) {
  const fs::path root = fs::temp_directory_path() / ("lathe_finetune_stop_" + std::to_string(::getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "data");
  {
    std::ofstream train(root / "data" / "train.jsonl");
    for (int i = 0; i < 4; ++i)
      train << R"({"prompt": "Question: )" << i << R"(? Answer:", "completion": " yes"})"
            << "\n";
  }
  const json config = {{"model_dir", test::model_dir("qwen3-q4g64")},
                       {"data_dir", (root / "data").string()},
                       {"adapter_path", (root / "adapter").string()},
                       {"iters", 100000},  // would run for hours
                       {"batch_size", 2},
                       {"rank", 4},
                       {"steps_per_report", 1},
                       {"max_seq_length", 64}};
  offer_test_job_kinds();
  JobRunner r({(root / "jobs").string(), LATHE_BINARY, 500});
  const JobRow noop = r.submit("noop", {{"steps", 1000}, {"step_ms", 20}});
  const JobRow row = r.submit("finetune", config);
  EXPECT_THROW(r.stop(noop.id), Error);  // a noop job cannot stop and keep its work
  EXPECT_FALSE(r.stop(row.id));          // queued behind the noop: not running yet
  EXPECT_THROW(r.stop("job_nope"), Error);
  r.cancel(noop.id);
  // Asked as soon as its row is running, long before the model is loaded: the run stops after its first step.
  // (Up to a minute: an ASan child beside other tests took over 15 s to start.)
  bool asked = false;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!asked && std::chrono::steady_clock::now() < until) {
    asked = r.stop(row.id);
    if (!asked) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(asked);
  const JobRow end = wait_terminal(*r.store(), row.id);
  ASSERT_EQ(end.status, JobStatus::Done) << end.error.value_or("");
  const auto summary = read_events(end.log_path).events.back()["summary"];
  EXPECT_EQ(summary["stopped_early"], true) << summary.dump();
  EXPECT_EQ(summary["steps"], 1) << summary.dump();
  EXPECT_TRUE(fs::exists(root / "adapter" / "adapters.safetensors"));
  EXPECT_TRUE(fs::exists(root / "adapter" / "adapter_config.json"));
  EXPECT_FALSE(r.stop(row.id));  // ended
  // It left a checkpoint: the same config run again resumes from the step it stopped at.
  const int64_t stopped_at = summary["steps"].get<int64_t>();
  const JobRow again = r.submit("finetune", config);
  wait_started(*r.store(), again.id);
  ASSERT_TRUE(r.stop(again.id) || is_terminal(r.store()->get(again.id)->status));
  const JobRow end2 = wait_terminal(*r.store(), again.id);
  ASSERT_EQ(end2.status, JobStatus::Done) << end2.error.value_or("");
  const auto summary2 = read_events(end2.log_path).events.back()["summary"];
  EXPECT_EQ(summary2["resumed_from"], stopped_at) << summary2.dump();
  EXPECT_GT(summary2["steps"].get<int64_t>(), stopped_at);
  fs::remove_all(root);
}

}  // namespace
}  // namespace lathe::jobs
