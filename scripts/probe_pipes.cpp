// How many 512-bit integer dot products (vpdpbusd), FMAs and adds this CPU starts a cycle, and
// which of them share pipes: the numbers a kernel's bound is computed from. A Zen 4 runs a
// 512-bit instruction as two 256-bit halves (one vpdpbusd a cycle); a Zen 5 has full-width
// units (two). The README's bound for the verify pass is computed from this program's output.
//
//   g++ -O2 -mavx512f -mavx512bw -mavx512vl -mavx512vnni scripts/probe_pipes.cpp -o /tmp/probe
//   /tmp/probe
//
// The clock comes from a chain of dependent scalar adds (one a cycle on every x86 core since
// the Pentium 4's), each rate from 12 independent accumulators (more than any latency needs).
#include <immintrin.h>

#include <cstdio>

#include "probe_timing.h"

// TWELVE's registers here: zmm0..zmm11, each from zmm30, zmm31
#define DPB(i) "vpdpbusd %%zmm30, %%zmm31, %%zmm" #i "\n"
#define FMA(i) "vfmadd231ps %%zmm30, %%zmm31, %%zmm" #i "\n"
#define ADD(i) "vpaddd %%zmm30, %%zmm" #i ", %%zmm" #i "\n"
#define CLOBBER "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", \
                "xmm10", "xmm11"
#define LOOP(name, A, B)                                                    \
    static void name(long n) {                                              \
        for (long i = 0; i < n; i++) __asm__ volatile(TWELVE(A, B)::: CLOBBER); \
    }
LOOP(dpbusd, DPB, DPB)
LOOP(fma, FMA, FMA)
LOOP(add, ADD, ADD)
LOOP(dpbusd_fma, DPB, FMA)
LOOP(dpbusd_add, DPB, ADD)

static void dpbusd_chain(long n) {  // one accumulator: the latency
    for (long i = 0; i < n; i++)
        __asm__ volatile("vpdpbusd %%zmm30, %%zmm31, %%zmm0\n vpdpbusd %%zmm30, %%zmm31, %%zmm0\n"
                         "vpdpbusd %%zmm30, %%zmm31, %%zmm0\n vpdpbusd %%zmm30, %%zmm31, %%zmm0\n"
                         ::: "xmm0");
}

int main() {
    const long n = 100000000;
    const double ghz = 4.0 * n / seconds(adds, n) / 1e9;
    printf("clock ~%.2f GHz (dependent scalar adds)\n", ghz);
    const struct {
        const char *what;
        void (*body)(long);
    } rows[] = {{"vpdpbusd zmm", dpbusd},
                {"vfmadd231ps zmm", fma},
                {"vpaddd zmm", add},
                {"6 vpdpbusd + 6 vfmadd231ps zmm", dpbusd_fma},
                {"6 vpdpbusd + 6 vpaddd zmm", dpbusd_add}};
    for (const auto &r : rows)
        printf("%-32s %.2f a cycle\n", r.what, 12.0 * n / 10 / seconds(r.body, n / 10) / 1e9 / ghz);
    printf("%-32s %.2f cycles\n", "vpdpbusd zmm latency",
           seconds(dpbusd_chain, n / 10) * ghz * 1e9 / (4.0 * n / 10));
}
