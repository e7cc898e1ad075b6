// [train] #19 learning: `run_finetune` (the finetune job's producer, the real CPU gradient engine) fine-tunes the
// tiny quantized qwen3 fixture to answer every question with the same word; the validation loss must fall to a
// quarter of where it started, and the adapter it writes must read back and mount on the model. DPO and ORPO
// move the chosen/rejected margin the right way.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine/model_bundle.h"
#include "lab/train/finetune_job.h"
#include "lora/adapter_manager.h"
#include "support/fixtures.h"

namespace lathe {
namespace {

namespace fs = std::filesystem;

TEST(TrainLearning, SftTeachesAFixedAnswerOnTheQuantizedFixture) {
  const fs::path dir = fs::temp_directory_path() / ("lathe_train_learn_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  const char* topics[] = {"the sky", "rivers", "cats",  "stone", "music", "trees", "the sea", "bread",
                          "winter",  "iron",   "glass", "birds", "roads", "salt",  "clouds",  "fire"};
  {
    std::ofstream train(dir / "data" / "train.jsonl"), valid(dir / "data" / "valid.jsonl");
    for (int i = 0; i < 16; ++i) {
      const std::string row =
          std::string(R"({"prompt": "Question: what about )") + topics[i] + R"(? Answer:", "completion": " yes"})";
      (i < 12 ? train : valid) << row << "\n";
    }
  }
  train::TrainConfig c;
  c.model_dir = test::model_dir("qwen3-q4g64");
  c.data_dir = (dir / "data").string();
  c.adapter_path = (dir / "adapter").string();
  c.iters = 120;
  c.batch_size = 4;
  c.learning_rate = 1e-2;
  c.lora.rank = 4;
  c.steps_per_eval = 40;
  c.steps_per_report = 40;
  c.max_seq_length = 64;
  std::vector<jobs::json> events;
  const jobs::JobResult r = lab::run_finetune(c, [&](const jobs::json& e) { events.push_back(e); });
  const auto& s = r.summary;
  ASSERT_TRUE(s.contains("first_val_loss")) << s.dump();
  const double first = s["first_val_loss"].get<double>(), last = s["last_val_loss"].get<double>();
  EXPECT_LT(last, 0.25 * first) << s.dump();
  EXPECT_EQ(s["steps"], 120);
  ASSERT_TRUE(r.output_path);
  ModelBundle bundle(c.model_dir);
  lora::AdapterManager manager(bundle.model());
  const lora::AdapterInfo info = manager.mount("taught", *r.output_path);
  EXPECT_EQ(info.modules, 2u * 7u);  // every target of both layers
  fs::remove_all(dir);
}

// DPO and ORPO on the same fixture: preferring " yes" over " no" moves the validation margin the right way.
TEST(TrainLearning, DpoAndOrpoMoveTheMarginTowardsTheChosenAnswer) {
  const fs::path dir = fs::temp_directory_path() / ("lathe_train_pref_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "data");
  const char* topics[] = {"the sky", "rivers", "cats", "stone", "music", "trees", "the sea", "bread", "winter", "iron"};
  {
    std::ofstream train(dir / "data" / "train.jsonl"), valid(dir / "data" / "valid.jsonl");
    for (int i = 0; i < 10; ++i)
      (i < 8 ? train : valid) << R"({"prompt": "Question: what about )" << topics[i]
                              << R"(? Answer:", "chosen": " yes", "rejected": " no"})"
                              << "\n";
  }
  for (const auto method : {train::Method::Dpo, train::Method::Orpo}) {
    train::TrainConfig c;
    c.model_dir = test::model_dir("qwen3-q4g64");
    c.data_dir = (dir / "data").string();
    c.adapter_path = (dir / train::method_name(method)).string();
    c.method = method;
    c.lr_schedule = "cosine";
    c.iters = 30;
    c.batch_size = 2;
    c.learning_rate = 1e-2;
    c.lora.rank = 4;
    c.steps_per_eval = 30;
    const auto s = lab::run_finetune(c, [](const jobs::json&) {}).summary;
    // DPO's margin starts at 0 (policy = reference); ORPO's at the base model's log-odds.
    EXPECT_GT(s["last_margin"].get<double>(), s["first_margin"].get<double>() + 1.0)
        << train::method_name(method) << " " << s.dump();
    EXPECT_LT(s["last_val_loss"].get<double>(), s["first_val_loss"].get<double>()) << train::method_name(method);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace lathe
