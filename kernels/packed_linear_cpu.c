/* The CPU's packed linear (issue 21): out[m, n] = sum_k x[m, k] * w[n, k], with w kept as
 * affine codes (lanes.packed: w = scale * code + bias per group of inputs; 4-bit codes two to a
 * byte, the even input in the low nibble; 8-bit codes one to a byte) and dequantized in
 * registers, so a decode step reads a quarter (or half) of the float32 weights' bytes.
 *
 * Batch invariance: every row's sum is the same sequence of float operations, whatever the
 * number of rows in the call, the row's place in it, the thread that computes its column or
 * the number of threads: 32 partial sums (two vectors) walk the inputs in order, each weight
 * dequantized as scale * code + bias (exact in float32 for llama.cpp's fp16 scales and small
 * codes, so the weights lanes.packed.dequantize makes), then the partials are added in a fixed tree.
 * Rows share a dequantized weight vector ROWS at a time (prefill and verify read the codes once
 * per ROWS rows); that changes which rows are computed together, never a row's operations.
 *
 * Portable C (vector_cpu.h) with AVX-512 and AVX2 paths for the codes' unpacking. Built at first use by
 * kernels/native.py; threads come from OpenMP where the compiler has it.
 */
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "vector_cpu.h"

#define ROWS 6        /* rows that share one dequantized weight vector */
#define COLS 1        /* columns that share one input vector (tile() takes up to COLS) */
#define COLUMN_TILE 8 /* output columns per unit of thread work */

/* A group's 32-input chunk of weights, scale * code + bias: w0 for the 16 low nibbles of 16
 * bytes (4 bits) or 16 bytes (8 bits), w1 for the high nibbles or the next 16 bytes. `table`
 * holds scale * q + bias for q = 0..15 (4 bits): with AVX-512 a 4-bit weight is a lookup in it
 * (one shuffle instead of a conversion and an FMA); the values are the same either way. */
static inline void dequantize_chunk(const uint8_t *p, int bits, f32x16 scale, f32x16 bias,
                                    f32x16 table, f32x16 *w0, f32x16 *w1) {
    if (bits == 32) { /* float32 weights as they are (an EAGLE head's own linears) */
        *w0 = load16((const float *)p);
        *w1 = load16((const float *)p + 16);
        return;
    }
#if defined(__AVX512F__)
    const __m512i a = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    if (bits == 4) {
        *w0 = (f32x16)_mm512_permutexvar_ps(_mm512_and_si512(a, _mm512_set1_epi32(15)),
                                            (__m512)table);
        *w1 = (f32x16)_mm512_permutexvar_ps(_mm512_srli_epi32(a, 4), (__m512)table);
    } else {
        const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(p + 16)));
        *w0 = fma16((f32x16)_mm512_cvtepi32_ps(a), scale, bias);
        *w1 = fma16((f32x16)_mm512_cvtepi32_ps(b), scale, bias);
    }
#elif defined(LANES_VECTOR_AVX2)
    (void)table; /* eight codes widened to eight floats at a time, then scale * code + bias */
    const __m128i raw = _mm_loadu_si128((const __m128i *)p), nibble = _mm_set1_epi8(15);
    const __m128i q0 = bits == 4 ? _mm_and_si128(raw, nibble) : raw;
    const __m128i q1 = bits == 4 ? _mm_and_si128(_mm_srli_epi16(raw, 4), nibble)
                                 : _mm_loadu_si128((const __m128i *)(p + 16));
    const f32x16 lo = {{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q0)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q0, 8)))}};
    const f32x16 hi = {{_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q1)),
                        _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q1, 8)))}};
    *w0 = fma16(lo, scale, bias);
    *w1 = fma16(hi, scale, bias);
#else
    (void)table;
    f32x16 lo, hi;
    for (int j = 0; j < 16; j++) { /* the compiler vectorizes what it can */
        lo[j] = (float)(bits == 4 ? p[j] & 15 : p[j]);
        hi[j] = (float)(bits == 4 ? p[j] >> 4 : p[j + 16]);
    }
    *w0 = fma16(lo, scale, bias);
    *w1 = fma16(hi, scale, bias);
#endif
}

/* A tile of `rows` rows by `cols` output columns (constants where it is inlined, so the
 * partial sums stay in registers). xs holds the rows' inputs in code order: at 4 bits each 32
 * inputs as the 16 even ones, then the 16 odd ones (the nibbles' order). Every (row, column)
 * keeps two vectors of partial sums, one per half of a chunk, each an FMA chain that walks the
 * chunks in order; they are added in a fixed order at the end. The tile's shape only decides
 * which chains run side by side (sharing a dequantized chunk across rows, an input vector
 * across columns), never a chain's operations. A short last tile repeats its last column
 * (computed, not stored). */
static inline __attribute__((always_inline)) void tile(
    const float *xs, int64_t x_stride, const int rows, const int cols, int64_t k, int bits,
    int64_t group, const uint8_t *codes, int64_t code_stride, const float *scales,
    const float *biases, int64_t groups, int valid_cols, float *out, int64_t out_stride) {
    static const float counting[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
    const f32x16 iota = load16(counting);
    f32x16 acc[ROWS][COLS][2];
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) acc[r][c][0] = acc[r][c][1] = zero16();
    int64_t col[COLS];
    for (int c = 0; c < cols; c++) col[c] = c < valid_cols ? c : valid_cols - 1;
    const int64_t per_group = group / 32;
    int64_t g = 0, left = per_group; /* the group counted along (no division per chunk) */
    for (int64_t i = 0; i < k; i += 32) {
        f32x16 w0[COLS], w1[COLS];
        for (int c = 0; c < cols; c++) {
            const f32x16 scale = splat16(bits == 32 ? 1.0f : scales[col[c] * groups + g]);
            const f32x16 bias = splat16(bits == 32 ? 0.0f : biases[col[c] * groups + g]);
            dequantize_chunk(codes + col[c] * code_stride + i * bits / 8, bits, scale, bias,
                             fma16(iota, scale, bias), &w0[c], &w1[c]);
        }
        for (int r = 0; r < rows; r++) {
            const f32x16 x0 = load16(xs + r * x_stride + i);
            const f32x16 x1 = load16(xs + r * x_stride + i + 16);
            for (int c = 0; c < cols; c++) {
                acc[r][c][0] = fma16(x0, w0[c], acc[r][c][0]);
                acc[r][c][1] = fma16(x1, w1[c], acc[r][c][1]);
            }
        }
        if (--left == 0) g++, left = per_group;
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols && c < valid_cols; c++)
            out[r * out_stride + c] = fixed_tree_sum(add16(acc[r][c][0], acc[r][c][1]));
}

#define TILE(R, C)                                                                               \
    static void tile_##R##x##C(const float *xs, int64_t k, int bits, int64_t group,              \
                               const uint8_t *codes, int64_t code_stride, const float *scales,  \
                               const float *biases, int64_t groups, int valid_cols, float *out, \
                               int64_t out_stride) {                                            \
        tile(xs, k, R, C, k, bits, group, codes, code_stride, scales, biases, groups,            \
             valid_cols, out, out_stride);                                                      \
    }
TILE(1, 1)
TILE(2, 1)
TILE(3, 1)
TILE(4, 1)
TILE(5, 1)
TILE(6, 1)
typedef void (*tile_fn)(const float *, int64_t, int, int64_t, const uint8_t *, int64_t,
                        const float *, const float *, int64_t, int, float *, int64_t);
/* every tile walks one column: its codes are then one forward stream, which the prefetcher
 * keeps up with best; the rows share each dequantized chunk. Two columns per tile (sharing an
 * input vector) made a verify's rows dearer: the default model's 8-bit LM head took 2.45 ms
 * for 2 rows against 1.47 ms one column at a time (bench/NOTES.md, twentieth session). */
static const tile_fn TILES[ROWS + 1] = {0, tile_1x1, tile_2x1, tile_3x1, tile_4x1, tile_5x1,
                                        tile_6x1};

/* x [m, k] -> xs [m, k] in code order (see tile). With glu, x is [m, 2k], a gate and
 * an up projection side by side, and the input is silu(gate) * up (the MLP's down projection). */
static inline float input_at(const float *row, int64_t i, int64_t k, int glu) {
    if (!glu) return row[i];
    const float gate = row[i];
    return gate / (1.0f + expf(-gate)) * row[k + i];
}

static void to_code_order(const float *x, float *xs, int64_t m, int64_t k, int bits, int glu) {
    const int64_t width = glu ? 2 * k : k;
    for (int64_t r = 0; r < m; r++) {
        const float *src = x + r * width;
        float *dst = xs + r * k;
        if (bits != 4) {
            for (int64_t i = 0; i < k; i++) dst[i] = input_at(src, i, k, glu);
            continue;
        }
        for (int64_t i = 0; i < k; i += 32)
            for (int j = 0; j < 16; j++) {
                dst[i + j] = input_at(src, i + 2 * j, k, glu);
                dst[i + 16 + j] = input_at(src, i + 2 * j + 1, k, glu);
            }
    }
}

/* out [m, n] = x [m, k] @ w.T, w [n, k] from codes [n, k * bits / 8], scales and biases
 * [n, k / group]; with glu, x [m, 2k] and the input silu(x[:, :k]) * x[:, k:]. bits 4 or 8;
 * group a multiple of 32 dividing k; bits 32: w itself, float32 [n, k] (scales and biases
 * unread). Returns 0, -1 for arguments it does not take (the caller
 * checks them first), -2 when out of memory. */
int lanes_packed_linear(const float *x, int64_t m, int64_t k, int glu, const uint8_t *codes,
                        const float *scales, const float *biases, int64_t n, int bits,
                        int64_t group, float *out) {
    if ((bits != 4 && bits != 8 && bits != 32) || group % 32 != 0 || k % group != 0) return -1;
    if (m == 0) return 0;
    float *scratch = malloc(sizeof(float) * (size_t)(m * k));
    if (scratch == NULL) return -2;
    to_code_order(x, scratch, m, k, bits, glu);
    const int64_t code_stride = k * bits / 8, groups = k / group;
    const int64_t tiles = (n + COLUMN_TILE - 1) / COLUMN_TILE;
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; t++) {
        const int64_t first = t * COLUMN_TILE;
        const int64_t last = first + COLUMN_TILE < n ? first + COLUMN_TILE : n;
        for (int64_t r = 0; r < m; r += ROWS) {
            const int rows = m - r < ROWS ? (int)(m - r) : ROWS;
            for (int64_t c = first; c < last; c++)
                TILES[rows](scratch + r * k, k, bits, group, codes + c * code_stride,
                            code_stride, scales + c * groups, biases + c * groups, groups, 1,
                            out + r * n + c, n);
        }
    }
    free(scratch);
    return 0;
}
