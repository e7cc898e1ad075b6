// --cuda-dense-weights: parsing, and the budget that never takes what the KV cache budget and the headroom need.
#include <gtest/gtest.h>

#include "common/error.h"
#include "engine/dense_weights_budget.h"

namespace lathe {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;
using Mode = DenseWeightsSetting::Mode;

TEST(DenseWeightsBudget, Parses) {
  EXPECT_EQ(parse_dense_weights("auto").mode, Mode::Auto);
  EXPECT_EQ(parse_dense_weights("on").mode, Mode::On);
  EXPECT_EQ(parse_dense_weights("off").mode, Mode::Off);
  const DenseWeightsSetting g = parse_dense_weights("8G");
  EXPECT_EQ(g.mode, Mode::Bytes);
  EXPECT_EQ(g.bytes, 8 * kGiB);
  EXPECT_EQ(parse_dense_weights("512m").bytes, int64_t{512} << 20);
  EXPECT_EQ(parse_dense_weights("1T").bytes, int64_t{1} << 40);
  EXPECT_EQ(parse_dense_weights("0").bytes, 0);
  EXPECT_EQ(parse_dense_weights("123456").bytes, 123456);
  for (const char* bad : {"", "yes", "-1", "8GB", "G", "1.5G", "99999999999999999999", "9999999999T", " 8G"})
    EXPECT_THROW(parse_dense_weights(bad), Error) << "'" << bad << "'";
}

TEST(DenseWeightsBudget, KvBudgetAndHeadroomComeFirst) {
  const int64_t free = 136 * kGiB, kv = 60 * kGiB;  // an H200 after loading a 4-bit 4B model
  const int64_t headroom = dense_weights_headroom(free);
  EXPECT_EQ(headroom, free / 16);
  EXPECT_EQ(dense_weights_headroom(4 * kGiB), kGiB) << "at least 1 GiB";
  const int64_t spare = free - kv - headroom;
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("on"), free, kv), spare);
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("auto"), free, kv), free / 4) << "auto: a quarter at most";
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("auto"), free, 100 * kGiB), free - 100 * kGiB - headroom);
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("8G"), free, kv), 8 * kGiB);
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("1T"), free, kv), spare) << "a cap, never past the KV budget";
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("off"), free, kv), 0);
}

TEST(DenseWeightsBudget, NothingWhenTheKvBudgetTakesTheDevice) {
  // A 24 GiB card whose KV budget (half the host's memory) is larger than what is free: no copies at all.
  const int64_t free = 19 * kGiB;
  for (const char* s : {"auto", "on", "8G"}) {
    EXPECT_EQ(dense_weights_budget(parse_dense_weights(s), free, 32 * kGiB), 0) << s;
    EXPECT_EQ(dense_weights_budget(parse_dense_weights(s), free, free - kGiB / 2), 0) << s << ": headroom";
  }
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("on"), 0, 0), 0) << "no device";
  EXPECT_EQ(dense_weights_budget(parse_dense_weights("on"), -5, 0), 0);
}

}  // namespace
}  // namespace lathe
