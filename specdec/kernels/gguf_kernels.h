// GGUF quantized weights multiplied in their file layout (included by cpu.cpp; Python side:
// specdec/kernels/gguf.py). A decode step streams every weight byte once, so the kernels read
// the 4.5-8.5 bit blocks as they are stored and never widen them in memory.
//
// A row of weights is cut into groups of G = 256 k: one K-quant super-block, 8 blocks of 32
// (Q4_0 ... Q8_0, IQ4_NL; the last group of a row may hold fewer; IQ4_XS: one group of 8
// blocks with 6-bit scales), or 256 floats (F32/F16/BF16).
// For each weight row and group the block is unpacked once into a small buffer in L1 (quants as
// bytes, scales ready for the integer unit), then applied to every x row of the pass: a verify
// pass of K+1 tokens reads the weights once, like a single token.
// One x row of a K-quant (a decode step) skips the buffer: rows_one reads each block in place.
// Loaded natively, every quantized type is rearranged once into 8-row tiles (R8Q4_K,
// R8Q6_K, R8B32 and the others below): one instruction then multiplies 4 k of 8 weight rows
// by one x row, so extra x rows cost only their multiplies (the default target's 5-token
// pass: 174 -> 105 ms on a Zen 3; with VNNI on a Zen 4, ~60 ms against a 1-token pass of
// ~26-30). The VNNI build stores Q4_0-Q8_0, IQ4_NL, Q4_K and Q6_K tiles in pairs and
// multiplies 16 rows per 512-bit instruction (Pair); its Q2_K, Q3_K, Q5_K and IQ4_XS tiles stay
// 8 rows wide.
//
// Two modes. int8 x (default): each x row is rounded to int8 per block of 32 (for 32-blocks
// and IQ4_XS) or 256 (K-quants) with an fp32 step, and a group's dot product is exact integer
// arithmetic (maddubs/madd, or VNNI dpbusd), converted to float once per group (K-quants: the
// sub-block scales are integers applied before the conversion, mins through x's block sums).
// Exact x:
// the group is decoded to the fp32 values gguf's dequantize gives, bit for bit, and multiplied
// by fp32 x with FMAs.
//
// Batch invariance: y[m,n] is two 8-lane fp32 accumulators updated group by group in k order
// by one function of (weight row n, x row m), then summed; nothing depends on M, on which x
// rows share a call, on k chunking or on threads. Integer parts are exact, so the AVX2 and
// AVX-512 builds agree bit for bit too.
// Nothing here is exported: two builds loaded in one process (the tests, ab_kernel_builds.py)
// would otherwise share the first one's inline variables (GCC makes them unique symbols, bound
// process-wide even under RTLD_LOCAL), e.g. another build's tile-pair layout
#pragma GCC visibility push(hidden)
namespace gq {

enum Type : int {
    F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
    Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
};
constexpr long G = 256;  // k per group

static inline float f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}
static inline __m256i ld(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
static inline void st(void *p, __m256i v) { _mm256_storeu_si256((__m256i *)p, v); }
static inline __m256i srl16(__m256i v, int n) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(n)); }
static inline __m256i bytes(int v) { return _mm256_set1_epi8((char)v); }
// a product that must round on its own before an add (gguf's numpy does not fuse; GCC would)
static inline float unfused(float v) {
    __asm__("" : "+x"(v));
    return v;
}

// ---- K-quants: one super-block of 256 ----------------------------------------------------
// Every K-quant is w = d * sc[i] * q - dmin * mn[i] (Q2_K, Q4_K, Q5_K) or d * sc[i] * (q - off)
// (Q3_K: off 4, Q6_K: off 32) with unsigned q and integer sc, mn per 16 k (i = k / 16).
struct alignas(64) KBuf {
    uint8_t q[G];        // unsigned quants in k order
    int16_t sc[16], mn[16];  // per 16 k
    float d, dmin;
    int off, oshift;     // off = 1 << oshift where there is an offset (Q3_K, Q6_K)
    bool mins;
};

// Q4_K/Q5_K: eight 6-bit scales and mins in 12 bytes (the top two bits of 4-7 live in 0-7),
// each stored twice in sc/mn (they are per 32 k; KBuf's are per 16)
static inline __m256i twice(uint32_t lo, uint32_t hi) {  // 8 bytes -> 16 int16, each twice
    const __m128i v = _mm_cvtepu8_epi16(_mm_cvtsi64_si128((long long)((uint64_t)hi << 32 | lo)));
    return _mm256_set_m128i(_mm_unpackhi_epi16(v, v), _mm_unpacklo_epi16(v, v));
}
static inline void scales_k4(const uint8_t *s, KBuf &u) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, top = 0x30303030;
    st(u.sc, twice(a[0] & m6, (a[2] & m4) | ((a[0] >> 2) & top)));
    st(u.mn, twice(a[1] & m6, ((a[2] >> 4) & m4) | ((a[1] >> 2) & top)));
}

struct TQ4_K {  // d, dmin, scales[12], qs[128]: chunk c's low nibbles are k 64c.., high 64c+32..
    static constexpr int QK = 256, BYTES = 144;
    static void parts(const uint8_t *b, KBuf &u) {
        const __m256i m4 = bytes(15);
        for (int c = 0; c < 4; c++) {
            const __m256i v = ld(b + 16 + 32 * c);
            st(u.q + 64 * c, _mm256_and_si256(v, m4));
            st(u.q + 64 * c + 32, _mm256_and_si256(srl16(v, 4), m4));
        }
        scales_k4(b + 4, u);
        u.d = f16(b), u.dmin = f16(b + 2), u.off = 0, u.oshift = 0, u.mins = true;
    }
};
struct TQ5_K {  // Q4_K plus qh[32] before qs: bit i of qh[l] is the fifth bit of k 32i + l
    static constexpr int QK = 256, BYTES = 176;
    static void parts(const uint8_t *b, KBuf &u) {
        const __m256i m4 = bytes(15), b4 = bytes(16), qh = ld(b + 16);
        for (int c = 0; c < 4; c++) {
            const __m256i v = ld(b + 48 + 32 * c);
            const __m256i hl = _mm256_and_si256(_mm256_slli_epi16(srl16(qh, 2 * c), 4), b4);
            const __m256i hh = _mm256_and_si256(_mm256_slli_epi16(srl16(qh, 2 * c + 1), 4), b4);
            st(u.q + 64 * c, _mm256_or_si256(_mm256_and_si256(v, m4), hl));
            st(u.q + 64 * c + 32, _mm256_or_si256(_mm256_and_si256(srl16(v, 4), m4), hh));
        }
        scales_k4(b + 4, u);
        u.d = f16(b), u.dmin = f16(b + 2), u.off = 0, u.oshift = 0, u.mins = true;
    }
};
struct TQ6_K {  // ql[128], qh[64], int8 scales[16], d; q = ql nibble | 2 bits of qh << 4, - 32
    static constexpr int QK = 256, BYTES = 210;
    static void parts(const uint8_t *b, KBuf &u) {
        const __m256i m4 = bytes(15), m2 = bytes(3);
        for (int h = 0; h < 2; h++) {  // k 128h + 32s + l: ql[64h + 32(s&1) + l] nibble s>>1
            const __m256i qh = ld(b + 128 + 32 * h);
            for (int s = 0; s < 4; s++) {
                __m256i lo = ld(b + 64 * h + 32 * (s & 1));
                lo = _mm256_and_si256(s >> 1 ? srl16(lo, 4) : lo, m4);
                const __m256i hi = _mm256_and_si256(srl16(qh, 2 * s), m2);
                st(u.q + 128 * h + 32 * s, _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4)));
            }
        }
        st(u.sc, _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))));
        st(u.mn, _mm256_setzero_si256());
        u.d = u.dmin = f16(b + 208), u.off = 32, u.oshift = 5, u.mins = false;
    }
};
struct TQ2_K {  // scales[16] (sc low nibble, mn high), qs[64], d, dmin; 2-bit q
    static constexpr int QK = 256, BYTES = 84;
    static void parts(const uint8_t *b, KBuf &u) {
        const __m256i m2 = bytes(3);
        for (int h = 0; h < 2; h++) {  // k 128h + 32s + l: bits 2s of qs[32h + l]
            const __m256i v = ld(b + 16 + 32 * h);
            for (int s = 0; s < 4; s++)
                st(u.q + 128 * h + 32 * s, _mm256_and_si256(srl16(v, 2 * s), m2));
        }
        const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
        st(u.sc, _mm256_and_si256(sm, _mm256_set1_epi16(15)));
        st(u.mn, _mm256_srli_epi16(sm, 4));
        u.d = f16(b + 80), u.dmin = f16(b + 82), u.off = 0, u.oshift = 0, u.mins = true;
    }
};
struct TQ3_K {  // hmask[32], qs[64], scales[12], d; q = 2 bits | hmask bit << 2, - 4
    static constexpr int QK = 256, BYTES = 110;
    static void parts(const uint8_t *b, KBuf &u) {
        const __m256i m2 = bytes(3), m1 = bytes(1), hm = ld(b);
        for (int h = 0; h < 2; h++) {  // k 128h + 32s + l: bit 4h + s of hmask[l]
            const __m256i v = ld(b + 32 + 32 * h);
            for (int s = 0; s < 4; s++) {
                const __m256i lo = _mm256_and_si256(srl16(v, 2 * s), m2);
                const __m256i hi = _mm256_and_si256(srl16(hm, 4 * h + s), m1);
                st(u.q + 128 * h + 32 * s, _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2)));
            }
        }
        st(u.sc, scales(b + 96));
        st(u.mn, _mm256_setzero_si256());
        u.d = u.dmin = f16(b + 108), u.off = 4, u.oshift = 2, u.mins = false;
    }
    // the 16 signed scales (6 bits, - 32) as int16: scale i's low nibble is nibble i / 8 of
    // byte i % 8, its top two bits are bits 2 (i / 4) of byte 8 + i % 4; four at a time in
    // 32-bit words (a scalar loop over the 16 had cost more than the block's dot product)
    static inline __m256i scales(const uint8_t *s) {
        uint32_t a[3];
        memcpy(a, s, 12);
        const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
        const uint64_t lo = (uint64_t)((a[1] & m4) | ((a[2] >> 2 & m2) << 4)) << 32 |
                            ((a[0] & m4) | ((a[2] & m2) << 4));
        const uint64_t hi = (uint64_t)((a[1] >> 4 & m4) | ((a[2] >> 6 & m2) << 4)) << 32 |
                            ((a[0] >> 4 & m4) | ((a[2] >> 4 & m2) << 4));
        const __m128i v = _mm_set_epi64x((long long)hi, (long long)lo);
        return _mm256_sub_epi16(_mm256_cvtepu8_epi16(v), _mm256_set1_epi16(32));
    }
};

static inline __m256i word_pick(int wa, int wb) {  // low half: int16 word wa, high half: wb
    const char a = (char)(2 * wa), b = (char)(2 * wb), a1 = (char)(a + 1), b1 = (char)(b + 1);
    return _mm256_setr_epi8(a, a1, a, a1, a, a1, a, a1, a, a1, a, a1, a, a1, a, a1, b, b1, b, b1, b,
                            b1, b, b1, b, b1, b, b1, b, b1, b, b1);
}
static inline __m256i word_pick(int g) { return word_pick(2 * g, 2 * g + 1); }

// 8 quants from bytes, as int32 lanes
static inline __m256i q8(const uint8_t *q) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)q));
}
static inline __m256 unfused8(__m256 v) {  // as unfused, for 8 lanes
    __asm__("" : "+x"(v));
    return v;
}

// the fp32 weights, as gguf computes them: (d * sc) * q - dmin * mn, or (d * sc) * (q - off)
static inline void k_f32(const KBuf &u, float *out) {
    const __m256i off = _mm256_set1_epi32(u.off);
    for (int i = 0; i < 16; i++) {
        const __m256 dl = _mm256_set1_ps(u.d * (float)u.sc[i]);
        const __m256 ml = _mm256_set1_ps(u.dmin * (float)u.mn[i]);
        for (int h = 0; h < 16; h += 8) {
            const __m256i q = q8(u.q + 16 * i + h);
            const __m256 v =
                u.mins ? _mm256_sub_ps(unfused8(_mm256_mul_ps(dl, _mm256_cvtepi32_ps(q))), ml)
                       : _mm256_mul_ps(dl, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, off)));
            _mm256_storeu_ps(out + 16 * i + h, v);
        }
    }
}

// ---- blocks of 32: eight per group -----------------------------------------------------------
// w = d * (q - off) (Q4_0: 8, Q5_0: 16, Q8_0: signed q, 0) or d * q + m (Q4_1, Q5_1)
struct alignas(64) BBuf {
    uint8_t q[G];  // unsigned quants (Q8_0: |q|)
    int8_t s[G];   // Q8_0: the signed quants
    alignas(32) float d[8], m[8];
};

static inline __m256i nibbles(const uint8_t *qs) {  // 16 bytes -> low nibbles, then high ones
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
    return _mm256_and_si256(both, bytes(15));
}
static inline __m256i fifth_bits(const uint8_t *qh) {  // bit j of a uint32 -> 16 in byte j
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32((int)h), _mm256_setr_epi64x(0, 0x0101010101010101LL,
                                                      0x0202020202020202LL, 0x0303030303030303LL));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
    return _mm256_and_si256(set, bytes(16));
}

struct TQ4_0 {
    static constexpr int QK = 32, BYTES = 18, OFF = 8;
    static constexpr bool MINS = false, SIGNED = false;
    static void block(const uint8_t *b, BBuf &u, int i) {
        st(u.q + 32 * i, nibbles(b + 2));
    }
};
struct TQ4_1 {
    static constexpr int QK = 32, BYTES = 20, OFF = 0;
    static constexpr bool MINS = true, SIGNED = false;
    static void block(const uint8_t *b, BBuf &u, int i) {
        st(u.q + 32 * i, nibbles(b + 4));
    }
};
struct TQ5_0 {
    static constexpr int QK = 32, BYTES = 22, OFF = 16;
    static constexpr bool MINS = false, SIGNED = false;
    static void block(const uint8_t *b, BBuf &u, int i) {
        st(u.q + 32 * i, _mm256_or_si256(nibbles(b + 6), fifth_bits(b + 2)));
    }
};
struct TQ5_1 {
    static constexpr int QK = 32, BYTES = 24, OFF = 0;
    static constexpr bool MINS = true, SIGNED = false;
    static void block(const uint8_t *b, BBuf &u, int i) {
        st(u.q + 32 * i, _mm256_or_si256(nibbles(b + 8), fifth_bits(b + 4)));
    }
};
struct TQ8_0 {
    static constexpr int QK = 32, BYTES = 34, OFF = 0;
    static constexpr bool MINS = false, SIGNED = true;
    static void block(const uint8_t *b, BBuf &u, int i) {
        const __m256i s = ld(b + 2);
        st(u.s + 32 * i, s);
        st(u.q + 32 * i, _mm256_abs_epi8(s));
    }
};

// IQ4_NL and IQ4_XS: a 4-bit q picks one of 16 fixed signed values (a nonlinear grid), so the
// weights are signed bytes and multiply as Q8_0's. The grid + bias, in both 128-bit lanes
// (bias 128: the unsigned form VNNI's dpbusd takes)
static inline __m128i iq4_grid128(bool bias) {
    const __m128i v =
        _mm_setr_epi8(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    return bias ? _mm_xor_si128(v, _mm_set1_epi8(-128)) : v;
}
static inline __m256i iq4_grid(bool bias) { return _mm256_broadcastsi128_si256(iq4_grid128(bias)); }
static inline void grid_block(const uint8_t *qs, BBuf &u, int i) {  // 16 bytes of nibbles
    const __m256i s = _mm256_shuffle_epi8(iq4_grid(false), nibbles(qs));
    st(u.s + 32 * i, s);
    st(u.q + 32 * i, _mm256_abs_epi8(s));
}
struct TIQ4_NL {  // Q4_0's block (d, then 16 bytes of nibbles): w = d * grid[q]
    static constexpr int QK = 32, BYTES = 18, OFF = 0;
    static constexpr bool MINS = false, SIGNED = true;
    static void block(const uint8_t *b, BBuf &u, int i) { grid_block(b + 2, u, i); }
};
// IQ4_XS: d, scales_h (uint16), scales_l[4], qs[128]: 8 blocks of 32 in a group of 256, block
// i's 6-bit scale ls (low nibble i % 2 of scales_l[i / 2], top bits 2i of scales_h), w = d *
// (ls - 32) * grid[q] (qs[16 i..]: IQ4_NL's nibbles). Its blocks take x rounded per 32 (the
// 32-blocks' form), each with its float scale d (ls - 32), exact in fp32 as gguf's.
struct TIQ4_XS {
    static constexpr int QK = 256, BYTES = 136, OFF = 0;
    static constexpr bool MINS = false, SIGNED = true;
    static int ls(const uint8_t *b, int i) {  // block i's 6-bit scale
        return (b[4 + i / 2] >> 4 * (i % 2) & 15) | (b[2 + i / 4] >> 2 * (i % 4) & 3) << 4;
    }
    static void group(const uint8_t *b, BBuf &u) {
        for (int i = 0; i < 8; i++) grid_block(b + 8 + 16 * i, u, i);
        const __m256i l = _mm256_setr_epi32(ls(b, 0), ls(b, 1), ls(b, 2), ls(b, 3), ls(b, 4),
                                            ls(b, 5), ls(b, 6), ls(b, 7));
        const __m256 sc = _mm256_cvtepi32_ps(_mm256_sub_epi32(l, _mm256_set1_epi32(32)));
        _mm256_store_ps(u.d, _mm256_mul_ps(_mm256_set1_ps(f16(b)), sc));
    }
};

// the fp16 at byte `at` of blocks 0..7 as 8 floats (0 past the row's end), built in registers:
// 8 scalar stores then a vector load would stall store forwarding in every group
template <class T>
static inline __m256 b_halves(const uint8_t *b, long n, int at) {
    auto h = [&](int i) -> short {
        uint16_t v = 0;
        if (i < n) memcpy(&v, b + i * T::BYTES + at, 2);
        return (short)v;
    };
    return _mm256_cvtph_ps(_mm_setr_epi16(h(0), h(1), h(2), h(3), h(4), h(5), h(6), h(7)));
}

// every block of a 32-block type starts with its fp16 d (Q4_1, Q5_1: then the fp16 m)
template <class T>
static inline void b_group(const uint8_t *row, long g, long nblocks, BBuf &u) {
    if constexpr (T::QK == 256) {  // IQ4_XS: its group of 8 blocks
        T::group(row + g * T::BYTES, u);
        _mm256_store_ps(u.m, _mm256_setzero_ps());
    } else {
        const uint8_t *b = row + 8 * g * T::BYTES;
        const long n = nblocks - 8 * g < 8 ? nblocks - 8 * g : 8;
        for (int i = 0; i < 8; i++) {
            if (i < n) {
                T::block(b + i * T::BYTES, u, i);
            } else {  // past the row's end: zero weights (x is zero-padded there too)
                st(u.q + 32 * i, _mm256_setzero_si256());
                st(u.s + 32 * i, _mm256_setzero_si256());
            }
        }
        _mm256_store_ps(u.d, b_halves<T>(b, n, 0));
        _mm256_store_ps(u.m, T::MINS ? b_halves<T>(b, n, 2) : _mm256_setzero_ps());
    }
}

template <class T>
static inline void b_f32(const BBuf &u, float *out) {
    for (int i = 0; i < 8; i++) {
        const __m256 d = _mm256_set1_ps(u.d[i]), m = _mm256_set1_ps(u.m[i]);
        for (int l = 0; l < 32; l += 8) {
            const int k = 32 * i + l;
            const __m256i q = q8(u.q + k), off = _mm256_set1_epi32(T::OFF);
            __m256 v;
            if constexpr (T::MINS) {
                v = _mm256_add_ps(unfused8(_mm256_mul_ps(d, _mm256_cvtepi32_ps(q))), m);
            } else if constexpr (T::SIGNED) {
                const __m128i s = _mm_loadl_epi64((const __m128i *)(u.s + k));
                v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(s)), d);
            } else {
                v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q, off)));
            }
            _mm256_storeu_ps(out + k, v);
        }
    }
}

// ---- plain floats: groups of 256 values ----------------------------------------------------
struct TF32 {
    static constexpr int QK = 1, BYTES = 4;
    static constexpr bool HALF = false;
    static inline float one(const uint8_t *p) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
};
struct TF16 {
    static constexpr int QK = 1, BYTES = 2;
    static constexpr bool HALF = true;
    static inline float one(const uint8_t *p) { return f16(p); }
};
struct TBF16 {
    static constexpr int QK = 1, BYTES = 2;
    static constexpr bool HALF = false;
    static inline float one(const uint8_t *p) {
        const uint32_t u = (uint32_t)(p[0] | p[1] << 8) << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};

// ---- every type: group g of a row as fp32 (zero past the row's end) -------------------------
enum Kind { KQ, B32, FLT };
template <class T>
constexpr bool X32 = false;  // a type of 256-groups whose x is rounded per 32 (IQ4_XS)
template <>
constexpr bool X32<TIQ4_XS> = true;
template <class T>
static constexpr Kind kind() {
    return X32<T> || T::QK == 32 ? B32 : T::QK == 256 ? KQ : FLT;
}

template <class T>
static void group_f32(const uint8_t *row, long g, long K, float *out) {
    if constexpr (kind<T>() == KQ) {
        KBuf u;
        T::parts(row + g * T::BYTES, u);
        k_f32(u, out);
    } else if constexpr (kind<T>() == B32) {
        BBuf u;
        b_group<T>(row, g, K / 32, u);
        b_f32<T>(u, out);
    } else {
        const long n = K - g * G < G ? K - g * G : G;
        const uint8_t *p = row + g * G * T::BYTES;
        if constexpr (T::HALF) {
            long k = 0;
            for (; k + 8 <= n; k += 8)
                _mm256_storeu_ps(out + k,
                                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 2 * k))));
            for (; k < n; k++) out[k] = f16(p + 2 * k);
        } else {
            for (long k = 0; k < n; k++) out[k] = T::one(p + k * T::BYTES);
        }
        for (long k = n; k < G; k++) out[k] = 0.0f;
    }
}

// ---- x rows as the kernels read them -----------------------------------------------------
// int8 mode: q [M][KP] (zero past K), per block of QX k an fp32 step dx = amax / 127 and
// q = round_even(x * (127 / amax)); block sums of q per 32 k (int32) and per 16 k (int16).
struct XRows {
    long M, KP, QX;
    int8_t *q;
    float *dx, *xf;  // xf: exact mode, fp32 x [M][KP]
    int32_t *s32;
    int16_t *s16;
    int16_t *e2, *e8;  // K-quant form: e per 32 k, twice (per 16 k) and once
    float *ef, *es;    // K-quant form, per 32 k: e and e * (block sum of q), as floats
};

static void quantize_block(const float *x, long n, int8_t *q, float *dx) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 vmax = _mm256_setzero_ps();
    long k = 0;
    for (; k + 8 <= n; k += 8)
        vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + k)));
    float amax = 0.0f;
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, vmax);
    for (int l = 0; l < 8; l++) amax = lanes[l] > amax ? lanes[l] : amax;
    for (; k < n; k++) amax = fabsf(x[k]) > amax ? fabsf(x[k]) : amax;
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    *dx = amax / 127.0f;
    k = 0;
    const __m256 vinv = _mm256_set1_ps(inv);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (; k + 32 <= n; k += 32) {  // round-to-nearest-even, as the reference does
        __m256i r[4];
        for (int j = 0; j < 4; j++)
            r[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + k + 8 * j), vinv));
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]),
                                             _mm256_packs_epi32(r[2], r[3]));
        __m256i v = _mm256_permutevar8x32_epi32(w, order);
        v = _mm256_max_epi8(v, bytes(-127));
        st(q + k, v);
    }
    for (; k < n; k++) {
        const long r = lrintf(x[k] * inv);
        q[k] = (int8_t)(r > 127 ? 127 : r < -127 ? -127 : r);
    }
}

static inline float hsum_max8(__m256 v) {  // the largest of 8 lanes
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}

// K-quant form (QX = 256): one fp32 step per 256 k, refined per block j of 32 k by an integer
// e_j in 1..32: x ~ q * base * e_j, base = amax / (127 * 32), e_j = ceil(32 amax_j / amax), so
// each block of 32 gets nearly its own step (as fine as the 32-blocks' rounding), while the
// dot product stays integer: e_j multiplies the weights' 16- or 32-k scales (int16) before the
// sum, and the conversion to float stays once per 256 k. (One step per 256, as llama.cpp's
// Q8_K: top-1 agreement with the exact model 98.0% on the default target; this: 99.3%.)
static void quantize_group_e(const float *x, int8_t *q, float *base, int16_t *e2, int16_t *e8) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    float amax_j[8], amax = 0.0f;
    for (int j = 0; j < 8; j++) {
        __m256 v = _mm256_setzero_ps();
        for (int k = 0; k < 32; k += 8)
            v = _mm256_max_ps(v, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + 32 * j + k)));
        amax_j[j] = hsum_max8(v);
        amax = amax_j[j] > amax ? amax_j[j] : amax;
    }
    *base = amax / 4064.0f;
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int j = 0; j < 8; j++) {
        int e = 1;
        float inv = 0.0f;
        if (amax > 0.0f) {
            e = (int)ceilf(32.0f * amax_j[j] / amax);
            e = e < 1 ? 1 : e > 32 ? 32 : e;
            inv = 4064.0f / (amax * (float)e);
        }
        e8[j] = e2[2 * j] = e2[2 * j + 1] = (int16_t)e;
        const __m256 vinv = _mm256_set1_ps(inv);
        __m256i r[4];
        for (int i = 0; i < 4; i++)
            r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 32 * j + 8 * i), vinv));
        const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]),
                                             _mm256_packs_epi32(r[2], r[3]));
        st(q + 32 * j, _mm256_max_epi8(_mm256_permutevar8x32_epi32(w, order), bytes(-127)));
    }
}

static void prepare_x(const float *x, long K, XRows &xr, bool int8x, int nt) {
    const long M = xr.M, KP = xr.KP;
#pragma omp parallel for schedule(static) num_threads(nt) if (M * K > (1 << 16))
    for (long m = 0; m < M; m++) {
        const float *xm = x + m * K;
        if (!int8x) {
            float *o = xr.xf + m * KP;
            memcpy(o, xm, K * sizeof(float));
            memset(o + K, 0, (KP - K) * sizeof(float));
            continue;
        }
        int8_t *q = xr.q + m * KP;
        if (xr.QX == G) {  // K-quants: K is whole groups
            for (long b = 0; b < KP / G; b++)
                quantize_group_e(xm + b * G, q + b * G, xr.dx + m * (KP / G) + b,
                                 xr.e2 + m * (KP / 16) + 16 * b, xr.e8 + m * (KP / 32) + 8 * b);
        } else {
            for (long b = 0; b < KP / xr.QX; b++) {
                const long k0 = b * xr.QX, n = K - k0 < xr.QX ? (K - k0 > 0 ? K - k0 : 0) : xr.QX;
                quantize_block(xm + k0, n, q + k0, xr.dx + m * (KP / xr.QX) + b);
                memset(q + k0 + n, 0, xr.QX - n);
            }
        }
        for (long b = 0; b < KP / 16; b++) {
            int s = 0;
            for (int k = 0; k < 16; k++) s += q[16 * b + k];
            xr.s16[m * (KP / 16) + b] = (int16_t)s;
        }
        const int16_t *s16 = xr.s16 + m * (KP / 16);
        for (long b = 0; b < KP / 32; b++) xr.s32[m * (KP / 32) + b] = s16[2 * b] + s16[2 * b + 1];
        if (xr.QX == G) {
            for (long b = 0; b < KP / 32; b++) {
                const long i = m * (KP / 32) + b;
                xr.ef[i] = (float)xr.e8[i];
                xr.es[i] = (float)(xr.e8[i] * xr.s32[i]);  // |.| <= 32 * 4064: exact
            }
        }
    }
}

// ---- the dot products of one unpacked group with one x row: acc = [A(8) | B(8)] ------------
static inline void dot_k(const KBuf &u, const XRows &x, long m, long g, float *acc) {
    const int8_t *xq = x.q + m * x.KP + g * G;
    const __m256i e2 = ld(x.e2 + m * (x.KP / 16) + g * 16);
    const __m256i sce = _mm256_mullo_epi16(ld(u.sc), e2);  // the scales times x's e_j
    const __m256i lo = _mm256_permute2x128_si256(sce, sce, 0x00);  // per 16 k: 0..7 twice
    const __m256i hi = _mm256_permute2x128_si256(sce, sce, 0x11);  // 8..15
    __m256i isum = _mm256_setzero_si256();
    for (int j = 0; j < 8; j++) {
        const __m256i p = _mm256_maddubs_epi16(ld(u.q + 32 * j), ld(xq + 32 * j));
        const __m256i sv = _mm256_shuffle_epi8(j < 4 ? lo : hi, word_pick(j & 3));
#if defined(__AVX512VNNI__)
        isum = _mm256_dpwssd_epi32(isum, p, sv);  // the same sum, one instruction
#else
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p, sv));
#endif
    }
    // mins: mn * e_j against x's sums per 16 k; offsets: off * (sc * e_j) the same way
    const __m256i s16 = ld(x.s16 + m * (x.KP / 16) + g * 16);
    __m256i osum = _mm256_madd_epi16(u.mins ? _mm256_mullo_epi16(ld(u.mn), e2) : sce, s16);
    if (!u.mins) osum = _mm256_sll_epi32(osum, _mm_cvtsi32_si128(u.oshift));
    const float base = x.dx[m * (x.KP / G) + g];
    const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(u.d * base),
                                     _mm256_loadu_ps(acc));
    const __m256 b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(osum), _mm256_set1_ps(-(u.dmin * base)),
                                     _mm256_loadu_ps(acc + 8));
    _mm256_storeu_ps(acc, a);
    _mm256_storeu_ps(acc + 8, b);
}

// ---- one x row: K-quant dots straight from the block's bytes ---------------------------------
// A decode step has one x row per weight row, so KBuf's stores and reloads and k_ready's
// shuffles cost more than the dot itself. These give the same int32 isum and osum lanes as
// k_ready + dot_k (integer sums are exact), then the same two FMAs: the same bits.
struct KSums {
    __m256i isum, osum;
    float d, dmin;
};

// Q4_K/Q5_K's 12 scale bytes at s times x's e: sc per 32 k (words 0-7, in both halves), mn
// per 16 k (each block's twice)
static inline void k4_scales(const uint8_t *s, const int16_t *e2, const int16_t *e8,
                             __m256i &sc, __m256i &mn) {
    uint32_t a[3];
    memcpy(a, s, 12);
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, top = 0x30303030;
    const uint64_t sc8 = (uint64_t)((a[2] & m4) | ((a[0] >> 2) & top)) << 32 | (a[0] & m6);
    sc = _mm256_mullo_epi16(
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc8))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)e8)));
    mn = _mm256_mullo_epi16(twice(a[1] & m6, ((a[2] >> 4) & m4) | ((a[1] >> 2) & top)), ld(e2));
}

// Q4_K: per 32 k one scale (both halves of sv[j] hold it), mins per 32 k twice as ov
static inline KSums ints(TQ4_K, const uint8_t *b, const int8_t *xq, const int16_t *s16,
                         const int16_t *e2, const int16_t *e8) {
    __m256i sc, mn;
    k4_scales(b + 4, e2, e8, sc, mn);
    const __m256i low4 = bytes(15);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {  // chunk c's low nibbles are k 64c.., high ones 64c + 32..
        const __m256i v = ld(b + 16 + 32 * c);
        const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(v, low4), ld(xq + 64 * c));
        const __m256i p1 =
            _mm256_maddubs_epi16(_mm256_and_si256(srl16(v, 4), low4), ld(xq + 64 * c + 32));
        const __m256i s0 = _mm256_shuffle_epi8(sc, word_pick(2 * c, 2 * c));
        const __m256i s1 = _mm256_shuffle_epi8(sc, word_pick(2 * c + 1, 2 * c + 1));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, s0));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, s1));
    }
    return {isum, _mm256_madd_epi16(mn, ld(s16)), f16(b), f16(b + 2)};
}

// the types with a scale per 16 k (sc: int16, times e): the 32 k of chunk (h, s), k 128h + 32s
// .., quants q against x's, times the two sub-blocks' scales, into isum
static inline __m256i chunk16(__m256i isum, __m256i q, const int8_t *xq, __m256i sc, int h,
                              int s) {
    const __m256i half = _mm256_permute2x128_si256(sc, sc, h ? 0x11 : 0x00);
    const __m256i p = _mm256_maddubs_epi16(q, ld(xq + 128 * h + 32 * s));
    return _mm256_add_epi32(isum, _mm256_madd_epi16(p, _mm256_shuffle_epi8(half, word_pick(s))));
}

// Q6_K: q = ql nibble | 2 bits of qh << 4 (off 32: ov = 32 * sc), int8 scales per 16 k
static inline KSums ints(TQ6_K, const uint8_t *b, const int8_t *xq, const int16_t *s16,
                         const int16_t *e2, const int16_t *) {
    const __m256i sc = _mm256_mullo_epi16(
        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(b + 192))), ld(e2));
    const __m256i low4 = bytes(15), bits45 = bytes(0x30);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {  // k 128h + 32s + l: ql[64h + 32(s&1) + l] nibble s>>1
        const __m256i qh = ld(b + 128 + 32 * h), l0 = ld(b + 64 * h), l1 = ld(b + 64 * h + 32);
        const __m256i hs[4] = {_mm256_slli_epi16(qh, 4), _mm256_slli_epi16(qh, 2), qh,
                               _mm256_srli_epi16(qh, 2)};  // bits 2s, 2s+1 -> bits 4, 5
        for (int s = 0; s < 4; s++) {
            const __m256i ql = s & 1 ? l1 : l0;
            const __m256i lo = _mm256_and_si256(s >> 1 ? srl16(ql, 4) : ql, low4);
            isum = chunk16(isum, _mm256_or_si256(lo, _mm256_and_si256(hs[s], bits45)), xq, sc, h,
                           s);
        }
    }
    const float d = f16(b + 208);
    return {isum, _mm256_slli_epi32(_mm256_madd_epi16(sc, ld(s16)), 5), d, d};  // off 32
}

// Q5_K: Q4_K's scales and mins, the fifth bit of k 32i + l in bit i of qh[l]
static inline KSums ints(TQ5_K, const uint8_t *b, const int8_t *xq, const int16_t *s16,
                         const int16_t *e2, const int16_t *e8) {
    __m256i sc, mn;
    k4_scales(b + 4, e2, e8, sc, mn);
    const __m256i low4 = bytes(15), b4 = bytes(16), qh = ld(b + 16);
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; c++) {  // as Q4_K's, each quant with its fifth bit
        const __m256i v = ld(b + 48 + 32 * c);
        const __m256i hl = _mm256_and_si256(_mm256_slli_epi16(srl16(qh, 2 * c), 4), b4);
        const __m256i hh = _mm256_and_si256(_mm256_slli_epi16(srl16(qh, 2 * c + 1), 4), b4);
        const __m256i q0 = _mm256_or_si256(_mm256_and_si256(v, low4), hl);
        const __m256i q1 = _mm256_or_si256(_mm256_and_si256(srl16(v, 4), low4), hh);
        const __m256i p0 = _mm256_maddubs_epi16(q0, ld(xq + 64 * c));
        const __m256i p1 = _mm256_maddubs_epi16(q1, ld(xq + 64 * c + 32));
        const __m256i s0 = _mm256_shuffle_epi8(sc, word_pick(2 * c, 2 * c));
        const __m256i s1 = _mm256_shuffle_epi8(sc, word_pick(2 * c + 1, 2 * c + 1));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p0, s0));
        isum = _mm256_add_epi32(isum, _mm256_madd_epi16(p1, s1));
    }
    return {isum, _mm256_madd_epi16(mn, ld(s16)), f16(b), f16(b + 2)};
}

// Q2_K and Q3_K: a scale (Q2_K: and a min) per 16 k, as KBuf holds them; the 32 k of chunk
// (h, s) are bits 2s, 2s + 1 of qs[32h ..] (Q3_K: with bit 4h + s of hmask as the third)
static inline KSums ints(TQ2_K, const uint8_t *b, const int8_t *xq, const int16_t *s16,
                         const int16_t *e2, const int16_t *) {
    const __m256i sm = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)b));
    const __m256i e = ld(e2);
    const __m256i sc = _mm256_mullo_epi16(_mm256_and_si256(sm, _mm256_set1_epi16(15)), e);
    const __m256i mn = _mm256_mullo_epi16(_mm256_srli_epi16(sm, 4), e);
    const __m256i m2 = bytes(3);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i v = ld(b + 16 + 32 * h);
        for (int s = 0; s < 4; s++)
            isum = chunk16(isum, _mm256_and_si256(srl16(v, 2 * s), m2), xq, sc, h, s);
    }
    return {isum, _mm256_madd_epi16(mn, ld(s16)), f16(b + 80), f16(b + 82)};
}
static inline KSums ints(TQ3_K, const uint8_t *b, const int8_t *xq, const int16_t *s16,
                         const int16_t *e2, const int16_t *) {
    const __m256i sc = _mm256_mullo_epi16(TQ3_K::scales(b + 96), ld(e2));
    const __m256i m2 = bytes(3), m1 = bytes(1), hm = ld(b);
    __m256i isum = _mm256_setzero_si256();
    for (int h = 0; h < 2; h++) {
        const __m256i v = ld(b + 32 + 32 * h);
        for (int s = 0; s < 4; s++) {
            const __m256i lo = _mm256_and_si256(srl16(v, 2 * s), m2);
            const __m256i hi = _mm256_and_si256(srl16(hm, 4 * h + s), m1);
            isum = chunk16(isum, _mm256_or_si256(lo, _mm256_slli_epi16(hi, 2)), xq, sc, h, s);
        }
    }
    const float d = f16(b + 108);
    return {isum, _mm256_slli_epi32(_mm256_madd_epi16(sc, ld(s16)), 2), d, d};  // off 4
}

template <class T>
constexpr bool ONE_ROW = false;  // the types with ints(): rows_one at M = 1
template <>
constexpr bool ONE_ROW<TQ2_K> = true;
template <>
constexpr bool ONE_ROW<TQ3_K> = true;
template <>
constexpr bool ONE_ROW<TQ4_K> = true;
template <>
constexpr bool ONE_ROW<TQ5_K> = true;
template <>
constexpr bool ONE_ROW<TQ6_K> = true;

// eight vectors -> lane i = the sum of vector i's lanes
static inline __m256i lane_sums(const __m256i (&p)[8]) {
    const __m256i a =
        _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i b =
        _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20),
                            _mm256_permute2x128_si256(a, b, 0x31));
}

template <class T>
static inline void dot_b(const BBuf &u, const XRows &x, long m, long g, float *acc) {
    const int8_t *xq = x.q + m * x.KP + g * G;
    __m256i p[8];
    for (int i = 0; i < 8; i++) {
        __m256i xv = ld(xq + 32 * i);
        if constexpr (T::SIGNED) xv = _mm256_sign_epi8(xv, ld(u.s + 32 * i));
#if defined(__AVX512VNNI__)
        p[i] = _mm256_dpbusd_epi32(_mm256_setzero_si256(), ld(u.q + 32 * i), xv);
#else
        p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(ld(u.q + 32 * i), xv), _mm256_set1_epi16(1));
#endif
    }
    __m256i sums = lane_sums(p);  // lane i: block i's integer dot product
    const long xb = m * (x.KP / 32) + g * 8;
    const __m256i s = ld(x.s32 + xb);  // x's block sums
    if constexpr (T::OFF != 0)  // 8 or 16
        sums = _mm256_sub_epi32(sums, _mm256_slli_epi32(s, T::OFF == 8 ? 3 : 4));
    const __m256 dx = _mm256_loadu_ps(x.dx + xb);
    const __m256 dd = _mm256_mul_ps(_mm256_loadu_ps(u.d), dx);
    _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), dd, _mm256_loadu_ps(acc)));
    if constexpr (T::MINS) {
        const __m256 dm = _mm256_mul_ps(_mm256_loadu_ps(u.m), dx);
        const __m256 b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), dm, _mm256_loadu_ps(acc + 8));
        _mm256_storeu_ps(acc + 8, b);
    }
}

static inline void dot_f32(const float *w, const XRows &x, long m, long g, float *acc) {
    const float *xf = x.xf + m * x.KP + g * G;
    __m256 a = _mm256_loadu_ps(acc), b = _mm256_loadu_ps(acc + 8);
    for (int k = 0; k < G; k += 16) {
        a = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(xf + k), a);
        b = _mm256_fmadd_ps(_mm256_loadu_ps(w + k + 8), _mm256_loadu_ps(xf + k + 8), b);
    }
    _mm256_storeu_ps(acc, a);
    _mm256_storeu_ps(acc + 8, b);
}

// ---- the three ways to process a group: unpack once per weight row, dot per x row ------------
template <class T>
struct KInt {
    typedef KBuf Buf;
    static constexpr long GB = T::BYTES;  // bytes of a group in a weight row
    static void unpack(const uint8_t *row, long g, long, Buf &u) {
        T::parts(row + g * T::BYTES, u);
    }
    static void dot(const Buf &u, const XRows &x, long m, long g, float *acc) {
        dot_k(u, x, m, g, acc);
    }
};
template <class T>
struct BInt {
    typedef BBuf Buf;
    static constexpr long GB = T::QK == 256 ? T::BYTES : 8 * T::BYTES;
    static void unpack(const uint8_t *row, long g, long K, Buf &u) {
        b_group<T>(row, g, K / 32, u);
    }
    static void dot(const Buf &u, const XRows &x, long m, long g, float *acc) {
        dot_b<T>(u, x, m, g, acc);
    }
};
template <class T>
struct Exact {
    static constexpr long GB = G / T::QK * T::BYTES;
    struct alignas(64) Buf {
        float w[G];
    };
    static void unpack(const uint8_t *row, long g, long K, Buf &u) { group_f32<T>(row, g, K, u.w); }
    static void dot(const Buf &u, const XRows &x, long m, long g, float *acc) {
        dot_f32(u.w, x, m, g, acc);
    }
};

struct Job {
    const uint8_t *w;
    long rb, N, K, groups;  // rb: bytes per weight row
    const XRows *x;
    float *y;
    long ldy;
    const float *bias;
    long y0 = 0;  // the weight row whose output is y's column 0
};

// y[m, n] for every m of the pass and the rows n0..n1 of one work item
template <class P>
static void rows(const Job &j, long n0, long n1) {
    constexpr long NB = 8, MC = 16;     // weight rows per item, x rows per sweep
    constexpr long XBYTES = 24 << 10;   // x of a k chunk, kept in L1/L2 across the item's rows
    const long M = j.x->M;
    alignas(64) float acc[NB * MC * 16];
    typename P::Buf u;
    for (long m0 = 0; m0 < M; m0 += MC) {
        const long mc = M - m0 < MC ? M - m0 : MC;
        long cg = XBYTES / (mc * G * (j.x->xf ? 4 : 1));
        cg = cg < 1 ? 1 : cg;
        memset(acc, 0, sizeof(float) * (n1 - n0) * mc * 16);
        for (long g0 = 0; g0 < j.groups; g0 += cg) {
            const long g1 = g0 + cg < j.groups ? g0 + cg : j.groups;
            for (long n = n0; n < n1; n++) {
                const uint8_t *row = j.w + n * j.rb;
                for (long g = g0; g < g1; g++) {
                    // the same group two rows on: one thread alone does not get memory's
                    // bandwidth from the hardware prefetcher (measured: Q6_K head, 1 thread)
                    const char *ahead = (const char *)(row + 2 * j.rb + g * P::GB);
                    for (long b = 0; b < P::GB; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);
                    P::unpack(row, g, j.K, u);
                    for (long m = 0; m < mc; m++)
                        P::dot(u, *j.x, m0 + m, g, acc + ((n - n0) * mc + m) * 16);
                }
            }
        }
        for (long n = n0; n < n1; n++)
            for (long m = 0; m < mc; m++) {
                const float *a = acc + ((n - n0) * mc + m) * 16;
                float s = hsum8(_mm256_loadu_ps(a)) + hsum8(_mm256_loadu_ps(a + 8));
                if (j.bias) s += j.bias[n];
                j.y[(m0 + m) * j.ldy + n - j.y0] = s;
            }
    }
}

// one x row (a decode step), the K-quants: the same FMAs as rows<KInt<T>> per (n, group), with
// the accumulators in registers and the block read in place
template <class T>
static void rows_one(const Job &j, long n0, long n1) {
    const XRows &x = *j.x;
    for (long n = n0; n < n1; n++) {
        const uint8_t *row = j.w + n * j.rb;
        __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        for (long g = 0; g < j.groups; g++) {
            const char *ahead = (const char *)(row + 2 * j.rb + g * T::BYTES);  // as rows
            for (long p = 0; p < T::BYTES; p += 64) _mm_prefetch(ahead + p, _MM_HINT_T0);
            const KSums k = ints(T{}, row + g * T::BYTES, x.q + g * G, x.s16 + g * 16,
                                 x.e2 + g * 16, x.e8 + g * 8);
            const float dx = x.dx[g];
            a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.isum), _mm256_set1_ps(k.d * dx), a);
            b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(k.osum), _mm256_set1_ps(-(k.dmin * dx)), b);
        }
        float s = hsum8(a) + hsum8(b);
        if (j.bias) s += j.bias[n];
        j.y[n - j.y0] = s;
    }
}

// ---- 8-row tiles: Q4_K and Q6_K repacked at load ---------------------------------------------
// In the file a row's super-blocks follow each other, so a product reads one weight row at a
// time and pays, per x row, shuffles that spread the row's scales over the lanes. Repacked
// (``repack``), tile t holds weight rows 8t..8t+7 group by group, the same bytes rearranged:
// a "step" is 32 bytes, k 4s..4s+3 of each of the 8 rows (byte 4r + i: row r, k 4s + i). One
// step times x's 4 bytes broadcast is one maddubs for 8 rows, and every per-row quantity (d,
// scales, mins) is a lane of a vector: nothing is shuffled per x row. The decoded steps stay in
// registers / L1 and serve every x row of the pass, so a verify pass of K+1 tokens costs little
// more than a decode step. (The interleaved-rows idea of the fastest CPU engines' repacked
// types, written for our x form.)
//
// Per x row, weight row r and block j of 32 k: the integer sum S = sum_k q * xq (maddubs pairs,
// then madd with the block's scales as int16 lanes), exact; then in fp32 T += e_j * S and (mins)
// U += mn_j * (e_j * sum xq); per group A += (d * base) * T, B -= (dmin * base) * U. The same
// function of (row, x row) whatever M is, so batch invariant; one lane per weight row.
enum : int {  // tiles: the file's type + 100
    Q4_0_R8 = 102, Q4_1_R8 = 103, Q5_0_R8 = 106, Q5_1_R8 = 107, Q8_0_R8 = 108,
    Q2_K_R8 = 110, Q3_K_R8 = 111, Q4_K_R8 = 112, Q5_K_R8 = 113, Q6_K_R8 = 114,
    IQ4_NL_R8 = 120, IQ4_XS_R8 = 123
};

struct R8Group {    // per tile-group: the 8 rows' factors as vector lanes
    __m256i sc2[8];  // Q6_K: lanes 2r, 2r+1 = sub-blocks 2j, 2j+1's scales (the offsets)
    __m256 mn[8];    // Q4_K: block j's mins as floats, lane r
    __m256 d, dmin;  // lane r
#if defined(__AVX512VNNI__)
    __m256 scf[8];     // Q4_K: block j's scale as a float, lane r
    __m256i sc32[16];  // Q6_K: sub-block i's scale as int32, lane r
#else
    __m256i sc[16];  // Q4_K: [j] block j's scale at lanes 2r and 2r+1 (madd pairs);
                     // Q6_K: [i] sub-block i's scale the same way
#endif
};

static inline __m256i bcast4(const int8_t *p) {  // 4 bytes into every 32-bit lane
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}
#if defined(__AVX512VNNI__)
// S += w (unsigned) times 4 bytes of x broadcast, the broadcast folded into the instruction
// (EVEX m32bcst; GCC emits a separate vpbroadcastd): at M = 16 a Q4_K tile 15% faster (Zen 4)
static inline void dp_bcast(__m256i &S, __m256i w, const int8_t *p) {
#if defined(SPECDEC_EMULATED)
    S = _mm256_dpbusd_epi32(S, w, bcast4(p));
#else
    __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(S) : "v"(w), "m"(*(const int32_t *)p));
#endif
}
#endif
static inline __m256i pairs_u8(__m128i v8) {  // 8 bytes (low half) -> 16 int16, each twice
    return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v8, v8));
}
static inline __m256i pairs_i8(__m128i v8) {
    return _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(v8, v8));
}
// Shuffle controls that keep each row in its 32-bit lane (row r's bytes 4r..4r+3 of a head
// vector, as the tiles store them): result byte k of lane r takes byte 4r + pick[k] (-1:
// zero). One in-lane shuffle then puts a block's scale byte where the row's lanes want it,
// where a transpose to [byte][row] and widenings took three times the shuffles.
struct alignas(32) LaneCtl {
    int8_t b[32];
};
static constexpr LaneCtl lane_ctl(int p0, int p1, int p2, int p3) {
    LaneCtl c{};
    const int p[4] = {p0, p1, p2, p3};
    for (int i = 0; i < 32; i++) c.b[i] = (int8_t)(p[i % 4] < 0 ? -128 : i % 16 / 4 * 4 + p[i % 4]);
    return c;
}
static inline __m256i pick(__m256i v, const LaneCtl &c) {
    return _mm256_shuffle_epi8(v, _mm256_load_si256((const __m256i *)c.b));
}
// byte q of each lane: as an unsigned int32 (U32), twice as unsigned int16 (U16), in the top
// byte of an int32 (TOP32) or of both int16 (TOP16: a shift then sign-extends it), and bytes
// q, q + 1 in the top bytes of the two int16 (TOP16_2, q even)
static constexpr LaneCtl U32[4] = {lane_ctl(0, -1, -1, -1), lane_ctl(1, -1, -1, -1),
                                   lane_ctl(2, -1, -1, -1), lane_ctl(3, -1, -1, -1)};
static constexpr LaneCtl U16[4] = {lane_ctl(0, -1, 0, -1), lane_ctl(1, -1, 1, -1),
                                   lane_ctl(2, -1, 2, -1), lane_ctl(3, -1, 3, -1)};
static constexpr LaneCtl TOP32[4] = {lane_ctl(-1, -1, -1, 0), lane_ctl(-1, -1, -1, 1),
                                     lane_ctl(-1, -1, -1, 2), lane_ctl(-1, -1, -1, 3)};
static constexpr LaneCtl TOP16[4] = {lane_ctl(-1, 0, -1, 0), lane_ctl(-1, 1, -1, 1),
                                     lane_ctl(-1, 2, -1, 2), lane_ctl(-1, 3, -1, 3)};
static constexpr LaneCtl TOP16_2[2] = {lane_ctl(-1, 0, -1, 1), lane_ctl(-1, 2, -1, 3)};

// int16 lanes 2r, 2r + 1 of u.sc2[j] (row r's values for 16-k sub-blocks 2j, 2j + 1: Q6_K's
// and Q3_K's scales, Q2_K's mins) against x's sums over those sub-blocks: an int32 a row
static inline __m256i sc2_x16(const R8Group &u, const int16_t *s16, int j) {
    int32_t pair;
    memcpy(&pair, s16 + 2 * j, 4);
    return _mm256_madd_epi16(u.sc2[j], _mm256_set1_epi32(pair));
}
#if defined(__AVX512VNNI__)
// a block of the types with a scale per 16 k (Q2_K, Q3_K, Q6_K): dpbusd's row sums per
// sub-block times the row's scale (int32, exact)
static inline __m256i sub_block_sums(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                                     int j) {
    __m256i S0 = _mm256_setzero_si256(), S1 = _mm256_setzero_si256();  // sub-blocks
    for (int s = 0; s < 4; s++) {
        dp_bcast(S0, w[s], xq + 4 * s);
        dp_bcast(S1, w[s + 4], xq + 16 + 4 * s);
    }
    return _mm256_add_epi32(_mm256_mullo_epi32(S0, u.sc32[2 * j]),
                            _mm256_mullo_epi32(S1, u.sc32[2 * j + 1]));
}
#endif

// Q4_K tile-group, 8 * 144 bytes: d[8], dmin[8] (fp16), the 12 scale bytes of each row as three
// 32-bit words a0[8], a1[8], a2[8], then 32 vectors: 4j + t holds step t of block j in its low
// nibbles and step t + 4 in its high ones.
struct R8Q4_K {
    static constexpr int QK = 256, BYTES = 144, TG = 8 * 144;
    static constexpr bool MINS = true;
    typedef TQ4_K Base;  // the file's type
    static void head(const uint8_t *tg, R8Group &u) {
        u.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
        u.dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tg + 16)));
        // the rows' 6-bit scales and mins (lane r = row r, byte j = block j, as scales_k4)
        const __m256i a0 = ld(tg + 32), a1 = ld(tg + 64), a2 = ld(tg + 96);
        const __m256i m6 = _mm256_set1_epi32(0x3f3f3f3f), m4 = _mm256_set1_epi32(0x0f0f0f0f);
        const __m256i top = _mm256_set1_epi32(0x30303030);
        const __m256i v[4] = {
            _mm256_and_si256(a0, m6),  // scales of blocks 0-3
            _mm256_or_si256(_mm256_and_si256(a2, m4),
                            _mm256_and_si256(_mm256_srli_epi32(a0, 2), top)),  // 4-7
            _mm256_and_si256(a1, m6),  // mins 0-3
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a2, 4), m4),
                            _mm256_and_si256(_mm256_srli_epi32(a1, 2), top)),  // 4-7
        };
        // block 4h + q's scale and min: byte q of v[h]'s and v[2 + h]'s lanes (lane_ctl)
        for (int h = 0; h < 2; h++)
            for (int q = 0; q < 4; q++) {
                const int j = 4 * h + q;
#if defined(__AVX512VNNI__)
                u.scf[j] = _mm256_cvtepi32_ps(pick(v[h], U32[q]));
#else
                u.sc[j] = pick(v[h], U16[q]);
#endif
                u.mn[j] = _mm256_cvtepi32_ps(pick(v[2 + h], U32[q]));
            }
    }
    // the mins' sum of group g for x row m: mn_j * (e_j * x's sum over block j), j by j
    static inline __attribute__((always_inline)) __m256 mins(const R8Group &u, const XRows &x,
                                                             long m, long g) {
        const float *es = x.es + m * (x.KP / 32) + g * 8;
        __m256 U = _mm256_setzero_ps();
        for (int jb = 0; jb < 8; jb++) U = _mm256_fmadd_ps(u.mn[jb], _mm256_set1_ps(es[jb]), U);
        return U;
    }
    static inline void steps(const uint8_t *tg, int j, __m256i (&w)[8]) {  // block j's 8 steps
        const __m256i low4 = bytes(15);
        for (int t = 0; t < 4; t++) {
            const __m256i v4 = ld(tg + 128 + 32 * (4 * j + t));
            w[t] = _mm256_and_si256(v4, low4);
            w[t + 4] = _mm256_and_si256(srl16(v4, 4), low4);
        }
    }
    // block j of one x row (xq: its 32 bytes) into T (scaled sums) and U (mins' sums)
    static inline void dot(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *, int j, __m256 &T) {
#if defined(__AVX512VNNI__)
        // dpbusd sums 4 products per row lane, in two chains (one chain of 8 would bound the
        // x-row loop by its latency); the row's scale is then applied in fp32, exact
        // (|S| < 2^16, scale < 2^6): the AVX2 path's float, bit for bit
        __m256i S2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        const __m256i S = _mm256_add_epi32(S2[0], S2[1]);
        const __m256 Ss = _mm256_mul_ps(_mm256_cvtepi32_ps(S), u.scf[j]);
        T = _mm256_fmadd_ps(Ss, _mm256_set1_ps(ef[j]), T);
#else
        __m256i P = _mm256_setzero_si256();  // <= 8 * 2 * 15 * 127: no int16 overflow
        for (int s = 0; s < 8; s++)
            P = _mm256_add_epi16(P, _mm256_maddubs_epi16(w[s], bcast4(xq + 4 * s)));
        const __m256i S = _mm256_madd_epi16(P, u.sc[j]);
        T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[j]), T);
#endif
    }
#if !defined(__AVX512VNNI__)
    // dot for x rows 0..mc-1 of the pass at once (q[m], ef[m]: row m's quants and factors, at
    // block j): each step, decoded once, meets every row before the next step, and every row's
    // sum stays in a register. dot's integers and float operations in dot's order: the same
    // bits. (dot row by row holds all 8 steps: beside 5 rows' sums the 16 registers ran out,
    // steps spilled and the rows' sums lived on the stack. Step by step without the empty asm
    // below, GCC reordered the integer adds, computed all 40 products first and spilled them.)
    // Every row of a pass in one sweep (SWEEP); s16 unused, as in dot.
    static constexpr int SWEEP = 16;
    template <int MC>
    static inline __attribute__((always_inline)) void dot_rows(
        const R8Group &u, const uint8_t *tg, int j, const int8_t *const *q,
        const float *const *ef, const int16_t *const *, long mc, __m256 *T) {
        const __m256i low4 = bytes(15);
        __m256i P[MC];  // <= 8 * 2 * 15 * 127: no int16 overflow, in any order
        for (int t = 0; t < 4; t++) {  // steps t and t + 4: one vector's two nibbles
            const __m256i v4 = ld(tg + 128 + 32 * (4 * j + t));
            for (int h = 0; h < 2; h++) {
                const __m256i w = _mm256_and_si256(h ? srl16(v4, 4) : v4, low4);
                for (long m = 0; m < mc; m++) {
                    const __m256i pr = _mm256_maddubs_epi16(w, bcast4(q[m] + 16 * h + 4 * t));
                    P[m] = t + h == 0 ? pr : _mm256_add_epi16(P[m], pr);
                    __asm__("" : "+x"(P[m]));  // an opaque value: the adds stay in this order
                }
            }
        }
        for (long m = 0; m < mc; m++) {
            const __m256i S = _mm256_madd_epi16(P[m], u.sc[j]);
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[m][j]), T[m]);
        }
    }
#endif
    // row r of a tile-group as the file's block (dequantize, tests)
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memcpy(b, tg + 2 * r, 2);
        memcpy(b + 2, tg + 16 + 2 * r, 2);
        for (int w = 0; w < 3; w++) memcpy(b + 4 + 4 * w, tg + 32 + 32 * w + 4 * r, 4);
        uint8_t q[G];
        for (int k = 0; k < G; k++) {
            const int j = k / 32, s = k % 32 / 4, i = k % 4;
            const uint8_t v = tg[128 + 32 * (4 * j + s % 4) + 4 * r + i];
            q[k] = s < 4 ? v & 15 : v >> 4;
        }
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[16 + 32 * c + l] = (uint8_t)(q[64 * c + l] | q[64 * c + 32 + l] << 4);
    }
    // the file's blocks of rows r0..r0+7 (group g) -> a tile-group
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        uint8_t q[8][G];
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b, 2);
            memcpy(tg + 16 + 2 * r, b + 2, 2);
            for (int w = 0; w < 3; w++) memcpy(tg + 32 + 32 * w + 4 * r, b + 4 + 4 * w, 4);
            KBuf u;
            TQ4_K::parts(b, u);
            memcpy(q[r], u.q, G);
        }
        for (int j = 0; j < 8; j++)
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 8; r++)
                    for (int i = 0; i < 4; i++)
                        tg[128 + 32 * (4 * j + t) + 4 * r + i] = (uint8_t)(
                            q[r][32 * j + 4 * t + i] | q[r][32 * j + 16 + 4 * t + i] << 4);
    }
};

// ---- tiles whose int16 sums hold half a block: Q2_K, Q3_K, Q5_K -----------------------------
// A block's eight steps in two halves of four: a half's int16 sums (<= 4 * 2 * 31 * 127), then
// a madd with that half's scales (T::half_scale: its 16-k sub-block's, or Q5_K's block scale
// for both). T::bits(tg, j) is what block j's steps share (their fifth or third bits; nothing
// for Q2_K), T::step(tg, j, st, bits) step st's unsigned quants.
template <class T>
static inline void half_steps(const uint8_t *tg, int j, __m256i (&w)[8]) {
    const __m256i b = T::bits(tg, j);
#pragma GCC unroll 8  // constant shifts: GCC, left to itself, kept the loop and branched
    for (int st = 0; st < 8; st++) w[st] = T::step(tg, j, st, b);
}
// bit `from` of h's bytes at bit `to` (the rest 0): a step's fifth or third bit, for constant
// `from` and `to` (the callers' loops unroll)
static inline __m256i bit_at(__m256i h, int from, int to) {
    const int d = to - from;
    const __m256i v = d > 0 ? _mm256_slli_epi16(h, d) : d < 0 ? _mm256_srli_epi16(h, -d) : h;
    return _mm256_and_si256(v, bytes(1 << to));
}
static inline __m256i two_bits(__m256i v, int t) {  // bits 2t, 2t + 1 of v's bytes
    const __m256i low = t == 0   ? v
                        : t == 1 ? _mm256_srli_epi16(v, 2)
                        : t == 2 ? _mm256_srli_epi16(v, 4)
                                 : _mm256_srli_epi16(v, 6);
    return _mm256_and_si256(low, bytes(3));
}
#if !defined(__AVX512VNNI__)
template <class T>  // one x row's block j (xq: its 32 bytes): the rows' integer sums
static inline __m256i half_sums(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                                int j) {
    __m256i S = _mm256_setzero_si256();
    for (int half = 0; half < 2; half++) {
        __m256i P = _mm256_setzero_si256();
        for (int s = 4 * half; s < 4 * half + 4; s++)
            P = _mm256_add_epi16(P, _mm256_maddubs_epi16(w[s], bcast4(xq + 4 * s)));
        S = _mm256_add_epi32(S, _mm256_madd_epi16(P, T::half_scale(u, j, half)));
    }
    return S;
}
// half_sums for x rows 0..mc-1 at once (R8Q4_K::dot_rows' reasons). A row's int16, int32 and
// float sums are live at once: past 4 rows the 16 registers spilled (in L1, 5 rows of Q5_K:
// 25.8 cycles a row and block; in sweeps of 4, 16.6), so these types' SWEEP is 4
constexpr int HALF_SWEEP = 4;
template <class T, int MC>
static inline __attribute__((always_inline)) void half_sums_rows(const R8Group &u,
                                                                 const uint8_t *tg, int j,
                                                                 const int8_t *const *q,
                                                                 long mc, __m256i (&S)[MC]) {
    const __m256i b = T::bits(tg, j);
#pragma GCC unroll 2
    for (int half = 0; half < 2; half++) {
        __m256i P[MC];
#pragma GCC unroll 4  // (as in half_steps)
        for (int t = 0; t < 4; t++) {
            const int st = 4 * half + t;
            const __m256i w = T::step(tg, j, st, b);
            for (long m = 0; m < mc; m++) {
                const __m256i pr = _mm256_maddubs_epi16(w, bcast4(q[m] + 4 * st));
                P[m] = t == 0 ? pr : _mm256_add_epi16(P[m], pr);
                __asm__("" : "+x"(P[m]));  // as R8Q4_K::dot_rows
            }
        }
        for (long m = 0; m < mc; m++) {
            const __m256i Sm = _mm256_madd_epi16(P[m], T::half_scale(u, j, half));
            S[m] = half ? _mm256_add_epi32(S[m], Sm) : Sm;
        }
    }
}
#endif

// Q2_K tile-group, 8 * 84 bytes: d[8], dmin[8] (fp16), the scale bytes as [sub-block i][row]
// (scale in the low nibble, min in the high one: 128 bytes), then block by block (64 bytes at
// 160 + 64j) two vectors of the 2-bit quants as R8Q3_K's. A scale and a min per 16 k: the
// integer sums per sub-block as R8Q3_K's (no offset), and the mins' per block (the pair of
// sub-blocks' mins against x's sums per 16 k, exact), converted with e_j as Q4_K's are.
struct R8Q2_K {
    static constexpr int QK = 256, BYTES = 84, TG = 8 * 84;
    static constexpr bool MINS = true;
    typedef TQ2_K Base;
    static void head(const uint8_t *tg, R8Group &u) {
        u.d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
        u.dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tg + 16)));
        const __m128i m4 = _mm_set1_epi8(15);
        for (int j = 0; j < 8; j++) {  // sub-blocks 2j, 2j + 1: 8 bytes each (rows)
            const __m128i v = _mm_loadu_si128((const __m128i *)(tg + 32 + 16 * j));
            const __m128i sc = _mm_and_si128(v, m4);
            const __m128i mn = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
#if defined(__AVX512VNNI__)
            u.sc32[2 * j] = _mm256_cvtepu8_epi32(sc);
            u.sc32[2 * j + 1] = _mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8));
#else
            u.sc[2 * j] = pairs_u8(sc);
            u.sc[2 * j + 1] = pairs_u8(_mm_srli_si128(sc, 8));
#endif
            // lanes 2r, 2r + 1: the two sub-blocks' mins of row r (madd against x's sums)
            u.sc2[j] = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, _mm_srli_si128(mn, 8)));
        }
    }
    // the mins' sum of group g for x row m: e_j * (both sub-blocks' mins against x's sums)
    static inline __attribute__((always_inline)) __m256 mins(const R8Group &u, const XRows &x,
                                                             long m, long g) {
        const int16_t *s16 = x.s16 + m * (x.KP / 16) + g * 16;
        const float *ef = x.ef + m * (x.KP / 32) + g * 8;
        __m256 U = _mm256_setzero_ps();
        for (int j = 0; j < 8; j++)
            U = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sc2_x16(u, s16, j)), _mm256_set1_ps(ef[j]), U);
        return U;
    }
    static constexpr int lo(int j) { return 160 + 64 * j; }  // block j's two vectors
    static inline __m256i bits(const uint8_t *, int) { return _mm256_setzero_si256(); }
    static inline __m256i step(const uint8_t *tg, int j, int st, __m256i) {
        return two_bits(ld(tg + lo(j) + 32 * (st / 4)), st % 4);
    }
    static inline void steps(const uint8_t *tg, int j, __m256i (&w)[8]) {  // block j's 8 steps
        half_steps<R8Q2_K>(tg, j, w);
    }
    static inline void dot(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *, int j, __m256 &T) {
#if defined(__AVX512VNNI__)
        const __m256i S = sub_block_sums(u, w, xq, j);
#else
        const __m256i S = half_sums<R8Q2_K>(u, w, xq, j);
#endif
        T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[j]), T);
    }
#if !defined(__AVX512VNNI__)
    static inline __m256i half_scale(const R8Group &u, int j, int half) {  // sub-block 2j + half
        return u.sc[2 * j + half];
    }
    static constexpr int SWEEP = HALF_SWEEP;
    template <int MC>  // dot for x rows 0..mc-1 at once
    static inline __attribute__((always_inline)) void dot_rows(
        const R8Group &u, const uint8_t *tg, int j, const int8_t *const *q,
        const float *const *ef, const int16_t *const *, long mc, __m256 *T) {
        __m256i S[MC];
        half_sums_rows<R8Q2_K, MC>(u, tg, j, q, mc, S);
        for (long m = 0; m < mc; m++)
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[m]), _mm256_set1_ps(ef[m][j]), T[m]);
    }
#endif
    // row r of a tile-group as the file's block (dequantize, tests)
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        for (int i = 0; i < 16; i++) b[i] = tg[32 + 8 * i + r];  // scales[16]
        memset(b + 16, 0, 64);
        for (int k = 0; k < G; k++) {  // the file's k 128h + 32s + l: bits 2s of qs[32h + l]
            const int j = k / 32, st = k % 32 / 4, i = k % 4;
            const int v = tg[lo(j) + 32 * (st / 4) + 4 * r + i] >> 2 * (st % 4) & 3;
            b[16 + 32 * (k / 128) + k % 32] |= (uint8_t)(v << 2 * (k % 128 / 32));
        }
        memcpy(b + 80, tg + 2 * r, 2);
        memcpy(b + 82, tg + 16 + 2 * r, 2);
    }
    // the file's blocks of rows r0..r0+7 (group g) -> a tile-group
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        uint8_t q[8][G];
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b + 80, 2);
            memcpy(tg + 16 + 2 * r, b + 82, 2);
            for (int i = 0; i < 16; i++) tg[32 + 8 * i + r] = b[i];
            KBuf u;
            TQ2_K::parts(b, u);
            memcpy(q[r], u.q, G);
        }
        memset(tg + lo(0), 0, TG - lo(0));
        for (int j = 0; j < 8; j++)
            for (int st = 0; st < 8; st++)
                for (int r = 0; r < 8; r++)
                    for (int i = 0; i < 4; i++)
                        tg[lo(j) + 32 * (st / 4) + 4 * r + i] |=
                            (uint8_t)(q[r][32 * j + 4 * st + i] << 2 * (st % 4));
    }
};

// Q3_K tile-group, 8 * 110 bytes: d[8] (fp16), the 12 scale bytes of each row as three 32-bit
// words a0[8], a1[8], a2[8] (as R8Q4_K's), then block by block (96 bytes at 112 + 96j) two
// vectors of the quants' low 2 bits (v: steps 4v .. 4v + 3 in bits 0-1, 2-3, 4-5, 6-7) and
// one of their third bits (bit st: step st's). q = low bits | third bit << 2 is the file's
// q + 4 (unsigned); scales per 16 k, signed, as R8Q6_K's: the same integer arithmetic with
// offset 4, and one sub-block's four steps fit an int16 sum (<= 4 * 2 * 7 * 127).
struct R8Q3_K {
    static constexpr int QK = 256, BYTES = 110, TG = 8 * 110;
    static constexpr bool MINS = false;
    typedef TQ3_K Base;
    static void head(const uint8_t *tg, R8Group &u) {
        u.d = u.dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
        // TQ3_K::scales' words for the 8 rows at once: lane r, byte q = scale 4h + q of row r
        const __m256i a0 = ld(tg + 16), a1 = ld(tg + 48), a2 = ld(tg + 80);
        const __m256i m4 = _mm256_set1_epi32(0x0f0f0f0f), m2 = _mm256_set1_epi32(0x03030303);
        auto top = [&](int n) {  // bits n, n + 1 of a2's bytes -> bits 4, 5
            return _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a2, n), m2), 4);
        };
        const __m256i v[4] = {
            _mm256_or_si256(_mm256_and_si256(a0, m4), top(0)),
            _mm256_or_si256(_mm256_and_si256(a1, m4), top(2)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a0, 4), m4), top(4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(a1, 4), m4), top(6)),
        };
        // sub-block 4h + q's scale (6 bits - 32): byte q of v[h]'s lanes (lane_ctl), signed
        for (int h = 0; h < 4; h++) {
            const __m256i sv = _mm256_sub_epi8(v[h], bytes(32));
            for (int q = 0; q < 4; q++) {
#if defined(__AVX512VNNI__)
                u.sc32[4 * h + q] = _mm256_srai_epi32(pick(sv, TOP32[q]), 24);
#else
                u.sc[4 * h + q] = _mm256_srai_epi16(pick(sv, TOP16[q]), 8);
#endif
            }
            for (int t = 0; t < 2; t++)  // sub-blocks 4h + 2t, 4h + 2t + 1
                u.sc2[2 * h + t] = _mm256_srai_epi16(pick(sv, TOP16_2[t]), 8);
        }
    }
    static constexpr int lo(int j) { return 112 + 96 * j; }  // block j's low-bit vectors
    static constexpr int hi(int j) { return lo(j) + 64; }    // its third bits
    static inline __m256i bits(const uint8_t *tg, int j) { return ld(tg + hi(j)); }
    static inline __m256i step(const uint8_t *tg, int j, int st, __m256i h) {
        return _mm256_or_si256(two_bits(ld(tg + lo(j) + 32 * (st / 4)), st % 4), bit_at(h, st, 2));
    }
    static inline void steps(const uint8_t *tg, int j, __m256i (&w)[8]) {  // block j's 8 steps
        half_steps<R8Q3_K>(tg, j, w);
    }
    // S minus the offset: 4 * sum_i sc_i * (x's sum over sub-block i), for sub-blocks 2j, 2j + 1
    static inline __m256i offset(const R8Group &u, const int16_t *s16, int j, __m256i S) {
        return _mm256_sub_epi32(S, _mm256_slli_epi32(sc2_x16(u, s16, j), 2));
    }
    static inline void dot(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *s16, int j, __m256 &T) {
#if defined(__AVX512VNNI__)
        const __m256i S = sub_block_sums(u, w, xq, j);
#else
        const __m256i S = half_sums<R8Q3_K>(u, w, xq, j);
#endif
        T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(offset(u, s16, j, S)), _mm256_set1_ps(ef[j]), T);
    }
#if !defined(__AVX512VNNI__)
    static inline __m256i half_scale(const R8Group &u, int j, int half) {  // sub-block 2j + half
        return u.sc[2 * j + half];
    }
    static constexpr int SWEEP = HALF_SWEEP;
    template <int MC>  // dot for x rows 0..mc-1 at once
    static inline __attribute__((always_inline)) void dot_rows(
        const R8Group &u, const uint8_t *tg, int j, const int8_t *const *q,
        const float *const *ef, const int16_t *const *s16, long mc, __m256 *T) {
        __m256i S[MC];
        half_sums_rows<R8Q3_K, MC>(u, tg, j, q, mc, S);
        for (long m = 0; m < mc; m++) {
            const __m256i Sm = offset(u, s16[m], j, S[m]);
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Sm), _mm256_set1_ps(ef[m][j]), T[m]);
        }
    }
#endif
    // row r of a tile-group as the file's block (dequantize, tests)
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memset(b, 0, 96);  // hmask[32], qs[64]: or-ed below
        for (int w = 0; w < 3; w++) memcpy(b + 96 + 4 * w, tg + 16 + 32 * w + 4 * r, 4);
        memcpy(b + 108, tg + 2 * r, 2);
        for (int k = 0; k < G; k++) {  // the file's k 128h + 32s + l: bits 2s of qs[32h + l],
            const int j = k / 32, st = k % 32 / 4, i = k % 4;  // bit 4h + s of hmask[l]
            const int low = tg[lo(j) + 32 * (st / 4) + 4 * r + i] >> 2 * (st % 4) & 3;
            const int third = tg[hi(j) + 4 * r + i] >> st & 1;
            const int h = k / 128, s = k % 128 / 32, l = k % 32;
            b[32 + 32 * h + l] |= (uint8_t)(low << 2 * s);
            b[l] |= (uint8_t)(third << (4 * h + s));
        }
    }
    // the file's blocks of rows r0..r0+7 (group g) -> a tile-group
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        uint8_t q[8][G];
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b + 108, 2);
            for (int w = 0; w < 3; w++) memcpy(tg + 16 + 32 * w + 4 * r, b + 96 + 4 * w, 4);
            KBuf u;
            TQ3_K::parts(b, u);
            memcpy(q[r], u.q, G);
        }
        memset(tg + lo(0), 0, TG - lo(0));
        for (int j = 0; j < 8; j++)
            for (int st = 0; st < 8; st++)
                for (int r = 0; r < 8; r++)
                    for (int i = 0; i < 4; i++) {
                        const uint8_t v = q[r][32 * j + 4 * st + i];  // 0..7
                        tg[lo(j) + 32 * (st / 4) + 4 * r + i] |= (uint8_t)((v & 3) << 2 * (st % 4));
                        tg[hi(j) + 4 * r + i] |= (uint8_t)((v >> 2) << st);
                    }
    }
};

// Q5_K tile-group, 8 * 176 bytes: R8Q4_K's head (128 bytes), then block by block (160 bytes at
// 128 + 160j) R8Q4_K's 4 nibble vectors and one of the fifth bits (bit st of byte 4r + i: step
// st's), in the order the kernel reads them. q < 32, so four steps' maddubs fit an int16 sum
// (<= 4 * 2 * 31 * 127) where Q4_K's eight do: two madds with the block's scales a row and
// block. The integers, then one conversion and FMA a block, are Q4_K's: AVX2's and VNNI's bits
// are the same.
struct R8Q5_K {
    static constexpr int QK = 256, BYTES = 176, TG = 8 * 176;
    static constexpr bool MINS = true;
    typedef TQ5_K Base;
    static void head(const uint8_t *tg, R8Group &u) { R8Q4_K::head(tg, u); }
    static inline __attribute__((always_inline)) __m256 mins(const R8Group &u, const XRows &x,
                                                             long m, long g) {
        return R8Q4_K::mins(u, x, m, g);
    }
    static constexpr int lo(int j) { return 128 + 160 * j; }  // block j's nibble vectors
    static constexpr int hi(int j) { return lo(j) + 128; }     // its fifth bits
    static inline __m256i bits(const uint8_t *tg, int j) { return ld(tg + hi(j)); }
    static inline __m256i step(const uint8_t *tg, int j, int st, __m256i h) {
        const __m256i v4 = ld(tg + lo(j) + 32 * (st % 4));
        return _mm256_or_si256(_mm256_and_si256(st < 4 ? v4 : srl16(v4, 4), bytes(15)),
                               bit_at(h, st, 4));
    }
    static inline void steps(const uint8_t *tg, int j, __m256i (&w)[8]) {  // block j's 8 steps
        half_steps<R8Q5_K>(tg, j, w);
    }
    static inline void dot(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *, int j, __m256 &T) {
#if defined(__AVX512VNNI__)
        __m256i S2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};  // as R8Q4_K's
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        const __m256i S = _mm256_add_epi32(S2[0], S2[1]);
        const __m256 Ss = _mm256_mul_ps(_mm256_cvtepi32_ps(S), u.scf[j]);
        T = _mm256_fmadd_ps(Ss, _mm256_set1_ps(ef[j]), T);
#else
        const __m256i S = half_sums<R8Q5_K>(u, w, xq, j);
        T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[j]), T);
#endif
    }
#if !defined(__AVX512VNNI__)
    static inline __m256i half_scale(const R8Group &u, int j, int) { return u.sc[j]; }
    static constexpr int SWEEP = HALF_SWEEP;
    template <int MC>  // dot for x rows 0..mc-1 at once
    static inline __attribute__((always_inline)) void dot_rows(
        const R8Group &u, const uint8_t *tg, int j, const int8_t *const *q,
        const float *const *ef, const int16_t *const *, long mc, __m256 *T) {
        __m256i S[MC];
        half_sums_rows<R8Q5_K, MC>(u, tg, j, q, mc, S);
        for (long m = 0; m < mc; m++)
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[m]), _mm256_set1_ps(ef[m][j]), T[m]);
    }
#endif
    // row r of a tile-group as the file's block (dequantize, tests)
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memcpy(b, tg + 2 * r, 2);
        memcpy(b + 2, tg + 16 + 2 * r, 2);
        for (int w = 0; w < 3; w++) memcpy(b + 4 + 4 * w, tg + 32 + 32 * w + 4 * r, 4);
        uint8_t q[G];
        for (int k = 0; k < G; k++) {
            const int j = k / 32, st = k % 32 / 4, i = k % 4;
            const uint8_t v = tg[lo(j) + 32 * (st % 4) + 4 * r + i];
            const int top = tg[hi(j) + 4 * r + i] >> st & 1;
            q[k] = (uint8_t)((st < 4 ? v & 15 : v >> 4) | top << 4);
        }
        memset(b + 16, 0, 32);  // qh: bit i of byte l is the fifth bit of k 32i + l
        for (int k = 0; k < G; k++) b[16 + k % 32] |= (uint8_t)((q[k] >> 4) << (k / 32));
        for (int c = 0; c < 4; c++)
            for (int l = 0; l < 32; l++)
                b[48 + 32 * c + l] =
                    (uint8_t)((q[64 * c + l] & 15) | (q[64 * c + 32 + l] & 15) << 4);
    }
    // the file's blocks of rows r0..r0+7 (group g) -> a tile-group
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        uint8_t q[8][G];
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b, 2);
            memcpy(tg + 16 + 2 * r, b + 2, 2);
            for (int w = 0; w < 3; w++) memcpy(tg + 32 + 32 * w + 4 * r, b + 4 + 4 * w, 4);
            KBuf u;
            TQ5_K::parts(b, u);
            memcpy(q[r], u.q, G);
        }
        for (int j = 0; j < 8; j++) {
            uint8_t *h = tg + hi(j);
            memset(h, 0, 32);
            for (int t = 0; t < 4; t++)
                for (int r = 0; r < 8; r++)
                    for (int i = 0; i < 4; i++) {  // steps t and t + 4
                        const uint8_t a = q[r][32 * j + 4 * t + i];
                        const uint8_t c = q[r][32 * j + 16 + 4 * t + i];
                        tg[lo(j) + 32 * t + 4 * r + i] = (uint8_t)((a & 15) | (c & 15) << 4);
                        h[4 * r + i] |= (uint8_t)((a >> 4) << t | (c >> 4) << (t + 4));
                    }
        }
    }
};

// Q6_K tile-group, 8 * 210 bytes: d[8] (fp16), the int8 scales as [sub-block i][row] (128),
// then block by block (192 bytes at 144 + 192j) 4 vectors of the quants' low 4 bits (t: step t
// low, step t + 4 high) and 2 of their top 2 bits (h: steps 4h .. 4h + 3 in bits 0-1, 2-3,
// 4-5, 6-7): the order the kernel reads them, one stream. (With all low bits first and the top
// bits after, a block's two reads were two streams 1 KB apart: without software prefetch a
// 1-token product of the Q6_K head took twice as long, and with it 9% longer than now.)
struct R8Q6_K {
    static constexpr int QK = 256, BYTES = 210, TG = 8 * 210;
    static constexpr bool MINS = false;
    typedef TQ6_K Base;
    static void head(const uint8_t *tg, R8Group &u) {
        u.d = u.dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
        const uint8_t *sc = tg + 16;
        for (int i = 0; i < 16; i++) {  // each build reads the form its dot product needs
#if defined(__AVX512VNNI__)
            u.sc32[i] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(sc + 8 * i)));
#else
            u.sc[i] = pairs_i8(_mm_loadl_epi64((const __m128i *)(sc + 8 * i)));
#endif
        }
        for (int j = 0; j < 8; j++)
            u.sc2[j] = _mm256_cvtepi8_epi16(
                _mm_unpacklo_epi8(_mm_loadl_epi64((const __m128i *)(sc + 16 * j)),
                                  _mm_loadl_epi64((const __m128i *)(sc + 16 * j + 8))));
    }
    // where block j's 4 low-bit vectors start, and its 2 top-bit vectors
    static constexpr int lo(int j) { return 144 + 192 * j; }
    static constexpr int hi(int j) { return lo(j) + 128; }
    // step st of block j, q + 32 (unsigned): nibble st / 4 of low-bit vector st % 4, with bits
    // 2t, 2t + 1 of top-bit vector st / 4 moved to bits 4, 5
    static inline __m256i step(const uint8_t *tg, int j, int st) {
        const __m256i low4 = bytes(15), b45 = bytes(0x30);
        const int t = st % 4;
        const __m256i v4 = ld(tg + lo(j) + 32 * t), h = ld(tg + hi(j) + 32 * (st / 4));
        const __m256i hs = t == 0   ? _mm256_slli_epi16(h, 4)
                           : t == 1 ? _mm256_slli_epi16(h, 2)
                           : t == 2 ? h
                                    : _mm256_srli_epi16(h, 2);
        return _mm256_or_si256(_mm256_and_si256(st < 4 ? v4 : srl16(v4, 4), low4),
                               _mm256_and_si256(hs, b45));
    }
    static inline void steps(const uint8_t *tg, int j, __m256i (&w)[8]) {  // block j's 8 steps
        for (int st = 0; st < 8; st++) w[st] = step(tg, j, st);
    }
    // (Tried: signed q - 32 against |x| and sign(x), one madd per 16 k instead of two and no
    // offset term: fewer multiplies, yet ~8% slower at M = 5 on a Zen 3.)
    static inline void dot(const R8Group &u, const __m256i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *s16, int j, __m256 &T) {
#if defined(__AVX512VNNI__)
        __m256i S = sub_block_sums(u, w, xq, j);
#else
        __m256i S = _mm256_setzero_si256();
        for (int p = 0; p < 4; p++) {  // steps 2p, 2p + 1: <= 2 * 2 * 63 * 127 in int16
            const __m256i P =
                _mm256_add_epi16(_mm256_maddubs_epi16(w[2 * p], bcast4(xq + 8 * p)),
                                 _mm256_maddubs_epi16(w[2 * p + 1], bcast4(xq + 8 * p + 4)));
            S = _mm256_add_epi32(S, _mm256_madd_epi16(P, u.sc[2 * j + p / 2]));
        }
#endif
        // q is stored + 32: minus 32 * sum_i sc_i * (x's sum over sub-block i)
        S = _mm256_sub_epi32(S, _mm256_slli_epi32(sc2_x16(u, s16, j), 5));
        T = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_set1_ps(ef[j]), T);
    }
#if !defined(__AVX512VNNI__)
    // dot for x rows 0..mc-1 at once (R8Q4_K::dot_rows' reasons; q, ef, s16: row m's at block
    // j): two steps decoded at a time serve every row; dot's integers and floats, the same bits.
    // At most 3 rows a sweep: with 4-5 rows' sums beside the steps the registers spill.
    static constexpr int SWEEP = 3;
    template <int MC>
    static inline __attribute__((always_inline)) void dot_rows(
        const R8Group &u, const uint8_t *tg, int j, const int8_t *const *q,
        const float *const *ef, const int16_t *const *s16, long mc, __m256 *T) {
        __m256i S[MC];
        for (int p = 0; p < 4; p++) {  // steps 2p, 2p + 1: sub-block 2j + p / 2
            const __m256i w[2] = {step(tg, j, 2 * p), step(tg, j, 2 * p + 1)};
            for (long m = 0; m < mc; m++) {
                const __m256i P = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast4(q[m] + 8 * p)),
                                                   _mm256_maddubs_epi16(w[1], bcast4(q[m] + 8 * p + 4)));
                const __m256i Sp = _mm256_madd_epi16(P, u.sc[2 * j + p / 2]);
                S[m] = p == 0 ? Sp : _mm256_add_epi32(S[m], Sp);
                __asm__("" : "+x"(S[m]));
            }
        }
        for (long m = 0; m < mc; m++) {
            const __m256i Sm = _mm256_sub_epi32(S[m], _mm256_slli_epi32(sc2_x16(u, s16[m], j), 5));
            T[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Sm), _mm256_set1_ps(ef[m][j]), T[m]);
        }
    }
#endif
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memcpy(b + 208, tg + 2 * r, 2);
        for (int i = 0; i < 16; i++) b[192 + i] = tg[16 + 8 * i + r];
        uint8_t q[G];
        for (int k = 0; k < G; k++) {
            const int j = k / 32, s = k % 32 / 4, i = k % 4;
            const uint8_t v = tg[lo(j) + 32 * (s % 4) + 4 * r + i];
            const uint8_t h = tg[hi(j) + 32 * (s / 4) + 4 * r + i];
            q[k] = (uint8_t)((s < 4 ? v & 15 : v >> 4) | ((h >> (2 * (s % 4))) & 3) << 4);
        }
        memset(b, 0, 192);
        for (int k = 0; k < G; k++) {  // the file: k = 128h + 32s + l
            const int h = k / 128, s = k % 128 / 32, l = k % 32;
            b[64 * h + 32 * (s & 1) + l] |= (uint8_t)((q[k] & 15) << (4 * (s >> 1)));
            b[128 + 32 * h + l] |= (uint8_t)((q[k] >> 4) << (2 * s));
        }
    }
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        uint8_t q[8][G];
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b + 208, 2);
            for (int i = 0; i < 16; i++) tg[16 + 8 * i + r] = b[192 + i];
            KBuf u;
            TQ6_K::parts(b, u);
            memcpy(q[r], u.q, G);
        }
        for (int j = 0; j < 8; j++)
            for (int r = 0; r < 8; r++)
                for (int i = 0; i < 4; i++) {
                    for (int t = 0; t < 4; t++)
                        tg[lo(j) + 32 * t + 4 * r + i] =
                            (uint8_t)((q[r][32 * j + 4 * t + i] & 15) |
                                      (q[r][32 * j + 16 + 4 * t + i] & 15) << 4);
                    for (int h = 0; h < 2; h++) {
                        uint8_t v = 0;
                        for (int t = 0; t < 4; t++)
                            v |= (uint8_t)((q[r][32 * j + 16 * h + 4 * t + i] >> 4) << (2 * t));
                        tg[hi(j) + 32 * h + 4 * r + i] = v;
                    }
                }
    }
};

// Q4_0, Q4_1, Q5_0, Q5_1 tile-group, 8 rows x one block of 32 k (8 times the file's block):
// d[8] (fp16), Q4_1/Q5_1's m[8] (fp16), 4 vectors of the low 4 bits (t: step t in the low
// nibbles, step t + 4 in the high ones), and for Q5_0/Q5_1 1 of the fifth bits (byte 4r + i,
// bit s: k 4s + i of row r). Q5_0 is the default draft's type (its K = 896 rules K-quants
// out): in the file layout a 1-token product reached 21 GB/s, bound by unpacking; tiled, ~55
// GB/s from the caches. Q4_1 and Q5_1 in the file layout: a 1-token pass of the default target
// 54 / 62 ms against Q4_0's 35 (Zen 2).
template <class B>
struct R8B32 {
    static constexpr bool MINS = B::MINS;  // Q4_1, Q5_1: w = d * q + m
    static constexpr int FILE_QH = MINS ? 4 : 2;  // in the file's block: the fifth bits, then
    static constexpr bool FIFTH = B::BYTES - FILE_QH == 20;  // Q5_0, Q5_1: a fifth bit
    static constexpr int FILE_QS = FILE_QH + (FIFTH ? 4 : 0);  // the nibbles
    static constexpr int QOFF = MINS ? 32 : 16, HOFF = QOFF + 128;  // in the tile-group
    static constexpr int QK = 32, BYTES = B::BYTES, TG = 8 * B::BYTES, OFF = B::OFF;
    typedef B Base;
    static inline void steps(const uint8_t *tg, __m256i (&w)[8]) {  // q + OFF, unsigned
        const __m256i low4 = bytes(15);
        for (int t = 0; t < 4; t++) {
            const __m256i v4 = ld(tg + QOFF + 32 * t);
            w[t] = _mm256_and_si256(v4, low4);
            w[t + 4] = _mm256_and_si256(srl16(v4, 4), low4);
        }
        if constexpr (FIFTH) {
            const __m256i h = ld(tg + HOFF);
#pragma GCC unroll 8  // (bit_at's constant shifts)
            for (int s = 0; s < 8; s++) w[s] = _mm256_or_si256(w[s], bit_at(h, s, 4));
        }
    }
    static inline __m256 d(const uint8_t *tg) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
    }
    static inline __m256 m(const uint8_t *tg) {  // the 8 rows' m (Q4_1, Q5_1)
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(tg + 16)));
    }
    // the block's m term for one x row, after its q term: A += m * (dx * sum), sum = x's
    // block sum of q (w = d q + m: sum_k w x = d dx S + m dx sum)
    static inline __m256 mins(__m256 A, __m256 m, int32_t sum, float dx) {
        if constexpr (MINS) return _mm256_fmadd_ps(m, _mm256_set1_ps((float)sum * dx), A);
        return A;
    }
#if defined(__AVX512VNNI__)
    static inline __m512 mins(__m512 A, __m512 m, int32_t sum, float dx) {  // (pairs)
        if constexpr (MINS) return _mm512_fmadd_ps(m, _mm512_set1_ps((float)sum * dx), A);
        return A;
    }
#endif
    // one block of one x row (xq: its 32 bytes, sum: their sum, dx: their step) into A
    static inline void dot(const __m256i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m256 d, __m256 m, __m256 &A) {
#if defined(__AVX512VNNI__)
        __m256i S2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        __m256i S = _mm256_add_epi32(S2[0], S2[1]);
#else
        __m256i P[2];  // 4 steps each: <= 4 * 2 * 31 * 127 in int16
        for (int h = 0; h < 2; h++)
            P[h] = _mm256_add_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(w[4 * h], bcast4(xq + 16 * h)),
                                 _mm256_maddubs_epi16(w[4 * h + 1], bcast4(xq + 16 * h + 4))),
                _mm256_add_epi16(_mm256_maddubs_epi16(w[4 * h + 2], bcast4(xq + 16 * h + 8)),
                                 _mm256_maddubs_epi16(w[4 * h + 3], bcast4(xq + 16 * h + 12))));
        const __m256i one = _mm256_set1_epi16(1);
        __m256i S = _mm256_add_epi32(_mm256_madd_epi16(P[0], one), _mm256_madd_epi16(P[1], one));
#endif
        if constexpr (OFF != 0) S = _mm256_sub_epi32(S, _mm256_set1_epi32(OFF * sum));  // q + OFF
        A = mins(_mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(d, _mm256_set1_ps(dx)), A),
                 m, sum, dx);
    }
#if !defined(__AVX512VNNI__)
    // dot for x rows 0..mc-1 at once (R8Q4_K::dot_rows' reasons; q, sum, dx: row m's at this
    // block): dot's integers (P[0] steps 0-3, P[1] 4-7) and float operations, the same bits
    template <int MC>
    static inline __attribute__((always_inline)) void dot_rows(const uint8_t *tg, __m256 d,
                                                               __m256 mv,
                                                               const int8_t *const *q,
                                                               const int32_t *sum,
                                                               const float *dx, long mc,
                                                               __m256 *A) {
        const __m256i low4 = bytes(15);
        __m256i h;
        if constexpr (FIFTH) h = ld(tg + HOFF);
        __m256i P[MC][2];
        for (int t = 0; t < 4; t++) {
            const __m256i v4 = ld(tg + QOFF + 32 * t);
            for (int i = 0; i < 2; i++) {  // step t + 4i
                __m256i w = _mm256_and_si256(i ? srl16(v4, 4) : v4, low4);
                if constexpr (FIFTH) w = _mm256_or_si256(w, bit_at(h, 4 * i + t, 4));
                for (long m = 0; m < mc; m++) {
                    const __m256i pr = _mm256_maddubs_epi16(w, bcast4(q[m] + 16 * i + 4 * t));
                    P[m][i] = t == 0 ? pr : _mm256_add_epi16(P[m][i], pr);
                    __asm__("" : "+x"(P[m][i]));
                }
            }
        }
        const __m256i one = _mm256_set1_epi16(1);
        for (long m = 0; m < mc; m++) {
            __m256i S = _mm256_add_epi32(_mm256_madd_epi16(P[m][0], one),
                                         _mm256_madd_epi16(P[m][1], one));
            if constexpr (OFF != 0) S = _mm256_sub_epi32(S, _mm256_set1_epi32(OFF * sum[m]));
            A[m] = mins(_mm256_fmadd_ps(_mm256_cvtepi32_ps(S),
                                        _mm256_mul_ps(d, _mm256_set1_ps(dx[m])), A[m]),
                        mv, sum[m], dx[m]);
        }
    }
#endif
    // tile-group: d[8] (fp16), Q4_1/Q5_1's m[8], 4 vectors of nibbles (vector t: step t in
    // the low nibbles, t + 4 in the high ones), Q5_0/Q5_1's fifth bits (bit s: step s)
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memset(b, 0, BYTES);
        memcpy(b, tg + 2 * r, 2);
        if constexpr (MINS) memcpy(b + 2, tg + 16 + 2 * r, 2);
        uint8_t *qs = b + FILE_QS;
        uint32_t qh = 0;
        for (int k = 0; k < 32; k++) {
            const int s = k / 4, i = k % 4;
            const uint8_t v = tg[QOFF + 32 * (s % 4) + 4 * r + i];
            int q = s < 4 ? v & 15 : v >> 4;
            if constexpr (FIFTH) q |= ((tg[HOFF + 4 * r + i] >> s) & 1) << 4;
            qs[k % 16] |= (uint8_t)((q & 15) << (k < 16 ? 0 : 4));
            qh |= (uint32_t)(q >> 4) << k;
        }
        if constexpr (FIFTH) memcpy(b + FILE_QH, &qh, 4);
    }
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        memset(tg + QOFF, 0, TG - QOFF);
        for (int r = 0; r < 8; r++) {
            memcpy(tg + 2 * r, blocks[r], 2);
            if constexpr (MINS) memcpy(tg + 16 + 2 * r, blocks[r] + 2, 2);
            BBuf u;
            B::block(blocks[r], u, 0);  // the file's quants in k order, unsigned
            const uint8_t *q = u.q;
            for (int k = 0; k < 32; k++) {
                const int s = k / 4, i = k % 4;
                tg[QOFF + 32 * (s % 4) + 4 * r + i] |= (uint8_t)((q[k] & 15) << (s < 4 ? 0 : 4));
                if constexpr (FIFTH) tg[HOFF + 4 * r + i] |= (uint8_t)((q[k] >> 4) << s);
            }
        }
    }
};
typedef R8B32<TQ5_0> R8Q5_0;
typedef R8B32<TQ4_0> R8Q4_0;
typedef R8B32<TQ5_1> R8Q5_1;
typedef R8B32<TQ4_1> R8Q4_1;

#if !defined(__AVX512VNNI__)
// the AVX2 dot of signed weights for x rows 0..mc-1 at once (R8B32::dot_rows' reasons), one
// block: step(s) gives step s's signed bytes (8 rows x 4 k), whose |w| serves every row; per
// row x carries w's sign (R8Q8_0::dot's integers and float operations, the same bits)
template <int MC, class Step>
static inline __attribute__((always_inline)) void signed_dot_rows(Step step, __m256 d,
                                                                  const int8_t *const *q,
                                                                  const float *dx, long mc,
                                                                  __m256 *A) {
    const __m256i one = _mm256_set1_epi16(1);
    __m256i S[MC];
    for (int s = 0; s < 8; s++) {
        const __m256i v = step(s), a = _mm256_abs_epi8(v);
        for (long m = 0; m < mc; m++) {
            const __m256i x = _mm256_sign_epi8(bcast4(q[m] + 4 * s), v);
            const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(a, x), one);
            S[m] = s == 0 ? p : _mm256_add_epi32(S[m], p);
        }
    }
    for (long m = 0; m < mc; m++)
        A[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S[m]), _mm256_mul_ps(d, _mm256_set1_ps(dx[m])),
                               A[m]);
}
#endif

// Q8_0 tile-group, 8 rows x one block of 32 k (8 * 34 bytes): d[8] (fp16), then 8 steps of
// signed quants (step s: byte 4r + i = k 4s + i of row r). maddubs and dpbusd want one
// unsigned operand. AVX2 multiplies |w| by x carrying w's sign (<= 2 * 127 * 127 an int16
// pair, so each step needs its own madd: 16 multiplies a block against Q4_0's 10). VNNI has no
// byte sign for 512 bits; it takes w + 128 (unsigned) and subtracts 128 times x's block sum,
// as Q4_0's offset. The same integer S.
struct R8Q8_0 {
    static constexpr bool MINS = false;
    static constexpr int QK = 32, BYTES = 34, TG = 8 * 34, OFF = 0;
    typedef TQ8_0 Base;
    static inline void steps(const uint8_t *tg, __m256i (&w)[8]) {  // AVX2: w; VNNI: w + 128
        for (int s = 0; s < 8; s++) {
            w[s] = ld(tg + 16 + 32 * s);
#if defined(__AVX512VNNI__)
            w[s] = _mm256_xor_si256(w[s], bytes(-128));
#endif
        }
    }
    static inline __m256 d(const uint8_t *tg) {
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
    }
    static inline __m256 m(const uint8_t *) { return _mm256_setzero_ps(); }
    // one block of one x row (xq: its 32 bytes, sum: their sum, dx: their step) into A
    static inline void dot(const __m256i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m256 d, __m256, __m256 &A) {
#if defined(__AVX512VNNI__)
        __m256i S2[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        const __m256i S =
            _mm256_sub_epi32(_mm256_add_epi32(S2[0], S2[1]), _mm256_set1_epi32(128 * sum));
#else
        (void)sum;
        const __m256i one = _mm256_set1_epi16(1);
        __m256i S = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(w[s]),
                                                   _mm256_sign_epi8(bcast4(xq + 4 * s), w[s]));
            S = _mm256_add_epi32(S, _mm256_madd_epi16(p, one));
        }
#endif
        A = _mm256_fmadd_ps(_mm256_cvtepi32_ps(S), _mm256_mul_ps(d, _mm256_set1_ps(dx)), A);
    }
#if !defined(__AVX512VNNI__)
    // dot for x rows 0..mc-1 at once (R8B32::dot_rows' reasons)
    template <int MC>
    static inline __attribute__((always_inline)) void dot_rows(const uint8_t *tg, __m256 d,
                                                               __m256, const int8_t *const *q,
                                                               const int32_t *,
                                                               const float *dx, long mc,
                                                               __m256 *A) {
        signed_dot_rows<MC>([&](int s) { return ld(tg + 16 + 32 * s); }, d, q, dx, mc, A);
    }
#endif
    static void block(const uint8_t *tg, int r, uint8_t *b) {
        memcpy(b, tg + 2 * r, 2);
        for (int k = 0; k < 32; k++) b[2 + k] = tg[16 + 32 * (k / 4) + 4 * r + k % 4];
    }
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        for (int r = 0; r < 8; r++) {
            memcpy(tg + 2 * r, blocks[r], 2);
            for (int k = 0; k < 32; k++) tg[16 + 32 * (k / 4) + 4 * r + k % 4] = blocks[r][2 + k];
        }
    }
};

// IQ4_NL tile-group: Q4_0's (d[8] fp16, 4 vectors of nibbles: vector t holds step t in the low
// nibbles, step t + 4 in the high ones). One byte shuffle a step turns nibbles into the grid's
// signed values, which multiply as Q8_0's: AVX2 |w| against x carrying w's sign (the table
// lookup and the sign are the cost of a nonlinear grid: Q4_0 multiplies its nibbles as they
// are), VNNI the grid + 128 less 128 times x's block sum
// a nibble vector's low (or high) nibbles through the grid; step s of a block is vector s % 4's
// low nibbles for s < 4, else its high ones
static inline __m256i grid_nibbles(__m256i v4, bool high, __m256i grid) {
    return _mm256_shuffle_epi8(grid, _mm256_and_si256(high ? srl16(v4, 4) : v4, bytes(15)));
}
static inline __m256i grid_step(const uint8_t *nib, int s, __m256i grid) {
    return grid_nibbles(ld(nib + 32 * (s % 4)), s >= 4, grid);
}
static inline void grid_steps(const uint8_t *nib, __m256i (&w)[8]) {  // AVX2: w; VNNI: w + 128
#if defined(__AVX512VNNI__)
    const __m256i grid = iq4_grid(true);
#else
    const __m256i grid = iq4_grid(false);
#endif
    for (int t = 0; t < 4; t++) {  // each vector read once for both its steps
        const __m256i v4 = ld(nib + 32 * t);
        w[t] = grid_nibbles(v4, false, grid), w[t + 4] = grid_nibbles(v4, true, grid);
    }
}
#if !defined(__AVX512VNNI__)
template <int MC>  // signed_dot_rows from one block's nibbles
static inline __attribute__((always_inline)) void grid_dot_rows(const uint8_t *nib, __m256 d,
                                                                const int8_t *const *q,
                                                                const float *dx, long mc,
                                                                __m256 *A) {
    const __m256i grid = iq4_grid(false);
    signed_dot_rows<MC>([&](int s) { return grid_step(nib, s, grid); }, d, q, dx, mc, A);
}
#endif
struct R8IQ4_NL : R8B32<TQ4_0> {  // Q4_0's tiles (block, pack: the same bytes)
    static constexpr int OFF = 0;
    typedef TIQ4_NL Base;
    static inline void steps(const uint8_t *tg, __m256i (&w)[8]) { grid_steps(tg + QOFF, w); }
    static inline void dot(const __m256i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m256 d, __m256 m, __m256 &A) {
        R8Q8_0::dot(w, xq, sum, dx, d, m, A);
    }
#if !defined(__AVX512VNNI__)
    template <int MC>
    static inline __attribute__((always_inline)) void dot_rows(const uint8_t *tg, __m256 d,
                                                               __m256, const int8_t *const *q,
                                                               const int32_t *,
                                                               const float *dx, long mc,
                                                               __m256 *A) {
        grid_dot_rows<MC>(tg + QOFF, d, q, dx, mc, A);
    }
#endif
};

// IQ4_XS tile-group, 8 rows x one group of 256 (8 * 136 bytes): d[8] (fp16); the 64 scales ls
// (row r, block j: i = 8j + r), their low 4 bits in 32 bytes (nibble i / 32 of byte i % 32),
// their top two in 16 (bits 2 (i / 16) of byte i % 16); then block j of the 8 rows as IQ4_NL's
// nibbles (128 bytes at 64 + 128 j). Per group the 8 blocks' scales d (ls - 32) are decoded
// once (lane r), then each block multiplies as IQ4_NL's with that scale for d.
struct R8IQ4_XS {
    static constexpr bool MINS = false;
    static constexpr int QK = 256, BYTES = 136, TG = 8 * 136, OFF = 0;
    typedef TIQ4_XS Base;
    static inline void scales(const uint8_t *tg, __m256 (&dl)[8]) {  // dl[j]: d (ls - 32)
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)tg));
        const __m256i lo = ld(tg + 16), m4 = bytes(15), m2 = bytes(3);
        const __m256i hi = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(tg + 48)));
        __m256i s[2];  // s[h] byte b: ls of i = 32h + b
        for (int h = 0; h < 2; h++) {
            const int a = 4 * h, b = 4 * h + 2;  // bytes 0-15: bits 2 (2h), 16-31: 2 (2h + 1)
            const __m256i top = _mm256_srlv_epi32(hi, _mm256_setr_epi32(a, a, a, a, b, b, b, b));
            s[h] = _mm256_or_si256(_mm256_and_si256(h ? srl16(lo, 4) : lo, m4),
                                   _mm256_slli_epi16(_mm256_and_si256(top, m2), 4));
        }
        for (int j = 0; j < 8; j++) {
            const __m256i v = s[j / 4];
            const __m128i half = j & 2 ? _mm256_extracti128_si256(v, 1) : _mm256_castsi256_si128(v);
            const __m128i ls = j & 1 ? _mm_srli_si128(half, 8) : half;
            const __m256i l = _mm256_sub_epi32(_mm256_cvtepu8_epi32(ls), _mm256_set1_epi32(32));
            dl[j] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(l));
        }
    }
    static inline void steps(const uint8_t *nib, __m256i (&w)[8]) { grid_steps(nib, w); }
    static inline void dot(const __m256i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m256 d, __m256 m, __m256 &A) {
        R8Q8_0::dot(w, xq, sum, dx, d, m, A);
    }
#if !defined(__AVX512VNNI__)
    template <int MC>  // (b_sweeps) nib: block j's nibbles, d: its scales
    static inline __attribute__((always_inline)) void dot_rows(const uint8_t *nib, __m256 d,
                                                               __m256, const int8_t *const *q,
                                                               const int32_t *,
                                                               const float *dx, long mc,
                                                               __m256 *A) {
        grid_dot_rows<MC>(nib, d, q, dx, mc, A);
    }
#endif
    static int ls_at(const uint8_t *tg, int i) {
        return (tg[16 + i % 32] >> 4 * (i / 32) & 15) | (tg[48 + i % 16] >> 2 * (i / 16) & 3) << 4;
    }
    // where k of block j of row r sits: its byte in the tile-group, and that byte's nibble
    static int nib_byte(int r, int j, int k) {
        return 64 + 128 * j + 32 * (k / 4 % 4) + 4 * r + k % 4;
    }
    static int nib_shift(int k) { return k < 16 ? 0 : 4; }  // steps 0-3 low, 4-7 high
    static void block(const uint8_t *tg, int r, uint8_t *b) {  // row r's block of the file
        memset(b, 0, BYTES);
        memcpy(b, tg + 2 * r, 2);
        for (int j = 0; j < 8; j++) {
            const int ls = ls_at(tg, 8 * j + r);
            b[4 + j / 2] |= (uint8_t)((ls & 15) << 4 * (j % 2));
            b[2 + j / 4] |= (uint8_t)((ls >> 4) << 2 * (j % 4));
            for (int k = 0; k < 32; k++) {
                const int q = tg[nib_byte(r, j, k)] >> nib_shift(k) & 15;
                b[8 + 16 * j + k % 16] |= (uint8_t)(q << nib_shift(k));
            }
        }
    }
    static void pack(const uint8_t *const *blocks, uint8_t *tg) {
        memset(tg + 16, 0, TG - 16);
        for (int r = 0; r < 8; r++) {
            const uint8_t *b = blocks[r];
            memcpy(tg + 2 * r, b, 2);
            for (int j = 0; j < 8; j++) {
                const int ls = TIQ4_XS::ls(b, j), i = 8 * j + r;
                tg[16 + i % 32] |= (uint8_t)((ls & 15) << 4 * (i / 32));
                tg[48 + i % 16] |= (uint8_t)((ls >> 4) << 2 * (i / 16));
                for (int k = 0; k < 32; k++) {
                    const int q = b[8 + 16 * j + k % 16] >> nib_shift(k) & 15;
                    tg[nib_byte(r, j, k)] |= (uint8_t)(q << nib_shift(k));
                }
            }
        }
    }
};
template <>
constexpr bool X32<R8IQ4_XS> = true;

template <class T>
constexpr bool TILED = false;
template <>
constexpr bool TILED<R8Q5_0> = true;
template <>
constexpr bool TILED<R8Q4_0> = true;
template <>
constexpr bool TILED<R8Q5_1> = true;
template <>
constexpr bool TILED<R8Q4_1> = true;
template <>
constexpr bool TILED<R8Q8_0> = true;
template <>
constexpr bool TILED<R8IQ4_NL> = true;
template <>
constexpr bool TILED<R8IQ4_XS> = true;
template <>
constexpr bool TILED<R8Q4_K> = true;
template <>
constexpr bool TILED<R8Q2_K> = true;
template <>
constexpr bool TILED<R8Q3_K> = true;
template <>
constexpr bool TILED<R8Q5_K> = true;
template <>
constexpr bool TILED<R8Q6_K> = true;

// How far ahead of the loads the tile loops prefetch their stream. One x row (a decode step)
// is bound by memory: on the Zen 2 (AVX2 build, 2 MB pages, 2 threads) a 1-row product from
// memory streamed 27-28 GB/s at two K-quant tile-groups (2.3-3.4 KB) or twelve 32-block ones
// (1.7 KB) ahead, 30-33 GB/s at 1152 bytes (0.96-1.34 KB alike; 1.5 KB as before): Q4_0
// +17%, Q5_0 +22%, Q4_K and Q6_K +6-10%; the default pair's 1-token passes -6%. Sparser
// prefetches (one line in two or four) ran 30-45% slower. More x rows are bound by their
// multiplies and keep the longer distances (2 rows at 1.2 KB: -1 to -4%). The AVX-512 builds
// keep theirs, measured on their own machines.
#if defined(__AVX512F__)
constexpr long AHEAD_ONE_ROW = 0;  // 0: as many rows
#else
constexpr long AHEAD_ONE_ROW = 1152;
#endif
template <int MC>
static inline long ahead_bytes(long many) {
    return MC == 1 && AHEAD_ONE_ROW ? AHEAD_ONE_ROW : many;
}

// one vector store a row: through a stack copy and 8-16 scalar stores a row, a 5-token pass
// filled the store buffer whenever the output's lines sat in the other core's cache (the MLP's
// gate|up output, read by the activation between passes): those products ~5% slower
static inline void store_tile(const Job &j, __m256 y8, long m, long n0) {
    if (j.bias) y8 = _mm256_add_ps(y8, _mm256_loadu_ps(j.bias + n0));
    _mm256_storeu_ps(j.y + m * j.ldy + n0 - j.y0, y8);
}

// x row m0 + m's quants and block factors (m < mc), set once per tile
template <int MC>
struct XPtrs {
    const int8_t *q[MC];
    const float *e[MC];
    const int16_t *s[MC];
    XPtrs(const XRows &x, long m0, long mc) {
        for (long m = 0; m < mc; m++) {
            q[m] = x.q + (m0 + m) * x.KP;
            e[m] = x.ef + (m0 + m) * (x.KP / 32);
            s[m] = x.s16 + (m0 + m) * (x.KP / 16);
        }
    }
};

// x rows m0 .. m0 + mc - 1 of one tile (mc <= MC). Inlined with mc = MC (``exact_rows``), the
// x-row loops unroll and every row's sums stay in registers (with a runtime count they lived
// on the stack: a load and a store per block and x row)
template <class T, int MC>
static inline __attribute__((always_inline)) void tile_rows(const Job &j, const uint8_t *tile,
                                                            long n0, long m0, long mc) {
    const XRows &x = *j.x;
    __m256 A[MC], B[MC];
    for (long m = 0; m < mc; m++) A[m] = B[m] = _mm256_setzero_ps();
    const XPtrs<MC> p(x, m0, mc);
    R8Group u;
    for (long g = 0; g < j.groups; g++) {
        const uint8_t *tg = tile + g * T::TG;
        // the stream two groups on (one x row: ahead_bytes), a block's share at a time: a
        // burst of the group's 18-27 prefetches at once stalls the loads (one token's Q6_K
        // head: 10.8 -> 7.7 ms)
        const char *ahead = (const char *)(tg + ahead_bytes<MC>(2 * T::TG));
        constexpr long PF = (T::TG + 8 * 64 - 1) / (8 * 64) * 64;  // bytes per block
        T::head(tg, u);
        __m256 Ts[MC];  // per x row: the blocks' scaled sums (the mins' come after)
        for (long m = 0; m < mc; m++) Ts[m] = _mm256_setzero_ps();
        for (int jb = 0; jb < 8; jb++) {
            __m256i w[8];
            for (long b = jb * PF; b < (jb + 1) * PF && b < T::TG; b += 64)
                _mm_prefetch(ahead + b, _MM_HINT_T0);
            const long oq = g * G + 32 * jb;
#if !defined(__AVX512VNNI__)
            if (MC > 1) {  // (one row: dot's order is already this)
                const int8_t *q[MC];
                const float *ef[MC];
                const int16_t *s16[MC];
                for (long m = 0; m < mc; m++)
                    q[m] = p.q[m] + oq, ef[m] = p.e[m] + g * 8, s16[m] = p.s[m] + g * 16;
                constexpr int S = T::SWEEP;
                if constexpr (MC <= S) {
                    T::template dot_rows<MC>(u, tg, jb, q, ef, s16, mc, Ts);
                    continue;
                } else if constexpr (MC <= 2 * S) {  // two sweeps, sizes known: loops unroll
                    T::template dot_rows<S>(u, tg, jb, q, ef, s16, S, Ts);
                    T::template dot_rows<MC - S>(u, tg, jb, q + S, ef + S, s16 + S, MC - S, Ts + S);
                    continue;
                }
            }
#endif
            T::steps(tg, jb, w);
            for (long m = 0; m < mc; m++)
                T::dot(u, w, p.q[m] + oq, p.e[m] + g * 8, p.s[m] + g * 16, jb, Ts[m]);
        }
        for (long m = 0; m < mc; m++) {
            const __m256 base = _mm256_set1_ps(x.dx[(m0 + m) * (x.KP / G) + g]);
            A[m] = _mm256_fmadd_ps(Ts[m], _mm256_mul_ps(u.d, base), A[m]);
            if constexpr (T::MINS) {  // the mins' sums, block by block, in a register
                const __m256 U = T::mins(u, x, m0 + m, g);
                B[m] = _mm256_fnmadd_ps(U, _mm256_mul_ps(u.dmin, base), B[m]);
            }
        }
    }
    for (long m = 0; m < mc; m++) store_tile(j, _mm256_add_ps(A[m], B[m]), m0 + m, n0);
}

#if !defined(__AVX512VNNI__)
// dot_rows for x rows FROM..MC-1 of a 32-block tile, at most 4 at a time (more rows' sums
// than 4 spill from AVX2's 16 registers), in sweeps of even sizes: 5 rows as 3 + 2. Each sweep
// decodes the block's steps again from L1: against row by row with all 8 steps held, 5-9
// rows ~5% faster, 16 (four sweeps) up to 38% slower (Q5_0's fifth bits), so up to 8 rows.
template <class T, int MC, int FROM = 0>
static inline __attribute__((always_inline)) void b_sweeps(const uint8_t *tg, __m256 d,
                                                           __m256 mv, const int8_t *const *q,
                                                           const int32_t *sum, const float *dx,
                                                           __m256 *A) {
    constexpr int LEFT = MC - FROM, SWEEPS = (LEFT + 3) / 4, N = (LEFT + SWEEPS - 1) / SWEEPS;
    T::template dot_rows<N>(tg, d, mv, q + FROM, sum + FROM, dx + FROM, N, A + FROM);
    if constexpr (FROM + N < MC) b_sweeps<T, MC, FROM + N>(tg, d, mv, q, sum, dx, A);
}
#endif

// block b (32 k) of a tile's 8 rows, its steps at blk and scales d (m: Q4_1/Q5_1's), for x
// rows m0..m0+mc-1, into A
template <class T, int MC>
static inline __attribute__((always_inline)) void tile_block(const XRows &x, const uint8_t *blk,
                                                             long b, __m256 d, __m256 mv,
                                                             long m0, long mc, __m256 *A) {
#if !defined(__AVX512VNNI__)
    if (MC > 1 && MC <= 8 && mc == MC) {
        const int8_t *q[MC];
        int32_t sum[MC];
        float dx[MC];
        for (long m = 0; m < MC; m++) {
            const long r = m0 + m, xb = r * (x.KP / 32) + b;
            q[m] = x.q + r * x.KP + 32 * b, sum[m] = x.s32[xb], dx[m] = x.dx[xb];
        }
        b_sweeps<T, MC>(blk, d, mv, q, sum, dx, A);
        return;
    }
#endif
    __m256i w[8];
    T::steps(blk, w);
    for (long m = 0; m < mc; m++) {
        const long r = m0 + m, xb = r * (x.KP / 32) + b;
        T::dot(w, x.q + r * x.KP + 32 * b, x.s32[xb], x.dx[xb], d, mv, A[m]);
    }
}

// the same for tiles of 32-blocks (Q4_0-Q5_1): block b of the 8 rows is tile-group b; each
// block's product is scaled (d * dx) and added on its own, as the file layout's
template <class T, int MC>
static inline __attribute__((always_inline)) void tile_rows_b(const Job &j, const uint8_t *tile,
                                                              long n0, long m0, long mc) {
    const long nb = j.K / T::QK;
    __m256 A[MC];
    for (long m = 0; m < mc; m++) A[m] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *tg = tile + b * T::TG;
        const char *ahead = (const char *)(tg + ahead_bytes<MC>(12 * T::TG));  // ~2 KB on
        for (int l = 0; l < T::TG; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
        const __m256 d = T::d(tg), mv = T::MINS ? T::m(tg) : d;
        tile_block<T, MC>(*j.x, tg, b, d, mv, m0, mc, A);
    }
    for (long m = 0; m < mc; m++) store_tile(j, A[m], m0 + m, n0);
}

// the same for IQ4_XS's tiles: per group its 8 blocks' scales d (ls - 32), once, then each
// block as an IQ4_NL tile-group with those scales for d
template <class T, int MC>
static inline __attribute__((always_inline)) void tile_rows_xs(const Job &j, const uint8_t *tile,
                                                               long n0, long m0, long mc) {
    __m256 A[MC];
    for (long m = 0; m < mc; m++) A[m] = _mm256_setzero_ps();
    for (long g = 0; g < j.groups; g++) {
        const uint8_t *tg = tile + g * T::TG;
        __m256 dl[8];
        T::scales(tg, dl);
        for (int jb = 0; jb < 8; jb++) {
            // an eighth of a tile-group at a time, 12 eighths on (as tile_rows_b's distance;
            // for one x row too: at ahead_bytes' 1.2 KB, -4%): the whole group at once, 2
            // groups on, ran the 1-token pass 40% slower
            const char *ahead = (const char *)(tg + (12 + jb) * (T::TG / 8));
            for (int l = 0; l < T::TG / 8; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
            tile_block<T, MC>(*j.x, tg + 64 + 128 * jb, 8 * g + jb, dl[jb], dl[jb], m0, mc, A);
        }
    }
    for (long m = 0; m < mc; m++) store_tile(j, A[m], m0 + m, n0);
}

template <class T, int MC>  // T's tiles: 32-blocks or K-quant groups
static inline __attribute__((always_inline)) void tile_any(const Job &j, const uint8_t *tile,
                                                           long n0, long m0, long mc) {
    if constexpr (X32<T>)  // IQ4_XS
        tile_rows_xs<T, MC>(j, tile, n0, m0, mc);
    else if constexpr (T::QK == 32)
        tile_rows_b<T, MC>(j, tile, n0, m0, mc);
    else
        tile_rows<T, MC>(j, tile, n0, m0, mc);
}
template <class T>
static __attribute__((noinline)) void tile_loop(const Job &j, const uint8_t *tile, long n0,
                                                long m0, long mc) {
    tile_any<T, 16>(j, tile, n0, m0, mc);  // mc unknown here: the loops stay loops
}

// exactly M x rows, each count its own kernel with its loops unrolled. (With AVX2's 16 vector
// registers past 8 rows the sums spill, yet a runtime count is slower still: GCC had been
// cloning the runtime-count kernel for each constant count; once the unit grew it stopped,
// and a 9-row Q4_K product took 1.5x as long.)
constexpr int EXACT_ROWS = 16;
template <class T, int M>
static void exact_rows(const Job &j, const uint8_t *tile, long n0, long m0) {
    if constexpr (M <= EXACT_ROWS)
        tile_any<T, M>(j, tile, n0, m0, M);
    else
        tile_loop<T>(j, tile, n0, m0, M);
}
typedef void (*TileFn)(const Job &, const uint8_t *, long, long);
template <class T, int... I>
static constexpr std::array<TileFn, sizeof...(I)> tile_table(std::integer_sequence<int, I...>) {
    return {exact_rows<T, I + 1>...};
}

// one tile (weight rows n0..n0+7) for every x row of the pass, 16 x rows at a time
template <class T>
static void rows_r8(const Job &j, long n0, long) {
    static constexpr auto fns = tile_table<T>(std::make_integer_sequence<int, 16>{});
    const uint8_t *tile = j.w + n0 * j.rb;  // 8 rows' bytes, group by group
    for (long m0 = 0; m0 < j.x->M; m0 += 16)
        fns[(j.x->M - m0 < 16 ? j.x->M - m0 : 16) - 1](j, tile, n0, m0);
}

#if defined(__AVX512VNNI__)
// ---- two tiles at once (AVX-512 with VNNI): 16 weight rows per instruction ------------------
// A Zen 4 splits a 512-bit instruction into two 256-bit halves, so the multipliers' rate is
// the same; but a pair of tiles (weight rows n0..n0+15, adjacent in memory) takes half the
// instructions of two 8-row tiles, and with ymm the x-row loop issued ~8 cycles per block and
// x row for the 4 its 8 dpbusd need: the front end, not the multipliers, set the pace (a
// synthetic loop: 5-8 cycles with ymm, 4.3-4.5 with zmm at 5-16 x rows). Lane r < 8 is tile
// a's weight row r, lane 8 + r tile b's; each lane does the 8-row kernel's arithmetic in its
// order, so the bits are the same (tested). Measured on the default target (Zen 4, 2 threads,
// the two kernels taking turns): a 5-token pass 45-49 -> 39-43 ms, 9 tokens -14%; a 1-token
// pass was 3-5% slower until the heads were decoded 16 lanes wide (two 8-row heads joined lane
// by lane had cost ~40% of a pair-group's instructions at one x row): then 14.6 -> 13.4 ms
// against the 8-row kernels, and a 5-token pass 36.2 -> 24.7 ms (a fast memory phase).
static inline __m512i cat(__m256i a, __m256i b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1);
}
static inline __m512 cat(__m256 a, __m256 b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(a), b, 1);
}
static inline __m256i cat(const uint8_t *a, const uint8_t *b) {  // 16 bytes at a, 16 at b
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}
static inline void dp_bcast(__m512i &S, __m512i w, const int8_t *p) {
#if defined(SPECDEC_EMULATED)
    int32_t v;
    memcpy(&v, p, 4);
    S = _mm512_dpbusd_epi32(S, w, _mm512_set1_epi32(v));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(S) : "v"(w), "m"(*(const int32_t *)p));
#endif
}
static inline void store_pair(const Job &j, __m512 y16, long m, long n0) {  // as store_tile
    if (j.bias) y16 = _mm512_add_ps(y16, _mm512_loadu_ps(j.bias + n0));
    _mm512_storeu_ps(j.y + m * j.ldy + n0 - j.y0, y16);
}
struct R16Group {  // R8Group's fields a type reads, tile a's lanes then tile b's
    __m512 d, dmin, scf[8], mn[8];
    __m512i sc32[16], sc2[8];
};
template <class T>
struct Pair;
template <>
struct Pair<R8Q4_K> {
    // the tile-group's bytes in the order the kernel reads them: the head, then the 32 step
    // vectors one by one, so that a's and b's step sit side by side and one 512-bit load holds
    // both (no insert: a cache-resident 1-row product -9%, from memory -4%). (Q6_K keeps
    // 128-byte segments: its 2 x 144-byte head would leave every such load across two lines.)
    static constexpr int SEGS = 33;
    static constexpr auto SEG = [] {
        std::array<std::array<int, 2>, SEGS> seg{};
        seg[0] = {0, 128};
        for (int i = 1; i < SEGS; i++) seg[i] = {128 + 32 * (i - 1), 32};
        return seg;
    }();
    // R8Q4_K::head's steps on both heads at once (a's bytes 0..127, b's 128..255): the rows'
    // scale bytes transposed in 512-bit registers, not two 256-bit heads joined lane by lane
    static void head(const uint8_t *pg, R16Group &u) {
        u.d = _mm512_cvtph_ps(cat(pg, pg + 128));
        u.dmin = _mm512_cvtph_ps(cat(pg + 16, pg + 144));
        const __m512i a0 = cat(ld(pg + 32), ld(pg + 160)), a1 = cat(ld(pg + 64), ld(pg + 192)),
                      a2 = cat(ld(pg + 96), ld(pg + 224));
        const __m512i m6 = _mm512_set1_epi32(0x3f3f3f3f), m4 = _mm512_set1_epi32(0x0f0f0f0f);
        const __m512i top = _mm512_set1_epi32(0x30303030);
        const __m512i v[4] = {
            _mm512_and_si512(a0, m6),
            _mm512_or_si512(_mm512_and_si512(a2, m4),
                            _mm512_and_si512(_mm512_srli_epi32(a0, 2), top)),
            _mm512_and_si512(a1, m6),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(a2, 4), m4),
                            _mm512_and_si512(_mm512_srli_epi32(a1, 2), top)),
        };
        // per 128-bit lane (4 rows: a 0-3, a 4-7, b 0-3, b 4-7): bytes by block, then the
        // lanes' dwords transposed: lane q = block q's byte of the 16 rows, in row order
        const __m512i tr = _mm512_broadcast_i32x4(
            _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
        const __m512i lanes =
            _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        for (int h = 0; h < 4; h++) {
            alignas(64) uint8_t t[64];
            _mm512_store_si512(t, _mm512_permutexvar_epi32(lanes, _mm512_shuffle_epi8(v[h], tr)));
            for (int q = 0; q < 4; q++) {
                const __m512 f = _mm512_cvtepi32_ps(
                    _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(t + 16 * q))));
                (h < 2 ? u.scf : u.mn)[4 * (h & 1) + q] = f;
            }
        }
    }
    static inline void steps(const uint8_t *pg, int j, __m512i (&w)[8]) {
        const __m512i low4 = _mm512_set1_epi8(15);
        for (int t = 0; t < 4; t++) {
            const __m512i v4 = _mm512_loadu_si512(pg + 256 + 256 * j + 64 * t);
            w[t] = _mm512_and_si512(v4, low4);
            w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v4, 4), low4);
        }
    }
    static inline void dot(const R16Group &u, const __m512i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *, int j, __m512 &T) {
        __m512i S2[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        const __m512i S = _mm512_add_epi32(S2[0], S2[1]);
        const __m512 Ss = _mm512_mul_ps(_mm512_cvtepi32_ps(S), u.scf[j]);
        T = _mm512_fmadd_ps(Ss, _mm512_set1_ps(ef[j]), T);
    }
};
template <>
struct Pair<R8Q6_K> {
    static constexpr int SEGS = 17;  // head; then per block j: low 4 bits, top 2 bits
    static constexpr auto SEG = [] {  // the tile-group's own order, in these pieces
        std::array<std::array<int, 2>, SEGS> seg{};
        seg[0] = {0, 144};
        for (int j = 0; j < 8; j++) {
            seg[1 + 2 * j] = {R8Q6_K::lo(j), 128};
            seg[2 + 2 * j] = {R8Q6_K::hi(j), 64};
        }
        return seg;
    }();
    // R8Q6_K::head on both heads at once (a's bytes 0..143, b's 144..287), 16 lanes wide
    static void head(const uint8_t *pg, R16Group &u) {
        u.d = u.dmin = _mm512_cvtph_ps(cat(pg, pg + 144));
        const uint8_t *sa = pg + 16, *sb = pg + 160;  // [sub-block i][row] int8 scales
        for (int j = 0; j < 8; j++) {  // sub-blocks 2j, 2j + 1: 8 bytes each, a's then b's
            const __m128i a = _mm_loadu_si128((const __m128i *)(sa + 16 * j));
            const __m128i b = _mm_loadu_si128((const __m128i *)(sb + 16 * j));
            u.sc32[2 * j] = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(a, b));
            u.sc32[2 * j + 1] = _mm512_cvtepi8_epi32(_mm_unpackhi_epi64(a, b));
            const __m256i ab = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
            u.sc2[j] = _mm512_cvtepi8_epi16(_mm256_unpacklo_epi8(ab, _mm256_bsrli_epi128(ab, 8)));
        }
    }
    static inline void steps(const uint8_t *pg, int j, __m512i (&w)[8]) {
        const __m512i low4 = _mm512_set1_epi8(15), b45 = _mm512_set1_epi8(0x30);
        const uint8_t *blk = pg + 288 + 384 * j, *ah = blk + 256;  // a's ql, b's, a's qh, b's
        const __m512i h0 = cat(ld(ah), ld(ah + 64)), h1 = cat(ld(ah + 32), ld(ah + 96));
        const __m512i hs0[4] = {_mm512_slli_epi16(h0, 4), _mm512_slli_epi16(h0, 2), h0,
                                _mm512_srli_epi16(h0, 2)};
        const __m512i hs1[4] = {_mm512_slli_epi16(h1, 4), _mm512_slli_epi16(h1, 2), h1,
                                _mm512_srli_epi16(h1, 2)};
        for (int t = 0; t < 4; t++) {
            const __m512i v4 = cat(ld(blk + 32 * t), ld(blk + 128 + 32 * t));
            w[t] = _mm512_or_si512(_mm512_and_si512(v4, low4), _mm512_and_si512(hs0[t], b45));
            w[t + 4] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v4, 4), low4),
                                       _mm512_and_si512(hs1[t], b45));
        }
    }
    static inline void dot(const R16Group &u, const __m512i (&w)[8], const int8_t *xq,
                           const float *ef, const int16_t *s16, int j, __m512 &T) {
        __m512i S0 = _mm512_setzero_si512(), S1 = _mm512_setzero_si512();
        for (int s = 0; s < 4; s++) {
            dp_bcast(S0, w[s], xq + 4 * s);
            dp_bcast(S1, w[s + 4], xq + 16 + 4 * s);
        }
        __m512i S = _mm512_add_epi32(_mm512_mullo_epi32(S0, u.sc32[2 * j]),
                                     _mm512_mullo_epi32(S1, u.sc32[2 * j + 1]));
        int32_t pair;
        memcpy(&pair, s16 + 2 * j, 4);
        const __m512i O = _mm512_madd_epi16(u.sc2[j], _mm512_set1_epi32(pair));
        S = _mm512_sub_epi32(S, _mm512_slli_epi32(O, 5));
        T = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_set1_ps(ef[j]), T);
    }
};
template <class B>
struct Pair<R8B32<B>> {  // a pair-group is block b of both tiles: 16 weight rows x 32 k
    typedef R8B32<B> T;
    // d, Q4_1/Q5_1's m, the low 4 bits, Q5_0/Q5_1's fifth bits: a's segment, then b's
    static constexpr int SEGS = 2 + T::MINS + T::FIFTH;
    static constexpr auto SEG = [] {
        std::array<std::array<int, 2>, 4> seg{};
        int i = 0;
        seg[i++] = {0, 16};
        if (T::MINS) seg[i++] = {16, 16};
        seg[i++] = {T::QOFF, 128};
        if (T::FIFTH) seg[i++] = {T::HOFF, 32};
        return seg;
    }();
    static constexpr int PQ = T::MINS ? 64 : 32, PH = PQ + 256;  // in the pair-group
    static inline void steps(const uint8_t *pg, __m512i (&w)[8]) {
        const __m512i low4 = _mm512_set1_epi8(15);
        for (int t = 0; t < 4; t++) {
            const __m512i v4 = cat(ld(pg + PQ + 32 * t), ld(pg + PQ + 128 + 32 * t));
            w[t] = _mm512_and_si512(v4, low4);
            w[t + 4] = _mm512_and_si512(_mm512_srli_epi16(v4, 4), low4);
        }
        if constexpr (T::FIFTH) {
            const __m512i b4 = _mm512_set1_epi8(16), h = cat(ld(pg + PH), ld(pg + PH + 32));
            const __m512i hs[8] = {_mm512_slli_epi16(h, 4), _mm512_slli_epi16(h, 3),
                                   _mm512_slli_epi16(h, 2), _mm512_slli_epi16(h, 1),
                                   h,                       _mm512_srli_epi16(h, 1),
                                   _mm512_srli_epi16(h, 2), _mm512_srli_epi16(h, 3)};
            for (int s = 0; s < 8; s++) w[s] = _mm512_or_si512(w[s], _mm512_and_si512(hs[s], b4));
        }
    }
    static inline __m512 d(const uint8_t *pg) { return _mm512_cvtph_ps(cat(pg, pg + 16)); }
    static inline __m512 m(const uint8_t *pg) { return _mm512_cvtph_ps(cat(pg + 32, pg + 48)); }
    static inline void dot(const __m512i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m512 d, __m512 m, __m512 &A) {
        __m512i S2[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        __m512i S = _mm512_add_epi32(S2[0], S2[1]);
        if constexpr (T::OFF != 0) S = _mm512_sub_epi32(S, _mm512_set1_epi32(T::OFF * sum));
        A = T::mins(_mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, _mm512_set1_ps(dx)), A),
                    m, sum, dx);
    }
};
template <>
struct Pair<R8Q8_0> {  // a pair-group is block b of both tiles: d a, d b, steps a, steps b
    static constexpr int SEGS = 2;
    static constexpr int SEG[2][2] = {{0, 16}, {16, 256}};
    static inline void steps(const uint8_t *pg, __m512i (&w)[8]) {  // w + 128, as R8Q8_0's
        for (int s = 0; s < 8; s++)
            w[s] = _mm512_xor_si512(cat(ld(pg + 32 + 32 * s), ld(pg + 288 + 32 * s)),
                                    _mm512_set1_epi8(-128));
    }
    static inline __m512 d(const uint8_t *pg) { return _mm512_cvtph_ps(cat(pg, pg + 16)); }
    static inline __m512 m(const uint8_t *) { return _mm512_setzero_ps(); }
    static inline void dot(const __m512i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m512 d, __m512, __m512 &A) {
        __m512i S2[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        for (int s = 0; s < 8; s++) dp_bcast(S2[s & 1], w[s], xq + 4 * s);
        const __m512i S =
            _mm512_sub_epi32(_mm512_add_epi32(S2[0], S2[1]), _mm512_set1_epi32(128 * sum));
        A = _mm512_fmadd_ps(_mm512_cvtepi32_ps(S), _mm512_mul_ps(d, _mm512_set1_ps(dx)), A);
    }
};
template <>
struct Pair<R8IQ4_NL> : Pair<R8B32<TQ4_0>> {  // Q4_0's pair-groups, the steps through the grid
    static inline void steps(const uint8_t *pg, __m512i (&w)[8]) {  // w + 128, as R8IQ4_NL's
        Pair<R8B32<TQ4_0>>::steps(pg, w);
        const __m512i grid = _mm512_broadcast_i32x4(iq4_grid128(true));
        for (int s = 0; s < 8; s++) w[s] = _mm512_shuffle_epi8(grid, w[s]);
    }
    static inline void dot(const __m512i (&w)[8], const int8_t *xq, int32_t sum, float dx,
                           __m512 d, __m512 m, __m512 &A) {
        Pair<R8Q8_0>::dot(w, xq, sum, dx, d, m, A);
    }
};
template <class T>
constexpr bool PAIRS = false;
template <>
constexpr bool PAIRS<R8IQ4_NL> = true;
template <>
constexpr bool PAIRS<R8Q4_K> = true;
template <>
constexpr bool PAIRS<R8Q5_0> = true;
template <>
constexpr bool PAIRS<R8Q4_0> = true;
template <>
constexpr bool PAIRS<R8Q5_1> = true;
template <>
constexpr bool PAIRS<R8Q4_1> = true;
template <>
constexpr bool PAIRS<R8Q8_0> = true;
template <>
constexpr bool PAIRS<R8Q6_K> = true;

// tile_rows for the tile pair at weight rows n0..n0+15 (tile_rows' steps, two tiles wide)
template <class T, int MC>
static inline __attribute__((always_inline)) void pair_rows(const Job &j, const uint8_t *ta,
                                                            long n0, long m0, long mc) {
    const XRows &x = *j.x;
    __m512 A[MC], B[MC];
    for (long m = 0; m < mc; m++) A[m] = B[m] = _mm512_setzero_ps();
    const XPtrs<MC> p(x, m0, mc);
    R16Group u;
    for (long g = 0; g < j.groups; g++) {
        const uint8_t *pg = ta + 2 * g * T::TG;  // the pair's group g (pair_group)
        // how far ahead to fetch: for one x row, the 8-row kernel's distance (2304 bytes) into
        // L1; for more, 1.5 pair-groups into L2 (a Q6_K 5-row pass from memory, against
        // L1 at 1 pair-group -17%; the model's 5-token pass measured best of the distances tried)
        const char *ahead = (const char *)(pg + (MC == 1 ? 2 : 3) * T::TG);
        constexpr long PF = (2 * T::TG + 8 * 64 - 1) / (8 * 64) * 64;
        Pair<T>::head(pg, u);
        __m512 Ts[MC];
        for (long m = 0; m < mc; m++) Ts[m] = _mm512_setzero_ps();
        for (int jb = 0; jb < 8; jb++) {
            __m512i w[8];
            for (long b = jb * PF; b < (jb + 1) * PF && b < 2 * T::TG; b += 64)
                _mm_prefetch(ahead + b, MC == 1 ? _MM_HINT_T0 : _MM_HINT_T1);
            Pair<T>::steps(pg, jb, w);
            const long oq = g * G + 32 * jb;
            for (long m = 0; m < mc; m++)
                Pair<T>::dot(u, w, p.q[m] + oq, p.e[m] + g * 8, p.s[m] + g * 16, jb, Ts[m]);
        }
        for (long m = 0; m < mc; m++) {
            const __m512 base = _mm512_set1_ps(x.dx[(m0 + m) * (x.KP / G) + g]);
            A[m] = _mm512_fmadd_ps(Ts[m], _mm512_mul_ps(u.d, base), A[m]);
            if constexpr (T::MINS) {
                const float *es = x.es + (m0 + m) * (x.KP / 32) + g * 8;
                __m512 U = _mm512_setzero_ps();
                for (int jb = 0; jb < 8; jb++)
                    U = _mm512_fmadd_ps(u.mn[jb], _mm512_set1_ps(es[jb]), U);
                B[m] = _mm512_fnmadd_ps(U, _mm512_mul_ps(u.dmin, base), B[m]);
            }
        }
    }
    for (long m = 0; m < mc; m++) store_pair(j, _mm512_add_ps(A[m], B[m]), m0 + m, n0);
}
// tile_rows_b for a pair of 32-block tiles (Q4_0-Q5_1): pair-group b is block b of both
template <class T, int MC>
static inline __attribute__((always_inline)) void pair_rows_b(const Job &j, const uint8_t *ta,
                                                              long n0, long m0, long mc) {
    const XRows &x = *j.x;
    const long nb = j.K / T::QK;
    __m512 A[MC];
    for (long m = 0; m < mc; m++) A[m] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++) {
        const uint8_t *pg = ta + 2 * b * T::TG;
        const char *ahead = (const char *)(pg + 12 * T::TG);  // as tile_rows_b, in bytes
        for (int l = 0; l < 2 * T::TG; l += 64) _mm_prefetch(ahead + l, _MM_HINT_T0);
        __m512i w[8];
        Pair<T>::steps(pg, w);
        const __m512 d = Pair<T>::d(pg), mv = T::MINS ? Pair<T>::m(pg) : d;
        for (long m = 0; m < mc; m++) {
            const long r = m0 + m, xb = r * (x.KP / 32) + b;
            Pair<T>::dot(w, x.q + r * x.KP + 32 * b, x.s32[xb], x.dx[xb], d, mv, A[m]);
        }
    }
    for (long m = 0; m < mc; m++) store_pair(j, A[m], m0 + m, n0);
}
template <class T, int M>
static void exact_pair_rows(const Job &j, const uint8_t *ta, long n0, long m0) {
    if constexpr (T::QK == 32)
        pair_rows_b<T, M>(j, ta, n0, m0, M);
    else
        pair_rows<T, M>(j, ta, n0, m0, M);
}
template <class T, int... I>
static constexpr std::array<TileFn, sizeof...(I)> pair_table(std::integer_sequence<int, I...>) {
    return {exact_pair_rows<T, I + 1>...};
}
// weight rows n0..n1 (16, or a last 8): a tile pair, or one tile, for every x row of the pass
template <class T>
static void rows_r16(const Job &j, long n0, long n1) {
    if (n1 - n0 < 16) return rows_r8<T>(j, n0, n1);
    static constexpr auto fns = pair_table<T>(std::make_integer_sequence<int, 16>{});
    const uint8_t *ta = j.w + n0 * j.rb;
    for (long m0 = 0; m0 < j.x->M; m0 += 16)
        fns[(j.x->M - m0 < 16 ? j.x->M - m0 : 16) - 1](j, ta, n0, m0);
}
#else
template <class T>
constexpr bool PAIRS = false;
template <class T>
struct Pair;
template <class T>
static void rows_r16(const Job &, long, long);  // never called: no pairs in this build
#endif

// With pairs (the VNNI build) the two tiles of each full pair, weight rows 16p..16p+15, are
// stored as one stream: pair-group g holds both tiles' group g, segment by segment in the
// order the kernel reads them (Pair<T>::SEG: a's segment, then b's). Two tiles read side by
// side from their own places halved a core's bandwidth from memory. A last unpaired tile
// keeps the 8-row form. Returns tile-group g of the tile holding weight row n (in scratch
// when it lies in a pair).
template <class T>
static inline const uint8_t *tile_group(const uint8_t *w, long n, long g, long rb, long N,
                                        uint8_t *scratch) {
    const long t = n / 8;
    if constexpr (PAIRS<T>) {
        if (t / 2 < N / 16) {
            const uint8_t *pg = w + t / 2 * 16 * rb + 2 * g * T::TG;
            for (int s = 0, at = 0; s < Pair<T>::SEGS; at += 2 * Pair<T>::SEG[s][1], s++)
                memcpy(scratch + Pair<T>::SEG[s][0], pg + at + t % 2 * Pair<T>::SEG[s][1],
                       Pair<T>::SEG[s][1]);
            return scratch;
        }
    }
    return w + t * 8 * rb + g * T::TG;
}
// the pair-group of tile-groups a and b
template <class T>
static void pair_group(const uint8_t *a, const uint8_t *b, uint8_t *pg) {
    if constexpr (PAIRS<T>) {
        for (int s = 0, at = 0; s < Pair<T>::SEGS; at += 2 * Pair<T>::SEG[s][1], s++) {
            memcpy(pg + at, a + Pair<T>::SEG[s][0], Pair<T>::SEG[s][1]);
            memcpy(pg + at + Pair<T>::SEG[s][1], b + Pair<T>::SEG[s][0], Pair<T>::SEG[s][1]);
        }
    }
}

// file layout -> tiles, in place: a matrix of N (a multiple of 8) rows of K
template <class T>
static void repack(uint8_t *w, long N, long K, int nt) {
    const long groups = K / T::QK, rb = groups * T::BYTES;
#pragma omp parallel for schedule(static) num_threads(nt)
    for (long t = 0; t < (N + 8) / 16; t++) {  // a pair's 16 rows, or a last tile's 8
        const long tiles = 16 * t + 16 <= N ? 2 : 1;
        uint8_t *copy = (uint8_t *)malloc(8 * tiles * rb), *out = w + 16 * t * rb;
        memcpy(copy, out, 8 * tiles * rb);
        for (long h = 0; h < tiles; h++) {  // tiles 2t, 2t + 1 in place
            for (long g = 0; g < groups; g++) {
                const uint8_t *blocks[8];
                for (int r = 0; r < 8; r++) blocks[r] = copy + (8 * h + r) * rb + g * T::BYTES;
                T::pack(blocks, out + 8 * h * rb + g * T::TG);
            }
        }
        if (PAIRS<T> && tiles == 2) {  // the two tiles -> pair-groups
            memcpy(copy, out, 16 * rb);
            for (long g = 0; g < groups; g++)
                pair_group<T>(copy + g * T::TG, copy + 8 * rb + g * T::TG, out + 2 * g * T::TG);
        }
        free(copy);
    }
}

// rows of a tiled matrix as fp32, by way of the file's blocks
template <class T>
static void dequantize_tiled(const uint8_t *w, const int64_t *ids, long R, long N, long K,
                             float *out, int nt) {
    const long groups = K / T::QK, rb = groups * T::BYTES;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * K > (1 << 16))
    for (long r = 0; r < R; r++) {
        const long n = ids ? ids[r] : r;
        alignas(64) uint8_t b[T::BYTES], scratch[T::TG];
        alignas(64) float f[G];  // group_f32 fills a whole group (8 blocks of 32)
        for (long g = 0; g < groups; g++) {
            T::block(tile_group<T>(w, n, g, rb, N, scratch), (int)(n % 8), b);
            group_f32<typename T::Base>(b, 0, T::QK, f);
            memcpy(out + r * K + g * T::QK, f, sizeof(float) * T::QK);
        }
    }
}

// qtype -> a call of F<T> (false for a type without kernels)
template <class F>
static bool with_type(int qtype, F &&f) {
    switch (qtype) {
        case F32: f(TF32{}); return true;
        case F16: f(TF16{}); return true;
        case BF16: f(TBF16{}); return true;
        case Q4_0: f(TQ4_0{}); return true;
        case Q4_1: f(TQ4_1{}); return true;
        case Q5_0: f(TQ5_0{}); return true;
        case Q5_1: f(TQ5_1{}); return true;
        case Q8_0: f(TQ8_0{}); return true;
        case IQ4_NL: f(TIQ4_NL{}); return true;
        case IQ4_XS: f(TIQ4_XS{}); return true;
        case Q2_K: f(TQ2_K{}); return true;
        case Q3_K: f(TQ3_K{}); return true;
        case Q4_K: f(TQ4_K{}); return true;
        case Q5_K: f(TQ5_K{}); return true;
        case Q6_K: f(TQ6_K{}); return true;
        case Q4_0_R8: f(R8Q4_0{}); return true;
        case Q5_0_R8: f(R8Q5_0{}); return true;
        case Q4_1_R8: f(R8Q4_1{}); return true;
        case Q5_1_R8: f(R8Q5_1{}); return true;
        case Q8_0_R8: f(R8Q8_0{}); return true;
        case IQ4_NL_R8: f(R8IQ4_NL{}); return true;
        case IQ4_XS_R8: f(R8IQ4_XS{}); return true;
        case Q4_K_R8: f(R8Q4_K{}); return true;
        case Q2_K_R8: f(R8Q2_K{}); return true;
        case Q3_K_R8: f(R8Q3_K{}); return true;
        case Q5_K_R8: f(R8Q5_K{}); return true;
        case Q6_K_R8: f(R8Q6_K{}); return true;
        default: return false;
    }
}

// how one part of a product runs: its rows function, chosen by type, mode and (for the
// one-row K-quant path) M; the same choice for every row of the part
typedef void (*RowsFn)(const Job &, long, long);
template <class T>
static RowsFn rows_fn(bool int8x, long M) {
    constexpr Kind KD = kind<T>();
    if constexpr (TILED<T>) {
        if (!int8x) return nullptr;  // tiles exist for int8 x only
        if constexpr (PAIRS<T>) return rows_r16<T>;
        return rows_r8<T>;
    } else if constexpr (KD == KQ) {
        if constexpr (ONE_ROW<T>) {
            if (int8x && M == 1) return rows_one<T>;
        }
        return int8x ? rows<KInt<T>> : rows<Exact<T>>;
    } else if constexpr (KD == B32) {
        return int8x ? rows<BInt<T>> : rows<Exact<T>>;
    } else {
        return rows<Exact<T>>;
    }
}

// The parts p = 0..P-1 of a stack (matrices of any types with K inputs, stacked along the
// output: q|k|v of mixed types) set up for one product with x [M, K]: each part's job and
// kernel, x rounded once per block size the parts need. ``ok`` is false for a type without
// kernels. Work item ``it`` (a tile pair's 16 weight rows, else 8) runs with ``item``.
struct Parts {
    int P;
    bool ok = false;
    Job jobs[8];
    RowsFn fns[8];
    long first_item[9] = {0};
    long col[8];  // the part's first column of the stacked output
    long rp[8];   // weight rows per work item: a tile pair's 16, else 8
    XRows xr[3];
    void *mem[3] = {nullptr, nullptr, nullptr};

    Parts(int P_, const int *qtypes, const uint8_t *const *ws, const long *Ns, const float *x,
          const float *bias, float *y, long ldy, long M, long K, bool int8x, int nt)
        : P(P_) {
        const long groups = (K + G - 1) / G, KP = groups * G;
        bool need[3] = {false, false, false};  // x rounded per 256, per 32; fp32 x
        int xkind[8];  // which of the x forms below part p reads
        if (P < 1 || P > 8) return;
        long c = 0;
        for (int p = 0; p < P; p++) {
            bool known = with_type(qtypes[p], [&](auto t) {
                typedef decltype(t) T;
                constexpr Kind KD = kind<T>();
                const bool i8 = int8x && KD != FLT;  // floats always take exact x
                xkind[p] = !i8 ? 2 : KD == KQ ? 0 : 1;
                need[xkind[p]] = true;
                fns[p] = rows_fn<T>(i8, M);
                if (TILED<T> && Ns[p] % 8) fns[p] = nullptr;
                rp[p] = PAIRS<T> ? 16 : 8;
                jobs[p] = Job{ws[p], K / T::QK * T::BYTES, Ns[p], K, groups, nullptr, y + c, ldy,
                              bias ? bias + c : nullptr};
            });
            if (!known || !fns[p]) return;
            col[p] = c;
            c += Ns[p];
            first_item[p + 1] = first_item[p] + (Ns[p] + rp[p] - 1) / rp[p];
        }
        // x as each kind of part reads it: int8 q M*KP bytes then s16, s32, dx, e2 (M*KP/8
        // bytes each at most), e8 (M*KP/16), ef and es (M*KP/8 each): under 2 * M*KP; or fp32
        const long qx[3] = {256, 32, 0};
        for (int v = 0; v < 3; v++) {
            xr[v] = XRows{M, KP, qx[v], 0, 0, 0, 0, 0, 0, 0, 0, 0};
            if (!need[v]) continue;
            mem[v] = aligned_alloc(64, ((v < 2 ? M * KP * 2 : M * KP * 4) | 63) + 1);
            if (v < 2) {
                xr[v].q = (int8_t *)mem[v];
                xr[v].s16 = (int16_t *)(xr[v].q + M * KP);
                xr[v].s32 = (int32_t *)(xr[v].s16 + M * KP / 16);
                xr[v].dx = (float *)(xr[v].s32 + M * KP / 32);
                xr[v].e2 = (int16_t *)(xr[v].dx + M * KP / 32);  // M*KP/16 int16
                xr[v].e8 = xr[v].e2 + M * KP / 16;                 // M*KP/32 int16
                xr[v].ef = (float *)(xr[v].e8 + M * KP / 32);      // M*KP/32 floats, twice
                xr[v].es = xr[v].ef + M * KP / 32;
            } else {
                xr[v].xf = (float *)mem[v];
            }
            prepare_x(x, K, xr[v], v < 2, nt);
        }
        for (int p = 0; p < P; p++) jobs[p].x = &xr[xkind[p]];
        ok = true;
    }
    ~Parts() {
        for (int v = 0; v < 3; v++) free(mem[v]);
    }
    Parts(const Parts &) = delete;
    Parts &operator=(const Parts &) = delete;

    long items() const { return first_item[P]; }
    void item(long it) const {
        int p = 0;
        while (it >= first_item[p + 1]) p++;
        const long n0 = (it - first_item[p]) * rp[p];
        const long n1 = n0 + rp[p] < jobs[p].N ? n0 + rp[p] : jobs[p].N;
        fns[p](jobs[p], n0, n1);
    }
    // the stacked output's columns c .. c + 15 into y16 [M][16] (ldy 16), with their bias:
    // the same kernels on the same x as ``item``, so the same bits. The caller checks that
    // the 16 columns lie in one part at a multiple of 16 from its start.
    void columns16(long c, float *y16) const {
        int p = 0;
        while (c >= col[p] + jobs[p].N) p++;
        Job j = jobs[p];
        const long n0 = c - col[p];
        j.y = y16;
        j.ldy = 16;
        j.y0 = n0;
        for (long n = n0; n < n0 + 16; n += rp[p]) fns[p](j, n, n + rp[p]);
    }
};

// y[:, col_p .. col_p + N_p) = x @ W_p.T for the parts of a stack (``Parts``), + bias over
// the whole row; one parallel loop covers every part's rows. Returns 0, or -1 for a type
// without kernels.
static int linear_parts(int P, const int *qtypes, const uint8_t *const *ws, const long *Ns,
                        const float *x, const float *bias, float *y, long ldy, long M, long K,
                        bool int8x, int nt) {
    const Parts parts(P, qtypes, ws, Ns, x, bias, y, ldy, M, K, int8x, nt);
    if (!parts.ok) return -1;
    const long items = parts.items();
    // guided: long contiguous runs of rows first (one stream for the hardware prefetcher;
    // dynamic hand-outs of 2 items made a 1-token pass of the default target's matrices 56.4
    // ms instead of 41.1 on a 2-core EPYC), then ever smaller ones, so that a thread the other
    // outran does not leave it waiting at the end (against static: target passes -2%, A/B)
#pragma omp parallel for schedule(guided, 4) num_threads(nt) if (nt > 1 && items > 1)
    for (long it = 0; it < items; it++) parts.item(it);
    return 0;
}

// rows of the matrix as fp32 (all R rows, or the listed ones): out [R][K]
template <class T>
static void dequantize_file(const uint8_t *w, const int64_t *ids, long R, long K, float *out,
                            int nt) {
    const long groups = (K + G - 1) / G, rb = K / T::QK * T::BYTES;
#pragma omp parallel for schedule(static) num_threads(nt) if (R * K > (1 << 16))
    for (long r = 0; r < R; r++) {
        const uint8_t *row = w + (ids ? ids[r] : r) * rb;
        alignas(64) float buf[G];
        for (long g = 0; g < groups; g++) {
            group_f32<T>(row, g, K, buf);
            const long n = K - g * G < G ? K - g * G : G;
            memcpy(out + r * K + g * G, buf, n * sizeof(float));
        }
    }
}

template <class T>
static void dequantize(const uint8_t *w, const int64_t *ids, long R, long N, long K, float *out,
                       int nt) {
    if constexpr (TILED<T>)
        dequantize_tiled<T>(w, ids, R, N, K, out, nt);
    else
        dequantize_file<T>(w, ids, R, K, out, nt);
}

// a matrix of the file's 32-block types or K-quants (N a multiple of 8) into tiles,
// in place: returns the tiled type, or -1
static int repack_tiles(int qtype, uint8_t *w, long N, long K, int nt) {
    if (N % 8 || K % 32) return -1;
    if (qtype == Q4_0) return repack<R8Q4_0>(w, N, K, nt), Q4_0_R8;
    if (qtype == Q5_0) return repack<R8Q5_0>(w, N, K, nt), Q5_0_R8;
    if (qtype == Q4_1) return repack<R8Q4_1>(w, N, K, nt), Q4_1_R8;
    if (qtype == Q5_1) return repack<R8Q5_1>(w, N, K, nt), Q5_1_R8;
    if (qtype == Q8_0) return repack<R8Q8_0>(w, N, K, nt), Q8_0_R8;
    if (qtype == IQ4_NL) return repack<R8IQ4_NL>(w, N, K, nt), IQ4_NL_R8;
    if (K % G) return -1;
    if (qtype == IQ4_XS) return repack<R8IQ4_XS>(w, N, K, nt), IQ4_XS_R8;
    if (qtype == Q4_K) return repack<R8Q4_K>(w, N, K, nt), Q4_K_R8;
    if (qtype == Q2_K) return repack<R8Q2_K>(w, N, K, nt), Q2_K_R8;
    if (qtype == Q3_K) return repack<R8Q3_K>(w, N, K, nt), Q3_K_R8;
    if (qtype == Q5_K) return repack<R8Q5_K>(w, N, K, nt), Q5_K_R8;
    if (qtype == Q6_K) return repack<R8Q6_K>(w, N, K, nt), Q6_K_R8;
    return -1;
}

}  // namespace gq
#pragma GCC visibility pop
