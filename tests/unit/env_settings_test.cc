// common/env.h: how LATHE_* switches and integers read the environment (one rule for every setting).
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/env.h"

namespace lathe {
namespace {

constexpr const char* kVar = "LATHE_ENV_SETTINGS_TEST";

TEST(EnvSettings, SwitchIsOnUnlessZero) {
  unsetenv(kVar);
  EXPECT_TRUE(env_switch(kVar));
  EXPECT_FALSE(env_switch(kVar, false));  // absent: the caller's default
  setenv(kVar, "0", 1);
  EXPECT_FALSE(env_switch(kVar));
  EXPECT_FALSE(env_switch(kVar, true));
  for (const char* on : {"1", "yes", "00", ""}) {
    setenv(kVar, on, 1);
    EXPECT_TRUE(env_switch(kVar, false)) << '"' << on << '"';
  }
  unsetenv(kVar);
}

TEST(EnvSettings, IntegerOrDefault) {
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 32), 32);
  setenv(kVar, "64", 1);
  EXPECT_EQ(env_int(kVar, 32), 64);
  setenv(kVar, "-3", 1);
  EXPECT_EQ(env_int(kVar, 32), -3);
  for (const char* bad : {"", "12x", "x", "1.5"}) {
    setenv(kVar, bad, 1);
    EXPECT_EQ(env_int(kVar, 32), 32) << '"' << bad << '"';
  }
  unsetenv(kVar);
}

}  // namespace
}  // namespace lathe
