// treemla tests: what the serving loop reports while it runs (progress hooks, the CPU backend's
// verify in pieces) and the pool-size rule's message.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "sim/simulation.h"
#include "tool_test_util.h"

namespace treemla::tool {
namespace {

// small_config() with a few heads (so pieces are groups of heads) and a due cross-check every
// fourth round.
SimulationConfig progress_config() {
  SimulationConfig c = small_config();
  c.rounds = 12;
  c.heads = 3;
  c.check_every = 4;
  return c;
}

// Every head of every request its own piece.
std::unique_ptr<SimBackend> cpu_in_pieces(const kvpool::PoolConfig& c, const BackendLimits&) {
  return std::make_unique<CpuBackend>(c, 1.0);
}

// Each (row, head) is computed on its own, so verify in pieces gives the bits of one call.
TEST(Progress, VerifyInPiecesGivesTheSameBits) {
  const SimulationConfig c = progress_config();
  const SimulationReport whole = run_simulation(c);
  const SimulationReport pieces = run_simulation(c, {.backend = &cpu_in_pieces});
  EXPECT_TRUE(pieces.checks_passed());
  EXPECT_EQ(whole.trace, pieces.trace);  // every LSE bit is in the trace
  EXPECT_EQ(whole.cross_check_max_diff, pieces.cross_check_max_diff);
  EXPECT_EQ(whole.cross_checks, pieces.cross_checks);
}

TEST(Progress, HooksFollowTheRun) {
  SimulationConfig c = progress_config();
  c.progress_every = 4;
  std::vector<RunProgress> events;
  std::ostringstream lines;
  SimulationHooks hooks;
  hooks.lines = &lines;
  hooks.progress = [&](const RunProgress& p) { events.push_back(p); };
  hooks.backend = &cpu_in_pieces;
  run_simulation(c, hooks);
  ASSERT_FALSE(events.empty());
  int line_events = 0, verify_events = 0, check_events = 0;
  int64_t round = 0;
  double fraction = 0;
  for (const RunProgress& p : events) {
    EXPECT_EQ(p.rounds, c.rounds);
    ASSERT_GE(p.round, round);
    if (p.round > round) {  // a new round starts from nothing
      EXPECT_EQ(p.round, round + 1);
      EXPECT_EQ(p.round_fraction, 0.0);
      EXPECT_EQ(std::string(p.activity), "drafting");
      round = p.round;
      fraction = 0;
    }
    EXPECT_GE(p.round_fraction, fraction) << "round " << p.round;
    EXPECT_LE(p.round_fraction, 1.0);
    fraction = p.round_fraction;
    line_events += p.line_follows;
    verify_events += std::string(p.activity) == "verify";
    check_events += std::string(p.activity) == "cross-check";
    if (std::string(p.activity) == "verify" && p.round % c.check_every == 0)
      EXPECT_LE(p.round_fraction, 0.5) << "a due cross-check takes the second half of the round";
  }
  EXPECT_EQ(round, c.rounds);
  EXPECT_EQ(line_events, c.rounds / c.progress_every);
  const std::string s = lines.str();
  EXPECT_EQ(std::count(s.begin(), s.end(), '\n'), line_events);
  EXPECT_GT(verify_events, c.rounds);  // pieces: several reports per verify call
  EXPECT_GT(check_events, 0);
}

TEST(Progress, LineFollowsComesBeforeItsLine) {
  SimulationConfig c = progress_config();
  c.progress_every = 3;
  std::ostringstream lines;
  std::vector<size_t> written_before;  // bytes of lines written when each line_follows came
  SimulationHooks hooks;
  hooks.lines = &lines;
  hooks.progress = [&](const RunProgress& p) {
    if (p.line_follows) written_before.push_back(lines.str().size());
  };
  run_simulation(c, hooks);
  ASSERT_EQ(written_before.size(), 4u);
  EXPECT_EQ(written_before[0], 0u);
  for (size_t i = 1; i < written_before.size(); ++i)
    EXPECT_GT(written_before[i], written_before[i - 1]);
}

// A default pool too large for the host names the options that size it, and a number of
// requests that fits.
TEST(SimulationConfig, TooLargeADefaultPoolNamesTheOptionsGiven) {
  SimulationConfig c;
  c.prompt_min = c.prompt_max = 262144;
  c.max_requests = 14;
  EXPECT_NO_THROW(validate_config(c));
  c.max_requests = 15;
  try {
    validate_config(c);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.rfind("--max-requests 15 with --prompt-max 262144 and --gen-max 96", 0), 0u) << m;
    EXPECT_NE(m.find("use --max-requests 14 or fewer"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace treemla::tool
