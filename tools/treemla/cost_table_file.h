// treemla tool: cost table files (docs/budget.md, "JSON schema") -- the JSON reader, and where
// the default table is found (docs/tool.md, "The cost table").
#pragma once

#include <string>
#include <vector>

#include "treemla/budget.h"

namespace treemla::tool {

struct CostTableFile {
  CostTable table;  // validated (validate_cost_table)
  std::string path;
  std::string family,
      tile;  // optional keys `treemla bench --cost-table` records; empty when absent
};

// Reads and validates a cost table file. Throws std::invalid_argument
// "<label>: '<path>': <what is wrong>", naming the key (with its index) and the rule or bound it
// breaks: a missing key, a value of the wrong type, arrays of the wrong length, a time that is
// null, not finite or not > 0, an axis that does not increase.
CostTableFile read_cost_table_file(const std::string& path, const std::string& label);

// Where the default table is looked for, in order: <dir of the treemla binary>/<the install
// tree's relative path from bin to share/treemla>/default-cost-table.json (an installed tool),
// then <dir of the binary>/share/treemla/default-cost-table.json (the build tree). CMake copies
// the committed H200 table to both.
std::vector<std::string> default_cost_table_candidates();

// The first default candidate that exists. Throws std::invalid_argument listing the places
// looked in when none does.
std::string find_default_cost_table();

}  // namespace treemla::tool
