/* Decode attention on CPU over the paged KV cache, read in place (see ops.py).

   One query token per sequence attends to all `seq_lens[i]` cached tokens of its sequence, found
   through its block table; the query heads that share a KV head are done together, so each cached
   key and value is read once. Softmax in fp32 as SDPA's: scores scaled, max subtracted, exp,
   normalized at the end. Compiled per instruction-set level as quant.c is: AVX-512
   intrinsics, or the compiler's vectors of VW floats (AVX2, and portable C for any CPU). Needs a
   head size that is a multiple of 16 (the caller checks `decode_attention_available`). */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__) && \
    defined(__AVX512VNNI__)
#define ATT_AVX512 1
#include <immintrin.h>
#endif

#define MAX_GROUP 8 /* query heads per KV head */
#define MAX_DIM 256

#ifdef ATT_AVX512
/* exp(x) for x <= 0 (scores minus their max): 2^n * exp(r), |r| <= ln2 / 2, with Cephes' expf
   polynomial (about 1 ulp); below -104 the result is 0, as expf's. */
static inline __m512 exp_nonpositive(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, n);
}

/* One (sequence, KV head): `group` query heads `qh` over `len` cached tokens -> `o`. */
static inline __attribute__((always_inline)) void attend(const float *qh, float *o, const int32_t *table, long len, const float *k_cache,
                   const float *v_cache, long block_size, long kv_heads, long h, long group, long dim, float scale,
                   float *scores) {
    long nv = dim / 16;
    __m512 top[MAX_GROUP], total[MAX_GROUP], acc[MAX_GROUP][MAX_DIM / 16];
    for (long g = 0; g < group; g++) top[g] = _mm512_set1_ps(-INFINITY);
    for (long t = 0; t < len; t++) {
        const float *key = k_cache + ((table[t / block_size] * block_size + t % block_size) * kv_heads + h) * dim;
        for (long g = 0; g < group; g++) {
            __m512 s = _mm512_setzero_ps();
            for (long j = 0; j < nv; j++) s = _mm512_fmadd_ps(_mm512_loadu_ps(qh + g * dim + 16 * j), _mm512_loadu_ps(key + 16 * j), s);
            scores[g * len + t] = _mm512_reduce_add_ps(s) * scale;
        }
    }
    for (long g = 0; g < group; g++) {
        float *sg = scores + g * len;
        for (long t = 0; t < len; t += 16) {
            __mmask16 m = len - t >= 16 ? 0xFFFF : (__mmask16)((1u << (len - t)) - 1);
            top[g] = _mm512_mask_max_ps(top[g], m, top[g], _mm512_maskz_loadu_ps(m, sg + t));
        }
        __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top[g]));
        total[g] = _mm512_setzero_ps();
        for (long t = 0; t < len; t += 16) {
            __mmask16 m = len - t >= 16 ? 0xFFFF : (__mmask16)((1u << (len - t)) - 1);
            __m512 p = _mm512_maskz_mov_ps(m, exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, sg + t), mx)));
            _mm512_mask_storeu_ps(sg + t, m, p);
            total[g] = _mm512_add_ps(total[g], p);
        }
        for (long j = 0; j < nv; j++) acc[g][j] = _mm512_setzero_ps();
    }
    for (long t = 0; t < len; t++) {
        const float *value = v_cache + ((table[t / block_size] * block_size + t % block_size) * kv_heads + h) * dim;
        for (long g = 0; g < group; g++) {
            __m512 p = _mm512_set1_ps(scores[g * len + t]);
            for (long j = 0; j < nv; j++) acc[g][j] = _mm512_fmadd_ps(p, _mm512_loadu_ps(value + 16 * j), acc[g][j]);
        }
    }
    for (long g = 0; g < group; g++) {
        __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(total[g]));
        for (long j = 0; j < nv; j++) _mm512_storeu_ps(o + g * dim + 16 * j, _mm512_mul_ps(acc[g][j], inv));
    }
}
#else
#ifdef __AVX2__
#define VW 8
#else
#define VW 4
#endif
typedef float vf __attribute__((vector_size(VW * 4)));

static inline vf loadv(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void storev(float *p, vf v) { memcpy(p, &v, sizeof v); }

static inline float hsum(vf v) {
    float s = 0;
    for (int j = 0; j < VW; j++) s += v[j];
    return s;
}

void exp_nonpositive_f32(float *p, long n); /* ops.c */

/* One (sequence, KV head): `group` query heads `qh` over `len` cached tokens -> `o`. */
static inline __attribute__((always_inline)) void attend(const float *qh, float *o, const int32_t *table, long len,
                                                         const float *k_cache, const float *v_cache, long block_size,
                                                         long kv_heads, long h, long group, long dim, float scale,
                                                         float *scores) {
    long nv = dim / VW;
    for (long t = 0; t < len; t++) {
        const float *key = k_cache + ((table[t / block_size] * block_size + t % block_size) * kv_heads + h) * dim;
        for (long g = 0; g < group; g++) {
            vf s = {0};
            for (long j = 0; j < nv; j++) s += loadv(qh + g * dim + VW * j) * loadv(key + VW * j);
            scores[g * len + t] = hsum(s) * scale;
        }
    }
    float inv[MAX_GROUP];
    for (long g = 0; g < group; g++) {
        float *sg = scores + g * len, top = -INFINITY, total = 0;
        for (long t = 0; t < len; t++) top = sg[t] > top ? sg[t] : top;
        for (long t = 0; t < len; t++) sg[t] -= top;
        exp_nonpositive_f32(sg, len);
        for (long t = 0; t < len; t++) total += sg[t];
        inv[g] = 1.0f / total;
    }
    /* The weighted sum of values, 4 vectors of each head at a time, so the accumulators of a
       group (3 x 4 for SmolLM2) stay in registers. */
    for (long j0 = 0; j0 < nv; j0 += 4) {
        vf acc[MAX_GROUP][4] = {{{0}}};
        long nj = nv - j0 < 4 ? nv - j0 : 4;
        for (long t = 0; t < len; t++) {
            const float *value = v_cache + ((table[t / block_size] * block_size + t % block_size) * kv_heads + h) * dim
                                 + VW * j0;
            for (long g = 0; g < group; g++) {
                float p = scores[g * len + t];
                for (long j = 0; j < nj; j++) acc[g][j] += p * loadv(value + VW * j);
            }
        }
        for (long g = 0; g < group; g++)
            for (long j = 0; j < nj; j++) storev(o + g * dim + VW * (j0 + j), acc[g][j] * inv[g]);
    }
}
#endif

int decode_attention_available(long heads, long kv_heads, long dim) {
    return heads % kv_heads == 0 && heads / kv_heads <= MAX_GROUP && dim % 16 == 0 && dim <= MAX_DIM;
}

/* q, out: [tokens, heads, dim]; rows[i]: sequence i's query row; tables: [n, max_blocks];
   caches: [blocks, block_size, kv_heads, dim]. */
int paged_decode_attention(const float *q, float *out, const int64_t *rows, const int32_t *seq_lens,
                           const int32_t *tables, long n, long max_blocks, const float *k_cache,
                           const float *v_cache, long block_size, long heads, long kv_heads, long dim, float scale) {
    if (!decode_attention_available(heads, kv_heads, dim)) return -1;
    long group = heads / kv_heads, max_len = 0;
    for (long i = 0; i < n; i++) max_len = seq_lens[i] > max_len ? seq_lens[i] : max_len;
    int failed = 0;
#pragma omp parallel
    {
        float *scores = malloc(group * max_len * sizeof(float));
        if (!scores) {
#pragma omp atomic write
            failed = 1;
        }
#pragma omp for schedule(static)
        for (long task = 0; task < n * kv_heads; task++) {
            if (!scores) continue;
            long i = task / kv_heads, h = task % kv_heads, first = (rows[i] * heads + h * group) * dim;
            if (group == 3 && dim == 64) /* SmolLM2's shape: constants let the accumulators live in registers */
                attend(q + first, out + first, tables + i * max_blocks, seq_lens[i], k_cache, v_cache, block_size,
                       kv_heads, h, 3, 64, scale, scores);
            else
                attend(q + first, out + first, tables + i * max_blocks, seq_lens[i], k_cache, v_cache, block_size,
                       kv_heads, h, group, dim, scale, scores);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}
