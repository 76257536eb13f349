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
