// What the probes (probe_pipes*.cpp, probe_tile*.cpp) share: the clock from a chain
// of dependent scalar adds (one a cycle on every x86 core since the Pentium 4's), and a timer.
#pragma once
#include <chrono>

static double seconds(void (*body)(long), long n) {
    body(n / 10);  // warm up: the clock ramps, the code is in cache
    const auto t0 = std::chrono::steady_clock::now();
    body(n);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

static double now() {  // seconds, for timing a call at a time
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

static void adds(long n) {
    long a = 0;
    for (long i = 0; i < n; i++) __asm__ volatile("add $1,%0\n add $1,%0\n add $1,%0\n add $1,%0" : "+r"(a));
}

// 12 instructions a loop trip, each writing its own register 0..11: rates, not latencies
#define TWELVE(A, B) A(0) B(1) A(2) B(3) A(4) B(5) A(6) B(7) A(8) B(9) A(10) B(11)
