// The AVX2 build's numbers: how many vpmaddubsw / vpmaddwd / FMAs / adds this CPU starts a cycle
// and which share a pipe (as probe_pipes.cpp does for AVX-512), then the Q4_K tile kernel's
// instruction mix for one block of 32 k, 8 weight rows and 5 x rows, from registers: what a
// verify pass's multiplies cost at best. The README's AVX2 bound is computed from its output.
//
//   g++ -O3 -mavx2 -mfma scripts/probe_pipes_avx2.cpp -o /tmp/probe2 && /tmp/probe2
//
// -O3, as the kernels are built: at -O2 GCC leaves the block's row and step loops rolled, and
// the mix takes ~20 cycles for reasons of its own.
//
// On the Zen 2 of 2026-12-06: vpmaddubsw, vpmaddwd and vpmullw one a cycle on one shared pipe;
// FMA two, vpaddw three, vcvtdq2ps one, none of them on that pipe. The kernel's mix (8
// vpmaddubsw, 8 vpaddw, 8 broadcasts, 1 vpmaddwd, 1 vcvtdq2ps, 1 FMA a row and block)
// ~11.3 cycles against the pipe's 9; without the last three, 7.9 against 8.
// On the Zen 3 of 2026-12-07: vpmaddubsw, vpmaddwd, vpmullw, FMA and vcvtdq2ps two a cycle
// (vpmaddubsw and vpmullw share their two pipes), vpaddw three; the kernel's mix 7.7-7.9
// cycles against the multiplies' 4.5.
#include <immintrin.h>

#include <cstdio>
#include <cstring>

#include "probe_timing.h"

// TWELVE's registers here: ymm0..ymm11, each from ymm14, ymm15 (or a broadcast from memory)
#define MUB(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n"
#define MWD(i) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #i "\n"
#define FMA(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n"
#define ADDW(i) "vpaddw %%ymm14, %%ymm" #i ", %%ymm" #i "\n"
#define CVT(i) "vcvtdq2ps %%ymm14, %%ymm" #i "\n"
#define SRL(i) "vpsrlw $4, %%ymm14, %%ymm" #i "\n"
#define AND(i) "vpand %%ymm14, %%ymm15, %%ymm" #i "\n"
#define BC(i) "vpbroadcastd (%0), %%ymm" #i "\n"
#define MULLW(i) "vpmullw %%ymm14, %%ymm15, %%ymm" #i "\n"
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                "xmm10", "xmm11"
static int mem[16];
#define LOOP(name, A, B)                                                                        \
    static void name(long n) {                                                                  \
        for (long i = 0; i < n; i++) __asm__ volatile(TWELVE(A, B)::"r"(mem) : CLOBBER);        \
    }
LOOP(mub, MUB, MUB)
LOOP(mwd, MWD, MWD)
LOOP(fma, FMA, FMA)
LOOP(addw, ADDW, ADDW)
LOOP(cvt, CVT, CVT)
LOOP(mullw, MULLW, MULLW)
LOOP(bc, BC, BC)
LOOP(mub_mwd, MUB, MWD)
LOOP(mub_fma, MUB, FMA)
LOOP(mub_addw, MUB, ADDW)
LOOP(mub_cvt, MUB, CVT)
LOOP(mub_srl, MUB, SRL)
LOOP(mub_and, MUB, AND)
LOOP(mub_bc, MUB, BC)
LOOP(mub_mullw, MUB, MULLW)

// one block of 32 k for 5 x rows, as the kernel computes it (not static: the compiler must not
// see the weights' values); VAR cuts the per-block tail: 0 the kernel's (vpmaddwd with the
// scales, conversion, FMA with the x row's factor), 1 the sum into an int16 accumulator,
// 2 vpmaddwd into an int32 one, 3 vpmaddwd and conversion into a float one
alignas(64) int8_t xq[5][32];
alignas(64) float ef[5];
__m256i scv, wv[8];
template <int VAR>
static void block(long n) {
    __m256i w[8];
    for (int s = 0; s < 8; s++) w[s] = wv[s];
    __m256 T[5];
    for (int m = 0; m < 5; m++) T[m] = _mm256_setzero_ps();
    for (long i = 0; i < n; i++) {
        const int8_t *x = &xq[0][0];
        __asm__ volatile("" : "+r"(x)::"memory");  // x's bytes read anew each trip
        for (int m = 0; m < 5; m++) {
            __m256i P = _mm256_setzero_si256();
            for (int s = 0; s < 8; s++) {
                int32_t v;
                memcpy(&v, x + 32 * m + 4 * s, 4);
                P = _mm256_add_epi16(P, _mm256_maddubs_epi16(w[s], _mm256_set1_epi32(v)));
            }
            const __m256i Ti = _mm256_castps_si256(T[m]);
            if (VAR == 1) {
                T[m] = _mm256_castsi256_ps(_mm256_add_epi16(Ti, P));
                continue;
            }
            const __m256i S = _mm256_madd_epi16(P, scv);
            if (VAR == 2)
                T[m] = _mm256_castsi256_ps(_mm256_add_epi32(Ti, S));
            else if (VAR == 3)
                T[m] = _mm256_add_ps(_mm256_cvtepi32_ps(S), T[m]);
            else
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[m]), T[m]);
        }
    }
    float o = 0;
    for (int m = 0; m < 5; m++) o += _mm256_cvtss_f32(T[m]);
    volatile float sink = o;
    (void)sink;
}

int main() {
    const long n = 20000000;
    const double clk = 4.0 * n / seconds(adds, n);
    printf("clock ~%.2f GHz (dependent scalar adds)\n", clk / 1e9);
    const struct {
        const char *what;
        void (*body)(long);
    } rates[] = {{"vpmaddubsw", mub},          {"vpmaddwd", mwd},
                 {"vfmadd231ps", fma},         {"vpaddw", addw},
                 {"vcvtdq2ps", cvt},           {"vpmullw", mullw},
                 {"vpbroadcastd m32", bc},     {"vpmaddubsw + vpmaddwd", mub_mwd},
                 {"vpmaddubsw + FMA", mub_fma}, {"vpmaddubsw + vpaddw", mub_addw},
                 {"vpmaddubsw + vcvtdq2ps", mub_cvt}, {"vpmaddubsw + vpsrlw", mub_srl},
                 {"vpmaddubsw + vpand", mub_and}, {"vpmaddubsw + vpbroadcastd", mub_bc},
                 {"vpmaddubsw + vpmullw", mub_mullw}};
    for (const auto &r : rates)
        printf("%-28s %.2f a cycle\n", r.what, 12.0 * (n / 4) / (seconds(r.body, n / 4) * clk));
    const struct {
        const char *what;
        void (*body)(long);
        int bound;  // its cycles of the multiply pipe a row and block
    } mixes[] = {{"the kernel's block", block<0>, 9},
                 {"without vpmaddwd/cvt/FMA", block<1>, 8},
                 {"vpmaddwd, no cvt/FMA", block<2>, 9},
                 {"vpmaddwd, cvt, add", block<3>, 9}};
    for (const auto &r : mixes)
        printf("%-28s %.2f cycles a row and block (the multiply pipe's: %d)\n", r.what,
               seconds(r.body, n / 10) * clk / (n / 10) / 5, r.bound);
}
