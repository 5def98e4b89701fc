// The AVX2 build's numbers: how many vpmaddubsw / vpmaddwd / FMAs / adds this CPU starts a cycle
// and which share a pipe (as probe_pipes.cpp does for AVX-512), then the Q4_K tile kernel's
// instruction mix for one block of 32 k, 8 weight rows and 5 x rows, from registers: what a
// verify pass's multiplies cost at best. The README's AVX2 bound is computed from its output.
//
//   g++ -O2 -mavx2 -mfma scripts/probe_pipes_avx2.cpp -o /tmp/probe2 && /tmp/probe2
//
// On the Zen 2 of 2026-12-06: vpmaddubsw, vpmaddwd and vpmullw one a cycle on one shared pipe;
// FMA two, vpaddw three, vcvtdq2ps one, none of them on that pipe. The kernel's mix (8
// vpmaddubsw, 8 vpaddw, 8 broadcasts, 1 vpmaddwd, 1 vcvtdq2ps, 1 FMA a row and block)
// ~11.3 cycles against the pipe's 9; without the last three, 7.9 against 8.
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstring>
static double seconds(void (*body)(long), long n) {
    body(n / 10);
    const auto t0 = std::chrono::steady_clock::now();
    body(n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
static void adds(long n) {
    long a = 0;
    for (long i = 0; i < n; i++) __asm__ volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0" : "+r"(a));
}
#define TWELVE(A, B) A(0) B(1) A(2) B(3) A(4) B(5) A(6) B(7) A(8) B(9) A(10) B(11)
#define MUB(i) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #i "\n"
#define MWD(i) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #i "\n"
#define FMA(i) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #i "\n"
#define ADDW(i) "vpaddw %%ymm14, %%ymm" #i ", %%ymm" #i "\n"
#define CVT(i) "vcvtdq2ps %%ymm14, %%ymm" #i "\n"
#define SRL(i) "vpsrlw $4, %%ymm14, %%ymm" #i "\n"
#define AND(i) "vpand %%ymm14, %%ymm15, %%ymm" #i "\n"
#define BC(i) "vpbroadcastd (%0), %%ymm" #i "\n"
#define MULLW(i) "vpmullw %%ymm14, %%ymm15, %%ymm" #i "\n"
#define CL "xmm0","xmm1","xmm2","xmm3","xmm4","xmm5","xmm6","xmm7","xmm8","xmm9","xmm10","xmm11"
static int mem[16];
#define LOOP(name, A, B) static void name(long n) { for (long i = 0; i < n; i++) __asm__ volatile(TWELVE(A, B) :: "r"(mem) : CL); }
LOOP(mub, MUB, MUB) LOOP(mwd, MWD, MWD) LOOP(fma, FMA, FMA) LOOP(addw, ADDW, ADDW)
LOOP(mub_mwd, MUB, MWD) LOOP(mub_fma, MUB, FMA) LOOP(mub_addw, MUB, ADDW) LOOP(mub_cvt, MUB, CVT)
LOOP(mub_srl, MUB, SRL) LOOP(mub_and, MUB, AND) LOOP(mub_bc, MUB, BC) LOOP(bc, BC, BC) LOOP(mullw, MULLW, MULLW)
LOOP(mub_mullw, MUB, MULLW) LOOP(fma_addw, FMA, ADDW) LOOP(cvt, CVT, CVT)
alignas(64) int8_t xq[5][32];
alignas(64) float ef[8];
alignas(64) __m256i scv;
__m256i wv[8];
// one "block" for 5 rows: the kernel's mix, intrinsics, rows interleaved by the compiler
template <int VAR>
static void blk(long n) {
    __m256i w[8];
    for (int s = 0; s < 8; s++) w[s] = wv[s];
    __m256 T[5];
    for (int m = 0; m < 5; m++) T[m] = _mm256_setzero_ps();
    for (long i = 0; i < n; i++) {
        const int8_t *px = &xq[0][0]; __asm__ volatile("" : "+r"(px) :: "memory");
        for (int m = 0; m < 5; m++) {
            __m256i P = _mm256_setzero_si256();
            if (VAR != 1) {
                for (int s = 0; s < 8; s++) {
                    int32_t v; memcpy(&v, px + 32 * m + 4 * s, 4);
                    P = _mm256_add_epi16(P, _mm256_maddubs_epi16(w[s], _mm256_set1_epi32(v)));
                }
            } else {  // tree
                __m256i p[8];
                for (int s = 0; s < 8; s++) { int32_t v; memcpy(&v, px + 32 * m + 4 * s, 4); p[s] = _mm256_maddubs_epi16(w[s], _mm256_set1_epi32(v)); }
                P = _mm256_add_epi16(_mm256_add_epi16(_mm256_add_epi16(p[0], p[1]), _mm256_add_epi16(p[2], p[3])),
                                     _mm256_add_epi16(_mm256_add_epi16(p[4], p[5]), _mm256_add_epi16(p[6], p[7])));
            }
            if (VAR == 2) { T[m] = _mm256_castsi256_ps(_mm256_add_epi16(_mm256_castps_si256(T[m]), P)); continue; }
            const __m256i S = _mm256_madd_epi16(P, scv);
            if (VAR == 3) { T[m] = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(T[m]), S)); continue; }
            if (VAR == 4) { T[m] = _mm256_add_ps(_mm256_cvtepi32_ps(S), T[m]); continue; }
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[m]), T[m]);
        }
    }
    float o = 0; for (int m = 0; m < 5; m++) o += _mm256_cvtss_f32(T[m]);
    volatile float sink = o; (void)sink;
}
int main() {
    const long n = 20000000;
    const double clk = 4.0 * n / seconds(adds, n);
    printf("clock ~%.2f GHz\n", clk / 1e9);
    struct { const char *name; void (*f)(long); } t[] = {
        {"vpmaddubsw", mub}, {"vpmaddwd", mwd}, {"vfmadd", fma}, {"vpaddw", addw}, {"vcvtdq2ps", cvt},
        {"vpmullw", mullw}, {"vpbroadcastd m32", bc},
        {"maddubs+maddwd", mub_mwd}, {"maddubs+fma", mub_fma}, {"maddubs+paddw", mub_addw},
        {"maddubs+cvt", mub_cvt}, {"maddubs+srlw", mub_srl}, {"maddubs+pand", mub_and},
        {"maddubs+bcast", mub_bc}, {"maddubs+mullw", mub_mullw}, {"fma+paddw", fma_addw}};
    for (auto &x : t) {
        const long m = n / 4;
        const double s = seconds(x.f, m);
        printf("%-18s %.2f per cycle\n", x.name, 12.0 * m / (s * clk));
    }
    const char *names[] = {"the kernel's mix", "the same, adds as a tree", "no vpmaddwd/cvt/FMA",
                           "vpmaddwd, no cvt/FMA", "vpmaddwd, cvt, add"};
    void (*mixes[])(long) = {blk<0>, blk<1>, blk<2>, blk<3>, blk<4>};
    for (int v = 0; v < 5; v++) {
        const long m = n / 10;
        printf("%-26s %.2f cycles a row and block (vpmaddubsw + vpmaddwd: 9)\n", names[v],
               seconds(mixes[v], m) * clk / m / 5);
    }
}
