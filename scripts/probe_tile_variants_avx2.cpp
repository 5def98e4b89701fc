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
// On the Zen 3 of 2026-12-08: v0 7.5-8.4, v2 6.3-7.9, v1 7.1-10.2, v3 6.5-9.3, v4 5.8-7.5,
// v5 22 (the machine's noise is in the ranges; compare within one run).
#include <immintrin.h>
#include <cstdio>
#include <cstring>
#include <cstdint>
#include "probe_timing.h"
static double now(){return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();}
static inline __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline __m256i bcast4(const int8_t *p) { int32_t v; memcpy(&v, p, 4); return _mm256_set1_epi32(v); }
alignas(64) uint8_t W[4][8 * 1024];   // 4 tiles, 8 groups each of 1 KB quants (in L1/L2)
alignas(64) int8_t X[16][256];
alignas(64) int8_t XB[16][8][8][32];  // pre-broadcast: row, block j, step s
alignas(64) float EF[16][8];
__m256i SC[8];
constexpr int MC = 5;
// V0: the kernel as it is: one tile, per step decode once, per row bcast+maddubs+add
__attribute__((noinline)) void v0(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, bcast4(X[m] + 32 * j + 16 * h + 4 * t));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(EF[m][j]), T[m]);
            }
        }
    }
}
// V2: x pre-broadcast (maddubs reads it from L1)
__attribute__((noinline)) void v2(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, ld(XB[m][j][4 * h + t]));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(EF[m][j]), T[m]);
            }
        }
    }
}
// V1: two tiles share each broadcast (T in memory)
__attribute__((noinline)) void v1(long n, __m256 *T) {
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
                        const __m256i b = bcast4(X[m] + 32 * j + 16 * h + 4 * t);
                        const __m256i pa = _mm256_maddubs_epi16(wa, b), pb = _mm256_maddubs_epi16(wb, b);
                        PA[m] = t + h == 0 ? pa : _mm256_add_epi16(PA[m], pa);
                        PB[m] = t + h == 0 ? pb : _mm256_add_epi16(PB[m], pb);
                        __asm__("" : "+x"(PA[m]), "+x"(PB[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256 e = _mm256_set1_ps(EF[m][j]);
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(PA[m], SC[j])), e, T[m]);
                T[MC + m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(PB[m], SC[j])), e, T[MC + m]);
            }
        }
    }
}
// V3: as V0, but the tail accumulates int32 (madd with scales already times e), cvt once a group
__attribute__((noinline)) void v3(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        __m256i A[MC];
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, bcast4(X[m] + 32 * j + 16 * h + 4 * t));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                A[m] = j ? _mm256_add_epi32(A[m], S) : S;
            }
        }
        for (int m = 0; m < MC; m++) T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[m]), _mm256_set1_ps(EF[m][0]), T[m]);
    }
}

// V4: prebroadcast + int32 tail
__attribute__((noinline)) void v4(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        __m256i A[MC];
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, ld(XB[m][j][4 * h + t]));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                A[m] = j ? _mm256_add_epi32(A[m], S) : S;
            }
        }
        for (int m = 0; m < MC; m++) T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(A[m]), _mm256_set1_ps(EF[m][0]), T[m]);
    }
}

alignas(64) int8_t XL[5][48][8][32];  // K = 1536 pre-broadcast: 60 KB (L2)
// V5: pre-broadcast from L2: one tile's 6 groups against all of x
__attribute__((noinline)) void v5(long n, __m256 *T) {
    const __m256i low4 = _mm256_set1_epi8(15);
    for (long it = 0; it < n; it++) {
        const uint8_t *tg = W[it & 3];
        const int g = it % 6;
        for (int j = 0; j < 8; j++) {
            __m256i P[MC];
            for (int t = 0; t < 4; t++) {
                const __m256i v4 = ld(tg + 32 * (4 * j + t));
                for (int h = 0; h < 2; h++) {
                    const __m256i w = _mm256_and_si256(h ? _mm256_srli_epi16(v4, 4) : v4, low4);
                    for (int m = 0; m < MC; m++) {
                        const __m256i pr = _mm256_maddubs_epi16(w, ld(XL[m][8 * g + j][4 * h + t]));
                        P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                        __asm__("" : "+x"(P[m]));
                    }
                }
            }
            for (int m = 0; m < MC; m++) {
                const __m256i S = _mm256_madd_epi16(P[m], SC[j]);
                T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(EF[m][j]), T[m]);
            }
        }
    }
}
int main() {
    memset(W, 0x35, sizeof W); memset(X, 3, sizeof X); memset(XB, 3, sizeof XB);
    for (int j = 0; j < 8; j++) SC[j] = _mm256_set1_epi16(j + 1);
    const long n = 2000000;
    __m256 T[2 * MC] = {};
    const double clk = 4.0 * 20000000 / seconds(adds, 20000000);
    printf("clock ~%.2f GHz\n", clk / 1e9);
    for (int rep = 0; rep < 2; rep++) {
    struct { const char *w; void (*f)(long, __m256 *); double blocks; } vs[] = {
        {"v0 kernel", v0, 8.0 * MC}, {"v2 prebcast", v2, 8.0 * MC}, {"v1 2 tiles", v1, 16.0 * MC}, {"v3 int32 tail", v3, 8.0 * MC}, {"v4 both", v4, 8.0*MC}, {"v5 prebcast L2", v5, 8.0*MC}};
    for (auto &v : vs) {
        double s = 1e9; for (int r = 0; r < 3; r++) { auto t0 = now(); v.f(n, T); double d = now() - t0; if (d < s) s = d; }
        printf("%-16s %.2f cycles a row and block\n", v.w, s * clk / (n * v.blocks));
    }}
    float o = 0; for (auto &t : T) o += _mm256_cvtss_f32(t); printf("%g\n", o);
}
