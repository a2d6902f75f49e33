// treemla: choosing the DDTree budget B from what verify costs. This part: the measured cost
// table of verify attention and its interpolation.
//
// Every function validates its inputs and throws treemla::Error with a message naming the field or
// argument and the bound it broke. No file format lives here: the tool and the Python binding read
// the JSON file into a CostTable.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "treemla/tree.h"

namespace treemla {

// The grid `treemla bench --cost-table` measures: B in kCostTableBudgets (n = 1 + B) and L on a
// log grid from 1K to 256K. A table may use any other grid that passes validate_cost_table.
constexpr std::array<int32_t, 8> kCostTableBudgets = {0, 15, 31, 63, 127, 255, 511, 1023};
constexpr std::array<int64_t, 9> kCostTablePrefixLens = {1024,  2048,  4096,   8192,  16384,
                                                        32768, 65536, 131072, 262144};

// Verify attention time per layer, C_v(n[i], L[j]) = us[i][j] microseconds, for one request of
// n tree nodes (the root and B = n - 1 draft nodes) over a prefix of L rows, measured for one
// configuration. Fields mirror the JSON file one to one.
struct CostTable {
  std::string gpu;                    // device name, e.g. "NVIDIA H200"
  std::string date;                   // measurement date, YYYY-MM-DD
  std::string commit;                 // treemla commit the kernel was built from
  int32_t heads = 0;                  // query heads H, 1..kMaxHeads
  int32_t page_size = 0;              // KV page size, a power of two
  std::vector<int32_t> n;             // [num_n] tree sizes 1 + B, 1 <= n[0] < n[1] < .. <= kMaxTreeNodes
  std::vector<int64_t> L;             // [num_L] prefix lengths, 1 <= L[0] < L[1] < .. <= kMaxPrefixLen
  std::vector<std::vector<double>> us;  // [num_n][num_L], finite and > 0

  int32_t min_budget() const { return n.empty() ? -1 : n.front() - 1; }
  int32_t max_budget() const { return n.empty() ? -1 : n.back() - 1; }
};

// Throws treemla::Error naming the first field that breaks the rules above (an empty axis, an
// axis that does not strictly increase, a row of the wrong length, a time that is not finite and
// positive, heads or page_size out of range).
void validate_cost_table(const CostTable& table);

// C_v(n, L) between grid points: piecewise bilinear in (n, L) -- linear in L between the two
// nearest L grid points, for each of the two nearest n grid points, then linear in n between
// those. Exact at grid points; along either axis it is monotone between neighbours; any cost of
// the form a + b n + c L + d n L is reproduced exactly. n outside [n.front(), n.back()] or L
// outside [L.front(), L.back()] is an error naming the range (no extrapolation).
double verify_cost_us(const CostTable& table, int32_t n, int64_t prefix_len);

}  // namespace treemla
