/* What the CPU's C kernels share (the kernels/..._cpu.c files): a 16-float vector, its
 * arithmetic, loads and stores, and the fixed tree that sums its lanes.
 *
 * With AVX2 (and no AVX-512) the vector is two 256-bit registers held in a struct. GCC lowers a
 * 64-byte generic vector on 32-byte registers through the stack — every FMA a round trip of
 * spills — which made the packed linear 6x slower than torch's matmul on a Zen 3 (bench/NOTES.md,
 * twenty-eighth session). Elsewhere it is GCC's generic vector, which the compiler maps onto one
 * AVX-512 register, four NEON ones, or scalar code. Both forms do the same float operations
 * lane by lane and sum in the same tree, so a kernel's bits do not depend on which one built it.
 *
 * The kernels are built with -ffp-contract=off (kernels/native.py), so the compiler never fuses
 * a multiply and an add on its own — it could decide differently in different copies of a loop,
 * and a row's bits would then depend on which copy ran it. */
#ifndef LANES_VECTOR_CPU_H
#define LANES_VECTOR_CPU_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define LANES_VECTOR_AVX2 1
typedef struct {
    __m256 h[2]; /* lanes 0-7, lanes 8-15 */
} f32x16;

static inline f32x16 zero16(void) { return (f32x16){{_mm256_setzero_ps(), _mm256_setzero_ps()}}; }
static inline f32x16 splat16(float s) { return (f32x16){{_mm256_set1_ps(s), _mm256_set1_ps(s)}}; }
static inline f32x16 add16(f32x16 a, f32x16 b) {
    return (f32x16){{_mm256_add_ps(a.h[0], b.h[0]), _mm256_add_ps(a.h[1], b.h[1])}};
}
static inline f32x16 mul16(f32x16 a, f32x16 b) {
    return (f32x16){{_mm256_mul_ps(a.h[0], b.h[0]), _mm256_mul_ps(a.h[1], b.h[1])}};
}
/* a * b + c, fused */
static inline f32x16 fma16(f32x16 a, f32x16 b, f32x16 c) {
    return (f32x16){{_mm256_fmadd_ps(a.h[0], b.h[0], c.h[0]), _mm256_fmadd_ps(a.h[1], b.h[1], c.h[1])}};
}
static inline f32x16 load16(const float *p) {
    return (f32x16){{_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}};
}
static inline void store16(float *p, f32x16 v) {
    _mm256_storeu_ps(p, v.h[0]);
    _mm256_storeu_ps(p + 8, v.h[1]);
}
/* the 16 lanes added pairwise, 8 + 8, 4 + 4, 2 + 2, 1 + 1: one order on every machine */
static inline float fixed_tree_sum(f32x16 v) {
    const __m256 s8 = _mm256_add_ps(v.h[0], v.h[1]);
    const __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    const __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

#else
typedef float f32x16 __attribute__((vector_size(64)));

static inline f32x16 zero16(void) { return (f32x16){0}; }
static inline f32x16 splat16(float s) { return (f32x16){0} + s; }
static inline f32x16 add16(f32x16 a, f32x16 b) { return a + b; }
static inline f32x16 mul16(f32x16 a, f32x16 b) { return a * b; }

/* a * b + c, fused where the machine fuses */
static inline f32x16 fma16(f32x16 a, f32x16 b, f32x16 c) {
#if defined(__AVX512F__)
    return (f32x16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    union halves { f32x16 v; __m256 h[2]; } ua = {a}, ub = {b}, uc = {c}, r;
    for (int i = 0; i < 2; i++) r.h[i] = _mm256_fmadd_ps(ua.h[i], ub.h[i], uc.h[i]);
    return r.v;
#elif defined(__aarch64__)
    union quarters { f32x16 v; float32x4_t q[4]; } ua = {a}, ub = {b}, uc = {c}, r;
    for (int i = 0; i < 4; i++) r.q[i] = vfmaq_f32(uc.q[i], ua.q[i], ub.q[i]);
    return r.v;
#else
    return a * b + c;
#endif
}

static inline f32x16 load16(const float *p) {
    f32x16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store16(float *p, f32x16 v) { memcpy(p, &v, sizeof v); }

/* the 16 lanes added pairwise, 8 + 8, 4 + 4, 2 + 2, 1 + 1: one order on every machine */
static inline float fixed_tree_sum(f32x16 v) {
    float s8[8], s4[4], s2[2];
    for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    for (int i = 0; i < 2; i++) s2[i] = s4[i] + s4[i + 2];
    return s2[0] + s2[1];
}
#endif

#endif
