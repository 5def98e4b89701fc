// The AVX2 build's Q4_K tile kernel as it runs (``linear_parts``, one thread, weights in L2
// for N = 512, K = 1536): cycles per x row, 32-k block and 8-row tile at M = 1, 2, 5, 9, 16,
// to set beside the instruction mix of probe_tile_variants_avx2.cpp. Args: N K type (12 Q4_K,
// 14 Q6_K). The clock comes from dependent adds; the VM's moves it, so repeat.
//
//   g++ -O3 -mavx2 -mfma -mf16c -fopenmp -std=c++17 scripts/probe_tile_kernel.cpp \
//       -o /tmp/probe_tile && /tmp/probe_tile 512 1536 12
//
// On the Zen 3 of 2026-12-08: 9.3-11.4 cycles a row and block at M = 5 (the mix: 7.5-8.4).
#include "../specdec/kernels/cpu.cpp"
#include <cstdio>
#include <random>

#include "probe_timing.h"
int main(int argc, char **argv) {
    const long N = argc > 1 ? atol(argv[1]) : 512, K = argc > 2 ? atol(argv[2]) : 1536;
    const int qt = argc > 3 ? atoi(argv[3]) : 12;  // Q4_K
    const long bytes_per = qt == 12 ? 144 : 210;
    std::vector<uint8_t> w(N * K / 256 * bytes_per);
    std::mt19937 rng(1);
    for (auto &b : w) b = rng();
    for (long i = 0; i < N * K / 256; i++) {  // valid fp16 d (and dmin)
        uint8_t *b = w.data() + i * bytes_per;
        uint16_t h = 0x2000 + (rng() & 0xff);
        if (qt == 12) { memcpy(b, &h, 2); memcpy(b + 2, &h, 2); } else memcpy(b + 208, &h, 2);
    }
    const int rt = gq::repack_tiles(qt, w.data(), N, K, 1);
    std::vector<float> x(16 * K), y(16 * N);
    for (auto &v : x) v = (rng() % 2001 - 1000) / 1000.0f;
    const uint8_t *wp = w.data();
    const double clk = 4e8 / seconds(adds, 100000000);
    printf("clock %.2f GHz, type %d -> %d, N %ld K %ld\n", clk / 1e9, qt, rt, N, K);
    for (long M : {1L, 2L, 5L, 9L, 16L}) {
        double best = 1e9;
        const int reps = 2000;
        for (int r = 0; r < 5; r++) {
            const double t0 = now();
            for (int i = 0; i < reps; i++) gq::linear_parts(1, &rt, &wp, &N, x.data(), nullptr, y.data(), N, M, K, true, 1);
            best = std::min(best, (now() - t0) / reps);
        }
        printf("M=%2ld %8.1f us  %.2f cycles a row and block\n", M, best * 1e6, best * clk / (M * (N / 8) * (K / 32)));
    }
}
