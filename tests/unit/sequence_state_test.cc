// A sequence's token chosen on the device (SequenceState::accept without sample) moves its host Sampler too: the
// step count (seeded draws keep their keys) and the grammar state, so the host can take any later step — which
// it must when a row the device sampler does not serve joins the batch.
#include <gtest/gtest.h>

#include "engine/sequence_state.h"

namespace lathe {
namespace {

class NoTextDecoder : public IncrementalDecoder {
 public:
  std::string push(int32_t) override { return ""; }
  std::string flush() override { return ""; }
};

// Allows only even tokens and records what it was told.
struct EvenTokens : TokenConstraint {
  struct State : ConstraintState {
    explicit State(std::vector<int32_t>& seen) : seen(seen) {}
    void mask(std::span<float> logits) override {
      for (size_t i = 1; i < logits.size(); i += 2) logits[i] = -std::numeric_limits<float>::infinity();
    }
    void accept(int32_t id) override { seen.push_back(id); }
    std::vector<int32_t>& seen;
  };
  std::unique_ptr<ConstraintState> start() const override { return std::make_unique<State>(seen); }
  mutable std::vector<int32_t> seen;
};

SequenceState make_sequence(const SamplingParams& p) {
  GenerateOptions o;
  o.max_tokens = 16;
  o.sampling = p;
  return SequenceState({1, 2, 3}, o, std::make_unique<NoTextDecoder>());
}

TEST(SequenceState, DeviceTokensAdvanceTheHostSamplerAndGrammar) {
  auto even = std::make_shared<EvenTokens>();
  SamplingParams greedy;
  greedy.constraint = even;
  SequenceState s = make_sequence(greedy);
  ASSERT_NE(s.constraint(), nullptr);
  std::vector<uint64_t> bits;
  s.constraint()->allowed_bits(8, bits);
  EXPECT_EQ(bits, std::vector<uint64_t>{0x55});
  s.accept(SampleResult{4, 0.0f, {}});  // the device's choice
  EXPECT_EQ(even->seen, std::vector<int32_t>{4});
  const std::vector<float> logits = {0.0f, 9.0f, 1.0f, 0.5f, 0.25f, 8.0f};
  const SampleResult host = s.sample(logits);  // the host takes the next step
  EXPECT_EQ(host.token, 2);
  s.accept(host);
  EXPECT_EQ(even->seen, (std::vector<int32_t>{4, 2})) << "a host-drawn token is accepted once";
  EXPECT_EQ(s.steps(), 2u);

  // Seeded sampling: a device-taken first step leaves the later host draws where an all-host run has them.
  SamplingParams seeded;
  seeded.temperature = 1.0f;
  seeded.seed = 11;
  SequenceState all_host = make_sequence(seeded), first_on_device = make_sequence(seeded);
  std::vector<float> flat(64, 0.0f);
  const SampleResult first = all_host.sample(flat);
  all_host.accept(first);
  first_on_device.accept(SampleResult{first.token, 0.0f, {}});
  for (int step = 1; step < 6; ++step) {
    const SampleResult a = all_host.sample(flat), b = first_on_device.sample(flat);
    EXPECT_EQ(a.token, b.token) << "step " << step;
    all_host.accept(a);
    first_on_device.accept(b);
  }
}

}  // namespace
}  // namespace lathe
