// specdec CPU kernels (x86-64, AVX2 + FMA), called through ctypes.
//
// Why our own kernels: on CPUs without native bf16 (AVX2 only), torch's bf16 matmuls run at
// a fraction of memory bandwidth, and MKL's small-M fp32 gemm is not much better. A decoder
// step is a few small-M matrix products over large weights, so a kernel that streams the
// weights once and converts bf16 -> fp32 in registers is 2-3x faster.
//
// Batch invariance (why exactness tests can demand token-identical output): every output
// element is reduced in one fixed order (8 fp32 lanes over k, then a fixed lane tree), which
// depends only on K, never on how many rows (M) are in the call or which tile computed it.
// So a token's logits are bit-identical whether it is decoded alone, in a batch, or inside a
// (K+1)-token verification pass. The attention kernel keeps the same promise per query.
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float hsum8(__m256 v) {
    __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
    lo = _mm_add_ps(lo, hi);
    __m128 sh = _mm_movehl_ps(lo, lo);
    lo = _mm_add_ps(lo, sh);
    sh = _mm_shuffle_ps(lo, lo, 1);
    lo = _mm_add_ss(lo, sh);
    return _mm_cvtss_f32(lo);
}

// ---- weight formats: load 8 weights as fp32 lanes --------------------------------------
struct F32 {
    typedef float T;
    static inline __m256 load(const float *p) { return _mm256_loadu_ps(p); }
    static inline float one(const float *p) { return *p; }
};
struct BF16 {
    typedef uint16_t T;
    static inline __m256 load(const uint16_t *p) {
        __m128i h = _mm_loadu_si128((const __m128i *)p);
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    static inline float one(const uint16_t *p) {
        uint32_t u = ((uint32_t)*p) << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
};
struct I8 {  // symmetric per-output-row int8; the row scale is applied after the reduction
    typedef int8_t T;
    static inline __m256 load(const int8_t *p) {
        __m128i b = _mm_loadl_epi64((const __m128i *)p);
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
    }
    static inline float one(const int8_t *p) { return (float)*p; }
};

// ---- linear: y[M,N] = x[M,K] @ w[N,K]^T * scale[N] + bias[N] ---------------------------
template <class W, int MT, int NT>
static inline void micro(const float *x, long K, const typename W::T *w, const float *scale,
                         const float *bias, float *y, long ldy) {
    __m256 acc[MT][NT];
    for (int i = 0; i < MT; i++)
        for (int t = 0; t < NT; t++) acc[i][t] = _mm256_setzero_ps();
    const long K8 = K & ~7L;
    // weights are streamed once: prefetch the next tile's rows (short rows defeat the
    // hardware prefetcher; this is worth ~40% of bandwidth at K = 896)
    constexpr long LINE = 64 / sizeof(typename W::T);
    for (long k = 0; k < K8; k += 8) {
        if ((k & (LINE - 1)) == 0)
            for (int t = 0; t < NT; t++)
                _mm_prefetch((const char *)(w + (NT + t) * K + k), _MM_HINT_T0);
        __m256 wv[NT];
        for (int t = 0; t < NT; t++) wv[t] = W::load(w + t * K + k);
        for (int i = 0; i < MT; i++) {
            __m256 a = _mm256_loadu_ps(x + i * K + k);
            for (int t = 0; t < NT; t++) acc[i][t] = _mm256_fmadd_ps(a, wv[t], acc[i][t]);
        }
    }
    for (int i = 0; i < MT; i++)
        for (int t = 0; t < NT; t++) {
            float s = hsum8(acc[i][t]);
            for (long k = K8; k < K; k++) s += x[i * K + k] * W::one(w + t * K + k);
            if (scale) s *= scale[t];
            if (bias) s += bias[t];
            y[i * ldy + t] = s;
        }
}

// Rows m0..m0+MT-1 against weight rows n0..n1-1; the column tile shrinks as rows grow so the
// accumulators stay in the 16 ymm registers.
template <class W, int MT>
static void tile_rows(const float *x, const typename W::T *w, const float *scale,
                      const float *bias, float *y, long N, long K, long m0, long n0, long n1) {
    constexpr int NT = MT == 1 ? 4 : MT <= 3 ? 4 : MT == 4 ? 3 : 2;
    long n = n0;
    const float *xm = x + m0 * K;
    float *ym = y + m0 * N;
    for (; n + NT <= n1; n += NT)
        micro<W, MT, NT>(xm, K, w + n * K, scale ? scale + n : 0, bias ? bias + n : 0, ym + n, N);
    for (; n < n1; n++)
        micro<W, MT, 1>(xm, K, w + n * K, scale ? scale + n : 0, bias ? bias + n : 0, ym + n, N);
}

template <class W>
static void linear(const float *x, const typename W::T *w, const float *scale, const float *bias,
                   float *y, long M, long N, long K, int nt) {
    const long NB = 16;  // weight rows per work item: small enough to balance two cores
    const long nb = (N + NB - 1) / NB;
#pragma omp parallel for schedule(dynamic, 4) num_threads(nt)
    for (long b = 0; b < nb; b++) {
        const long n0 = b * NB, n1 = n0 + NB < N ? n0 + NB : N;
        for (long m = 0; m < M;) {
            const long r = M - m;
            const int mt = r >= 6 ? 6 : (int)r;
            switch (mt) {
                case 6: tile_rows<W, 6>(x, w, scale, bias, y, N, K, m, n0, n1); break;
                case 5: tile_rows<W, 5>(x, w, scale, bias, y, N, K, m, n0, n1); break;
                case 4: tile_rows<W, 4>(x, w, scale, bias, y, N, K, m, n0, n1); break;
                case 3: tile_rows<W, 3>(x, w, scale, bias, y, N, K, m, n0, n1); break;
                case 2: tile_rows<W, 2>(x, w, scale, bias, y, N, K, m, n0, n1); break;
                default: tile_rows<W, 1>(x, w, scale, bias, y, N, K, m, n0, n1);
            }
            m += mt;
        }
    }
}

// ---- RMSNorm over the last dimension -----------------------------------------------------
static void rmsnorm_rows(const float *x, const float *w, float *y, long R, long D, float eps,
                         int nt) {
    const long D8 = D & ~7L;
#pragma omp parallel for schedule(static) num_threads(nt) if (R > 8)
    for (long r = 0; r < R; r++) {
        const float *xr = x + r * D;
        float *yr = y + r * D;
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
static void silu_mul_rows(const float *gu, float *out, long R, long I, int nt) {
#pragma omp parallel for schedule(static) num_threads(nt) if (R > 8)
    for (long r = 0; r < R; r++) {
        const float *g = gu + r * 2 * I, *u = g + I;
        float *o = out + r * I;
        for (long i = 0; i < I; i++) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
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
    const long group = H / KVH, D8 = D & ~7L;
    const long items = B * T * H;
#pragma omp parallel num_threads(nt)
    {
        float *p = (float *)malloc(sizeof(float) * (S > 0 ? S : 1));
        float *acc = (float *)malloc(sizeof(float) * (D + 8));
#pragma omp for schedule(dynamic, 1)
        for (long it = 0; it < items; it++) {
            const long b = it / (T * H), t = (it / H) % T, h = it % H, g = h / group;
            const float *qv = q + ((b * T + t) * H + h) * D;
            const float *kb = kc + (rows[b] * KVH + g) * S * D;
            const float *vb = vc + (rows[b] * KVH + g) * S * D;
            const uint8_t *mrow = mask ? mask + (b * T + t) * MS : 0;
            const long tt = t < nnew[b] ? t : nnew[b] - 1;
            const long send = mask ? MS : start[b] + tt + 1;
            float mx = -INFINITY;
            for (long s = 0; s < send; s++) {
                if (mrow && !mrow[s]) continue;
                const float *kv = kb + s * D;
                __m256 a = _mm256_setzero_ps();
                for (long d = 0; d < D8; d += 8)
                    a = _mm256_fmadd_ps(_mm256_loadu_ps(qv + d), _mm256_loadu_ps(kv + d), a);
                float sc = hsum8(a);
                for (long d = D8; d < D; d++) sc += qv[d] * kv[d];
                sc *= scale;
                p[s] = sc;
                if (sc > mx) mx = sc;
            }
            float sum = 0.0f;
            for (long d = 0; d < D; d++) acc[d] = 0.0f;
            for (long s = 0; s < send; s++) {
                if (mrow && !mrow[s]) continue;
                const float e = expf(p[s] - mx);
                sum += e;
                const float *vv = vb + s * D;
                const __m256 ev = _mm256_set1_ps(e);
                for (long d = 0; d < D8; d += 8)
                    _mm256_storeu_ps(acc + d, _mm256_fmadd_ps(ev, _mm256_loadu_ps(vv + d),
                                                              _mm256_loadu_ps(acc + d)));
                for (long d = D8; d < D; d++) acc[d] += e * vv[d];
            }
            float *o = out + ((b * T + t) * H + h) * D;
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            for (long d = 0; d < D; d++) o[d] = acc[d] * inv;
        }
        free(p);
        free(acc);
    }
}

extern "C" {
int specdec_abi_version() { return 1; }
void linear_f32(const float *x, const float *w, const float *bias, float *y, long M, long N,
                long K, int nt) {
    linear<F32>(x, w, 0, bias, y, M, N, K, nt);
}
void linear_bf16(const float *x, const uint16_t *w, const float *bias, float *y, long M, long N,
                 long K, int nt) {
    linear<BF16>(x, w, 0, bias, y, M, N, K, nt);
}
void linear_i8(const float *x, const int8_t *w, const float *scale, const float *bias, float *y,
               long M, long N, long K, int nt) {
    linear<I8>(x, w, scale, bias, y, M, N, K, nt);
}
void rmsnorm(const float *x, const float *w, float *y, long R, long D, float eps, int nt) {
    rmsnorm_rows(x, w, y, R, D, eps, nt);
}
void silu_mul(const float *gu, float *out, long R, long I, int nt) {
    silu_mul_rows(gu, out, R, I, nt);
}
void rope(float *x, const int64_t *pos, const float *cos_t, const float *sin_t, long R, long H,
          long D, int nt) {
    rope_rows(x, pos, cos_t, sin_t, R, H, D, nt);
}
void attend(const float *q, const float *knew, const float *vnew, float *kc, float *vc,
            const int64_t *rows, const int64_t *start, const int64_t *nnew, const uint8_t *mask,
            long MS, float *out, long B, long T, long H, long KVH, long D, long S, float scale,
            int nt) {
    attention(q, knew, vnew, kc, vc, rows, start, nnew, mask, MS, out, B, T, H, KVH, D, S, scale,
              nt);
}
}
