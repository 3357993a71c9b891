// The float32 arithmetic's 8-lane operations (float32.cpp's kernels and float32_pairs.h read through them):
// a register of 8 float32 lanes (`Lanes`) and what is done to it, and each kind's piece of 32 weights as its
// float32 values (`block_values`), in AVX2 intrinsics where the build has AVX2, FMA and F16C, else in
// portable loops that compute the same values in the same order. A float kind's (F16's, BF16's) 8 weights
// read as they lie, wherever they lie (`float_lanes`): GGUF's rows, or the int8 arithmetic's tiles.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "projection.h"

namespace {

constexpr int64_t kLanes = 8;
#ifdef SPECDRAFT_AVX2

using Lanes = __m256;

inline Lanes zero() { return _mm256_setzero_ps(); }

inline float total(Lanes a) {  // the fixed tree
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

inline Lanes load(const float* p) { return _mm256_loadu_ps(p); }

inline Lanes load(const float* p, int64_t n) {  // n < 8 values, zeros after them
    alignas(32) float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = 0; j < n; ++j) v[j] = p[j];
    return _mm256_load_ps(v);
}

inline void fma_into(Lanes w, Lanes x, Lanes& acc) { acc = _mm256_fmadd_ps(w, x, acc); }

// Eight bytes at p as eight int32 lanes, zero- or sign-extended.
inline __m256i widen_u8(const uint8_t* p) { return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
inline __m256i widen_i8(const uint8_t* p) { return _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)); }
inline __m256 half(const uint8_t* p) { return _mm256_cvtph_ps(_mm_set1_epi16(int16_t(load_u16(p)))); }

inline __m256i low_nibbles(__m256i a) { return _mm256_and_si256(a, _mm256_set1_epi32(15)); }

// Piece `sub` of a block of KIND at p (sub 0 for a block of 32) as its 32 values, one specialisation a
// kind below: v[i] holds elements 8i .. 8i + 7 (the layouts: formats.h's `*_piece`, which compute the
// same values one at a time).
template <int64_t KIND>
void block_values(const uint8_t* p, int sub, Lanes v[4]);

// Q4_1: byte j holds element j in its low nibble and element j + 16 in its high one.
template <>
inline void block_values<Q4_1>(const uint8_t* p, int, Lanes v[4]) {
    // d, m, d, m, ... from one 4-byte broadcast, then each spread to every lane
    __m256 dm = _mm256_cvtph_ps(_mm_castps_si128(_mm_broadcast_ss((const float*)p)));
    __m256 d = _mm256_moveldup_ps(dm), m = _mm256_movehdup_ps(dm);
    __m256i a = widen_u8(p + 4), b = widen_u8(p + 12);
    v[0] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(low_nibbles(a)), m);
    v[1] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(low_nibbles(b)), m);
    v[2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(a, 4)), m);
    v[3] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), m);
}

template <>
inline void block_values<Q8_0>(const uint8_t* p, int, Lanes v[4]) {
    __m256 d = half(p);
    for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(widen_i8(p + 2 + 8 * i)));
}

// Q4_0: Q4_1's nibbles (at 2), less 8.
template <>
inline void block_values<Q4_0>(const uint8_t* p, int, Lanes v[4]) {
    const __m256 d = half(p);
    const __m256i a = widen_u8(p + 2), b = widen_u8(p + 10), eight = _mm256_set1_epi32(8);
    const __m256i q[4] = {low_nibbles(a), low_nibbles(b), _mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4)};
    for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[i], eight)));
}

// 16 bytes at qs as 32 nibbles (IQ4_NL's order: the low ones, then the high ones) looked up in IQ4_NL's
// table, times d.
inline void looked_up_values(const uint8_t* qs, __m256 d, Lanes v[4]) {
    const __m128i bytes = _mm_loadu_si128((const __m128i*)qs), nibble = _mm_set1_epi8(15);
    const __m128i table = _mm_loadu_si128((const __m128i*)kIq4nlValues);
    const __m128i low = _mm_shuffle_epi8(table, _mm_and_si128(bytes, nibble));  // elements 0 .. 15
    const __m128i high = _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(bytes, 4), nibble));  // 16 .. 31
    const __m128i w[4] = {low, _mm_srli_si128(low, 8), high, _mm_srli_si128(high, 8)};
    for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w[i])));
}

// IQ4_NL: Q4_1's nibbles (at 2) looked up in its table.
template <>
inline void block_values<IQ4_NL>(const uint8_t* p, int, Lanes v[4]) { looked_up_values(p + 2, half(p), v); }

// IQ4_XS's sub-block `sub`: its 16 bytes at 8 + 16 sub as IQ4_NL's, times d * (its scale - 32).
template <>
inline void block_values<IQ4_XS>(const uint8_t* p, int sub, Lanes v[4]) {
    looked_up_values(p + 8 + 16 * sub, _mm256_set1_ps(_cvtsh_ss(load_u16(p)) * float(iq4_xs_scale(p, sub) - 32)), v);
}

// The integers of a 5-bit kind (Q5_0, Q5_1): Q4_1's nibbles (qs, just after qh), and element j's 5th
// bit qh's bit j (qh at `qh_at`); q[i] holds elements 8i .. 8i + 7.
inline void five_bit_lanes(const uint8_t* qh_at, __m256i q[4]) {
    uint32_t qh;
    std::memcpy(&qh, qh_at, 4);
    const __m256i a = widen_u8(qh_at + 4), b = widen_u8(qh_at + 12), lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i nibbles[4] = {low_nibbles(a), low_nibbles(b), _mm256_srli_epi32(a, 4), _mm256_srli_epi32(b, 4)};
    for (int i = 0; i < 4; ++i) {
        const __m256i bit = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(int32_t(qh >> (8 * i))), lane),
                                             _mm256_set1_epi32(1));
        q[i] = _mm256_or_si256(nibbles[i], _mm256_slli_epi32(bit, 4));
    }
}

// Q5_0: qh at 2, less 16.
template <>
inline void block_values<Q5_0>(const uint8_t* p, int, Lanes v[4]) {
    const __m256 d = half(p);
    __m256i q[4];
    five_bit_lanes(p + 2, q);
    for (int i = 0; i < 4; ++i) v[i] = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(q[i], _mm256_set1_epi32(16))));
}

// Q5_1: d and m as Q4_1's, qh at 4: d * q + m.
template <>
inline void block_values<Q5_1>(const uint8_t* p, int, Lanes v[4]) {
    const __m256 d = half(p), m = half(p + 2);
    __m256i q[4];
    five_bit_lanes(p + 4, q);
    for (int i = 0; i < 4; ++i) v[i] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(q[i]), m);
}

// Q4_K's (Q5_K's) sub-block `sub`: its 32 nibbles at 16 (Q5_K: 48) + 32 (sub / 2), low for even sub,
// high for odd; Q5_K's element e's 5th bit qh byte 16 + e's bit sub.
template <int64_t KIND>
inline void mins_values(const uint8_t* p, int sub, Lanes v[4]) {
    int scale, min;
    q4_k_scale(p + 4, sub, scale, min);
    const __m256 ds = _mm256_set1_ps(_cvtsh_ss(load_u16(p)) * float(scale));
    const __m256 dm = _mm256_set1_ps(_cvtsh_ss(load_u16(p + 2)) * float(min));
    const uint8_t* q = p + (KIND == Q5_K ? 48 : 16) + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int i = 0; i < 4; ++i) {
        __m256i w = low_nibbles(_mm256_srli_epi32(widen_u8(q + 8 * i), shift));
        if constexpr (KIND == Q5_K) {
            const __m256i high = _mm256_and_si256(_mm256_srli_epi32(widen_u8(p + 16 + 8 * i), sub), _mm256_set1_epi32(1));
            w = _mm256_or_si256(w, _mm256_slli_epi32(high, 4));
        }
        v[i] = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(w), dm);
    }
}
template <>
inline void block_values<Q4_K>(const uint8_t* p, int sub, Lanes v[4]) { mins_values<Q4_K>(p, sub, v); }
template <>
inline void block_values<Q5_K>(const uint8_t* p, int sub, Lanes v[4]) { mins_values<Q5_K>(p, sub, v); }

// Q6_K's sub-block `sub` = 4h + k: low 4 bits from ql (64h + 32 (k % 2)), top 2 from qh (128 + 32h),
// scales 192 + 8h + 2k and the next (each 16 weights).
template <>
inline void block_values<Q6_K>(const uint8_t* p, int sub, Lanes v[4]) {
    const int h = sub / 4, k = sub % 4;
    const uint8_t *ql = p + 64 * h + 32 * (k % 2), *qh = p + 128 + 32 * h;
    const float d = _cvtsh_ss(load_u16(p + 208));
    for (int i = 0; i < 4; ++i) {
        const __m256 ds = _mm256_set1_ps(d * float(int8_t(p[192 + 8 * h + 2 * k + i / 2])));
        const __m256i low = low_nibbles(_mm256_srli_epi32(widen_u8(ql + 8 * i), 4 * (k / 2)));
        const __m256i high = _mm256_and_si256(_mm256_srli_epi32(widen_u8(qh + 8 * i), 2 * k), _mm256_set1_epi32(3));
        const __m256i q = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 4)), _mm256_set1_epi32(32));
        v[i] = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q));
    }
}

// Q2_K's sub-block `sub` = 4h + j: its 2 bits from qs (16 + 32h), bits 2j, 2j + 1; scales and mins 2 sub
// and the next (each 16 weights): (d * scale) * q - dmin * min.
template <>
inline void block_values<Q2_K>(const uint8_t* p, int sub, Lanes v[4]) {
    const int h = sub / 4, j = sub % 4;
    const float d = _cvtsh_ss(load_u16(p + 80)), dmin = _cvtsh_ss(load_u16(p + 82));
    for (int i = 0; i < 4; ++i) {
        const int k = 2 * sub + i / 2;
        const __m256 ds = _mm256_set1_ps(d * float(p[k] & 15)), dm = _mm256_set1_ps(dmin * float(p[k] >> 4));
        const __m256i q = _mm256_and_si256(_mm256_srli_epi32(widen_u8(p + 16 + 32 * h + 8 * i), 2 * j), _mm256_set1_epi32(3));
        v[i] = _mm256_fmsub_ps(ds, _mm256_cvtepi32_ps(q), dm);
    }
}

// Q3_K's sub-block `sub` = 4h + j: low 2 bits from qs (32 + 32h), the 3rd from hmask (bit 4h + j), less 4;
// scales 2 sub and the next (each 16 weights), less 32.
template <>
inline void block_values<Q3_K>(const uint8_t* p, int sub, Lanes v[4]) {
    const int h = sub / 4, j = sub % 4;
    const float d = _cvtsh_ss(load_u16(p + 108));
    for (int i = 0; i < 4; ++i) {
        const __m256 ds = _mm256_set1_ps(d * float(q3_k_scale(p, 2 * sub + i / 2) - 32));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi32(widen_u8(p + 32 + 32 * h + 8 * i), 2 * j), _mm256_set1_epi32(3));
        const __m256i high = _mm256_and_si256(_mm256_srli_epi32(widen_u8(p + 8 * i), 4 * h + j), _mm256_set1_epi32(1));
        const __m256i q = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(high, 2)), _mm256_set1_epi32(4));
        v[i] = _mm256_mul_ps(ds, _mm256_cvtepi32_ps(q));
    }
}

// A float kind's 8 weights at p (16 bytes), each converted (exactly).
template <int64_t KIND>
inline Lanes float_lanes(const uint8_t* p) {
    const __m128i h = _mm_loadu_si128((const __m128i*)p);
    if constexpr (KIND == F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));  // BF16: the float32's top half
}

template <>  // F16, BF16: 32 weights as they lie
inline void block_values<F16>(const uint8_t* p, int, Lanes v[4]) {
    for (int i = 0; i < 4; ++i) v[i] = float_lanes<F16>(p + 16 * i);
}
template <>
inline void block_values<BF16>(const uint8_t* p, int, Lanes v[4]) {
    for (int i = 0; i < 4; ++i) v[i] = float_lanes<BF16>(p + 16 * i);
}

inline void store(float* p, Lanes v) { _mm256_storeu_ps(p, v); }

#else  // portable loops in the same order

struct Lanes {
    float v[kLanes];
};

inline Lanes zero() {
    Lanes a;
    for (int j = 0; j < kLanes; ++j) a.v[j] = 0.0f;
    return a;
}

inline float total(const Lanes& a) {
    float s4[4];
    for (int j = 0; j < 4; ++j) s4[j] = a.v[j] + a.v[j + 4];
    float s0 = s4[0] + s4[2], s1 = s4[1] + s4[3];
    return s0 + s1;
}

inline Lanes load(const float* p) {
    Lanes a;
    for (int j = 0; j < kLanes; ++j) a.v[j] = p[j];
    return a;
}

inline Lanes load(const float* p, int64_t n) {
    Lanes a;
    for (int j = 0; j < kLanes; ++j) a.v[j] = j < n ? p[j] : 0.0f;
    return a;
}

inline void fma_into(const Lanes& w, const Lanes& x, Lanes& acc) {
    for (int j = 0; j < kLanes; ++j) acc.v[j] = std::fmaf(w.v[j], x.v[j], acc.v[j]);
}

template <int64_t KIND>
inline void block_values(const uint8_t* p, int sub, Lanes v[4]) {
    alignas(32) float values[kBlock];
    Traits<KIND>::piece(p, sub, values);
    for (int i = 0; i < 4; ++i) v[i] = load(values + 8 * i);
}

template <int64_t KIND>
inline Lanes float_lanes(const uint8_t* p) {
    Lanes a;
    for (int j = 0; j < kLanes; ++j) a.v[j] = Traits<KIND>::value(p + 2 * j);
    return a;
}

inline void store(float* p, const Lanes& v) { std::memcpy(p, v.v, sizeof(v.v)); }

#endif

// Where a projection's rows lie: GGUF's rows one after another, or (Tiled) a float kind's tiles in the
// int8 arithmetic (projection.h's `float_tile_at`: row r's 8-weight groups kFloatStep bytes apart).
template <bool Tiled>
inline const uint8_t* row_at(const uint8_t* w, int64_t row_bytes, int64_t r) {
    if constexpr (Tiled) return w + specdraft::float_tile_at(r, 0, row_bytes);
    return w + r * row_bytes;
}

// A row's 32 values at piece b: a float32 row's, a block's (`block_values`), or a float kind's in its tiles.
template <int64_t kind, bool Tiled = false>
inline void piece_values(const uint8_t* row, int64_t b, Lanes v[4]) {
    using K = Traits<kind>;
    if constexpr (K::dense) {
        for (int i = 0; i < 4; ++i) v[i] = load((const float*)row + b * kBlock + 8 * i);
    } else if constexpr (Tiled) {
        for (int i = 0; i < 4; ++i) v[i] = float_lanes<kind>(row + (4 * b + i) * specdraft::kFloatStep);
    } else {
        block_values<kind>(row + (b >> K::piece_shift) * K::bytes, int(b & (K::pieces - 1)), v);
    }
}

}  // namespace
