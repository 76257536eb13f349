/* The CPU engine's elementwise ops in fp32 (see ops.py): RMSNorm with the residual add before
   it, rotary embedding, the KV-cache write and SiLU-and-multiply. Each replaces several PyTorch
   calls per layer, whose dispatch costs more than the arithmetic at decode batch sizes. Plain C
   loops that compilers vectorize at every instruction-set level; numerics as the PyTorch
   references in kernels/ (the sums in another order). Rows are split over the OpenMP threads when
   there are enough of them to pay for it. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define PARALLEL_MIN 32768 /* elements: below this one thread is faster */

typedef float v8f __attribute__((vector_size(32)));
typedef int32_t v8i __attribute__((vector_size(32)));

/* exp(x) for x <= 0 on 8 lanes: Cephes' expf polynomial (about 1 ulp) times 2^n; below -87 the
   result is 0. Written with the compiler's vectors: plain loops of this do not vectorize. */
static inline v8f exp8(v8f x) {
    v8i tiny = x < -87.0f;
    x = (v8f)(((v8i)x & ~tiny) | ((v8i)((v8f){0} - 87.0f) & tiny));
    v8i e = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, v8i); /* round to nearest for x <= 0 */
    v8f fn = __builtin_convertvector(e, v8f);
    v8f r = x - fn * 0.693359375f;
    r = r - fn * -2.12194440e-4f;
    v8f q = r * 1.9875691500e-4f + 1.3981999507e-3f;
    q = q * r + 8.3334519073e-3f;
    q = q * r + 4.1665795894e-2f;
    q = q * r + 1.6666665459e-1f;
    q = q * r + 5.0000001201e-1f;
    v8f y = (q * (r * r) + r + 1.0f) * (v8f)((e + 127) << 23);
    return (v8f)((v8i)y & ~tiny);
}

/* p[i] = exp(p[i]) for p[i] <= 0. Used by the softmax of attention.c too. */
void exp_nonpositive_f32(float *p, long n) {
    long i = 0;
    for (; i + 8 <= n; i += 8) {
        v8f x;
        memcpy(&x, p + i, sizeof x);
        x = exp8(x);
        memcpy(p + i, &x, sizeof x);
    }
    if (i < n) {
        v8f x = {0};
        memcpy(&x, p + i, (n - i) * sizeof(float));
        x = exp8(x);
        memcpy(p + i, &x, (n - i) * sizeof(float));
    }
}

/* out = rms_norm(x [+ residual]) * w per row; with a residual, residual_out = x + residual. */
void rms_norm_f32(const float *x, const float *residual, const float *w, float *out, float *residual_out, long rows,
                  long dim, float eps) {
#pragma omp parallel for schedule(static) if (rows * dim >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *o = out + r * dim;
        if (residual) {
            float *s = residual_out + r * dim;
            for (long i = 0; i < dim; i++) s[i] = xr[i] + residual[r * dim + i];
            xr = s;
        }
        float squares[8] = {0}; /* 8 partial sums: a reduction compilers vectorize */
        long i = 0;
        for (; i + 8 <= dim; i += 8)
            for (int j = 0; j < 8; j++) squares[j] += xr[i + j] * xr[i + j];
        float total = 0;
        for (; i < dim; i++) total += xr[i] * xr[i];
        for (int j = 0; j < 8; j++) total += squares[j];
        float scale = 1.0f / sqrtf(total / (float)dim + eps);
        for (i = 0; i < dim; i++) o[i] = w[i] * (xr[i] * scale);
    }
}

/* Rotate-half rope of each token's query heads (q -> q_out, contiguous) and key heads (in place),
   by the token's cos/sin rows [dim]. */
void rotary_f32(const float *q, long q_stride, float *q_out, float *k, long k_stride, const float *cos,
                const float *sin, long tokens, long q_heads, long kv_heads, long dim) {
    long half = dim / 2;
#pragma omp parallel for schedule(static) if (tokens * (q_heads + kv_heads) * dim >= PARALLEL_MIN)
    for (long t = 0; t < tokens; t++) {
        const float *c = cos + t * dim, *s = sin + t * dim;
        for (long h = 0; h < q_heads + kv_heads; h++) {
            const float *x = h < q_heads ? q + t * q_stride + h * dim : k + t * k_stride + (h - q_heads) * dim;
            float *o = h < q_heads ? q_out + (t * q_heads + h) * dim : k + t * k_stride + (h - q_heads) * dim;
            float tmp[512];
            for (long i = 0; i < half; i++) {
                tmp[i] = x[i] * c[i] - x[i + half] * s[i];
                tmp[i + half] = x[i + half] * c[i + half] + x[i] * s[i + half];
            }
            memcpy(o, tmp, dim * sizeof(float));
        }
    }
}

/* Token t's key and value rows (`row` floats) to cache slot slots[t]; slot -1 is skipped. */
void store_kv_f32(const float *k, long k_stride, const float *v, long v_stride, float *k_cache, float *v_cache,
                  const int64_t *slots, long tokens, long row) {
    for (long t = 0; t < tokens; t++) {
        if (slots[t] < 0) continue;
        memcpy(k_cache + slots[t] * row, k + t * k_stride, row * sizeof(float));
        memcpy(v_cache + slots[t] * row, v + t * v_stride, row * sizeof(float));
    }
}

/* out[r] = silu(gate) * up, with gate_up[r] = [gate | up], each `inter` wide. */
void silu_mul_f32(const float *gate_up, float *out, long rows, long inter) {
#pragma omp parallel for schedule(static) if (rows * inter >= PARALLEL_MIN)
    for (long r = 0; r < rows; r++) {
        const float *g = gate_up + r * 2 * inter, *u = g + inter;
        float *o = out + r * inter;
        for (long i = 0; i < inter; i++) o[i] = -fabsf(g[i]);
        exp_nonpositive_f32(o, inter); /* e = exp(-|g|): silu(g) = g / (1 + exp(-g)) without overflow */
        for (long i = 0; i < inter; i++) {
            float e = o[i];
            o[i] = (g[i] >= 0 ? g[i] : g[i] * e) / (1.0f + e) * u[i];
        }
    }
}
