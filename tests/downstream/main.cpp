// Uses the installed headers and library: builds a tiny tree, runs the CPU reference on it.
#include <treemla/attention.h>
#include <treemla/tree.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  using namespace treemla;
  const std::vector<int32_t> parents{-1, 0, 0, 1};
  const std::vector<uint64_t> mask = tree::build_ancestor_mask(parents);
  const int prefix = 3, q_len = 4, H = 1;
  std::vector<float> q(q_len * H * kHeadDimQK, 0.01f), kv((prefix + q_len) * kHeadDimQK, 0.5f);
  std::vector<int32_t> page_table(prefix + q_len), prefix_lens{prefix}, q_indptr{0, q_len};
  for (int i = 0; i < prefix + q_len; ++i) page_table[i] = i;
  VerifyParams p;
  p.dtype = DType::kFP32;
  p.batch = 1;
  p.num_heads = H;
  p.page_size = 1;
  p.num_pages = prefix + q_len;
  p.page_table_stride = prefix + q_len;
  p.mask_words = 1;
  p.sm_scale = 0.125f;
  p.q = q.data();
  p.kv_cache = kv.data();
  p.page_table = page_table.data();
  p.prefix_lens = prefix_lens.data();
  p.q_indptr = q_indptr.data();
  p.tree_mask = mask.data();
  std::vector<float> o(q_len * H * kHeadDimV), lse(q_len * H);
  cpu::verify_full(p, o.data(), lse.data());
  // Every key row equals 0.5 everywhere, so every output is 0.5.
  const bool ok = std::fabs(o[0] - 0.5f) < 1e-6f && std::fabs(o.back() - 0.5f) < 1e-6f;
  std::printf("downstream: o[0] = %g, lse[3] = %g -> %s\n", o[0], lse[3], ok ? "ok" : "WRONG");
  return ok ? 0 : 1;
}
