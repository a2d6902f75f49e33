#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "treemla/dtype.h"
#include "treemla/error.h"

using namespace treemla;

TEST(DType, Bf16RoundTripAndRounding) {
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(-2.5f)), -2.5f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even gives 1.
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_float(float_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_TRUE(std::isinf(bf16_to_float(float_to_bf16(INFINITY))));
}

TEST(DType, Fp16MatchesExhaustiveRoundTrip) {
  // Every finite fp16 value converts to float and back unchanged.
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t x = static_cast<uint16_t>(h);
    const float f = fp16_to_float(x);
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_fp16(f), x) << "fp16 bits " << h;
  }
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);                                   // rounds to inf
  EXPECT_EQ(float_to_fp16(65519.0f), 0x7bff);                                   // largest finite
  EXPECT_EQ(fp16_to_float(float_to_fp16(1.0f + std::ldexp(1.0f, -11))), 1.0f);  // tie to even
}

TEST(DType, ParseNamesTheArgument) {
  EXPECT_EQ(parse_dtype("fp16"), DType::kFP16);
  try {
    parse_dtype("int8", "--dtype");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(e.message().find("--dtype"), std::string::npos);
    EXPECT_NE(e.message().find("int8"), std::string::npos);
  }
}
