// treemla tests of the tool's serving loop: a small configuration they share.
#pragma once

#include "sim/simulation.h"

namespace treemla::tool {

// Short prompts, small pages, few heads: a run of a few dozen rounds takes milliseconds.
inline SimulationConfig small_config() {
  SimulationConfig c;
  c.rounds = 40;
  c.seed = 7;
  c.heads = 1;
  c.budget = 15;
  c.depth = 5;
  c.top_k = 3;
  c.page_size = 4;
  c.max_requests = 3;
  c.prompt_min = 8;
  c.prompt_max = 40;
  c.gen_min = 8;
  c.gen_max = 24;
  c.check_every = 5;
  c.progress_every = 0;
  return c;
}

}  // namespace treemla::tool
