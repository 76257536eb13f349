/* A decode step's decoder layers in one C call (see layer.py), for the steps whose every
   linear computes from the GGUF blocks: at decode batch sizes the ~14 PyTorch calls per layer
   that this replaces cost as much as their arithmetic. Each part is one of the kernels of
   quant.c, ops.c and attention.c, in the order the model (sut/model.py) runs them. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int q4_1_matmul(const float *x, const uint8_t *qs, const float *d, const float *m, float *y, long M, long N, long K);
int q8_0_matmul(const float *x, const uint8_t *qs, const float *d, float *y, long M, long N, long K);
int q4_1_matmul_i16(const float *x, const uint8_t *codes, const float *d, const float *m, float *y, long M, long N, long K);
int q8_0_matmul_i16(const float *x, const uint8_t *codes, const float *d, float *y, long M, long N, long K);
void rms_norm_f32(const float *x, const float *residual, const float *w, float *out, float *residual_out, long rows,
                  long dim, float eps);
void rotary_f32(const float *q, long q_stride, float *q_out, float *k, long k_stride, const float *cos,
                const float *sin, long tokens, long q_heads, long kv_heads, long dim);
void store_kv_f32(const float *k, long k_stride, const float *v, long v_stride, float *k_cache, float *v_cache,
                  const int64_t *slots, long tokens, long row);
void silu_mul_f32(const float *gate_up, float *out, long rows, long inter);
int paged_decode_attention(const float *q, float *out, const int64_t *rows, const int32_t *seq_lens,
                           const int32_t *tables, long n, long max_blocks, const float *k_cache,
                           const float *v_cache, long block_size, long heads, long kv_heads, long dim, float scale);

/* One linear layer's blocks (quant.py's BlockWeights; for int16, its int16_layout). */
struct linear {
    int kind; /* 0 Q4_1, 1 Q8_0, 2 Q4_1 with int16 inputs, 3 Q8_0 with int16 inputs */
    const uint8_t *codes;
    const float *d, *m;
    long rows, cols;
};

static int apply(const struct linear *l, const float *x, float *y, long M) {
    switch (l->kind) {
    case 0: return q4_1_matmul(x, l->codes, l->d, l->m, y, M, l->rows, l->cols);
    case 1: return q8_0_matmul(x, l->codes, l->d, y, M, l->rows, l->cols);
    case 2: return q4_1_matmul_i16(x, l->codes, l->d, l->m, y, M, l->rows, l->cols);
    case 3: return q8_0_matmul_i16(x, l->codes, l->d, y, M, l->rows, l->cols);
    }
    return -4;
}

/* residual_out = x + residual (x alone when residual is NULL: the first layer), normed by norm_w,
   times qkv into qkv_out [M, (heads + 2 kv_heads) dim]; q rotated into q_out [M, heads, dim] and
   k in place, then k and v written to their cache slots. */
static int layer_attention_input(const float *x, const float *residual, float *residual_out, const float *norm_w, float eps,
                          const struct linear *qkv, float *qkv_out, float *q_out, const float *cos, const float *sin,
                          float *k_cache, float *v_cache, const int64_t *slots, long M, long heads, long kv_heads,
                          long dim) {
    long hidden = qkv->cols, width = qkv->rows, kv = kv_heads * dim;
    float *normed = malloc(M * hidden * sizeof(float));
    if (!normed) return -2;
    if (!residual) memcpy(residual_out, x, M * hidden * sizeof(float));
    rms_norm_f32(x, residual, norm_w, normed, residual_out, M, hidden, eps);
    int rc = apply(qkv, normed, qkv_out, M);
    free(normed);
    if (rc) return rc;
    float *k = qkv_out + heads * dim, *v = k + kv;
    rotary_f32(qkv_out, width, q_out, k, width, cos, sin, M, heads, kv_heads, dim);
    store_kv_f32(k, width, v, width, k_cache, v_cache, slots, M, kv);
    return 0;
}

/* h = attn @ o^T; residual_out = h + residual; out = down(silu(gate) * up) of its norm. */
static int layer_mlp(const float *attn, const struct linear *o, const float *residual, float *residual_out,
              const float *norm_w, float eps, const struct linear *gate_up, const struct linear *down, float *out,
              long M) {
    long hidden = o->rows, inter = down->cols;
    float *h = malloc(M * hidden * sizeof(float)), *normed = malloc(M * hidden * sizeof(float));
    float *gu = malloc(M * 2 * inter * sizeof(float)), *act = malloc(M * inter * sizeof(float));
    int rc = !h || !normed || !gu || !act ? -2 : apply(o, attn, h, M);
    if (!rc) {
        rms_norm_f32(h, residual, norm_w, normed, residual_out, M, hidden, eps);
        rc = apply(gate_up, normed, gu, M);
    }
    if (!rc) {
        silu_mul_f32(gu, act, M, inter);
        rc = apply(down, act, out, M);
    }
    free(h);
    free(normed);
    free(gu);
    free(act);
    return rc;
}

/* One decoder layer's weights and cache (layer.py's LayerWeights). */
struct layer {
    struct linear qkv, o, gate_up, down;
    const float *input_norm, *post_attention_norm;
    float *k_cache, *v_cache; /* [blocks, block_size, kv_heads, dim] */
};

/* All layers for M sequences with one new token each (row i is sequence i's), from the embeddings
   x: the last layer's output to `out` and its residual to `residual` (both [M, hidden]), as the
   model's loop leaves them before its final norm. Sequence i has seq_lens[i] tokens, this one
   included (already counted), in the blocks of tables[i]; its new key and value go to slots[i]. */
int decode_layers(const struct layer *layers, long n_layers, const float *x, float *out, float *residual,
                  const float *cos, const float *sin, const int64_t *slots, const int64_t *rows,
                  const int32_t *seq_lens, const int32_t *tables, long max_blocks, long block_size, long M,
                  long heads, long kv_heads, long dim, float eps, float scale) {
    long hidden = layers[0].o.rows, width = layers[0].qkv.rows;
    float *qkv = malloc(M * width * sizeof(float)), *q = malloc(M * heads * dim * sizeof(float));
    float *attn = malloc(M * heads * dim * sizeof(float)), *mid = malloc(M * hidden * sizeof(float));
    float *h = malloc(M * hidden * sizeof(float));
    int rc = !qkv || !q || !attn || !mid || !h ? -2 : 0;
    for (long i = 0; i < n_layers && !rc; i++) {
        const struct layer *l = layers + i;
        /* layer i's input is x for the first, else the previous output h (its residual in `residual`) */
        rc = layer_attention_input(i ? h : x, i ? residual : NULL, mid, l->input_norm, eps, &l->qkv, qkv, q, cos,
                                   sin, l->k_cache, l->v_cache, slots, M, heads, kv_heads, dim);
        if (!rc)
            rc = paged_decode_attention(q, attn, rows, seq_lens, tables, M, max_blocks, l->k_cache, l->v_cache,
                                        block_size, heads, kv_heads, dim, scale);
        if (!rc)
            rc = layer_mlp(attn, &l->o, mid, residual, l->post_attention_norm, eps, &l->gate_up, &l->down,
                           i + 1 < n_layers ? h : out, M);
    }
    free(qkv);
    free(q);
    free(attn);
    free(mid);
    free(h);
    return rc;
}
