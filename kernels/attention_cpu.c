/* The CPU's exact attention (issue 21): causal attention of one lane's queries over its paged
 * keys and values, float32, one (query, head) at a time.
 *
 * Batch invariance: a query's result is a function of its own position and the keys up to it,
 * computed by the same sequence of float operations in prefill, decode and verify: the scores
 * are 16-lane dot products summed in a fixed tree, the softmax's max is exact in any order, and
 * the exponentials, their sum and the weighted values are accumulated key by key in ascending
 * position. No query ever sees how many other queries, lanes or threads share the call.
 *
 * Built at first use by kernels/native.py (vector_cpu.h: the vector type and its helpers).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector_cpu.h"

#define MAX_HEAD_DIM 256 /* head_dim: a multiple of 16 up to this */

static inline float dot(const float *a, const float *b, int d) {
    f32x16 acc = zero16();
    for (int i = 0; i < d; i += 16) acc = fma16(load16(a + i), load16(b + i), acc);
    return fixed_tree_sum(acc);
}

/* q [num_queries, heads, d] at positions first_position + i; caches [slots, kv_heads, d];
 * kv_slots [first_position + num_queries]; out like q. Returns 0, -1 for shapes it does not
 * take, -2 when out of memory. */
int lanes_attention(const float *q, int64_t num_queries, int64_t heads, int64_t kv_heads,
                    int64_t d, const float *k_cache, const float *v_cache, const int64_t *kv_slots,
                    int64_t first_position, float scale, float *out) {
    if (d % 16 != 0 || d > MAX_HEAD_DIM || heads % kv_heads != 0) return -1;
    const int64_t group = heads / kv_heads, row = kv_heads * d, pairs = num_queries * heads;
    int failed = 0;
#pragma omp parallel reduction(| : failed)
    {
        float *s = malloc(sizeof(float) * (size_t)(first_position + num_queries));
        failed = s == NULL;
#pragma omp for schedule(static)
        for (int64_t pair = 0; pair < pairs; pair++) {
            if (s == NULL) continue;
            const int64_t i = pair / heads, h = pair % heads, kvh = h / group;
            const int64_t visible = first_position + i + 1;
            const float *qh = q + pair * d;
            float top = -INFINITY;
            for (int64_t j = 0; j < visible; j++) {
                s[j] = dot(qh, k_cache + kv_slots[j] * row + kvh * d, (int)d) * scale;
                top = s[j] > top ? s[j] : top;
            }
            f32x16 acc[MAX_HEAD_DIM / 16];
            for (int c = 0; c < d / 16; c++) acc[c] = zero16();
            float denom = 0.0f;
            for (int64_t j = 0; j < visible; j++) {
                const float p = expf(s[j] - top);
                const f32x16 pv = splat16(p);
                const float *vj = v_cache + kv_slots[j] * row + kvh * d;
                denom += p;
                for (int c = 0; c < d / 16; c++) acc[c] = fma16(pv, load16(vj + 16 * c), acc[c]);
            }
            const f32x16 inv = splat16(1.0f / denom);
            for (int c = 0; c < d / 16; c++) store16(out + pair * d + 16 * c, mul16(acc[c], inv));
        }
        free(s);
    }
    return failed ? -2 : 0;
}
