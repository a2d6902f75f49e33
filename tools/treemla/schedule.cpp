// treemla schedule: the work list the verify schedule makes for a call, without a GPU. The
// arithmetic is the schedule kernel's own (src/cuda/common/schedule_model.h: the candidates'
// estimates and the choice are the functions the kernel calls); model_schedule() replays its
// passes for a batch of alike requests.
#include <fmt/format.h>

#include <iostream>
#include <string>
#include <vector>

#include "bench.h"
#include "cli.h"
#include "commands.h"
#include "cuda/common/schedule_model.h"
#include "treemla/attention.h"

namespace treemla::tool {

namespace {

void print_case(const bench::Shape& s, const std::string& family, int sms, int ctas_per_sm) {
  using namespace treemla::cuda;
  const int grid = sms * ctas_per_sm;
  const int max_waves = plan_max_waves(sms, grid);
  const int slots = max_waves * grid;
  const int pct = refine_pct_for(family == "sm90a");
  const std::vector<ModelRequest> reqs(static_cast<size_t>(s.batch),
                                       ModelRequest{s.q_len, s.prefix});
  const ScheduleModel m = model_schedule(reqs, s.heads, grid, slots, max_waves, pct);
  const int tiles = m.tiles.empty() ? 0 : m.tiles[0];
  std::cout << fmt::format(
      "case {}:{}:{}:{} ({}, {} CTAs = {} SMs x {}; up to {} waves, {} partial slots; refined last "
      "wave under {}% of the best plain estimate)\n",
      s.batch, s.heads, s.q_len, s.prefix, family, grid, sms, ctas_per_sm, max_waves, slots, pct);
  std::cout << fmt::format(
      "  a request: {} rows = {} row tile{} of {}; {} prefix blocks of {} keys\n",
      s.q_len * s.heads, tiles, tiles == 1 ? "" : "s", kBlockM,
      m.pblocks.empty() ? 0 : m.pblocks[0], kScheduleBlockN);
  std::cout
      << "  candidate waves splits   items partials largest smallest  estimate  refined (q)\n";
  for (int c = 0; c < kNumCandidates; ++c) {
    if (!m.cand_allowed[c]) {
      std::cout << fmt::format("  {:9} {:5} {:6}   (more waves than the plan's {})\n", c,
                               cand_waves(c), cand_up(c) ? "up" : "down", max_waves);
      continue;
    }
    const Estimate& e = m.est[c];
    const std::string refined =
        e.refined >= 0 ? fmt::format("{} ({})", e.refined, e.q) : std::string("-");
    std::cout << fmt::format(
        "  {:9} {:5} {:6} {:7} {:8} {:7} {:8} {:>9}  {}\n", c, cand_waves(c),
        cand_up(c) ? "up" : "down", m.cand_items[c], m.cand_parts[c], m.cand_max[c], m.cand_min[c],
        e.plain >= 0 ? std::to_string(e.plain) : std::string("too many"), refined);
  }
  const int splits = m.splits.empty() ? 1 : m.splits[0];
  std::cout << fmt::format(
      "  chosen: candidate {} ({} wave{}, splits rounded {}{}): {} split{} a "
      "request",
      m.chosen, cand_waves(m.chosen), cand_waves(m.chosen) == 1 ? "" : "s",
      cand_up(m.chosen) ? "up" : "down", m.refine_count > 0 ? ", refined last wave" : "", splits,
      splits == 1 ? "" : "s");
  if (m.refine_count > 0) {
    std::cout << fmt::format(
        "; {} whole work items, then {} item{} in {} pieces each: {} work items on {} CTAs",
        m.refine_first, m.refine_count, m.refine_count == 1 ? "" : "s", m.refine_q, m.items, grid);
  } else {
    const int last = m.items % grid == 0 ? (m.items > 0 ? grid : 0) : m.items % grid;
    const int waves = (m.items + grid - 1) / grid;
    std::cout << fmt::format("; {} work items on {} CTAs, {} wave{} (the last {} of {}: {} idle)",
                             m.items, grid, waves, waves == 1 ? "" : "s", last, grid, grid - last);
  }
  std::cout << fmt::format("; {} partial slots, {} combine groups\n", m.partials, m.groups);
}

}  // namespace

int cmd_schedule(int argc, char** argv) {
  CLI::App app(
      "Prints, without a GPU, the work list the verify schedule makes for each case: every "
      "candidate\n"
      "of its estimate (wave count, splits rounded down or up), the estimates, the choice, and how "
      "the\n"
      "work items fill the persistent grid (docs/verify-kernel.md, \"The work list\"). Every "
      "request of a\n"
      "case has the same q_len and prefix; page_size does not change the schedule.\n",
      "treemla schedule");
  cli::configure(app);
  std::string cases = "1:8:65:185000:64";
  app.add_option("--cases", cases, "semicolon-separated batch:heads:q_len:prefix:page_size")
      ->check(CLI::Validator(
          [](std::string& text) {
            std::vector<bench::Shape> shapes;
            if (text == "default") return std::string("'default' is bench's grid; list the cases");
            return bench::parse_cases(text, shapes);
          },
          "CASES"))
      ->capture_default_str();
  std::string family = "sm90a";
  cli::add_choice(app, "--family", family, {"sm90a", "warpspec", "cpasync", "decode"},
                  "kernel family: its refined-wave threshold and, by default, its CTAs per SM (the "
                  "cluster family's CTA pairs are not modeled)");
  int sms = 132;
  cli::add_integer(app, "--sms", sms, 1, 1024, "SMs of the GPU (H100 SXM and H200: 132)");
  int ctas_per_sm = 0;
  cli::add_integer(app, "--ctas-per-sm", ctas_per_sm, 0, 8,
                   "resident CTAs per SM; 0: the family's on sm_90 (decode 2, the others 1; the "
                   "decode family has 1 on sm_120)");
  if (const auto rc = cli::parse(app, argc, argv)) return *rc;
  std::vector<bench::Shape> shapes;
  bench::parse_cases(cases, shapes);  // checked above
  for (const bench::Shape& s : shapes) {
    if (family == "decode" && s.q_len * s.heads > 16)
      return cli::usage_error(
          app, fmt::format("--cases: the decode family takes requests of at most 16 rows; case "
                           "{}:{}:{}:{} has q_len * heads = {}",
                           s.batch, s.heads, s.q_len, s.prefix, s.q_len * s.heads));
  }
  if (ctas_per_sm == 0) ctas_per_sm = family == "decode" ? 2 : 1;
  for (const bench::Shape& s : shapes) print_case(s, family, sms, ctas_per_sm);
  return 0;
}

}  // namespace treemla::tool
