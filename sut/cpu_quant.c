/* Small-batch linear layers on CPU straight from GGUF's block-quantized weights (see cpu_quant.py).

   y[M, N] = x[M, K] @ W^T, with W [N, K] stored as blocks of 32 along K:
     Q4_1: w = d * q + m, q in 0..15 (byte j of a block holds element j in its low nibble and
           element j + 16 in its high nibble, GGUF's layout);
     Q8_0: w = d * q, q in -128..127.
   d and m come in as fp32 (converted exactly from the file's fp16). Each weight is rebuilt in
   fp32 with one rounding, as gguf's own dequantizer does, so the product is that of the fp32
   checkpoint; only the order of the sums differs. A decode step reads 0.63 (Q4_1) or 1.06 (Q8_0)
   bytes per weight instead of 4: the point, since at small batch a linear layer is bound by
   reading its weights. Compute stays fp32 (FMA), so at larger batch oneDNN's fp32 GEMM wins and
   the Python side switches to it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

#define QK 32 /* weights per block */
#define NR 4  /* weight rows per panel */
#define MR 4  /* input rows per micro-tile */

typedef float v16f __attribute__((vector_size(64)));

static inline v16f load16(const float *p) { v16f v; memcpy(&v, p, sizeof v); return v; }

static inline float hsum(v16f v) {
    float s = 0;
    for (int j = 0; j < 16; j++) s += v[j];
    return s;
}

/* Rebuild nr rows of Q4_1 weights in fp32: w[r * K + k]. */
static void dequant_q4_1(const uint8_t *qs, const float *d, const float *m, long K, int nr, float *w) {
    long nb = K / QK;
    for (int r = 0; r < nr; r++)
        for (long b = 0; b < nb; b++) {
            const uint8_t *q = qs + r * (K / 2) + b * 16;
            float db = d[r * nb + b], mb = m[r * nb + b], *out = w + r * K + b * QK;
#ifdef __AVX512F__
            __m512i qi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)q));
            __m512 dv = _mm512_set1_ps(db), mv = _mm512_set1_ps(mb);
            _mm512_storeu_ps(out, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(_mm512_and_si512(qi, _mm512_set1_epi32(15))), mv));
            _mm512_storeu_ps(out + 16, _mm512_fmadd_ps(dv, _mm512_cvtepi32_ps(_mm512_srli_epi32(qi, 4)), mv));
#else
            for (int j = 0; j < 16; j++) {
                out[j] = __builtin_fmaf(db, (float)(q[j] & 15), mb);
                out[j + 16] = __builtin_fmaf(db, (float)(q[j] >> 4), mb);
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
#ifdef __AVX512F__
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
    v16f acc[NR][MR];
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) acc[a][r] = (v16f){0};
    for (long k = 0; k < K; k += 16) {
        v16f xv[MR];
        for (int r = 0; r < mr; r++) xv[r] = load16(x + r * K + k);
        for (int a = 0; a < nr; a++) {
            v16f wa = load16(w + a * K + k);
            for (int r = 0; r < mr; r++) acc[a][r] += wa * xv[r];
        }
    }
    for (int a = 0; a < nr; a++)
        for (int r = 0; r < mr; r++) y[r * ldy + a] = hsum(acc[a][r]);
}

static void micro_tile(const float *w, const float *x, long K, int nr, int mr, float *y, long ldy) {
    if (nr == NR) {
        switch (mr) {
        case 4: micro(w, x, K, NR, 4, y, ldy); return;
        case 3: micro(w, x, K, NR, 3, y, ldy); return;
        case 2: micro(w, x, K, NR, 2, y, ldy); return;
        case 1: micro(w, x, K, NR, 1, y, ldy); return;
        }
    }
    for (int a = 0; a < nr; a++) /* the last panel of a layer whose N is not a multiple of NR */
        for (int r = 0; r < mr; r++) micro(w + a * K, x + r * K, K, 1, 1, y + r * ldy + a, ldy);
}

typedef void (*dequant_fn)(const uint8_t *, const float *, const float *, long, int, float *);

/* Panels of NR weight rows are split over the OpenMP threads; each panel is rebuilt once into a
   per-thread buffer (L1/L2-resident) and applied to all M input rows. */
static int matmul(dequant_fn dequant, long row_bytes, const float *x, const uint8_t *qs, const float *d,
                  const float *m, float *y, long M, long N, long K) {
    if (K % QK) return -1;
    long nb = K / QK;
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
            dequant(qs + n * row_bytes, d + n * nb, m ? m + n * nb : NULL, K, nr, w);
            for (long i = 0; i < M; i += MR)
                micro_tile(w, x + i * K, K, nr, M - i < MR ? (int)(M - i) : MR, y + i * N + n, N);
        }
        free(w);
    }
    return failed ? -2 : 0;
}

int q4_1_matmul(const float *x, const uint8_t *qs, const float *d, const float *m, float *y, long M, long N, long K) {
    return matmul(dequant_q4_1, K / 2, x, qs, d, m, y, M, N, K);
}

int q8_0_matmul(const float *x, const uint8_t *qs, const float *d, float *y, long M, long N, long K) {
    return matmul(dequant_q8_0, K, x, qs, d, NULL, y, M, N, K);
}

/* ---- int16-activation kernels (the engine setting int16_activations; cpu_quant.py) ----

   The same product with each input row quantized per block of 32 to int16: x ~ s * xi with
   s = max|x| / 32767, so y = sum_b d_b * s_b * sum_k xi_k q_k  (+ m_b * sum_k x_k for Q4_1, with
   the exact fp32 sum). The inner sums are exact int32 (|xi q| <= 32767 * 128, 32 terms), computed
   by AVX512-VNNI's vpdpwssd, which does 32 multiply-adds per instruction where fp32 FMA does 16.
   The only new error is the rounding of x to int16: at most s/2 per element, 2^-16 of its block's
   largest, ~128x finer than bf16. Weights come pre-arranged per group of 16 output rows
   (BlockWeights.int16_layout in cpu_quant.py): each lane of a vector is one output row, each int16 pair one pair
   of consecutive k, so the input is broadcast one k-pair (one int32) at a time. */
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define HAVE_I16 1
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
#endif

int int16_kernels_available(void) {
#ifdef HAVE_I16
    return 1;
#else
    return 0;
#endif
}

int q4_1_matmul_i16(const float *x, const uint8_t *codes, const float *d, const float *m, float *y, long M, long N, long K) {
#ifdef HAVE_I16
    return matmul_i16(0, x, codes, d, m, y, M, N, K);
#else
    (void)x; (void)codes; (void)d; (void)m; (void)y; (void)M; (void)N; (void)K;
    return -3;
#endif
}

int q8_0_matmul_i16(const float *x, const uint8_t *codes, const float *d, float *y, long M, long N, long K) {
#ifdef HAVE_I16
    return matmul_i16(1, x, codes, d, NULL, y, M, N, K);
#else
    (void)x; (void)codes; (void)d; (void)y; (void)M; (void)N; (void)K;
    return -3;
#endif
}
