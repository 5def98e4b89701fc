// The AVX-512 builds' code compiled for an AVX2 CPU, for tests only (kernels.load_build(...,
// emulated=True) passes this file with -include). This project's machines are AVX2-only on
// some days: without this, the AVX-512 and VNNI paths would go untested on those days.
//
// SIMDe (Debian: libsimde-dev) implements every _mm512_* and AVX-512VL/VNNI intrinsic with
// AVX2 ones, lane by lane the same operations, so integer results and each fp32 add, multiply,
// FMA and conversion are exactly the real instructions': an emulated build gives the real
// build's bits, slowly (test_emulated_builds_give_the_real_builds_bits checks it on CPUs with
// AVX-512). Then the compiler's own AVX-512 macros are defined, so the source takes its
// AVX-512 branches. Inline asm with EVEX forms (dp_bcast) and register constraints
// on 512-bit values have intrinsic fallbacks under SPECDEC_EMULATED.
#pragma once
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>

#if !SIMDE_NATURAL_VECTOR_SIZE_LE(256)
#error "SIMDe would emulate FMAs as a multiply and an add here, not as the fused instruction"
#endif

// Aliases this SIMDe version (0.7.4) lacks, or names wrongly (its _mm512_madd_epi16 alias takes
// the masked form's four arguments). Each is exact: two 256-bit halves of the same operation.
#undef _mm512_madd_epi16
#define _mm512_madd_epi16(a, b) simde_mm512_madd_epi16(a, b)
#define _mm512_shuffle_f32x4(a, b, imm) simde_mm512_shuffle_f32x4(a, b, imm)

static inline simde__m512 specdec_cvtepi32_ps(simde__m512i a) {
    const simde__m256 lo = simde_mm256_cvtepi32_ps(simde_mm512_castsi512_si256(a));
    const simde__m256 hi = simde_mm256_cvtepi32_ps(simde_mm512_extracti64x4_epi64(a, 1));
    return simde_mm512_insertf32x8(simde_mm512_castps256_ps512(lo), hi, 1);
}
static inline simde__m512i specdec_cvtepi8_epi32(simde__m128i a) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(simde_mm256_cvtepi8_epi32(a)),
                                   simde_mm256_cvtepi8_epi32(simde_mm_srli_si128(a, 8)), 1);
}
static inline simde__m512i specdec_cvtepu8_epi32(simde__m128i a) {
    return simde_mm512_inserti64x4(simde_mm512_castsi256_si512(simde_mm256_cvtepu8_epi32(a)),
                                   simde_mm256_cvtepu8_epi32(simde_mm_srli_si128(a, 8)), 1);
}
static inline simde__m512 specdec_cvtph_ps(simde__m256i a) {  // F16C, native on every build
    return simde_mm512_insertf32x8(
        simde_mm512_castps256_ps512(_mm256_cvtph_ps(simde_mm256_castsi256_si128(a))),
        _mm256_cvtph_ps(simde_mm256_extracti128_si256(a, 1)), 1);
}
#define _mm512_cvtepi32_ps(a) specdec_cvtepi32_ps(a)
#define _mm512_cvtepi8_epi32(a) specdec_cvtepi8_epi32(a)
#define _mm512_cvtepu8_epi32(a) specdec_cvtepu8_epi32(a)
#define _mm512_cvtph_ps(a) specdec_cvtph_ps(a)

#define SPECDEC_EMULATED 1
#define __AVX512F__ 1
#define __AVX512BW__ 1
#define __AVX512DQ__ 1
#define __AVX512VL__ 1
#if defined(SPECDEC_EMULATE_VNNI)
#define __AVX512VNNI__ 1
#endif
