// The kernel family and tile configuration a plan gets (cuda::choose_family, the rule
// make_verify_plan applies), on the devices treemla supports, most of which no test machine
// here has: sm_80, sm_86, sm_90 with and without sm_90a code, sm_100, sm_120. The GPU suite's
// VerifyGpu.FamilyChoiceAndRefusals checks the same rule through make_verify_plan on the device
// it runs on, and the refusals of forced choices a device cannot run.
#include <gtest/gtest.h>

#if TREEMLA_WITH_CUDA

#include "cuda/dispatch.h"

namespace treemla::test {
namespace {

using cuda::KernelFamily;
using cuda::TileConfig;
using cuda::VerifyLimits;

constexpr int kOptin99K = 101376;   // sm_86, sm_89, sm_120: 99 KB per block
constexpr int kOptin163K = 166912;  // sm_80
constexpr int kOptin227K = 232448;  // sm_90, sm_100

struct Device {
  int cc, optin;
  bool sm90a, warpspec_image;
};

cuda::FamilyChoice choose(const Device& d, const VerifyLimits& l,
                          TileConfig tile = TileConfig::kAuto,
                          KernelFamily family = KernelFamily::kAuto) {
  return cuda::choose_family(l, d.cc, d.optin, d.sm90a, d.warpspec_image, tile, family);
}

void expect(const cuda::FamilyChoice& c, KernelFamily f, TileConfig t) {
  EXPECT_EQ(c.family, f) << cuda::kernel_family_name(c.family);
  EXPECT_EQ(c.tile, t) << cuda::tile_config_name(c.tile);
}

// max_batch, max_total_q, num_heads, max_q_len
const VerifyLimits kNoBound{2, 130, 8, 0};
const VerifyLimits kTree{2, 130, 8, 65};  // 520 rows a request at the bound
const VerifyLimits kTile{2, 130, 8, 8};   // 64 rows: one full tile
const VerifyLimits kShort{2, 130, 8, 7};  // 56 rows
const VerifyLimits kDecodeRows{8, 8, 16, 1};

TEST(FamilyChoice, Sm120) {
  const Device d{120, kOptin99K, false, true};
  expect(choose(d, kNoBound), KernelFamily::kCpAsync, TileConfig::kSmem99K);
  expect(choose(d, kTree), KernelFamily::kWarpSpec, TileConfig::kSmem99K);
  expect(choose(d, kTile), KernelFamily::kWarpSpec, TileConfig::kSmem99K);
  expect(choose(d, kShort), KernelFamily::kCpAsync, TileConfig::kSmem99K);
  expect(choose(d, kDecodeRows), KernelFamily::kDecode, TileConfig::kSmem99K);
  // A build without the warpspec kernel for the device keeps cpasync.
  expect(choose({120, kOptin99K, false, false}, kTree), KernelFamily::kCpAsync,
         TileConfig::kSmem99K);
  // A forced tile is returned as asked (make_verify_plan refuses what does not fit); neither
  // decode nor warpspec has the large configuration.
  expect(choose(d, kDecodeRows, TileConfig::kSmemLarge), KernelFamily::kCpAsync,
         TileConfig::kSmemLarge);
  expect(choose(d, kTree, TileConfig::kSmemLarge), KernelFamily::kCpAsync, TileConfig::kSmemLarge);
}

TEST(FamilyChoice, Sm90WithSm90aCode) {
  const Device d{90, kOptin227K, true, true};
  expect(choose(d, kNoBound), KernelFamily::kSm90a, TileConfig::kSmemLarge);
  expect(choose(d, kTree), KernelFamily::kSm90a, TileConfig::kSmemLarge);
  // Decode-bounded limits take the decode family here too (level with sm90a or faster at every
  // decode shape on the H200); the large configuration forced keeps sm90a.
  expect(choose(d, kDecodeRows), KernelFamily::kDecode, TileConfig::kSmem99K);
  expect(choose(d, kDecodeRows, TileConfig::kSmemLarge), KernelFamily::kSm90a,
         TileConfig::kSmemLarge);
  // The 99 KB configuration asked for (what sm_120 runs): sm90a has none.
  expect(choose(d, kTree, TileConfig::kSmem99K), KernelFamily::kWarpSpec, TileConfig::kSmem99K);
  expect(choose(d, kDecodeRows, TileConfig::kSmem99K), KernelFamily::kDecode, TileConfig::kSmem99K);
  expect(choose(d, kNoBound, TileConfig::kSmem99K), KernelFamily::kCpAsync, TileConfig::kSmem99K);
}

TEST(FamilyChoice, Sm90WithoutSm90aCodeAndSm100) {
  for (const Device& d :
       {Device{90, kOptin227K, false, true}, Device{100, kOptin227K, false, true}}) {
    expect(choose(d, kNoBound), KernelFamily::kCpAsync, TileConfig::kSmemLarge);
    expect(choose(d, kTree), KernelFamily::kWarpSpec, TileConfig::kSmem99K);
    expect(choose(d, kShort), KernelFamily::kCpAsync, TileConfig::kSmemLarge);
    expect(choose(d, kDecodeRows), KernelFamily::kDecode, TileConfig::kSmem99K);
    expect(choose(d, kTree, TileConfig::kSmemLarge), KernelFamily::kCpAsync,
           TileConfig::kSmemLarge);
  }
}

TEST(FamilyChoice, Sm80AndSm86) {
  // warpspec needs compute capability 9.0: tree limits stay with cpasync.
  const Device a{80, kOptin163K, false, true};
  expect(choose(a, kNoBound), KernelFamily::kCpAsync, TileConfig::kSmemLarge);
  expect(choose(a, kTree), KernelFamily::kCpAsync, TileConfig::kSmemLarge);
  expect(choose(a, kDecodeRows), KernelFamily::kDecode, TileConfig::kSmem99K);
  const Device b{86, kOptin99K, false, true};
  expect(choose(b, kTree), KernelFamily::kCpAsync, TileConfig::kSmem99K);
  expect(choose(b, kDecodeRows), KernelFamily::kDecode, TileConfig::kSmem99K);
}

TEST(FamilyChoice, ForcedFamilyKeepsItsOwnConfiguration) {
  const Device d{90, kOptin227K, true, true};
  expect(choose(d, kNoBound, TileConfig::kAuto, KernelFamily::kDecode), KernelFamily::kDecode,
         TileConfig::kSmem99K);
  expect(choose(d, kNoBound, TileConfig::kAuto, KernelFamily::kWarpSpec), KernelFamily::kWarpSpec,
         TileConfig::kSmem99K);
  expect(choose(d, kNoBound, TileConfig::kAuto, KernelFamily::kCpAsync), KernelFamily::kCpAsync,
         TileConfig::kSmemLarge);
  expect(choose({120, kOptin99K, false, true}, kNoBound, TileConfig::kAuto, KernelFamily::kCpAsync),
         KernelFamily::kCpAsync, TileConfig::kSmem99K);
}

}  // namespace
}  // namespace treemla::test

#else

TEST(FamilyChoice, NeedsTheCudaBuild) {
  GTEST_SKIP() << "choose_family is part of the CUDA build (TREEMLA_ENABLE_CUDA=ON)";
}

#endif
