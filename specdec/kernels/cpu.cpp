// specdec CPU kernels (x86-64: AVX2 + FMA, or AVX-512), called through ctypes.
//
// Why our own kernels: on CPUs without native bf16 (AVX2 only), torch's bf16 matmuls run at
// a fraction of memory bandwidth, and MKL's small-M fp32 gemm is not much better. A decoder
// step is a few small-M matrix products over large weights, so a kernel that streams the
// weights once and converts bf16 -> fp32 in registers is 2-3x faster.
//
// One source, three builds: VL (fp32 lanes per vector) is 8 with AVX2 and 16 when compiled with
// AVX-512 (twice the work per instruction and 32 registers: verification passes of 5-9
// tokens and int4 unpacking are bound by instructions, not memory); with VNNI too, int4
// weights can also meet int8 activations (I4Q, for drafters). The loader picks the widest
// build the CPU runs.
//
// Batch invariance (why exactness tests can demand token-identical output): every output
// element is reduced in one fixed order (VL fp32 lanes over k, each weight format fixing which
// k goes to which lane, then a fixed lane tree), which depends only on K and the build, never
// on how many rows (M) are in the call, which tile computed it or how many threads ran. So a
// token's logits are bit-identical whether it is decoded alone, in a batch, or inside a
// (K+1)-token verification pass. The attention kernel keeps the same promise per query.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <array>
#include <memory>
#include <utility>
#include <vector>

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehl_ps(lo, lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_shuffle_ps(lo, lo, 1);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

// ---- the vector type of this build -----------------------------------------------------------
#if defined(__AVX512F__)
#define VL 16
typedef __m512 vf;
typedef __m512i vi;
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm512_storeu_ps(p, v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vset1(float v) { return _mm512_set1_ps(v); }
static inline vi viload(const void *p) { return _mm512_loadu_si512(p); }
static inline vi vset1i(int v) { return _mm512_set1_epi32(v); }
static inline vi vand(vi a, vi b) { return _mm512_and_si512(a, b); }
static inline vi vslli(vi a, int n) { return _mm512_slli_epi32(a, n); }
static inline vi vsrli(vi a, int n) { return _mm512_srli_epi32(a, n); }
static inline vf vcvt(vi a) { return _mm512_cvtepi32_ps(a); }
static inline vf vcast(vi a) { return _mm512_castsi512_ps(a); }
static inline float vsum(vf v) {  // the two halves added, then the 8-lane tree
    const __m256 lo = _mm512_castps512_ps256(v);
    const __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    return hsum8(_mm256_add_ps(lo, hi));
}
// vsum of eight vectors at once, out[u] = vsum(a[u]) bit for bit (the same adds in the same
// order, four or eight lanes of sums at a time instead of one): the eight scalar trees cost
// attention's scores as much as their FMAs
static inline void vsum8(const vf (&a)[8], float *out) {
    __m512 y[4];  // [lo+hi of a[2i] | lo+hi of a[2i+1]] (8 lanes each)
    for (int i = 0; i < 4; i++)
        y[i] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0x44),
                             _mm512_shuffle_f32x4(a[2 * i], a[2 * i + 1], 0xee));
    __m512 z[2];  // 128-bit lane u: its vector's 4 lanes + the next 4 (hsum8's first add)
    for (int i = 0; i < 2; i++)
        z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88),
                             _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xdd));
    // 128-bit lane u of z[i]: the 4-lane sum of a[4i + u]; then x0 + x2, x1 + x3 of a[u] and
    // a[u + 4] side by side, and their sums: lane u of t = [vsum(a[u]), vsum(a[u + 4]), ...]
    const __m512 w = _mm512_add_ps(_mm512_shuffle_ps(z[0], z[1], 0x44),
                                   _mm512_shuffle_ps(z[0], z[1], 0xee));
    const __m512 t = _mm512_add_ps(_mm512_shuffle_ps(w, w, 0x88), _mm512_shuffle_ps(w, w, 0xdd));
    alignas(64) float r[16];
    _mm512_store_ps(r, t);
    for (int u = 0; u < 4; u++) out[u] = r[4 * u], out[u + 4] = r[4 * u + 1];
}
static inline vf vcvt_i8(const int8_t *p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}
#else
#define VL 8
typedef __m256 vf;
typedef __m256i vi;
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
static inline void vstore(float *p, vf v) { _mm256_storeu_ps(p, v); }
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vset1(float v) { return _mm256_set1_ps(v); }
static inline vi viload(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline vi vset1i(int v) { return _mm256_set1_epi32(v); }
static inline vi vand(vi a, vi b) { return _mm256_and_si256(a, b); }
static inline vi vslli(vi a, int n) { return _mm256_slli_epi32(a, n); }
static inline vi vsrli(vi a, int n) { return _mm256_srli_epi32(a, n); }
static inline vf vcvt(vi a) { return _mm256_cvtepi32_ps(a); }
static inline vf vcast(vi a) { return _mm256_castsi256_ps(a); }
static inline float vsum(vf v) { return hsum8(v); }
static inline void vsum8(const vf (&a)[8], float *out) {
    for (int u = 0; u < 8; u++) out[u] = hsum8(a[u]);
}
static inline vf vcvt_i8(const int8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
#endif

// ---- weight formats ------------------------------------------------------------------------
// A weight row is cut into blocks of KB consecutive k (BYTES of weights). A format
// turns one block into NV fp32 vectors in a lane order of its choosing, and pack_x lays x out
// in that same order (slot s = VL*u + lane of vector u holds x[k0 + src(s)] * xmul(s)), so a
// dot product is a plain sequence of FMAs over (packed x, unpacked w) vectors. XV = packed x
// vectors per block (NV, plus I4's offset vector). Formats never look at M.
struct F32 {
    typedef float T;
    static constexpr int KB = VL, NV = 1, XV = 1, BYTES = 4 * VL;
    static constexpr bool GROUPED = false, INT8X = false;
    static int src(int s) { return s; }
    static float xmul(int) { return 1.0f; }
    static inline vf load(const float *b, int) { return vload(b); }
    static inline void pack(const float *x, float *o) { vstore(o, vload(x)); }
    static inline float one(const float *r, long k) { return r[k]; }
};
struct BF16 {  // 2*VL bf16 in one load: lane j holds k = 2j (low half) and 2j+1 (high)
    typedef uint16_t T;
    static constexpr int KB = 2 * VL, NV = 2, XV = 2, BYTES = 4 * VL;
    static constexpr bool GROUPED = false, INT8X = false;
    static int src(int s) { return 2 * (s % VL) + s / VL; }
    static float xmul(int) { return 1.0f; }
    static inline void pack(const float *x, float *o) {  // evens, then odds
#if VL == 16
        const __m512 lo = _mm512_loadu_ps(x), hi = _mm512_loadu_ps(x + 16);
        const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26,
                                             28, 30);
        const __m512i od = _mm512_add_epi32(ev, _mm512_set1_epi32(1));
        _mm512_storeu_ps(o, _mm512_permutex2var_ps(lo, ev, hi));
        _mm512_storeu_ps(o + 16, _mm512_permutex2var_ps(lo, od, hi));
#else
        const __m256 lo = _mm256_loadu_ps(x), hi = _mm256_loadu_ps(x + 8);
        const __m256i order = _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7);
        _mm256_storeu_ps(o, _mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo, hi, 0x88), order));
        _mm256_storeu_ps(o + 8, _mm256_permutevar8x32_ps(_mm256_shuffle_ps(lo, hi, 0xDD), order));
#endif
    }
    static inline vf load(const uint16_t *b, int u) {  // one ALU op per VL weights
        const vi v = viload(b);
        return vcast(u == 0 ? vslli(v, 16) : vand(v, vset1i(-65536)));
    }
    static inline float one(const uint16_t *r, long k) {
        uint32_t u = ((uint32_t)r[k]) << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};
struct I8 {  // symmetric per-output-row int8; the row scale is applied after the reduction
    typedef int8_t T;
    static constexpr int KB = VL, NV = 1, XV = 1, BYTES = VL;
    static constexpr bool GROUPED = false, INT8X = false;
    static int src(int s) { return s; }
    static float xmul(int) { return 1.0f; }
    static inline void pack(const float *x, float *o) { vstore(o, vload(x)); }
    static inline vf load(const int8_t *b, int) { return vcvt_i8(b); }
    static inline float one(const int8_t *r, long k) { return (float)r[k]; }
};
// int4, symmetric per group of 32 k with an fp16 scale: w = scale * (nibble - 8). Stored in
// 32-byte units of 64 k = 8 uint32 lanes of 8 nibbles; nibble p of lane j is
// k = 32*(j&1) + 4*p + (j>>1), so lane j belongs to group j&1 and one broadcast of the unit's
// two scales lines up with the lanes. A block is VL/8 units (the 16-lane build takes two side
// by side). Nibble p is taken in place (w & 0xF<<4p, one AND) and x is packed premultiplied
// by 16^-p, which is exact. The -8 offset rides on a ninth packed vector, -8 * (sum of the
// lane's x), that seeds each block's partial sum. Rows are zero-padded to a multiple of 128 k
// (nibbles 8, i.e. 0; every build reads whole blocks), x likewise, so there is no k tail.
struct I4 {
    typedef uint8_t T;
    static constexpr int KB = 8 * VL, NV = 8, XV = 9, BYTES = 4 * VL;
    static constexpr bool GROUPED = true, INT8X = false;
    static constexpr int SCALES = KB / 32;  // fp16 group scales per block
    static int src(int s) {
        const int j = s % VL, p = s / VL;
        return 64 * (j >> 3) + 32 * (j & 1) + 4 * p + ((j & 7) >> 1);
    }
    static float xmul(int s) {
        const int p = s / VL;
        return p == 0 || p == 7 ? 1.0f : ldexpf(1.0f, -4 * p);
    }
    static inline void pack(const float *x, float *o) {
        for (int s = 0; s < 8 * VL; s++) o[s] = x[src(s)] * xmul(s);
        for (int j = 0; j < VL; j++) {  // the offset vector: -8 * (sum of the lane's x)
            float c = 0.0f;
            for (int p = 0; p < 8; p++) c += x[src(VL * p + j)];
            o[8 * VL + j] = -8.0f * c;
        }
    }
    static inline vf load(const uint8_t *b, int p) {
        const vi v = viload(b);
        return vcvt(p == 7 ? vsrli(v, 28)  // 0xF<<28 would be negative
                           : vand(v, vset1i(0xF << (4 * p))));
    }
    static inline vf scales(const uint16_t *s) {  // lanes: s[0], s[1], s[0], ... (per unit)
        int32_t two;
        memcpy(&two, s, 4);
#if VL == 16
        int32_t next;
        memcpy(&next, s + 2, 4);
        return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi32(next), _mm_set1_epi32(two)));
#else
        return _mm256_cvtph_ps(_mm_set1_epi32(two));
#endif
    }
    static inline float one(const uint8_t *, long) { return 0.0f; }  // no tail: rows are padded
};
#if defined(__AVX512VNNI__)
// I4's weights against x quantized to int8, for VNNI's 4-way u8 x s8 dot product (drafters:
// any q the drafter really samples from keeps speculative decoding exact). x is quantized per
// row and 128-k block (scale = max|x| / 127, round to nearest even), so a row's result never
// depends on the other rows. One 64-byte block of weights becomes two u8 operands in place:
// the low nibbles of every byte (nibble p = 2b of lane j: k = base_j + 8b) and the high ones
// (k = base_j + 8b + 4), base_j = 64*(j>>3) + 32*(j&1) + ((j&7)>>1); x is packed to match. The
// stored nibble is q + 8: each lane's int32 sum is seeded with -8 * (its x's sum), exact. Per
// block: int32 lanes (each in one group), then acc += float(lanes) * group scales * x's scale.
// Packed x per block: [lo bytes | hi bytes | offsets int32 | x scale] (4 vectors).
struct I4Q : I4 {
    static constexpr int XV = 4;
    static constexpr bool INT8X = true;
    static inline void pack(const float *x, float *o) {
        float amax = 0.0f;
        for (int k = 0; k < KB; k++) amax = fmaxf(amax, fabsf(x[k]));
        const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        int8_t q[KB];
        for (int k = 0; k < KB; k++) {
            const long r = lrintf(x[k] * inv);
            q[k] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
        }
        int8_t *lo = (int8_t *)o, *hi = (int8_t *)(o + VL);
        int32_t *off = (int32_t *)(o + 2 * VL);
        for (int j = 0; j < VL; j++) {
            const int base = 64 * (j >> 3) + 32 * (j & 1) + ((j & 7) >> 1);
            int32_t sum = 0;
            for (int b = 0; b < 4; b++) {
                lo[4 * j + b] = q[base + 8 * b];
                hi[4 * j + b] = q[base + 8 * b + 4];
                sum += q[base + 8 * b] + q[base + 8 * b + 4];
            }
            off[j] = -8 * sum;
            o[3 * VL + j] = amax / 127.0f;
        }
    }
};
#endif
template <class W>
struct Fmt : W {
    static constexpr long BLK = W::BYTES / sizeof(typename W::T);  // T per block
    static constexpr long blocks(long K) { return W::GROUPED ? (K + W::KB - 1) / W::KB : K / W::KB; }
    // T per stored row, and (I4) group scales per row: rows are stored padded to 128 k
    static constexpr long row(long K) { return W::GROUPED ? (K + 127) / 128 * 64 : K; }
    static constexpr long scale_row(long K) { return W::GROUPED ? (K + 127) / 128 * 4 : 0; }
};

// x [M,K] -> packed [blocks][M][XV*VL]: the rows of a block side by side, so that a k chunk of
// all rows is one contiguous piece (it stays in L1) and a tile addresses its rows by constants.
// Shared among the threads of a parallel region if called in one. Only I4 has a partial last
// block: it is packed from a zero-padded copy.
template <class W>
static void pack_x(const float *x, float *xp, long M, long K) {
    const long nb = Fmt<W>::blocks(K);
#pragma omp for schedule(static)
    for (long b = 0; b < nb; b++)
        for (long m = 0; m < M; m++) {
            float *o = xp + (b * M + m) * W::XV * VL;
            const float *xr = x + m * K + b * W::KB;
            if ((b + 1) * W::KB <= K) {
                W::pack(xr, o);
            } else {
                float pad[W::KB] = {};
                memcpy(pad, xr, (K - b * W::KB) * sizeof(float));
                W::pack(pad, o);
            }
        }
}

// ---- linear: y[M,N] = x[M,K] @ w[N,K]^T * scale[N] + bias[N] ---------------------------
// Every y[m,n] is: VL fp32 lanes accumulated by FMA over the blocks in k order (for I4: per
// block a partial sum, then acc += partial * group scales), then vsum, the k tail in order,
// the row scale, the bias. The blocking below (register tiles, k chunks with the accumulators
// parked in `st` between chunks, which is exact) only changes what is in cache when.
//
// Where the time goes on this class of machine (Zen, 2 cores, 20-40 GB/s): bf16 products are
// bound by memory up to M ~ 6 (2 bytes per 2*M flops), so for small M what matters is
// streaming whole rows with prefetch; beyond, FMA throughput, hence the x-in-register tiles and
// sharing each weight group across all x tiles while it is in L1.

// One block of MT x rows times NT weight rows into acc (see micro).
template <class W, int MT, int NT>
static inline void block(vf (&acc)[MT][NT], const float *xb, const typename W::T *w, long ws,
                         const uint16_t *gs, long gss) {
#if defined(__AVX512VNNI__)
    if constexpr (W::INT8X) {
        const vi low = vset1i(0x0F0F0F0F);
        for (int t = 0; t < NT; t++) {
            const vi v = viload(w + t * ws);
            const vi lo = vand(v, low), hi = vand(vsrli(v, 4), low);
            const vf s = I4::scales(gs + t * gss);
            for (int i = 0; i < MT; i++) {
                const float *xi = xb + i * W::XV * VL;
                vi p = viload(xi + 2 * VL);
                p = _mm512_dpbusd_epi32(p, lo, viload(xi));
                p = _mm512_dpbusd_epi32(p, hi, viload(xi + VL));
                acc[i][t] = vfma(vcvt(p), _mm512_mul_ps(s, vload(xi + 3 * VL)), acc[i][t]);
            }
        }
        return;
    }
#endif
    vf part[MT][NT];  // I4: this block's partial sum, seeded with the offset vector
    if constexpr (W::GROUPED)
        for (int i = 0; i < MT; i++) {
            const vf c = vload(xb + (i * W::XV + W::NV) * VL);
            for (int t = 0; t < NT; t++) part[i][t] = c;
        }
    for (int u = 0; u < W::NV; u++) {
        vf wv[NT];
        for (int t = 0; t < NT; t++) wv[t] = W::load(w + t * ws, u);
        for (int i = 0; i < MT; i++) {
            vf a = vload(xb + (i * W::XV + u) * VL);
            // keep x in a register: GCC would rather fold this load into each of the NT
            // FMAs, and loads, not FMAs, then bound the loop
#if !defined(SPECDEC_EMULATED)  // (emulated vectors are structs: no register to name)
            __asm__("" : "+v"(a));
#endif
            for (int t = 0; t < NT; t++)
                if constexpr (W::GROUPED)
                    part[i][t] = vfma(a, wv[t], part[i][t]);
                else
                    acc[i][t] = vfma(a, wv[t], acc[i][t]);
        }
    }
    if constexpr (W::GROUPED)
        for (int t = 0; t < NT; t++) {
            const vf s = I4::scales(gs + t * gss);
            for (int i = 0; i < MT; i++) acc[i][t] = vfma(part[i][t], s, acc[i][t]);
        }
}

// micro: MT x rows times NT weight rows over nb blocks. xb: packed x of the tile's first row
// at its first block (blocks xbs floats apart); w: the first weight row (rows ws apart); gs:
// I4 group scales of that row (rows gss apart). acc in/out: st + t * sts + i * VL.
// pf: where the next tile's weights start (rows ws apart); prefetched as far ahead of it as we
// are into this tile.
template <class W, int MT, int NT>
static inline void micro(const float *xb, long xbs, const typename W::T *w, long ws,
                         const uint16_t *gs, long gss, float *st, long sts, long nb,
                         const typename W::T *pf) {
    constexpr long BLK = Fmt<W>::BLK;
    vf acc[MT][NT];
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < MT; i++) acc[i][t] = vload(st + t * sts + i * VL);
    for (long b = 0; b < nb; b++) {
        // weights are streamed once: prefetch the next tile's rows (short rows defeat the
        // hardware prefetcher; this is worth ~40% of bandwidth at K = 896)
        if (((b * W::BYTES) & 63) == 0)  // one line per 64 bytes (BYTES <= 64)
            for (int t = 0; t < NT; t++)
                _mm_prefetch((const char *)(pf + t * ws + b * BLK), _MM_HINT_T0);
        block<W, MT, NT>(acc, xb + b * xbs, w + b * BLK, ws,
                         W::GROUPED ? gs + I4::SCALES * b : gs, gss);
    }
    for (int t = 0; t < NT; t++)
        for (int i = 0; i < MT; i++) vstore(st + t * sts + i * VL, acc[i][t]);
}

// Register tiles: MT x rows by NT weight rows; accumulators (and I4's partials), one weight
// vector per column, one x vector and a constant or two must fit in the registers (16 with
// AVX2: 4x3 and 6x2 spill; 32 with AVX-512). Measured on Zen 3 with the weights in L2, AVX2:
// 2x4, 3x3, 4x2 and 5x2 run at 60-75% of the FMA peak; more x rows are split into tiles of
// at most max_mt. AVX-512 on Zen 5 (28 layers of Qwen2.5-1.5B's bf16 matrices, weights from
// memory, 2 cores): x4 columns beat x2 and x3 for 4-9 rows (9 rows: 99 vs 114-121 ms; AVX2:
// 145 ms); 1 row is bound by memory alike in both builds (~71-75 ms).
template <class W, int MT>
static constexpr int tile_n() {
    if (W::INT8X) return MT == 1 ? 8 : 4;
    if (VL == 16) {
        if (W::GROUPED) return MT == 1 ? 8 : 4;
        return MT <= 2 ? 8 : 4;
    }
    if (W::GROUPED) return MT == 1 ? 4 : MT == 2 ? 3 : 1;
    return MT <= 2 ? 4 : MT == 3 ? 3 : 2;
}
template <class W>
static constexpr int max_mt() {
    if (W::INT8X) return 4;  // 8 rows: 27 ms against 32 (3) and 30 (6) for a 0.5B's matrices
    if (VL == 16) return W::GROUPED ? 3 : 6;
    return W::GROUPED ? 3 : 5;
}

struct LinearArgs {
    const float *x, *xp, *scale, *bias;
    const void *w;
    const uint16_t *gs;  // I4 group scales [N, scale_row(K)]
    float *y;
    long M, N, K;
};

// the tail of the reduction, one code path for every tile shape
template <class W>
static void finish(const LinearArgs &a, const float *st, long mt, long m0, long n0, long n1) {
    const typename W::T *w = (const typename W::T *)a.w;
    const long kt = Fmt<W>::blocks(a.K) * W::KB, ws = Fmt<W>::row(a.K);
    for (long n = n0; n < n1; n++)
        for (long i = 0; i < mt; i++) {
            const float *xr = a.x + (m0 + i) * a.K;
            float s = vsum(vload(st + ((n - n0) * mt + i) * VL));  // [n][i][VL]
            for (long k = kt; k < a.K; k++) s = fmaf(xr[k], W::one(w + n * ws, k), s);
            if (a.scale) s *= a.scale[n];
            if (a.bias) s += a.bias[n];
            a.y[(m0 + i) * a.N + n] = s;
        }
}

// One group of NT weight rows against all x rows of a pass, tiles of MT or MT-1 x rows (the
// group's weights come from memory once, then from L1 for the other tiles).
template <class W, int MT, int NT>
static void group(const LinearArgs &a, float *st, long mrows, long ntile, long m0, long n,
                  long b0, long b1, const typename W::T *pf) {
    constexpr long BLK = Fmt<W>::BLK;
    const long ws = Fmt<W>::row(a.K), gss = Fmt<W>::scale_row(a.K), xbs = a.M * W::XV * VL;
    const typename W::T *w = (const typename W::T *)a.w + n * ws + b0 * BLK;
    const uint16_t *gs = a.gs ? a.gs + n * gss + I4::SCALES * b0 : 0;
    for (long i = 0, m = 0; i < ntile; i++) {
        const long mt = (mrows - m + ntile - i - 1) / (ntile - i);  // near-equal tiles
        const float *xb = a.xp + b0 * xbs + (m0 + m) * W::XV * VL;
        if (mt == MT || MT == 1)
            micro<W, MT, NT>(xb, xbs, w, ws, gs, gss, st + m * VL, mrows * VL, b1 - b0, pf);
        else
            micro<W, (MT > 1 ? MT - 1 : 1), NT>(xb, xbs, w, ws, gs, gss, st + m * VL,
                                                mrows * VL, b1 - b0, pf);
        m += mt;
    }
}

template <class W, int MT>
static void groups(const LinearArgs &a, float *st, long mrows, long ntile, long m0, long n0,
                   long n1, long b0, long b1, const typename W::T *pf_after) {
    constexpr int NT = tile_n<W, MT>();
    const typename W::T *w = (const typename W::T *)a.w;
    const long ws = Fmt<W>::row(a.K);
    for (long n = n0; n < n1;) {
        const long nt = n + NT <= n1 ? NT : 1;
        // prefetch the next group during this one (prefetching further ahead measured no
        // better, also for short int4 rows)
        const typename W::T *pf = n + nt < n1 ? w + (n + nt) * ws + b0 * Fmt<W>::BLK : pf_after;
        float *s = st + (n - n0) * mrows * VL;
        if (nt == NT)
            group<W, MT, NT>(a, s, mrows, ntile, m0, n, b0, b1, pf);
        else
            group<W, MT, 1>(a, s, mrows, ntile, m0, n, b0, b1, pf);
        n += nt;
    }
}

template <class W>
static void linear(const float *x, const typename W::T *w, const float *scale,
                   const uint16_t *gs, const float *bias, float *y, long M, long N, long K,
                   int nt) {
    constexpr long NB = 16;            // weight rows per work item
    constexpr long SUPER = 10;         // x rows that share one pass over the weights
    constexpr long XBYTES = 16 << 10;  // x chunk kept in L1 (of 32 KB) between tiles
    constexpr long BLK = Fmt<W>::BLK;
    const long nblk = Fmt<W>::blocks(K), ws = Fmt<W>::row(K);
    float *xp = (float *)aligned_alloc(64, ((nblk * M * W::XV * VL * 4) | 63) + 1);
    const LinearArgs a{x, xp, scale, bias, w, gs, y, M, N, K};
    const long nitems = (N + NB - 1) / NB;
    // a small x is packed here: packing it in the parallel region would make every thread
    // wait at its barrier for the last one to wake up (measured: 5% of a draft pass)
    const bool big = M * K > (1 << 16);
    if (!big) pack_x<W>(x, xp, M, K);
#pragma omp parallel num_threads(nt)
    {
        if (big) pack_x<W>(x, xp, M, K);  // ends with a barrier
        float st[SUPER * NB * VL] __attribute__((aligned(64)));  // [weight row][x row][VL]
        // static: each thread one contiguous run of rows, one long stream that the hardware
        // prefetcher follows (dynamic hand-outs of 4 items cost 17% of an int4 draft pass)
#pragma omp for schedule(static) nowait
        for (long it = 0; it < nitems; it++) {
            const long n0 = it * NB, n1 = n0 + NB < N ? n0 + NB : N;
            for (long m0 = 0; m0 < M; m0 += SUPER) {
                const long mrows = M - m0 < SUPER ? M - m0 : SUPER;
                const long ntile = (mrows + max_mt<W>() - 1) / max_mt<W>();
                const long mt = (mrows + ntile - 1) / ntile;  // the largest tile
                // k chunks only when several tiles share the weights: then x of all mrows
                // rows stays in L1 while the weight chunk is reused from there. A single
                // tile streams whole rows, which the memory system prefers (measured).
                long cb = ntile == 1 ? nblk : XBYTES / (mrows * W::XV * VL * 4);
                cb = cb < 1 ? 1 : cb;
                memset(st, 0, sizeof(float) * mrows * NB * VL);
                for (long b0 = 0; b0 < nblk; b0 += cb) {
                    const long b1 = b0 + cb < nblk ? b0 + cb : nblk;
                    // read after this chunk: the next chunk, or the next work item (likely
                    // ours: adjacent)
                    const typename W::T *pf = b1 < nblk ? w + n0 * ws + b1 * BLK
                                              : n1 < N  ? w + n1 * ws
                                                        : w + n0 * ws + b0 * BLK;
                    switch (mt) {
#define GROUPS(MT) groups<W, MT>(a, st, mrows, ntile, m0, n0, n1, b0, b1, pf)
                        case 6: GROUPS(6); break;
                        case 5: GROUPS(5); break;
                        case 4: GROUPS(4); break;
                        case 3: GROUPS(3); break;
                        case 2: GROUPS(2); break;
                        default: GROUPS(1);
#undef GROUPS
                    }
                }
                finish<W>(a, st, mrows, m0, n0, n1);
            }
        }
    }
    free(xp);
}

// ---- RMSNorm over the last dimension -----------------------------------------------------
// delta (if given) is first added into x in place: the residual stream's add and the next
// norm in one pass, the same bits as an add then a norm
static void rmsnorm_rows(float *x, const float *delta, const float *w, float *y, long R, long D,
                         float eps, int nt) {
    const long D8 = D & ~7L;
#pragma omp parallel for schedule(static) num_threads(nt) if (R > 8)
    for (long r = 0; r < R; r++) {
        float *xr = x + r * D;
        float *yr = y + r * D;
        if (delta)
            for (long d = 0; d < D; d++) xr[d] += delta[r * D + d];
        __m256 acc = _mm256_setzero_ps();
        for (long d = 0; d < D8; d += 8) {
            __m256 v = _mm256_loadu_ps(xr + d);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float ss = hsum8(acc);
        for (long d = D8; d < D; d++) ss += xr[d] * xr[d];
        const float inv = 1.0f / sqrtf(ss / (float)D + eps);
        for (long d = 0; d < D; d++) yr[d] = w[d] * (xr[d] * inv);
    }
}

// ---- SwiGLU gate: out = silu(gate) * up, gate_up = [gate | up] per row ---------------------
// exp for 8 lanes (Cephes' range reduction and polynomial, within ~2 ulp of expf): libm's
// scalar expf made this step ~70 us of a 1-token pass. x is clamped to [-87, 88], where
// silu's result no longer changes in fp32. Every element takes this path (no scalar tail), so
// a value's result does not depend on where it sits in the row or how many rows there are.
static inline __m256 exp8(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                      _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500e-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073e-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894e-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459e-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201e-1f));
    y = _mm256_fmadd_ps(y, _mm256_mul_ps(x, x), _mm256_add_ps(x, _mm256_set1_ps(1.0f)));
    const __m256i e = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}
static inline __m256 silu_mul8(__m256 g, __m256 u) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), g));
    return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
static void silu_mul_rows(const float *gu, float *out, long R, long I, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt) if (R > 8)
    for (long r = 0; r < R; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        long i = 0;
        for (; i + 8 <= I; i += 8)
            _mm256_storeu_ps(o + i, silu_mul8(_mm256_loadu_ps(g + i), _mm256_loadu_ps(u + i)));
        if (i < I) {  // the tail through the same vector code, padded
            alignas(32) float gt[8] = {0}, ut[8] = {0}, ot[8];
            memcpy(gt, g + i, (I - i) * sizeof(float));
            memcpy(ut, u + i, (I - i) * sizeof(float));
            _mm256_store_ps(ot, silu_mul8(_mm256_load_ps(gt), _mm256_load_ps(ut)));
            memcpy(o + i, ot, (I - i) * sizeof(float));
        }
    }
}

// ---- rotary embedding of q and k read from the fused q|k|v rows (qkv [R, ld]), written
// contiguous: q [R,HQ,D], k [R,HK,D]; the same arithmetic as rope_rows, without the copies
static void rope_qk_rows(const float *qkv, long ld, const int64_t *pos, const float *cos_t,
                         const float *sin_t, long R, long HQ, long HK, long D, float *q, float *k,
                         int nt) {
    const long half = D / 2;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * (HQ + HK) > 64)
    for (long r = 0; r < R; r++) {
        const float *c = cos_t + pos[r] * D, *s = sin_t + pos[r] * D;
        for (long h = 0; h < HQ + HK; h++) {
            const float *v = qkv + r * ld + h * D;
            float *o = h < HQ ? q + (r * HQ + h) * D : k + (r * HK + h - HQ) * D;
            for (long d = 0; d < half; d++) {
                const float x1 = v[d], x2 = v[d + half];
                o[d] = x1 * c[d] + (-x2) * s[d];
                o[d + half] = x2 * c[d + half] + x1 * s[d + half];
            }
        }
    }
}

// ---- rotary embedding, in place: x [R,H,D] with one position per row --------------------
// out[d] = x[d]*cos[d] - x[d+D/2]*sin[d];  out[d+D/2] = x[d+D/2]*cos[d+D/2] + x[d]*sin[d+D/2]
static void rope_rows(float *x, const int64_t *pos, const float *cos_t, const float *sin_t,
                      long R, long H, long D, int nt) {
    const long half = D / 2;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * H > 64)
    for (long r = 0; r < R; r++) {
        const float *c = cos_t + pos[r] * D, *s = sin_t + pos[r] * D;
        for (long h = 0; h < H; h++) {
            float *v = x + (r * H + h) * D;
            for (long d = 0; d < half; d++) {
                const float x1 = v[d], x2 = v[d + half];
                v[d] = x1 * c[d] + (-x2) * s[d];
                v[d + half] = x2 * c[d + half] + x1 * s[d + half];
            }
        }
    }
}

// ---- attention over the KV cache, with the new keys/values appended first ------------------
// KV slots per block: SB, or half of it where a block of K rows would pass 16 KB in an item
// of one query token (a decode step's), whose few rows (the heads sharing a KV head) reuse a
// block from L1 only if it fits there: 64 slots of a head of 128 are 32 KB, a Zen 2's whole
// L1. The target's 1-token pass after 2000 / 4000 tokens -3.6% / -2.9%, +0.3% (noise) after
// 128 (Zen 2, builds alternating ABBA, 24-40 rounds); passes of 2 or more tokens were 0.5-1.6%
// slower with 32. The same bits at any size. The AVX2 build only: on a Sapphire Rapids (48 KB
// L1) the avx512vnni build's 1-token pass after 2000 tokens was -0.7% with 32 (noise, ABBA).
constexpr long SB = 64;

// The cache lines of the next block of K or V rows that one query row's pass over the current
// block fetches ahead, a few every few slots. Each block is read from memory by a query row's
// first pass over it and from the caches by the others: without these the memory stood idle
// while they ran (a 2000-token context: the target's attention 6.6 GB/s a core, 20% of its
// 1-token pass). Into L2 (T1): the current block stays in L1.
struct Ahead {
    const char *at = nullptr, *end = nullptr;
    long per = 0;  // lines each `some` prefetches: the lines over the slots / step calls, up
    Ahead() = default;
    Ahead(const char *p, long bytes, long slots, long step)
        : at(p), end(p + bytes), per((bytes / 64 + 1) * step / (slots > step ? slots : step) + 1) {}
    void some() {  // every `step` slots
        for (long i = 0; i < per && at < end; i++, at += 64) _mm_prefetch(at, _MM_HINT_T1);
    }
    void rest() {
        for (; at < end; at += 64) _mm_prefetch(at, _MM_HINT_T1);
    }
};

// one query row's scores for slots s0 .. se-1 (mask: skip where 0): p[s] = scale * q.k_s, mx
// their running max. Each dot is one VL-lane FMA chain over d, then vsum, then the tail; eight
// slots' chains run side by side (a CPU with two FMA units needs eight to hide the latency),
// the same bits as one slot's. (In the AVX-512 builds VL = 16: a Zen 5 does two 16-lane FMAs
// a cycle, twice the 8-lane rate.)
// pf: the next block's lines this pass prefetches on the way (Ahead).
static inline void scores(const float *qv, const float *kb, long D, long s0, long se,
                          const uint8_t *mrow, float scale, float *p, float &mx, Ahead pf) {
    const long DV = D & ~(long)(VL - 1);
    auto one = [&](long s) {
        const float *kv = kb + s * D;
        vf a = vset1(0.0f);
        for (long d = 0; d < DV; d += VL) a = vfma(vload(qv + d), vload(kv + d), a);
        float sc = vsum(a);
        for (long d = DV; d < D; d++) sc += qv[d] * kv[d];
        return sc * scale;
    };
    float m = mx;  // in a register: through memory each max waited on the previous store
    long s = s0;
    if (!mrow && DV == D)
        for (; s + 8 <= se; s += 8) {
            const float *k0 = kb + s * D;
            vf a[8];
            for (int u = 0; u < 8; u++) a[u] = vset1(0.0f);
            for (long d = 0; d < D; d += VL) {
                const vf x = vload(qv + d);
                for (int u = 0; u < 8; u++) a[u] = vfma(x, vload(k0 + u * D + d), a[u]);
            }
            pf.some();
            float sums[8];
            vsum8(a, sums);
            for (int u = 0; u < 8; u++) {
                const float sc = sums[u] * scale;
                p[s + u] = sc;
                m = sc > m ? sc : m;
            }
        }
    for (; s < se; s++) {
        if (mrow && !mrow[s]) continue;
        const float sc = one(s);
        p[s] = sc;
        m = sc > m ? sc : m;
    }
    pf.rest();
    mx = m;
}

// e[s - s0] = exp(p[s] - mx) for slots s0 .. se-1, 8 at a time (exp8, also for a padded tail:
// a slot's value does not depend on its neighbours). libm's expf, a call per slot and head,
// took ~1.7 ms of a 23 ms target step after a 2000-token prompt. Masked slots get a value
// too (p there is unset; exp8 clamps whatever it holds) that the callers skip.
static inline void exps(const float *p, float mx, long s0, long se, float *e) {
    const __m256 m8 = _mm256_set1_ps(mx);
    long s = s0;
    for (; s + 8 <= se; s += 8)
        _mm256_storeu_ps(e + s - s0, exp8(_mm256_sub_ps(_mm256_loadu_ps(p + s), m8)));
    if (s < se) {
        alignas(32) float t[8] = {0};
        memcpy(t, p + s, (se - s) * sizeof(float));
        _mm256_store_ps(t, exp8(_mm256_sub_ps(_mm256_load_ps(t), m8)));
        memcpy(e + s - s0, t, (se - s) * sizeof(float));
    }
}

// acc += e_s * v_s and sum += e_s (e_s = exp(p[s] - mx)) over slots s0 .. se-1 in order; with
// NV = D / VL known the accumulator stays in registers across the block
template <int NV>
static inline void weigh(const float *p, float mx, const float *vb, long D, long s0, long se,
                         const uint8_t *mrow, float &sum, float *acc, Ahead pf) {
    float e[SB];
    exps(p, mx, s0, se, e);
    float total = sum;  // in a register: the sum in memory made each add wait on a store
    for (long s = s0; s < se; s++)
        if (!mrow || mrow[s]) total += e[s - s0];
    sum = total;
    if constexpr (NV > 0) {
        vf a[NV];
        for (int v = 0; v < NV; v++) a[v] = vload(acc + VL * v);
        for (long s = s0; s < se; s++) {
            if ((s & 7) == 0) pf.some();
            if (mrow && !mrow[s]) continue;
            const float *vv = vb + s * D;
            const vf ev = vset1(e[s - s0]);
            for (int v = 0; v < NV; v++) a[v] = vfma(ev, vload(vv + VL * v), a[v]);
        }
        for (int v = 0; v < NV; v++) vstore(acc + VL * v, a[v]);
    } else {
        const long DV = D & ~(long)(VL - 1);
        for (long s = s0; s < se; s++) {
            if (mrow && !mrow[s]) continue;
            const float *vv = vb + s * D;
            const vf ev = vset1(e[s - s0]);
            for (long d = 0; d < DV; d += VL)
                vstore(acc + d, vfma(ev, vload(vv + d), vload(acc + d)));
            for (long d = DV; d < D; d++) acc[d] += e[s - s0] * vv[d];
        }
    }
    pf.rest();
}

// q: [B,T,H,D]; knew/vnew: [B,T,KVH,D]; caches: [R,KVH,S,D]; rows/start/nnew: [B].
// Query t of batch entry b sees cache slots s <= start[b] + min(t, nnew[b]-1) (causal over
// slots), or, with a mask [B,T,MS] (MS <= S), exactly the slots where mask is nonzero.
static void attention(const float *q, const float *knew, const float *vnew, float *kc, float *vc,
                      const int64_t *rows, const int64_t *start, const int64_t *nnew,
                      const uint8_t *mask, long MS, float *out, long B, long T, long H, long KVH,
                      long D, long S, float scale, int nt) {
    for (long b = 0; b < B; b++)
        for (long t = 0; t < nnew[b]; t++)
            for (long g = 0; g < KVH; g++) {
                const long dst = ((rows[b] * KVH + g) * S + start[b] + t) * D;
                const long src = ((b * T + t) * KVH + g) * D;
                memcpy(kc + dst, knew + src, D * sizeof(float));
                memcpy(vc + dst, vnew + src, D * sizeof(float));
            }
    // An item is up to TC query tokens of one batch entry times the hp heads that share a KV
    // head (all `group` of them unless that leaves a thread idle): each K and V row is read
    // once for all of them, not once per token and head (a 2048-token context: the target's
    // 1-token pass -15%, the draft's -22%). Each (token, head) does the one-head loop's
    // arithmetic in the same order: the same bits.
    constexpr long TC = 16;
    const long group = H / KVH, chunks = (T + TC - 1) / TC;
    long hp = group;
    while (hp % 2 == 0 && B * chunks * (H / hp) < nt) hp /= 2;
    const long items = B * chunks * (H / hp);
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (long it = 0; it < items; it++) {
        const long b = it / (chunks * (H / hp)), c = it / (H / hp) % chunks;
        const long h0 = it % (H / hp) * hp, g = h0 / group;
        const long t0 = c * TC, nq = (T - t0 < TC ? T - t0 : TC), nr = nq * hp;  // rows: (t, j)
        const float *kb = kc + (rows[b] * KVH + g) * S * D;
        const float *vb = vc + (rows[b] * KVH + g) * S * D;
        long send[TC], smax = 0;  // slots query t0 + i may see: s < send[i] (and the mask's)
        for (long i = 0; i < nq; i++) {
            const long t = t0 + i, tt = t < nnew[b] ? t : nnew[b] - 1;
            send[i] = mask ? MS : start[b] + tt + 1;
            smax = send[i] > smax ? send[i] : smax;
        }
        float *p = (float *)malloc(sizeof(float) * (nr * (smax > 0 ? smax : 1) + nr * (D + 10)));
        float *acc = p + nr * (smax > 0 ? smax : 1), *mx = acc + nr * (D + 8), *sum = mx + nr;
        for (long r = 0; r < nr; r++) {
            mx[r] = -INFINITY;
            sum[r] = 0.0f;
            for (long d = 0; d < D; d++) acc[r * (D + 8) + d] = 0.0f;
        }
        // fn(row r = (i, j), first slot, end slot, mask row, prefetch) for every row, slot
        // block by slot block of sb (the block's K and V rows stay in L1 while every row uses
        // them); each row's call prefetches an equal share of the next block of `rows` (after
        // the last one: `then`'s first block)
#if defined(__AVX512F__)
        const long sb = SB;  // (32 for a decode step: -0.7% on a Sapphire Rapids, noise)
#else
        const long sb = nq == 1 && SB * D * 4 > 16384 ? SB / 2 : SB;
#endif
        auto by_block = [&](const float *rows, const float *then, auto &&fn) {
            const long nr = nq * hp;
            for (long s0 = 0; s0 < smax; s0 += sb) {
                const long s1 = s0 + sb < smax ? s0 + sb : smax;
                const float *nb = s1 < smax ? rows + s1 * D : then;
                const long nbytes = !nb ? 0
                                    : s1 < smax ? ((s1 + sb < smax ? s1 + sb : smax) - s1) * D * 4
                                                : (sb < smax ? sb : smax) * D * 4;
                for (long i = 0; i < nq; i++) {
                    const uint8_t *mrow = mask ? mask + (b * T + t0 + i) * MS : nullptr;
                    const long se = send[i] < s1 ? send[i] : s1;
                    for (long j = 0; j < hp; j++) {
                        const long r = i * hp + j, lo = nbytes * r / nr / 64 * 64;
                        const long hi = r + 1 == nr ? nbytes : nbytes * (r + 1) / nr / 64 * 64;
                        fn(r, s0, se, mrow, Ahead((const char *)nb + lo, hi - lo, se - s0, 8));
                    }
                }
            }
        };
        by_block(kb, vb, [&](long r, long s0, long se, const uint8_t *mrow, Ahead pf) {
            const float *qv = q + ((b * T + t0 + r / hp) * H + h0 + r % hp) * D;
            scores(qv, kb, D, s0, se, mrow, scale, p + r * smax, mx[r], pf);
        });
        by_block(vb, nullptr, [&](long r, long s0, long se, const uint8_t *mrow, Ahead pf) {
            float *ar = acc + r * (D + 8);
            if (D == 128)
                weigh<128 / VL>(p + r * smax, mx[r], vb, D, s0, se, mrow, sum[r], ar, pf);
            else if (D == 64)
                weigh<64 / VL>(p + r * smax, mx[r], vb, D, s0, se, mrow, sum[r], ar, pf);
            else
                weigh<0>(p + r * smax, mx[r], vb, D, s0, se, mrow, sum[r], ar, pf);
        });
        for (long i = 0; i < nq; i++)
            for (long j = 0; j < hp; j++) {
                const long r = i * hp + j;
                float *o = out + ((b * T + t0 + i) * H + h0 + j) * D;
                const float inv = sum[r] > 0.0f ? 1.0f / sum[r] : 0.0f;
                for (long d = 0; d < D; d++) o[d] = acc[r * (D + 8) + d] * inv;
            }
        free(p);
    }
}

#include "gguf_kernels.h"

extern "C" {
int specdec_abi_version() { return 10; }
int specdec_vector_lanes() { return VL; }
void linear_f32(const float *x, const float *w, const float *bias, float *y, long M, long N,
                long K, int nt) {
    linear<F32>(x, w, 0, 0, bias, y, M, N, K, nt);
}
void linear_bf16(const float *x, const uint16_t *w, const float *bias, float *y, long M, long N,
                 long K, int nt) {
    linear<BF16>(x, w, 0, 0, bias, y, M, N, K, nt);
}
void linear_i8(const float *x, const int8_t *w, const float *scale, const float *bias, float *y,
               long M, long N, long K, int nt) {
    linear<I8>(x, w, scale, 0, bias, y, M, N, K, nt);
}
// w: [N, ceil(K/128)*64] bytes in I4's layout; scale: fp16 [N, ceil(K/128)*4]
void linear_i4(const float *x, const uint8_t *w, const uint16_t *scale, const float *bias,
               float *y, long M, long N, long K, int nt) {
    linear<I4>(x, w, 0, scale, bias, y, M, N, K, nt);
}
#if defined(__AVX512VNNI__)
// as linear_i4, with x quantized to int8 per row and 128-k block (see I4Q)
void linear_i4q(const float *x, const uint8_t *w, const uint16_t *scale, const float *bias,
                float *y, long M, long N, long K, int nt) {
    linear<I4Q>(x, w, 0, scale, bias, y, M, N, K, nt);
}
#endif
// GGUF quantized weights in their file layout (gguf_kernels.h); 0, or -1 for a type without
// kernels. w: [N] rows of the file's blocks; y: [M, ldy] (a column slice of a wider y is fine)
int gguf_linear(int qtype, const float *x, const uint8_t *w, const float *bias, float *y, long ldy,
                long M, long N, long K, int int8x, int nt) {
    return gq::linear_parts(1, &qtype, &w, &N, x, bias, y, ldy, M, K, int8x != 0, nt);
}
// P such matrices stacked along the output (q|k|v): y [M, ldy], part p in its columns
int gguf_linear_parts(int P, const int *qtypes, const uint8_t *const *ws, const long *Ns,
                      const float *x, const float *bias, float *y, long ldy, long M, long K,
                      int int8x, int nt) {
    return gq::linear_parts(P, qtypes, ws, Ns, x, bias, y, ldy, M, K, int8x != 0, nt);
}
// rows ids[0..R) (or 0..R where ids is null) of such a matrix (N rows) as fp32 [R, K]
int gguf_dequantize(int qtype, const uint8_t *w, const int64_t *ids, long R, long N, long K,
                    float *out, int nt) {
    return gq::with_type(qtype,
                         [&](auto t) { gq::dequantize<decltype(t)>(w, ids, R, N, K, out, nt); })
               ? 0
               : -1;
}
// fp32 values, nb blocks of 32, as Q4_0 blocks (18 bytes: fp16 d, 16 bytes of nibbles), bit for
// bit as ggml's reference quantize_row_q4_0 and gguf.quants: d = (the block's value of largest
// magnitude, its first) / -8, q = min(15, trunc(x / d + 8.5)) with x / d as x * (1 / d)
int gguf_quantize_q4_0(const float *x, long nb, uint8_t *out, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long b = 0; b < nb; b++) {
        const float *v = x + 32 * b;
        uint8_t *o = out + 18 * b;
        float amax = 0.0f, max = 0.0f;
        for (int i = 0; i < 32; i++)
            if (fabsf(v[i]) > amax) amax = fabsf(v[i]), max = v[i];
        const float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        const uint16_t h = _cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT);
        memcpy(o, &h, 2);
        auto q = [&](float x) {
            volatile float scaled = x * id;  // rounded before the add, as the reference: no FMA
            const int i = (int)(scaled + 8.5f);
            return (uint8_t)(i < 15 ? i : 15);
        };
        for (int i = 0; i < 16; i++) o[2 + i] = (uint8_t)(q(v[i]) | q(v[16 + i]) << 4);
    }
    return 0;
}
// the file's Q4_K / Q6_K rows [N, K] rearranged in place into 8-row tiles (gguf_kernels.h):
// the tiled type's code, or -1 (another type, N not a multiple of 8)
int gguf_repack(int qtype, uint8_t *w, long N, long K, int nt) {
    return gq::repack_tiles(qtype, w, N, K, nt);
}
void rmsnorm(const float *x, const float *w, float *y, long R, long D, float eps, int nt) {
    rmsnorm_rows((float *)x, nullptr, w, y, R, D, eps, nt);
}
void add_rmsnorm(float *x, const float *delta, const float *w, float *y, long R, long D, float eps,
                 int nt) {
    rmsnorm_rows(x, delta, w, y, R, D, eps, nt);
}
void silu_mul(const float *gu, float *out, long R, long I, int nt) {
    silu_mul_rows(gu, out, R, I, nt);
}
void rope(float *x, const int64_t *pos, const float *cos_t, const float *sin_t, long R, long H,
          long D, int nt) {
    rope_rows(x, pos, cos_t, sin_t, R, H, D, nt);
}
void rope_qk(const float *qkv, long ld, const int64_t *pos, const float *cos_t,
             const float *sin_t, long R, long HQ, long HK, long D, float *q, float *k, int nt) {
    rope_qk_rows(qkv, ld, pos, cos_t, sin_t, R, HQ, HK, D, q, k, nt);
}
void attend(const float *q, const float *knew, const float *vnew, float *kc, float *vc,
            const int64_t *rows, const int64_t *start, const int64_t *nnew, const uint8_t *mask,
            long MS, float *out, long B, long T, long H, long KVH, long D, long S, float scale,
            int nt) {
    attention(q, knew, vnew, kc, vc, rows, start, nnew, mask, MS, out, B, T, H, KVH, D, S, scale,
              nt);
}

// ---- the decoder layers of a forward pass in one call ------------------------------------
// model.py's layer loop over GGUF matrices: the same kernels in the same order on the same
// buffers, so the same bits, without Python between a layer's nine kernels (~1.5 ms a pass).
struct Mats {  // a stack of GGUF matrices with the same inputs (as gguf_linear_parts)
    int P, int8x;
    const int *qtypes;
    const uint8_t *const *ws;
    const long *Ns;
    long N;  // the sum of Ns
    const float *bias;
};
struct Layer {
    Mats qkv, o, gate_up, down;
    const float *attn_norm, *mlp_norm;
};
// The MLP's first half: act [R, I] = silu(h @ G.T) * (h @ U.T) for the stack [G; U] (I rows
// each). Work item c multiplies columns 16c.. of both halves into a buffer of its thread and
// writes act's columns: the same kernels on the same x, and silu_mul8 per element, as the
// product into gu [R, 2I] and silu_mul_rows, so the same bits. gu's lines, written by either
// core and read by the activation on one, had each to be pulled back by the next layer's
// writer: with this step and the tiles' vector stores, the default target's 5-token pass
// 22.2 -> 20.2 ms (A/B). A stack that does not split at 16-column boundaries takes the two
// steps through gu, and so does one x row (a decode step, bound by memory): there each core
// reads G's rows, then U's, as one stream, where the items alternate between the two every
// 16 columns (the default target's 1-token gate|up products 15.7 -> 14.9 ms on the Zen 2).
static int gate_up_silu(const Mats &m, const float *h, float *gu, float *act, long R, long K,
                        long I, int nt) {
    bool split16 = R > 1 && I % 16 == 0 && m.N == 2 * I;
    for (int p = 0; p < m.P; p++) split16 = split16 && m.Ns[p] % 16 == 0;
    if (!split16) {
        if (gq::linear_parts(m.P, m.qtypes, m.ws, m.Ns, h, m.bias, gu, m.N, R, K, m.int8x != 0,
                             nt))
            return -1;
        silu_mul_rows(gu, act, R, I, nt);
        return 0;
    }
    const gq::Parts parts(m.P, m.qtypes, m.ws, m.Ns, h, m.bias, gu, m.N, R, K, m.int8x != 0, nt);
    if (!parts.ok) return -1;
    const long items = I / 16;
    // act's lines go past the caches where the down product's x rounding reads them on one
    // core (prepare_x's serial case, a pass of a few tokens): stored normally, each line the
    // other core wrote is pulled back by the next layer's writer (the 5-token pass -5%). Where
    // both cores read them back (9 tokens and more) normal stores are the faster (+2%).
    const bool stream = R * I <= (1 << 16);
#pragma omp parallel num_threads(nt) if (nt > 1 && items > 1)
    {
        static thread_local std::vector<float> buf;
        if ((long)buf.size() < 32 * R) buf.resize(32 * R);
        float *g = buf.data(), *u = g + 16 * R;
#pragma omp for schedule(guided, 4)  // as linear_parts
        for (long c = 0; c < items; c++) {
            parts.columns16(16 * c, g);
            parts.columns16(I + 16 * c, u);
            for (long r = 0; r < R; r++)
                for (int i = 0; i < 16; i += 8) {
                    float *o = act + r * I + 16 * c + i;  // 32-byte aligned (I % 16 == 0)
                    const __m256 v = silu_mul8(_mm256_loadu_ps(g + 16 * r + i),
                                               _mm256_loadu_ps(u + 16 * r + i));
                    if (stream)
                        _mm256_stream_ps(o, v);
                    else
                        _mm256_storeu_ps(o, v);
                }
        }
        if (stream) _mm_sfence();  // the streamed stores before the barrier's
    }
    return 0;
}

// x [B*T, Dm]: the embedded tokens in, the residual stream after the last layer out (in place);
// kcs/vcs: each layer's cache [rows, HK, S, D]; the rest as attend/rope_qk. 0, or -1 where a
// matrix has no kernel (the caller checks the types first: a pass cut short leaves x and the
// cache half written).
int decoder_layers(const Layer *layers, long L, float *const *kcs, float *const *vcs, float *x,
                   long B, long T, long Dm, long HQ, long HK, long D, long I,
                   const int64_t *pos, const float *cos_t, const float *sin_t,
                   const int64_t *rows, const int64_t *start, const int64_t *nnew,
                   const uint8_t *mask, long MS, long S, float scale, float eps, int nt) {
    const long R = B * T, NQ = HQ * D, NK = HK * D, NQKV = NQ + 2 * NK;
    // buffers, each 64-byte aligned: h lives throughout; the attention half's (qkv, q, k, v,
    // att, o) and the MLP half's (gu, act, mlp) never overlap in time, so they share memory
    auto row = [](long w) { return (w + 15) & ~15L; };
    const long attn_w[6] = {NQKV, NQ, NK, NK, NQ, Dm}, mlp_w[3] = {2 * I, I, Dm};
    long attn_len = 0, mlp_len = 0;
    for (long w : attn_w) attn_len += R * row(w);
    for (long w : mlp_w) mlp_len += R * row(w);
    const long total = R * row(Dm) + (attn_len > mlp_len ? attn_len : mlp_len) + 16;
    // a pass of a few tokens reuses its thread's workspace (the SSD drafter runs beside the
    // target: one each); a prefill's large one is freed when the pass ends
    static thread_local std::vector<float> kept;
    std::unique_ptr<float[]> large;  // uninitialized: a prefill's buffers are written first
    float *base;
    if (total <= (1L << 21)) {
        if ((long)kept.size() < total) kept.resize(total);
        base = kept.data();
    } else {
        large.reset(new float[total]);
        base = large.get();
    }
    float *at = (float *)(((uintptr_t)base + 63) & ~(uintptr_t)63);
    float *h = at;
    float *half = at + R * row(Dm);
    float *bufs[6];
    at = half;
    for (int i = 0; i < 6; i++) {
        bufs[i] = at;
        at += R * row(attn_w[i]);
    }
    float *qkv = bufs[0], *q = bufs[1], *k = bufs[2], *v = bufs[3], *att = bufs[4], *o = bufs[5];
    float *gu = half, *act = gu + R * row(2 * I), *mlp = act + R * row(I);
    auto product = [&](const Mats &m, const float *in, float *out, long K) {
        return gq::linear_parts(m.P, m.qtypes, m.ws, m.Ns, in, m.bias, out, m.N, R, K,
                                m.int8x != 0, nt);
    };
    rmsnorm_rows(x, nullptr, layers[0].attn_norm, h, R, Dm, eps, nt);
    for (long l = 0; l < L; l++) {
        const Layer &ly = layers[l];
        if (product(ly.qkv, h, qkv, Dm)) return -1;
        rope_qk_rows(qkv, NQKV, pos, cos_t, sin_t, R, HQ, HK, D, q, k, nt);
        for (long r = 0; r < R; r++) memcpy(v + r * NK, qkv + r * NQKV + NQ + NK, NK * sizeof(float));
        attention(q, k, v, kcs[l], vcs[l], rows, start, nnew, mask, MS, att, B, T, HQ, HK, D, S,
                  scale, nt);
        if (product(ly.o, att, o, NQ)) return -1;
        rmsnorm_rows(x, o, ly.mlp_norm, h, R, Dm, eps, nt);  // x += o
        if (gate_up_silu(ly.gate_up, h, gu, act, R, Dm, I, nt)) return -1;
        if (product(ly.down, act, mlp, I)) return -1;
        if (l + 1 < L)
            rmsnorm_rows(x, mlp, layers[l + 1].attn_norm, h, R, Dm, eps, nt);  // x += mlp
        else
            for (long i = 0; i < R * Dm; i++) x[i] += mlp[i];
    }
    return 0;
}
}
