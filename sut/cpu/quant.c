/* Linear layers on CPU straight from GGUF's block-quantized weights (see quant.py).

   y[M, N] = x[M, K] @ W^T, with W [N, K] stored as blocks of 32 along K:
     Q4_1: w = d * q + m, q in 0..15 (byte j of a block holds element j in its low nibble and
           element j + 16 in its high nibble, GGUF's layout);
     Q8_0: w = d * q, q in -128..127.
   d and m come in as fp32 (converted exactly from the file's fp16).

   Two products:
   - exact (`q4_1_matmul`, `q8_0_matmul`): each weight is rebuilt in fp32 with one rounding, as
     gguf's own dequantizer does, so the product is that of the fp32 checkpoint; only the order of
     the sums differs. A decode step reads 0.63 (Q4_1) or 1.06 (Q8_0) bytes per weight instead of
     4: the point, since at small batch a linear layer is bound by reading its weights.
   - int16 activations (`*_matmul_i16`, the engine setting int16_activations): each input row is
     rounded to int16 per block of 32 and multiplied with the integer codes exactly in int32.

   This file is compiled once per instruction-set level (build.py): AVX-512 (with VNNI), AVX2
   (with FMA) and portable C for any compiler and CPU, ARM included. Each level computes the same
   products; the portable code is also the plain statement of what the others do. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define LEVEL_AVX512 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__FMA__)
#define LEVEL_AVX2 1
#include <immintrin.h>
#endif

#define QK 32 /* weights per block */

/* 2 = AVX-512, 1 = AVX2, 0 = portable: what this build was compiled for (build.py checks it). */
int cpu_kernels_level(void) {
#if defined(LEVEL_AVX512)
    return 2;
#elif defined(LEVEL_AVX2)
    return 1;
#else
    return 0;
#endif
}

/* ---- exact products ---- */

#ifdef LEVEL_AVX2
/* AVX2 has 16 vector registers: each block is rebuilt in registers (4 x 8 weights per row) and
   used at once for MR input rows, NR weight rows at a time. */
#define NR 2
#define MR 4

static inline __attribute__((always_inline)) void rebuild_block(int q8, const uint8_t *q, float db, float mb,
                                                                __m256 w[4]) {
    __m256 d = _mm256_set1_ps(db);
    if (q8) {
        for (int c = 0; c < 4; c++)
            w[c] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8 * c)))));
        return;
    }
    __m256 m = _mm256_set1_ps(mb);
    __m128i bytes = _mm_loadu_si128((const __m128i *)q), low4 = _mm_set1_epi8(15);
    __m128i lo = _mm_and_si128(bytes, low4), hi = _mm_and_si128(_mm_srli_epi16(bytes, 4), low4);
    __m128i parts[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int c = 0; c < 4; c++) w[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(parts[c])), m);
}

static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

/* y[r * ldy + a] = dot(weight row a, x row r) for a < nr, r < mr (constants once inlined). */
static inline __attribute__((always_inline)) void exact_tile(int q8, const uint8_t *qs, long row_bytes, const float *d,
                                                             const float *m, const float *x, long K, int nr, int mr,
                                                             float *y, long ldy) {
    long nb = K / QK, block_bytes = q8 ? 32 : 16;
    __m256 acc[NR][MR];
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) acc[a][r] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++)
        for (int a = 0; a < nr; a++) {
            __m256 w[4];
            rebuild_block(q8, qs + a * row_bytes + b * block_bytes, d[a * nb + b], q8 ? 0 : m[a * nb + b], w);
            for (int c = 0; c < 4; c++)
                for (int r = 0; r < mr; r++)
                    acc[a][r] = _mm256_fmadd_ps(w[c], _mm256_loadu_ps(x + r * K + b * QK + 8 * c), acc[a][r]);
        }
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) y[r * ldy + a] = hsum8(acc[a][r]);
}

static inline __attribute__((always_inline)) void exact_tiles(int q8, const uint8_t *qs, long row_bytes, const float *d, const float *m, const float *x,
                        long M, long K, int nr, float *y, long ldy) {
    for (long i = 0; i < M; i += MR) {
        int mr = M - i < MR ? (int)(M - i) : MR;
        const float *xi = x + i * K;
        float *yi = y + i * ldy;
#define TILE(NRC, MRC) exact_tile(q8, qs, row_bytes, d, m, xi, K, NRC, MRC, yi, ldy)
        if (nr == NR) {
            switch (mr) {
            case 4: TILE(NR, 4); break;
            case 3: TILE(NR, 3); break;
            case 2: TILE(NR, 2); break;
            default: TILE(NR, 1); break;
            }
        } else
            for (int r = 0; r < mr; r++) exact_tile(q8, qs, row_bytes, d, m, xi + r * K, K, 1, 1, yi + r * ldy, ldy);
#undef TILE
    }
}

static int matmul(int q8, const float *x, const uint8_t *qs, const float *d, const float *m, float *y, long M, long N,
                  long K) {
    if (K % QK) return -1;
    long nb = K / QK, row_bytes = q8 ? K : K / 2;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n += NR) {
        int nr = N - n < NR ? (int)(N - n) : NR;
        if (q8) exact_tiles(1, qs + n * row_bytes, row_bytes, d + n * nb, NULL, x, M, K, nr, y + n, N);
        else exact_tiles(0, qs + n * row_bytes, row_bytes, d + n * nb, m + n * nb, x, M, K, nr, y + n, N);
    }
    return 0;
}

#else
/* AVX-512 and portable: each panel of NR weight rows is rebuilt once in fp32 into a per-thread
   buffer (L1/L2-resident) and applied to all M input rows in tiles of NR x MR dot products, with
   the compiler's vectors (VW floats: one AVX-512 register, or 128 bits, which SSE and NEON have). */
#ifdef LEVEL_AVX512
#define VW 16
#define MR 4
#else
#define VW 4
#define MR 2
#endif
#define NR 4

typedef float vf __attribute__((vector_size(VW * 4)));

static inline vf loadv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }

static inline float hsum(vf v) {
    float s = 0;
    for (int j = 0; j < VW; j++) s += v[j];
    return s;
}

/* Rebuild nr rows of Q4_1 weights in fp32: w[r * K + k]. */
static void dequant_q4_1(const uint8_t *qs, const float *d, const float *m, long K, int nr, float *w) {
    long nb = K / QK;
    for (int r = 0; r < nr; r++)
        for (long b = 0; b < nb; b++) {
            const uint8_t *q = qs + r * (K / 2) + b * 16;
            float db = d[r * nb + b], mb = m[r * nb + b], *out = w + r * K + b * QK;
#ifdef LEVEL_AVX512
            __m512i qi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
            __m512 dv = _mm512_set1_ps(db), mv = _mm512_set1_ps(mb);
            _mm512_storeu_ps(out, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(_mm512_and_si512(qi, _mm512_set1_epi32(15))), mv));
            _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(_mm512_srli_epi32(qi, 4)), mv));
#else
            /* d * q is exact (q < 16, d an fp16), so d * q + m rounds once with or without FMA. */
            for (int j = 0; j < 16; j++) {
                out[j] = db * (float)(q[j] & 15) + mb;
                out[j + 16] = db * (float)(q[j] >> 4) + mb;
            }
#endif
        }
}

/* Rebuild nr rows of Q8_0 weights in fp32 (m is unused). */
static void dequant_q8_0(const uint8_t *qs, const float *d, const float *m, long K, int nr, float *w) {
    (void)m;
    long nb = K / QK;
    for (int r = 0; r < nr; r++)
        for (long b = 0; b < nb; b++) {
            const int8_t *q = (const int8_t *)qs + r * K + b * QK;
            float db = d[r * nb + b], *out = w + r * K + b * QK;
#ifdef LEVEL_AVX512
            __m512 dv = _mm512_set1_ps(db);
            _mm512_storeu_ps(out, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q)))));
            _mm512_storeu_ps(out + 16, _mm512_mul_ps(dv, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16))))));
#else
            for (int j = 0; j < QK; j++) out[j] = db * (float)q[j];
#endif
        }
}

/* y[r * ldy + a] = dot(w row a, x row r) for a < nr, r < mr; inlined with constant nr and mr so
   the nr * mr accumulators stay in registers. */
static inline __attribute__((always_inline)) void micro(const float *w, const float *x, long K, int nr, int mr,
                                                         float *y, long ldy) {
    vf acc[NR][MR];
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) acc[a][r] = (vf){0};
    for (long k = 0; k < K; k += VW) {
        vf xv[MR];
        for (int r = 0; r < mr; r++) xv[r] = loadv(x + r * K + k);
        for (int a = 0; a < nr; a++) {
            vf wa = loadv(w + a * K + k);
            for (int r = 0; r < mr; r++) acc[a][r] += wa * xv[r];
        }
    }
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) y[r * ldy + a] = hsum(acc[a][r]);
}

static void micro_tile(const float *w, const float *x, long K, int nr, int mr, float *y, long ldy) {
    if (nr == NR) {
        switch (mr) {
#if MR == 4
        case 4: micro(w, x, K, NR, 4, y, ldy); return;
        case 3: micro(w, x, K, NR, 3, y, ldy); return;
#endif
        case 2: micro(w, x, K, NR, 2, y, ldy); return;
        case 1: micro(w, x, K, NR, 1, y, ldy); return;
        }
    }
    for (int a = 0; a < nr; a++) /* the last panel of a layer whose N is not a multiple of NR */
        for (int r = 0; r < mr; r++) micro(w + a * K, x + r * K, K, 1, 1, y + r * ldy + a, ldy);
}

/* Panels of NR weight rows are split over the OpenMP threads; each panel is rebuilt once into a
   per-thread buffer and applied to all M input rows. */
static int matmul(int q8, const float *x, const uint8_t *qs, const float *d, const float *m, float *y, long M, long N,
                  long K) {
    if (K % QK) return -1;
    long nb = K / QK, row_bytes = q8 ? K : K / 2;
    int failed = 0;
#pragma omp parallel
    {
        float *w = aligned_alloc(64, NR * K * sizeof(float));
        if (!w) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long n = 0; n < N; n += NR) {
            if (!w) continue;
            int nr = N - n < NR ? (int)(N - n) : NR;
            if (q8) dequant_q8_0(qs + n * row_bytes, d + n * nb, NULL, K, nr, w);
            else dequant_q4_1(qs + n * row_bytes, d + n * nb, m + n * nb, K, nr, w);
            for (long i = 0; i < M; i += MR)
                micro_tile(w, x + i * K, K, nr, M - i < MR ? (int)(M - i) : MR, y + i * N + n, N);
        }
        free(w);
    }
    return failed ? -2 : 0;
}
#endif

int q4_1_matmul(const float *x, const uint8_t *qs, const float *d, const float *m, float *y, long M, long N, long K) {
    return matmul(0, x, qs, d, m, y, M, N, K);
}

int q8_0_matmul(const float *x, const uint8_t *qs, const float *d, float *y, long M, long N, long K) {
    return matmul(1, x, qs, d, NULL, y, M, N, K);
}

/* ---- int16-activation products ----

   The same product with each input row quantized per block of 32 to int16: x ~ s * xi with
   s = max|x| / 32767, so y = sum_b d_b * s_b * sum_k xi_k q_k  (+ m_b * sum_k x_k for Q4_1, with
   the fp32 sum of the block's x). The inner sums are exact int32 (|xi q| <= 32767 * 128, 32
   terms): AVX512-VNNI's vpdpwssd does 32 multiply-adds per instruction, AVX2's vpmaddwd 16 (and
   an add), the portable code one at a time. The only new error is the rounding of x to int16: at
   most s/2 per element, 2^-16 of its block's largest, ~128x finer than bf16.

   Weights come pre-arranged per group of 16 output rows (BlockWeights.int16_layout in
   quant.py), per block of 32 columns: Q4_1 as 4 chunks of 64 bytes, chunk c holding for
   each row n and half h (byte offset 4n + 2h) one little-endian uint16 whose nibble t is the
   code of column 2(4c + t) + h; Q8_0 as 16 chunks of 32 bytes, chunk j holding int8 codes of
   columns 2j + h at offset 2n + h. d and m are fp32 [groups][blocks][16]. So one lane of a vector
   is one output row and each int16 pair one pair of consecutive columns: the input is broadcast
   one column pair (one int32) at a time. Rows are padded to a multiple of 32 with zero codes and
   scales. */
#define GR 16 /* output rows per group */
#define MI 4  /* input rows per micro-tile */

#ifndef LEVEL_AVX512
/* xq[r][k] = round(x / s), xs[r][b] = s, xsum[r][b] = sum of the block's x (an omp for: call it
   inside a parallel region). */
static void quantize_rows(const float *x, long M, long K, int16_t *xq, float *xs, float *xsum) {
    long nb = K / QK;
#pragma omp for schedule(static)
    for (long r = 0; r < M; r++)
        for (long b = 0; b < nb; b++) {
            const float *p = x + r * K + b * QK;
            float amax = 0, sum = 0;
            for (int k = 0; k < QK; k++) {
                amax = fabsf(p[k]) > amax ? fabsf(p[k]) : amax;
                sum += p[k];
            }
            float inv = amax > 0 ? 32767.0f / amax : 0.0f;
            xs[r * nb + b] = amax / 32767.0f;
            xsum[r * nb + b] = sum;
            for (int k = 0; k < QK; k++) xq[r * K + b * QK + k] = (int16_t)lrintf(p[k] * inv);
        }
}
#endif

#if defined(LEVEL_AVX512)
#define GR 16 /* output rows per group: one vector */
#define NG 2  /* groups per panel */
#define MI 4  /* input rows per micro-tile */

/* Unpack one group's codes for all K into buf[(b * 16 + j) * 32 + 2 * n + h] = q[n][32b + 2j + h]. */
static void unpack_q4_1_i16(const uint8_t *codes, long nb, int16_t *buf) {
    const __m512i low4 = _mm512_set1_epi16(15);
    for (long b = 0; b < nb; b++)
        for (int c = 0; c < 4; c++) { /* 64 bytes: 4 nibbles per int16 slot, pairs j = 4c + t */
            __m512i v = _mm512_loadu_si512(codes + (b * 4 + c) * 64);
            for (int t = 0; t < 4; t++)
                _mm512_store_si512(buf + (b * 16 + 4 * c + t) * 32, _mm512_and_si512(_mm512_srli_epi16(v, 4 * t), low4));
        }
}

static void unpack_q8_0_i16(const uint8_t *codes, long nb, int16_t *buf) {
    for (long p = 0; p < nb * 16; p++) /* 32 int8 per k-pair, sign-extended */
        _mm512_store_si512(buf + p * 32, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(codes + p * 32))));
}

/* xq[r][k] = round(x / s), xs[r][b] = s, xsum[r][b] = sum of the block's x. */
static void quantize_rows(const float *x, long M, long K, int16_t *xq, float *xs, float *xsum) {
    long nb = K / QK;
#pragma omp for schedule(static)
    for (long r = 0; r < M; r++)
        for (long b = 0; b < nb; b++) {
            const float *p = x + r * K + b * QK;
            __m512 lo = _mm512_loadu_ps(p), hi = _mm512_loadu_ps(p + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            float inv = amax > 0 ? 32767.0f / amax : 0.0f;
            xs[r * nb + b] = amax / 32767.0f;
            xsum[r * nb + b] = _mm512_reduce_add_ps(_mm512_add_ps(lo, hi));
            __m512 iv = _mm512_set1_ps(inv);
            _mm256_storeu_si256((__m256i *)(xq + r * K + b * QK), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(lo, iv))));
            _mm256_storeu_si256((__m256i *)(xq + r * K + b * QK + 16), _mm512_cvtepi32_epi16(_mm512_cvtps_epi32(_mm512_mul_ps(hi, iv))));
        }
}

/* y[r][n0 + 16g + lane] for r < mr, g < NG, from unpacked panel `buf` (NG groups). */
static inline __attribute__((always_inline)) void micro_i16(const int16_t *buf, long K, const float *d, const float *m,
                                                             const int16_t *xq, const float *xs, const float *xsum,
                                                             int mr, float *y, long ldy, __mmask16 *mask) {
    long nb = K / QK, gstride = nb * 16 * 32;
    __m512 acc[MI][NG];
    for (int r = 0; r < mr; r++)
        for (int g = 0; g < NG; g++) acc[r][g] = _mm512_setzero_ps();
    for (long b = 0; b < nb; b++) {
        __m512i iacc[MI][NG];
        for (int r = 0; r < mr; r++)
            for (int g = 0; g < NG; g++) iacc[r][g] = _mm512_setzero_si512();
        for (int j = 0; j < 16; j++) {
            __m512i w[NG];
            for (int g = 0; g < NG; g++) w[g] = _mm512_load_si512(buf + g * gstride + (b * 16 + j) * 32);
            for (int r = 0; r < mr; r++) {
                int32_t pair;
                memcpy(&pair, xq + r * K + b * QK + 2 * j, sizeof pair);
                __m512i xb = _mm512_set1_epi32(pair);
                for (int g = 0; g < NG; g++) iacc[r][g] = _mm512_dpwssd_epi32(iacc[r][g], w[g], xb);
            }
        }
        for (int g = 0; g < NG; g++) {
            __m512 dv = _mm512_loadu_ps(d + (g * nb + b) * GR);
            __m512 mv = m ? _mm512_loadu_ps(m + (g * nb + b) * GR) : _mm512_setzero_ps();
            for (int r = 0; r < mr; r++) {
                acc[r][g] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[r][g]), _mm512_mul_ps(dv, _mm512_set1_ps(xs[r * nb + b])), acc[r][g]);
                if (m) acc[r][g] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[r * nb + b]), acc[r][g]);
            }
        }
    }
    for (int r = 0; r < mr; r++)
        for (int g = 0; g < NG; g++) _mm512_mask_storeu_ps(y + r * ldy + g * GR, mask[g], acc[r][g]);
}

static void micro_i16_tile(const int16_t *buf, long K, const float *d, const float *m, const int16_t *xq,
                           const float *xs, const float *xsum, int mr, float *y, long ldy, __mmask16 *mask) {
    switch (mr) {
    case 4: micro_i16(buf, K, d, m, xq, xs, xsum, 4, y, ldy, mask); return;
    case 3: micro_i16(buf, K, d, m, xq, xs, xsum, 3, y, ldy, mask); return;
    case 2: micro_i16(buf, K, d, m, xq, xs, xsum, 2, y, ldy, mask); return;
    default: micro_i16(buf, K, d, m, xq, xs, xsum, 1, y, ldy, mask); return;
    }
}

/* codes: per group of 16 rows, nb blocks of 256 (Q4_1) or 512 (Q8_0) bytes; d, m: [groups][nb][16]
   fp32 (m NULL for Q8_0). Rows are padded to a multiple of GR * NG with zero codes and scales. */
static int matmul_i16(int q8, const float *x, const uint8_t *codes, const float *d, const float *m, float *y,
                      long M, long N, long K) {
    if (K % QK) return -1;
    if (M == 0) return 0;
    long nb = K / QK, groups = (N + GR * NG - 1) / (GR * NG) * NG, block_bytes = q8 ? 512 : 256;
    int16_t *xq = aligned_alloc(64, ((M * K * sizeof(int16_t) + 63) / 64) * 64);
    float *xs = malloc(M * nb * sizeof(float)), *xsum = malloc(M * nb * sizeof(float));
    int failed = !xq || !xs || !xsum;
    if (!failed) {
#pragma omp parallel
        {
            quantize_rows(x, M, K, xq, xs, xsum); /* ends with the omp for's barrier */
            int16_t *buf = aligned_alloc(64, NG * nb * 16 * 32 * sizeof(int16_t));
            if (!buf) {
#pragma omp atomic write
                failed = 1;
            }
#pragma omp for schedule(static)
            for (long g0 = 0; g0 < groups; g0 += NG) {
                if (!buf) continue;
                __mmask16 mask[NG];
                for (int g = 0; g < NG; g++) {
                    long rows = N - (g0 + g) * GR;
                    mask[g] = (__mmask16)((1u << (rows < 0 ? 0 : rows > GR ? GR : rows)) - 1);
                    const uint8_t *c = codes + (g0 + g) * nb * block_bytes;
                    if (q8) unpack_q8_0_i16(c, nb, buf + g * nb * 16 * 32);
                    else unpack_q4_1_i16(c, nb, buf + g * nb * 16 * 32);
                }
                const float *dp = d + g0 * nb * GR, *mp = m ? m + g0 * nb * GR : NULL;
                for (long i = 0; i < M; i += MI)
                    micro_i16_tile(buf, K, dp, mp, xq + i * K, xs + i * nb, xsum + i * nb,
                                   M - i < MI ? (int)(M - i) : MI, y + i * N + g0 * GR, N, mask);
            }
            free(buf);
        }
    }
    free(xq);
    free(xs);
    free(xsum);
    return failed ? -2 : 0;
}

#elif defined(LEVEL_AVX2)
/* One group of 16 output rows (two vectors of 8 lanes) for mr input rows: the codes are unpacked
   in registers, once per block for all mr rows. Stores all 16 rows to y (the caller pads). */
static inline __attribute__((always_inline)) void micro_i16(int q8, const uint8_t *codes, long nb, const float *d,
                                                            const float *m, const int16_t *xq, const float *xs,
                                                            const float *xsum, long K, int mr, float *y, long ldy) {
    const __m256i low4 = _mm256_set1_epi16(15);
    __m256 acc[MI][2];
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (long b = 0; b < nb; b++) {
        __m256i iacc[MI][2];
        for (int r = 0; r < mr; r++) iacc[r][0] = iacc[r][1] = _mm256_setzero_si256();
#pragma GCC unroll 4 /* fully unrolled, GCC turns the add chains into trees that spill */
        for (int j = 0; j < 16; j++) {
            __m256i w0, w1;
            if (q8) {
                const uint8_t *c = codes + (b * 16 + j) * 32;
                w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)c));
                w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(c + 16)));
            } else {
                const uint8_t *c = codes + (b * 4 + j / 4) * 64;
                int shift = 4 * (j % 4);
                w0 = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)c), shift), low4);
                w1 = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(c + 32)), shift), low4);
            }
            for (int r = 0; r < mr; r++) {
                int32_t pair;
                memcpy(&pair, xq + r * K + b * QK + 2 * j, sizeof pair);
                __m256i xb = _mm256_set1_epi32(pair);
                iacc[r][0] = _mm256_add_epi32(iacc[r][0], _mm256_madd_epi16(w0, xb));
                iacc[r][1] = _mm256_add_epi32(iacc[r][1], _mm256_madd_epi16(w1, xb));
            }
        }
        for (int h = 0; h < 2; h++) {
            __m256 dv = _mm256_loadu_ps(d + b * GR + 8 * h);
            __m256 mv = m ? _mm256_loadu_ps(m + b * GR + 8 * h) : _mm256_setzero_ps();
            for (int r = 0; r < mr; r++) {
                acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[r][h]), _mm256_mul_ps(dv, _mm256_set1_ps(xs[r * nb + b])),
                                            acc[r][h]);
                if (m) acc[r][h] = _mm256_fmadd_ps(mv, _mm256_set1_ps(xsum[r * nb + b]), acc[r][h]);
            }
        }
    }
    for (int r = 0; r < mr; r++) {
        _mm256_storeu_ps(y + r * ldy, acc[r][0]);
        _mm256_storeu_ps(y + r * ldy + 8, acc[r][1]);
    }
}
#else
/* Portable: the same sums, one multiply-add at a time (compilers vectorize the loops over the
   16 rows). */
static inline __attribute__((always_inline)) void micro_i16(int q8, const uint8_t *codes, long nb, const float *d,
                                                            const float *m, const int16_t *xq, const float *xs,
                                                            const float *xsum, long K, int mr, float *y, long ldy) {
    float acc[MI][GR] = {{0}};
    for (long b = 0; b < nb; b++) {
        int32_t iacc[MI][GR] = {{0}};
        for (int j = 0; j < 16; j++) {
            int16_t w[2][GR];
            for (int n = 0; n < GR; n++)
                for (int h = 0; h < 2; h++) {
                    if (q8) {
                        w[h][n] = (int8_t)codes[(b * 16 + j) * 32 + 2 * n + h];
                    } else {
                        const uint8_t *c = codes + (b * 4 + j / 4) * 64 + 4 * n + 2 * h;
                        w[h][n] = (int16_t)(((c[0] | c[1] << 8) >> (4 * (j % 4))) & 15);
                    }
                }
            for (int r = 0; r < mr; r++) {
                int32_t x0 = xq[r * K + b * QK + 2 * j], x1 = xq[r * K + b * QK + 2 * j + 1];
                for (int n = 0; n < GR; n++) iacc[r][n] += w[0][n] * x0 + w[1][n] * x1;
            }
        }
        for (int r = 0; r < mr; r++)
            for (int n = 0; n < GR; n++) {
                acc[r][n] += (float)iacc[r][n] * (d[b * GR + n] * xs[r * nb + b]);
                if (m) acc[r][n] += m[b * GR + n] * xsum[r * nb + b];
            }
    }
    for (int r = 0; r < mr; r++) memcpy(y + r * ldy, acc[r], sizeof acc[r]);
}
#endif

#ifdef LEVEL_AVX2
#define LONE_ROW_TILE 1
#else
#define LONE_ROW_TILE 2
#endif

#ifndef LEVEL_AVX512
/* Groups of 16 rows split over the threads; per group, the input rows in tiles of MI, written to
   a 16-wide scratch row and copied out (the last group of a layer may be partly padding). */
static int matmul_i16(int q8, const float *x, const uint8_t *codes, const float *d, const float *m, float *y,
                      long M, long N, long K) {
    if (K % QK) return -1;
    if (M == 0) return 0;
    long nb = K / QK, groups = (N + GR - 1) / GR, block_bytes = q8 ? 512 : 256;
    /* One zero row past the input: the portable code takes a lone row as two (GCC vectorizes the
       one-row tile so poorly that two rows take half its time). */
    int16_t *xq = calloc((M + 1) * K, sizeof(int16_t));
    float *xs = calloc((M + 1) * nb, sizeof(float)), *xsum = calloc((M + 1) * nb, sizeof(float));
    int failed = !xq || !xs || !xsum;
    if (!failed) {
#pragma omp parallel
        {
            quantize_rows(x, M, K, xq, xs, xsum); /* ends with the omp for's barrier */
#pragma omp for schedule(static)
            for (long g = 0; g < groups; g++) {
                const uint8_t *c = codes + g * nb * block_bytes;
                const float *dg = d + g * nb * GR, *mg = m ? m + g * nb * GR : NULL;
                long rows = N - g * GR < GR ? N - g * GR : GR;
                for (long i = 0; i < M; i += MI) {
                    float out[MI][GR];
                    int mr = M - i < MI ? (int)(M - i) : MI;
                    const int16_t *xi = xq + i * K;
                    const float *si = xs + i * nb, *ui = xsum + i * nb;
#define TILE(Q8, MRC) micro_i16(Q8, c, nb, dg, mg, xi, si, ui, K, MRC, out[0], GR)
                    if (q8) switch (mr) {
                        case 4: TILE(1, 4); break;
                        case 3: TILE(1, 3); break;
                        case 2: TILE(1, 2); break;
                        default: TILE(1, LONE_ROW_TILE); break;
                        }
                    else switch (mr) {
                        case 4: TILE(0, 4); break;
                        case 3: TILE(0, 3); break;
                        case 2: TILE(0, 2); break;
                        default: TILE(0, LONE_ROW_TILE); break;
                        }
#undef TILE
                    for (int r = 0; r < mr; r++) memcpy(y + (i + r) * N + g * GR, out[r], rows * sizeof(float));
                }
            }
        }
    }
    free(xq);
    free(xs);
    free(xsum);
    return failed ? -2 : 0;
}
#endif

int q4_1_matmul_i16(const float *x, const uint8_t *codes, const float *d, const float *m, float *y, long M, long N, long K) {
    return matmul_i16(0, x, codes, d, m, y, M, N, K);
}

int q8_0_matmul_i16(const float *x, const uint8_t *codes, const float *d, float *y, long M, long N, long K) {
    return matmul_i16(1, x, codes, d, NULL, y, M, N, K);
}
