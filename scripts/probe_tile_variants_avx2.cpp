// Variants of the AVX2 Q4_K tile kernel's inner loop for 5 x rows, from L1 (synthetic: one
// tile's quants, x and the scales in registers or L1): cycles a row and block for
//   v0  the kernel's mix: per step a 4-byte broadcast of x, vpmaddubsw, vpaddw
//   v2  x stored already broadcast (the multiply reads 32 bytes from L1)
//   v1  two tiles sharing each broadcast
//   v3  the blocks' sums kept in int32, one conversion a group
//   v4  v2 and v3
//   v5  v2 with x's whole K (60 KB, in L2) read once a tile
//
//   g++ -O3 -mavx2 -mfma -mf16c -Iscripts scripts/probe_tile_variants_avx2.cpp \
//       -o /tmp/probe_var && /tmp/probe_var
//
// On the Zen 3 of 2026-12-08: v0 7.4-8.4, v2 6.3-7.9, v1 7.0-10.2, v3 6.4-9.3, v4 5.7-7.5,
// v5 9.7-10.3 (the machine's noise is in the ranges; compare within one run). Every array is
// written before it is read: a never-written one maps every page to the kernel's zero page,
// which this core's L1 serves slowly (a first version's v5: 22 cycles).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "probe_timing.h"

static inline __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m256i bcast4(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
constexpr int MC = 5;                 // x rows
alignas(64) uint8_t W[4][8 * 1024];   // 4 tiles' quants, 1 KB a group (L1)
alignas(64) int8_t X[MC][256];        // x rows' int8 bytes (one group)
alignas(64) int8_t XB[MC][8][8][32];  // the same pre-broadcast: row, block j, step s (10 KB)
alignas(64) int8_t XL[MC][48][8][32]; // pre-broadcast for K = 1536: 60 KB (L2)
alignas(64) float EF[MC][8];
__m256i SC[8];

enum XForm { BCAST, L1, L2 };  // x broadcast per step, pre-broadcast in L1, in L2
// x row m's step (t, h) of block j, in group g
template <XForm XF>
static inline __m256i xstep(int m, int g, int j, int t, int h) {
    if constexpr (XF == BCAST) return bcast4(X[m] + 32 * j + 16 * h + 4 * t);
    if constexpr (XF == L1) return ld(XB[m][j][4 * h + t]);
    return ld(XL[m][8 * g + j][4 * h + t]);
}

// One tile, one group a trip (L2: the group cycles through x's 6, so x is read from L2), per
// step the weights decoded once, per x row a multiply and an add; then per block the sum
// times the scale into floats (I32: into an int32 sum, converted once a group)
template <XForm XF, bool I32>
__attribute__((noinline)) void one_tile(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        const int g = it % 6;
        __m256i A[MC];
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, xstep<XF>(m, g, j, t, h));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));  // as the kernel: the adds in this order
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                if constexpr (I32)
                    A[m] = j ? _mm256_add_epi32(A[m], S) : S;
                else
                    T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(EF[m][j]), T[m]);
            }
        }
        if constexpr (I32)
            for (int m = 0; m < MC; m++)
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[m]), _mm256_set1_ps(EF[m][0]), T[m]);
    }
}

// v1: two tiles share each broadcast (their 2 x 5 sums in registers, T's in memory)
__attribute__((noinline)) void two_tiles(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *ta = W[it & 3], *tb = W[(it + 1) & 3];
        for (int j = 0; j < 8; j++) {
            __m256i PA[MC], PB[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i va = ld(ta + 32 * (4 * j + t)), vb = ld(tb + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i wa = _mm256_and_si256(h ? _mm256_srli_epi16(va, 4) : va, low4);
                    const __m256i wb = _mm256_and_si256(h ? _mm256_srli_epi16(vb, 4) : vb, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i b = xstep<BCAST>(m, 0, j, t, h);
                        const __m256i pa = _mm256_maddubs_epi16(wa, b);
                        const __m256i pb = _mm256_maddubs_epi16(wb, b);
                        PA[m] = t + h == 0 ? pa : _mm256_add_epi16(PA[m], pa);
                        PB[m] = t + h == 0 ? pb : _mm256_add_epi16(PB[m], pb);
                        __asm__("" : "+x"(PA[m]), "+x"(PB[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256 e = _mm256_set1_ps(EF[m][j]);
                const __m256i SA = _mm256_madd_epi16(PA[m], SC[j]);
                const __m256i SB = _mm256_madd_epi16(PB[m], SC[j]);
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SA), e, T[m]);
                T[MC + m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(SB), e, T[MC + m]);
            }
        }
    }
}

int main() {
    memset(W, 0x35, sizeof W);
    memset(X, 3, sizeof X);
    memset(XB, 3, sizeof XB);
    memset(XL, 3, sizeof XL);
    for (int j = 0; j < 8; j++) SC[j] = _mm256_set1_epi16(j + 1);
    const long n = 2000000;
    __m256 T[2 * MC] = {};
    const double clk = 4.0 * 20000000 / seconds(adds, 20000000);
    printf("clock ~%.2f GHz\n", clk / 1e9);
    const struct {
        const char *what;
        void (*body)(long, __m256 *);
        double blocks;  // row-blocks a trip
    } variants[] = {{"v0 kernel", one_tile<BCAST, false>, 8.0 * MC},
                    {"v2 prebcast", one_tile<L1, false>, 8.0 * MC},
                    {"v1 2 tiles", two_tiles, 16.0 * MC},
                    {"v3 int32 tail", one_tile<BCAST, true>, 8.0 * MC},
                    {"v4 both", one_tile<L1, true>, 8.0 * MC},
                    {"v5 prebcast L2", one_tile<L2, false>, 8.0 * MC}};
    for (int rep = 0; rep < 2; rep++)
        for (const auto &v : variants) {
            double best = 1e9;
            for (int r = 0; r < 3; r++) {
                const double t0 = now();
                v.body(n, T);
                best = std::min(best, now() - t0);
            }
            printf("%-16s %.2f cycles a row and block\n", v.what, best * clk / (n * v.blocks));
        }
    float o = 0;
    for (const auto &t : T) o += _mm256_cvtss_f32(t);
    printf("(%g)\n", o);  // the sums are used: the loops stay
}
