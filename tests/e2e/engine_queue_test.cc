// EngineService's bounded queue on the demo model: a full queue answers 429, and a queued request whose client
// left (cancelled) gives its place back at once, while another generation still runs.
#include <gtest/gtest.h>

#include <chrono>

#include "engine/chat_session.h"
#include "server/api_error.h"
#include "server/engine_service.h"
#include "server/metrics.h"

namespace lathe::server {
namespace {

// Drains a job's events until it finishes; returns its result.
GenerateResult drain(GenerationJob& job) {
  std::vector<TokenEvent> events;
  while (!job.wait(events, std::chrono::milliseconds(50))) events.clear();
  return job.result();
}

TEST(EngineQueue, CancelledQueuedRequestFreesItsPlace) {
  ChatSession session(std::string(LATHE_SOURCE_DIR) + "/models/demo");
  Metrics metrics;
  SchedulerOptions one_row;  // one running row, so the second request queues
  one_row.max_batch = 1;
  EngineService engine(session, metrics, /*max_queue=*/1, one_row);
  const std::vector<int32_t> prompt = session.chat_prompt({{{"role", "user"}, {"content", "hello world"}}});
  // ~100 words: the demo model echoes them in upper case, a couple of hundred tokens; the checks below run
  // between its first token and its last (in-process calls, well under a millisecond).
  std::string words;
  for (int i = 0; i < 8; ++i) words += "the quick brown fox jumps over the lazy dog and runs away ";
  const std::vector<int32_t> long_prompt = session.chat_prompt({{{"role", "user"}, {"content", words}}});
  GenerateOptions busy;
  busy.max_tokens = 400;
  GenerateOptions short_run;
  short_run.max_tokens = 4;

  auto running = engine.submit(long_prompt, busy, "a");
  std::vector<TokenEvent> events;
  while (events.empty()) ASSERT_FALSE(running->wait(events, std::chrono::milliseconds(50))) << "finished early";
  auto queued = engine.submit(prompt, short_run, "b");  // the engine is busy: this one waits
  EXPECT_EQ(engine.queued(), 1u);
  try {
    engine.submit(prompt, short_run, "c");
    ADD_FAILURE() << "a full queue must answer 429";
  } catch (const ApiError& e) {
    EXPECT_EQ(e.status(), 429);
  }
  queued->cancel();                                   // its client left
  auto next = engine.submit(prompt, short_run, "d");  // takes the freed place while "a" still runs
  EXPECT_EQ(engine.queued(), 1u);
  EXPECT_EQ(drain(*queued).finish_reason, "cancelled");
  running->cancel();
  EXPECT_EQ(drain(*running).finish_reason, "cancelled");
  EXPECT_EQ(drain(*next).tokens.size(), 4u);
}

TEST(EngineQueue, CancelAllEndsRunningAndQueuedGenerations) {
  ChatSession session(std::string(LATHE_SOURCE_DIR) + "/models/demo");
  Metrics metrics;
  SchedulerOptions one_row;
  one_row.max_batch = 1;
  EngineService engine(session, metrics, /*max_queue=*/4, one_row);
  std::string words;
  for (int i = 0; i < 8; ++i) words += "the quick brown fox jumps over the lazy dog and runs away ";
  const std::vector<int32_t> long_prompt = session.chat_prompt({{{"role", "user"}, {"content", words}}});
  GenerateOptions busy;
  busy.max_tokens = 400;
  auto running = engine.submit(long_prompt, busy, "a");
  std::vector<TokenEvent> events;
  while (events.empty()) ASSERT_FALSE(running->wait(events, std::chrono::milliseconds(50))) << "finished early";
  auto queued = engine.submit(long_prompt, busy, "b");
  engine.cancel_all();
  const GenerateResult a = drain(*running);
  EXPECT_EQ(a.finish_reason, "cancelled");
  EXPECT_LT(a.tokens.size(), 400u);
  EXPECT_TRUE(running->stopped_by_server());
  EXPECT_EQ(drain(*queued).finish_reason, "cancelled");
  EXPECT_TRUE(queued->stopped_by_server());
  GenerateOptions short_run;
  short_run.max_tokens = 4;
  EXPECT_THROW(engine.submit(long_prompt, short_run, "c"), ApiError);  // shutting down: later requests get 503
}

}  // namespace
}  // namespace lathe::server
