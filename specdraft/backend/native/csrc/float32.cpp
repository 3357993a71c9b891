// The projections' float32 arithmetic (a `Projection` with no quantised tokens, projection.h): one order for every weight format and every pass size, so that the same weights
// give bitwise the same sums whether they are read as float32 rows or as GGUF blocks, and whether
// the pass has 1 token or 32:
//   - a row's weights are float32 values: a float32 row as it is, a block's as formats.h's
//     `Traits<KIND>::piece` gives them (Q4_1's and Q5_1's d * q + m, Q8_0's d * q, Q4_0's d * (q - 8), Q5_0's
//     d * (q - 16), IQ4_NL's d * table[q], IQ4_XS's (d * (scale - 32)) * table[q], Q4_K's and Q5_K's (d *
//     scale) * q - dmin * min, Q6_K's (d * scale) * (q - 32), Q3_K's (d * (scale - 32)) * (q - 4), Q2_K's (d
//     * scale) * q - dmin * min: each product is exact in float32, so the value is exact or the one rounding
//     of the sum, the value a dequantised float32 copy holds; F16's and BF16's weights as they lie, exact);
//   - each (row, token) sums in 8 lanes: lane j takes elements j, j + 8, j + 16, ... in order, each
//     a fused multiply-add (one rounding); past the row's end the lanes add nothing;
//   - the 8 lanes are then added in one fixed tree: j + (j + 4), then + 2, then + 1.
// (8 lanes, not 16: a pass's tile then holds 2 rows x 6 tokens of sums in AVX2's 16 registers; AVX-512
// builds hold two such sums a register, float32_pairs.h.)
// The kernels differ only in how they reach those values: a decode token (T = 1) expands the blocks
// of 8 rows at a time in registers; a short pass (up to 8 tokens: a verify step) expands a row's
// blocks in registers once for all its tokens; a longer one expands 2 rows at a time into scratch
// rows and reads them for every 6 tokens. Each reads a row in pieces of 32 weights (a block, or a
// K kind's sub-block: formats.h). x86 machines with AVX2, FMA and F16C (every AVX-512 machine too) run the intrinsics
// below; others compile the portable loops (the compiler vectorises them; fmaf is an instruction
// wherever the machine has FMA). Both give the same sums.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "for_count.h"
#include "formats.h"
#include "projection.h"

namespace {

using specdraft::Out;

constexpr int64_t kLanes = 8;
constexpr int64_t kRows = 8;       // rows a decode tile reads together
constexpr int64_t kPassRows = 2;   // rows a tile of a longer pass reads together
constexpr int64_t kTokens = 6;     // tokens a tile of a longer pass computes together (2 x 6 sums)
constexpr int64_t kShort = 8;      // the most tokens a short pass reads a row's values once for (8 sums)

constexpr int64_t kAhead = 1;  // tiles a decode tile asks the memory for ahead of reading them

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

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

template <>  // F16, BF16: 32 weights as they lie, each converted (exactly)
inline void block_values<F16>(const uint8_t* p, int, Lanes v[4]) {
    for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(p + 16 * i)));
}
template <>
inline void block_values<BF16>(const uint8_t* p, int, Lanes v[4]) {
    for (int i = 0; i < 4; ++i)
        v[i] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(p + 16 * i))), 16));
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

inline void store(float* p, const Lanes& v) { std::memcpy(p, v.v, sizeof(v.v)); }

#endif

#include "float32_pairs.h"

// One decode token, R rows: from their blocks, expanded in registers, or float32 rows. (The kernels
// below are compiled per kind, so that each reads its blocks as if it were the only one.)
template <int64_t kind, int R>
void decode_tile(const uint8_t* w, int64_t row_bytes, int64_t width, const float* x, float* sums) {
    Lanes acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero();
    if constexpr (Traits<kind>::dense) {
        int64_t i = 0;
        for (; i + kLanes <= width; i += kLanes) {
            Lanes xv = load(x + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) fma_into(load((const float*)(w + r * row_bytes) + i), xv, acc[r]);
        }
        if (i < width) {
            Lanes xv = load(x + i, width - i);
            for (int r = 0; r < R; ++r) fma_into(load((const float*)(w + r * row_bytes) + i, width - i), xv, acc[r]);
        }
    } else {
        constexpr int64_t bytes = Traits<kind>::bytes;
        constexpr int shift = Traits<kind>::piece_shift, last = Traits<kind>::pieces - 1;
        for (int64_t b = 0; b < width / kBlock; ++b) {
            const float* xb = x + b * kBlock;
            const int sub = int(b & last);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) {
                Lanes v[4];
                const uint8_t* p = w + r * row_bytes + (b >> shift) * bytes;
                // the same piece two tiles on (about: a K kind's block in eighths): memory and arithmetic overlap
                prefetch(p + (sub * bytes >> shift) + kAhead * R * row_bytes);
                block_values<kind>(p, sub, v);
                for (int i = 0; i < 4; ++i) fma_into(v[i], load(xb + 8 * i), acc[r]);  // x from L1: registers hold sums
            }
        }
    }
    for (int r = 0; r < R; ++r) sums[r] = total(acc[r]);
}

// A row of blocks of KIND -> its float32 values out[width] (`expand_row`'s values, vectorised).
template <int64_t KIND>
void expand_values(const uint8_t* row, int64_t width, float* out) {
    using T = Traits<KIND>;
    for (int64_t b = 0; b < width / kBlock; ++b) {
        Lanes v[4];
        block_values<KIND>(row + (b >> T::piece_shift) * T::bytes, int(b & (T::pieces - 1)), v);
        for (int i = 0; i < 4; ++i) store(out + b * kBlock + 8 * i, v[i]);
    }
}

// One row against the T tokens (stride xs) of a short pass: sums[t]. The row's values, float32 or
// blocks expanded in registers, are read once for the T tokens.
template <int64_t kind, int T>
void row_tokens(const uint8_t* row, int64_t width, const float* x, int64_t xs, float* sums) {
    Lanes acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = zero();
    if constexpr (Traits<kind>::dense) {
        const float* values = (const float*)row;
        int64_t i = 0;
        for (; i + kLanes <= width; i += kLanes) {
            Lanes v = load(values + i);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) fma_into(v, load(x + t * xs + i), acc[t]);
        }
        if (i < width) {
            Lanes v = load(values + i, width - i);
            for (int t = 0; t < T; ++t) fma_into(v, load(x + t * xs + i, width - i), acc[t]);
        }
    } else {
        using K = Traits<kind>;
        for (int64_t b = 0; b < width / kBlock; ++b) {
            Lanes v[4];
            block_values<kind>(row + (b >> K::piece_shift) * K::bytes, int(b & (K::pieces - 1)), v);
#pragma GCC unroll 4
            for (int i = 0; i < 4; ++i)
#pragma GCC unroll 8
                for (int t = 0; t < T; ++t) fma_into(v[i], load(x + t * xs + b * kBlock + 8 * i), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) sums[t] = total(acc[t]);
}

// R rows of float32 values (stride `row`) against T tokens (stride `xs`): sums[r * T + t]. Full
// 8-lane steps first, then the row's tail, each lane summing its elements in order either way.
template <int R, int T>
void dense_tile(const float* w, int64_t row, int64_t width, const float* x, int64_t xs, float* sums) {
    Lanes acc[R][T];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[r][t] = zero();
    int64_t i = 0;
    for (; i + kLanes <= width; i += kLanes) {
        Lanes xv[T];
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) xv[t] = load(x + t * xs + i);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
            Lanes wv = load(w + r * row + i);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) fma_into(wv, xv[t], acc[r][t]);
        }
    }
    if (i < width) {
        for (int r = 0; r < R; ++r) {
            Lanes wv = load(w + r * row + i, width - i);
            for (int t = 0; t < T; ++t) fma_into(wv, load(x + t * xs + i, width - i), acc[r][t]);
        }
    }
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) sums[r * T + t] = total(acc[r][t]);
}

template <int64_t kind, int R>
void decode_rows(const uint8_t* w, int64_t row_bytes, int64_t width, const float* x, int64_t first, const Out& out) {
    float sums[R];
    decode_tile<kind, R>(w + first * row_bytes, row_bytes, width, x, sums);
    for (int r = 0; r < R; ++r) out.put(0, first + r, sums[r]);
}

template <int R, int T>
void pass_tokens(const float* values, int64_t width, const float* x, int64_t xs, int64_t t0, int64_t first,
                 const Out& out) {
    float sums[R * T];
#ifdef SPECDRAFT_PAIRS
    if (R == 2 && width % kLanes == 0) dense_pair<T>(values, width, width, x + t0 * xs, xs, sums); else
#endif
    dense_tile<R, T>(values, width, width, x + t0 * xs, xs, sums);
    for (int r = 0; r < R; ++r)
        for (int t = 0; t < T; ++t) out.put(t0 + t, first + r, sums[r * T + t]);
}

template <int R>
void pass_rows(const float* values, int64_t width, const float* x, int64_t xs, int64_t n, int64_t first,
               const Out& out) {
    int64_t t = 0;
    for (; t + kTokens <= n; t += kTokens) pass_tokens<R, kTokens>(values, width, x, xs, t, first, out);
    if (t < n)  // the last tokens, fewer than kTokens
        for_count<kTokens - 1>(n - t, [&](auto T) { pass_tokens<R, T>(values, width, x, xs, t, first, out); });
}

template <int64_t kind, int T>
void short_pass_row(const uint8_t* row, int64_t width, const float* x, int64_t xs, int64_t r, const Out& out) {
    float sums[T];
    row_tokens<kind, T>(row, width, x, xs, sums);
    for (int t = 0; t < T; ++t) out.put(t, r, sums[t]);
}

template <int64_t kind>
void project_kind(const Projection& p, int64_t start, int64_t end, const Out& out) {
    const int64_t row_bytes = p.row_bytes, width = p.width, n = p.n, xs = p.xs;
    const uint8_t* w = p.w;
    const float* x = p.x;
    if (n == 1) {
        int64_t r = start;
        for (; r + kRows <= end; r += kRows) decode_rows<kind, kRows>(w, row_bytes, width, x, r, out);
        for (; r < end; ++r) decode_rows<kind, 1>(w, row_bytes, width, x, r, out);
        return;
    }
    if (n <= kShort) {  // a short pass (a verify step's k + 1 tokens): each row's blocks expanded once, in registers
#ifdef SPECDRAFT_PAIRS
        int64_t paired = start;  // rows computed in pairs; the rest below
        if (Traits<kind>::floats && short_pass_in_pairs<kind>(p, paired, end, out)) return;
        start = paired;
#endif
        for (int64_t r = start; r < end; ++r) {
            for (int64_t i = 0; i < row_bytes; i += 64) prefetch(w + (r + 1) * row_bytes + i);  // the next row
            const uint8_t* row = w + r * row_bytes;
            for_count<kShort>(n, [&](auto T) { short_pass_row<kind, T>(row, width, x, xs, r, out); });
        }
        return;
    }
    static thread_local std::vector<float> scratch;  // a longer pass: rows expanded into scratch, tiles of 2 x 6
    constexpr bool dense = Traits<kind>::dense;
    if (!dense) scratch.resize(kPassRows * width);
    for (int64_t r = start; r < end; r += kPassRows) {
        int64_t rows = end - r < kPassRows ? end - r : kPassRows;
        for (int64_t i = 0; i < kPassRows * row_bytes; i += 64) prefetch(w + (r + kPassRows) * row_bytes + i);  // the next tile
        const float* values = (const float*)(w + r * row_bytes);
        if constexpr (!dense) {  // each row's blocks expanded once, read for every token
            for (int64_t i = 0; i < rows; ++i) expand_values<kind>(w + (r + i) * row_bytes, width, scratch.data() + i * width);
            values = scratch.data();
        }
        if (rows == kPassRows) {
            pass_rows<kPassRows>(values, width, x, xs, n, r, out);
        } else {
            for (int64_t i = 0; i < rows; ++i) pass_rows<1>(values + i * width, width, x, xs, n, r + i, out);
        }
    }
}

}  // namespace

void specdraft::project_float32(const Projection& p, int64_t start, int64_t end, const Out& out) {
    with_kind(p.kind, [&](auto k) { project_kind<k>(p, start, end, out); });
}

// Rows [start, end) of w as float32 values into y (stride ys): the dense weight, for passes that
// multiply by it elsewhere (prefill chunks, by BLAS). Reads kind, w, row_bytes, width, y and ys.
extern "C" void specdraft_expand(const Projection* p, int64_t start, int64_t end) {
    with_kind(p->kind, [&](auto k) {
        for (int64_t r = start; r < end; ++r) {
            if constexpr (Traits<k>::dense)
                std::memcpy(p->y + r * p->ys, p->w + r * p->row_bytes, p->width * 4);
            else
                expand_values<k>(p->w + r * p->row_bytes, p->width, p->y + r * p->ys);
        }
    });
}
