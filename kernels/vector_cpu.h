/* What the CPU's C kernels share (the kernels/..._cpu.c files): a 16-float vector, which GCC and Clang map
 * onto whatever the machine has (one AVX-512 register, two AVX2 ones, four NEON ones), its FMA
 * written out, its loads and stores, and the fixed tree that sums its lanes.
 *
 * The kernels are built with -ffp-contract=off (kernels/native.py), so the compiler never fuses
 * a multiply and an add on its own — it could decide differently in different copies of a loop,
 * and a row's bits would then depend on which copy ran it. */
#ifndef LANES_VECTOR_CPU_H
#define LANES_VECTOR_CPU_H

#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

typedef float f32x16 __attribute__((vector_size(64)));

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
