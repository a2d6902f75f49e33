// wgmma (sm_90a) building blocks of the sm90a verify family: shared-memory matrix descriptors
// for the 128-byte-swizzled layout every operand of the family uses, the two instruction shapes
// it issues, and the fences and group waits around them. Only code compiled for sm_90a calls
// these (the instructions exist on no other target).
//
// Layout (docs/verify-kernel.md, "The sm90a family"): a [rows][576] operand (Q, or a KV block) is
// stored as 9 column chunks of 64 elements; chunk c holds rows x 128 bytes, and the 16-byte unit
// u of row r sits at unit u ^ (r % 8) of that row (the 128-byte swizzle, on 1024-byte-aligned
// chunks). The same bytes serve as a K-major operand (Q and K in S = Q K^T, P in O += P V) and as
// an N-major one (V in O += P V: 64 columns x 8 keys per 1024-byte atom).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace treemla::cuda::sm90a {

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TREEMLA_HAS_WGMMA 1
#else
#define TREEMLA_HAS_WGMMA 0
#endif

// Byte offset of 16-byte unit `unit` (0..7) of row `row` inside a 128-byte-swizzled chunk.
__host__ __device__ constexpr uint32_t swizzle128(int row, int unit) {
  return static_cast<uint32_t>(row * 128 + ((unit ^ (row & 7)) << 4));
}

// Shared-memory matrix descriptor, 128-byte swizzle. `addr` is a shared-space byte address
// (inside a 1024-byte-aligned chunk, plus the k-step offset); lbo and sbo in bytes.
//   K-major operand (rows x 16 k): sbo = 1024 (the next 8 rows); lbo unused (1).
//   N-major operand (16 k x N):    lbo = the next 64 columns (one chunk), sbo = 1024 (next 8 k).
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  uint64_t d = 0;
  d |= static_cast<uint64_t>((addr & 0x3FFFF) >> 4);
  d |= static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16;
  d |= static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32;
  d |= uint64_t{1} << 62;  // 128-byte swizzle
  return d;
}

#if TREEMLA_HAS_WGMMA

__device__ __forceinline__ void wgmma_fence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (st.shared, cp.async) become visible to wgmma reads.
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving accesses of accumulator registers across wgmma issue / wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One asm statement per element type (TY: "bf16" or "f16"): scale_d = 0 overwrites D.
#define TREEMLA_WGMMA_M64N64K16(TY)                                                                \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                      \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                      \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"             \
      "}, %32, %33, p, 1, 1, 0, 0;\n}\n"                                                           \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "l"(da), "l"(db), "r"(scale_d))

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], A and B from shared memory (B K-major).
template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_ss(float (&d)[32], uint64_t da, uint64_t db,
                                                   int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    TREEMLA_WGMMA_M64N64K16("bf16");
  } else {
    TREEMLA_WGMMA_M64N64K16("f16");
  }
}
#undef TREEMLA_WGMMA_M64N64K16

// D[64 x 64] (+)= A[64 x 16] B[16 x 64], A from registers (the m64k16 fragment, as for
// wgmma_m64n256k16_rs_tnspb below), B from shared memory (K-major).
#define TREEMLA_WGMMA_M64N64K16_RS(TY)                                                             \
  asm volatile(                                                                                    \
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"                                                 \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                      \
      " {"                                                                                         \
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                      \
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"             \
      "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"                                             \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),        \
        "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),    \
        "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
        "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
        "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d))

template <typename T>
__device__ __forceinline__ void wgmma_m64n64k16_rs(float (&d)[32], const uint32_t (&a)[4],
                                                   uint64_t db, int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    TREEMLA_WGMMA_M64N64K16_RS("bf16");
  } else {
    TREEMLA_WGMMA_M64N64K16_RS("f16");
  }
}
#undef TREEMLA_WGMMA_M64N64K16_RS

// The 128 accumulator registers of an m64n256 product: the operand list (%0 .. %127) and the
// outputs bound to it.
#define TREEMLA_WGMMA_D128_LIST                                                                    \
  "{"                                                                                              \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"                          \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"                \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"                \
  "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63,"                \
  "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79,"                \
  "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95,"                \
  "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111,"    \
  "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127" \
  "}"
#define TREEMLA_WGMMA_D128_OUTS                                                                   \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
      "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),    \
      "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),  \
      "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),  \
      "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),  \
      "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]),  \
      "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),  \
      "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]),  \
      "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),  \
      "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]),  \
      "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),  \
      "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),  \
      "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]),  \
      "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]),  \
      "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]),          \
      "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]),         \
      "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]),         \
      "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), "+f"(d[122]),         \
      "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

// One asm statement per element type (TY: "bf16" or "f16") and A operand: A_OPS names the A and B
// operands (%128 on), SCALE the scale_d operand, TAIL the immediates after the scales; scale_d = 0
// overwrites D.
#define TREEMLA_WGMMA_M64N256K16(TY, A_OPS, SCALE, TAIL, ...)                     \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE                          \
               ", 0;\n"                                                           \
               "wgmma.mma_async.sync.aligned.m64n256k16.f32." TY "." TY           \
               " " TREEMLA_WGMMA_D128_LIST ", " A_OPS ", p, 1, 1, " TAIL ";\n}\n" \
               : TREEMLA_WGMMA_D128_OUTS                                          \
               : __VA_ARGS__)

// D[64 x 256] (+)= A[64 x 16] B[16 x 256], A and B from shared memory (B N-major).
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16_ss_tnspb(float (&d)[128], uint64_t da, uint64_t db,
                                                          int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    TREEMLA_WGMMA_M64N256K16("bf16", "%128, %129", "%130", "0, 1", "l"(da), "l"(db), "r"(scale_d));
  } else {
    TREEMLA_WGMMA_M64N256K16("f16", "%128, %129", "%130", "0, 1", "l"(da), "l"(db), "r"(scale_d));
  }
}

// D[64 x 256] (+)= A[64 x 16] B[16 x 256], A from registers (the m64k16 fragment: 16-bit pairs
// (row g, cols 2 q4..), (row g + 8, ...), (row g, cols 8 + 2 q4..), (row g + 8, ...) of warp w's
// rows 16 w + g, lane = 4 g + q4, the layout of an m64n16 accumulator), B from shared memory
// (N-major).
template <typename T>
__device__ __forceinline__ void wgmma_m64n256k16_rs_tnspb(float (&d)[128], const uint32_t (&a)[4],
                                                          uint64_t db, int scale_d) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    TREEMLA_WGMMA_M64N256K16("bf16", "{%128, %129, %130, %131}, %132", "%133", "1", "r"(a[0]),
                             "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  } else {
    TREEMLA_WGMMA_M64N256K16("f16", "{%128, %129, %130, %131}, %132", "%133", "1", "r"(a[0]),
                             "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(scale_d));
  }
}
#undef TREEMLA_WGMMA_M64N256K16
#undef TREEMLA_WGMMA_D128_OUTS
#undef TREEMLA_WGMMA_D128_LIST

#endif  // TREEMLA_HAS_WGMMA

}  // namespace treemla::cuda::sm90a
