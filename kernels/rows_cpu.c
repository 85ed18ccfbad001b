/* The CPU's row-wise steps of a layer (issue 21), float32: the residual add with its RMSNorm,
 * and RoPE with the KV write. One call per layer step instead of the 6-12 torch ops each took,
 * most of a small model's decode time on a CPU being per-op overhead.
 *
 * Batch invariance: every row is computed alone, by the same operations in the same order (the
 * norm's sum of squares: 16 lanes, then a fixed tree), whatever the number of rows.
 *
 * Built at first use by kernels/native.py (vector_cpu.h: the vector type and its helpers).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "vector_cpu.h"

/* out[r] = weight * (s * rsqrt(mean(s^2) + eps)) with s = x[r] (+ residual[r], stored to
 * summed when given). Rows contiguous, dim a multiple of 16. */
int lanes_rms_norm(const float *x, const float *residual, int64_t rows, int64_t dim,
                   const float *weight, float eps, float *summed, float *out) {
    if (dim % 16 != 0) return -1;
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * dim;
        float *sr = summed ? summed + r * dim : out + r * dim;
        f32x16 squares = zero16();
        for (int64_t i = 0; i < dim; i += 16) {
            f32x16 s = load16(xr + i);
            if (residual) s = add16(load16(residual + r * dim + i), s);
            store16(sr + i, s);
            squares = fma16(s, s, squares);
        }
        const float scale = 1.0f / sqrtf(fixed_tree_sum(squares) / (float)dim + eps);
        const f32x16 scale16 = splat16(scale);
        for (int64_t i = 0; i < dim; i += 16)
            store16(out + r * dim + i, mul16(load16(weight + i), mul16(load16(sr + i), scale16)));
    }
    return 0;
}

/* Rotate-half RoPE on the first rope_dim dims of every head of x [tokens, heads, d] (rows
 * x_stride floats apart) with cos, sin [tokens, rope_dim / 2], into out [tokens, heads, d]
 * (rows out_stride floats apart); the dims past rope_dim are copied. */
static void rope_rows(const float *x, int64_t x_stride, int64_t tokens, int64_t heads, int64_t d,
                      int64_t rope_dim, const float *cos, const float *sin, float *out,
                      const int64_t *out_rows, int64_t out_stride) {
    const int64_t half = rope_dim / 2;
    for (int64_t t = 0; t < tokens; t++) {
        const float *c = cos + t * half, *s = sin + t * half;
        float *o_row = out + (out_rows ? out_rows[t] : t) * out_stride;
        for (int64_t h = 0; h < heads; h++) {
            const float *xh = x + t * x_stride + h * d;
            float *oh = o_row + h * d;
            for (int64_t i = 0; i < half; i++) {
                const float x1 = xh[i], x2 = xh[i + half];
                oh[i] = x1 * c[i] - x2 * s[i];
                oh[i + half] = x2 * c[i] + x1 * s[i];
            }
            if (rope_dim < d) memcpy(oh + rope_dim, xh + rope_dim, sizeof(float) * (d - rope_dim));
        }
    }
}

/* A layer's attention inputs: q rotated into q_out [tokens, heads, d]; k rotated and v copied
 * into the caches [slots, kv_heads, d] at slots [tokens]. q, k and v rows are q_stride,
 * kv_stride floats apart (column views of one fused projection). */
int lanes_rope_write(const float *q, int64_t q_stride, const float *k, const float *v,
                     int64_t kv_stride, int64_t tokens, int64_t heads, int64_t kv_heads, int64_t d,
                     int64_t rope_dim, const float *cos, const float *sin, const int64_t *slots,
                     float *q_out, float *k_cache, float *v_cache) {
    if (rope_dim % 2 != 0 || rope_dim > d) return -1;
    rope_rows(q, q_stride, tokens, heads, d, rope_dim, cos, sin, q_out, NULL, heads * d);
    rope_rows(k, kv_stride, tokens, kv_heads, d, rope_dim, cos, sin, k_cache, slots, kv_heads * d);
    for (int64_t t = 0; t < tokens; t++)
        memcpy(v_cache + slots[t] * kv_heads * d, v + t * kv_stride, sizeof(float) * kv_heads * d);
    return 0;
}
