// The measurement switches' parser (src/common/env_switch.h): unset means the default, a value
// outside what the switch takes throws naming the variable, the value and what it takes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <vector>

#include "common/env_switch.h"
#include "common/expect_error.h"

using treemla::detail::env_choice;
using treemla::detail::env_int;
using treemla::detail::env_ints;
using treemla::detail::env_set;
using treemla::test::expect_error;

namespace {

constexpr const char* kVar = "TREEMLA_TEST_ENV_SWITCH";

// Sets kVar for one test and removes it afterwards.
class EnvSwitch : public ::testing::Test {
 protected:
  void TearDown() override { unsetenv(kVar); }
  static void set(const char* v) { ASSERT_EQ(setenv(kVar, v, 1), 0); }
};

}  // namespace

TEST_F(EnvSwitch, SetMeansANonEmptyValue) {
  unsetenv(kVar);
  EXPECT_FALSE(env_set(kVar));
  set("");
  EXPECT_FALSE(env_set(kVar));
  set("0");
  EXPECT_TRUE(env_set(kVar));
}

TEST_F(EnvSwitch, ChoiceUnsetOrEmptyIsTheDefault) {
  unsetenv(kVar);
  EXPECT_EQ(env_choice(kVar, {"auto", "cpasync", "tma"}, 0), 0);
  EXPECT_EQ(env_choice(kVar, {"none", "64", "128", "256"}, 3), 3);
  set("");
  EXPECT_EQ(env_choice(kVar, {"none", "64", "128", "256"}, 3), 3);
}

TEST_F(EnvSwitch, ChoiceTakesEachNameExactly) {
  const char* names[] = {"none", "64", "128", "256"};
  for (int i = 0; i < 4; ++i) {
    set(names[i]);
    EXPECT_EQ(env_choice(kVar, {"none", "64", "128", "256"}, 3), i) << names[i];
  }
}

TEST_F(EnvSwitch, ChoiceRefusesAnythingElse) {
  for (const char* bad : {"512", "NONE", " none", "none ", "25", "2560", "bulk"}) {
    set(bad);
    expect_error(
        [] {
          env_choice(kVar, {"none", "64", "128", "256"}, 3);
        },
        {kVar, "must be none, 64, 128 or 256", std::string("\"") + bad + "\""});
  }
  set("tma2");
  expect_error(
      [] {
        env_choice(kVar, {"bulk", "cpasync"}, 0);
      },
      {kVar, "must be bulk or cpasync", "\"tma2\""});
}

TEST_F(EnvSwitch, IntInRange) {
  unsetenv(kVar);
  EXPECT_EQ(env_int(kVar, 0, 1000, -1), -1);
  set("0");
  EXPECT_EQ(env_int(kVar, 0, 1000, -1), 0);
  set("97");
  EXPECT_EQ(env_int(kVar, 0, 1000, -1), 97);
  set("1000");
  EXPECT_EQ(env_int(kVar, 0, 1000, -1), 1000);
  set("-5");
  EXPECT_EQ(env_int(kVar, -10, 10, 0), -5);
}

TEST_F(EnvSwitch, IntRefusesGarbageAndOutOfRange) {
  for (const char* bad : {"abc", "97%", "9 7", " 97", "+97", "1001", "-1", "0x10", "1e2",
                          "99999999999999999999999"}) {
    set(bad);
    expect_error([] { env_int(kVar, 0, 1000, -1); },
                 {kVar, "must be an integer in [0, 1000]", std::string("\"") + bad + "\""});
  }
}

TEST_F(EnvSwitch, IntsTakesExactlyTheCount) {
  unsetenv(kVar);
  EXPECT_TRUE(env_ints(kVar, 2, 0, 100).empty());
  set("3,12");
  EXPECT_EQ(env_ints(kVar, 2, 0, 100), (std::vector<long>{3, 12}));
  set("0,100");
  EXPECT_EQ(env_ints(kVar, 2, 0, 100), (std::vector<long>{0, 100}));
}

TEST_F(EnvSwitch, IntsRefusesWrongCountSeparatorsAndRange) {
  for (const char* bad :
       {"3", "3,", ",3", "3,12,4", "3;12", "3, 12", "3,12x", "-1,2", "3,101", "a,b"}) {
    set(bad);
    expect_error(
        [] { env_ints(kVar, 2, 0, 100); },
        {kVar, "must be 2 comma-separated integers in [0, 100]", std::string("\"") + bad + "\""});
  }
}
