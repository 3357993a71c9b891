// The int8 arithmetic (int8.cpp says what it computes) for the kinds it reads in place, row by row, as
// llama.cpp's dot products read them: Q5_0 against tokens quantised per 32 (q8_0's), Q4_K and Q6_K
// against tokens quantised per 256 (q8_K's: one scale d_x for a super-block, `specdraft_quantize`).
// For each block and token, from the integers q of the block's weights (formats.h's layouts) and x of
// the token's:
//   Q5_0:  i = sum_j (q_j - 16) x_j                                      acc = fma(d * d_x, float(i), acc)
//   Q4_K:  i = sum_s scale_s (sum_j q_sj x_sj), n = sum_s min_s (sum_j x_sj)   (s: 8 sub-blocks of 32)
//          acc = fma(d * d_x, float(i), acc), then acc = fma(-(dmin * d_x), float(n), acc)
//   Q6_K:  i = sum_s scale_s (sum_j (q_sj - 32) x_sj)                   (s: 16 sub-blocks of 16)
//          acc = fma(d * d_x, float(i), acc)
// block after block from acc = 0, then y = acc + bias (+ residual) as `Out::put` adds them. The integers
// are exact on every path (|i| < 2^31; float(i) rounds the same everywhere) and every float operation
// is one of the above, in scalar, per row and token: every path and pass width gives bitwise the same
// sums. The AVX2 code reaches the integers by vpmaddubsw and vpmaddwd (the scales as vpmaddwd's
// multipliers; Q6_K's signed q - 32 by the sign trick), the portable loops one product at a time. A
// row's block is unpacked once for up to kRowTokens tokens.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "for_count.h"
#include "formats.h"
#include "projection.h"

namespace {

using specdraft::Out;

constexpr int64_t kRowTokens = 8;  // tokens a row's unpacked block serves

// The float operations of a block and token (every path's, as above).
inline float scaled_step(float d, float dx, int32_t i, float acc) { return std::fmaf(d * dx, float(i), acc); }

inline float q4_k_step(float d, float dmin, float dx, int32_t i, int32_t n, float acc) {
    return std::fmaf(-(dmin * dx), float(n), std::fmaf(d * dx, float(i), acc));
}

// Q4_K's scales and mins of its 8 sub-blocks (formats.h's `q4_k_scale`), and n = sum_s min_s * totals[s].
inline void q4_k_scales(const uint8_t* p, int32_t scale[8], int32_t min[8]) {
    for (int s = 0; s < 8; ++s) q4_k_scale(p + 4, s, scale[s], min[s]);
}

inline int32_t q4_k_mins(const int32_t min[8], const int32_t* totals) {
    int32_t n = 0;
    for (int s = 0; s < 8; ++s) n += min[s] * totals[s];
    return n;
}

#ifdef SPECDRAFT_AVX2

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

inline __m256i nibbles(__m256i raw, int shift) {  // bits shift .. shift + 3 of each byte
    return _mm256_and_si256(_mm256_srli_epi16(raw, shift), _mm256_set1_epi8(15));
}

inline int32_t total(__m256i v) {  // the sum of 8 int32 lanes (exact: any order)
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}

// 32 unsigned weights w (each <= 63) times 32 int8 x, pairs summed (no saturation: 2 * 63 * 127 < 2^15),
// then pairs of pairs times `scales` (int16 lanes) summed: 8 int32.
inline __m256i products(__m256i w, const int8_t* x, __m256i scales) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i*)x)), scales);
}

// Q5_0: q (0..31) as 32 bytes: the nibbles, and qh's bit j as byte j's bit 4 (each qh byte spread to 8
// bytes, then byte k tested for bit k % 8).
struct Q5_0Block {
    static constexpr int64_t kWeights = 32, kBytes = 22;
    __m256i q;
    float d;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p));
        const __m128i qs = _mm_loadu_si128((const __m128i*)(p + 6)), low = _mm_set1_epi8(15);
        const __m256i nibble = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(qs, 4), low), _mm_and_si128(qs, low));
        uint32_t qh;
        std::memcpy(&qh, p + 2, 4);
        __m256i bits = _mm256_shuffle_epi8(_mm256_set1_epi32(int32_t(qh)),
                                           _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                                             0x0101010101010101, 0x0000000000000000));
        bits = _mm256_cmpeq_epi8(_mm256_or_si256(bits, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe)), _mm256_set1_epi64x(-1));
        q = _mm256_or_si256(nibble, _mm256_and_si256(bits, _mm256_set1_epi8(16)));
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        const int32_t i = total(products(q, x, _mm256_set1_epi16(1))) - 16 * totals[0];
        return scaled_step(d, dx, i, acc);
    }
};

// Q4_K: each sub-block's 32 q (0..15) as bytes; its scale the multiplier of its pairs.
struct Q4_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 144;
    __m256i q[8];
    int32_t scale[8], min[8];
    float d, dmin;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p));
        dmin = _cvtsh_ss(load_u16(p + 2));
        q4_k_scales(p, scale, min);
        for (int c = 0; c < 4; ++c) {
            const __m256i raw = load32(p + 16 + 32 * c);
            q[2 * c] = nibbles(raw, 0);
            q[2 * c + 1] = nibbles(raw, 4);
        }
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        __m256i sums = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s)
            sums = _mm256_add_epi32(sums, products(q[s], x + 32 * s, _mm256_set1_epi16(int16_t(scale[s]))));
        return q4_k_step(d, dmin, dx, total(sums), q4_k_mins(min, totals), acc);
    }
};

// Q6_K: each piece's 32 q - 32 (-32..31) as |q - 32| and its sign; its two scales (16 weights each)
// the multipliers of its low and high 128 bits' pairs.
struct Q6_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 210;
    __m256i magnitude[8], sign[8], scales[8];
    float d;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p + 208));
        for (int s = 0; s < 8; ++s) {
            const int h = s / 4, k = s % 4;
            const __m256i low = nibbles(load32(p + 64 * h + 32 * (k % 2)), 4 * (k / 2));
            const __m256i high = _mm256_and_si256(_mm256_srli_epi16(load32(p + 128 + 32 * h), 2 * k), _mm256_set1_epi8(3));
            sign[s] = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
            magnitude[s] = _mm256_abs_epi8(sign[s]);
            const int8_t* scale = (const int8_t*)(p + 192 + 8 * h + 2 * k);
            scales[s] = _mm256_set_m128i(_mm_set1_epi16(scale[1]), _mm_set1_epi16(scale[0]));
        }
    }
    float step(const int8_t* x, float dx, const int32_t*, float acc) const {
        __m256i sums = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const __m256i signed_x = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i*)(x + 32 * s)), sign[s]);
            sums = _mm256_add_epi32(sums, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude[s], signed_x), scales[s]));
        }
        return scaled_step(d, dx, total(sums), acc);
    }
};

#else  // portable loops: the same integers, one product at a time

struct Q5_0Block {
    static constexpr int64_t kWeights = 32, kBytes = 22;
    int32_t q[32];
    float d;
    void load(const uint8_t* p) {
        d = half_to_float(load_u16(p));
        uint32_t qh;
        std::memcpy(&qh, p + 2, 4);
        for (int j = 0; j < 32; ++j) q[j] = (j < 16 ? p[6 + j] & 15 : p[6 + j - 16] >> 4) | int((qh >> j) & 1) << 4;
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        int32_t i = 0;
        for (int j = 0; j < 32; ++j) i += q[j] * int32_t(x[j]);
        return scaled_step(d, dx, i - 16 * totals[0], acc);
    }
};

struct Q4_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 144;
    uint8_t q[256];
    int32_t scale[8], min[8];
    float d, dmin;
    void load(const uint8_t* p) {
        d = half_to_float(load_u16(p));
        dmin = half_to_float(load_u16(p + 2));
        q4_k_scales(p, scale, min);
        for (int s = 0; s < 8; ++s)
            for (int e = 0; e < 32; ++e) q[32 * s + e] = (p[16 + 32 * (s / 2) + e] >> (4 * (s % 2))) & 15;
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        int32_t i = 0;
        for (int s = 0; s < 8; ++s) {
            int32_t sum = 0;
            for (int e = 0; e < 32; ++e) sum += int32_t(q[32 * s + e]) * int32_t(x[32 * s + e]);
            i += scale[s] * sum;
        }
        return q4_k_step(d, dmin, dx, i, q4_k_mins(min, totals), acc);
    }
};

struct Q6_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 210;
    int8_t q[256];  // q - 32
    int32_t scale[16];
    float d;
    void load(const uint8_t* p) {
        d = half_to_float(load_u16(p + 208));
        for (int n = 0; n < 256; ++n) {
            const int h = n / 128, k = n % 128 / 32, i = n % 32;
            const int low = (p[64 * h + 32 * (k % 2) + i] >> (4 * (k / 2))) & 15, high = (p[128 + 32 * h + i] >> (2 * k)) & 3;
            q[n] = int8_t((low | high << 4) - 32);
        }
        for (int s = 0; s < 16; ++s) scale[s] = int8_t(p[192 + s]);
    }
    float step(const int8_t* x, float dx, const int32_t*, float acc) const {
        int32_t i = 0;
        for (int s = 0; s < 16; ++s) {
            int32_t sum = 0;
            for (int e = 0; e < 16; ++e) sum += int32_t(q[16 * s + e]) * int32_t(x[16 * s + e]);
            i += scale[s] * sum;
        }
        return scaled_step(d, dx, i, acc);
    }
};

#endif

static_assert(Q5_0Block::kBytes == 22 && Q4_KBlock::kBytes == 144 && Q6_KBlock::kBytes == 210, "formats.h's sizes");

// Row r against tokens [t0, t0 + T): each block unpacked once, then met by every token in turn.
template <class Block, int T>
[[gnu::noinline]] void int8_row(const Projection& p, int64_t r, int64_t t0, const Out& out) {
    constexpr int64_t pieces = Block::kWeights / kBlock;
    const int64_t blocks = p.width / kBlock;  // the quantised tokens' scales and totals: per 32
    const uint8_t* row = p.w + r * p.row_bytes;
    float acc[T] = {};
    for (int64_t b = 0; b < p.width / Block::kWeights; ++b) {
        Block w;
        w.load(row + b * Block::kBytes);
        for (int t = 0; t < T; ++t) {
            const int64_t token = t0 + t, at = token * blocks + b * pieces;
            acc[t] = w.step(p.qx + token * p.width + b * Block::kWeights, p.xd[at], p.xtotal + at, acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) out.put(t0 + t, r, acc[t]);
}

template <class Block>
void int8_rows_of(const Projection& p, int64_t start, int64_t end, const Out& out) {
    for (int64_t r = start; r < end; ++r)
        for (int64_t t = 0; t < p.n; t += kRowTokens)
            for_count<kRowTokens>(p.n - t, [&](auto T) { int8_row<Block, T>(p, r, t, out); });
}

}  // namespace

void specdraft::project_int8_rows(const Projection& p, int64_t start, int64_t end, const Out& out) {
    switch (p.kind) {
        case Q5_0: int8_rows_of<Q5_0Block>(p, start, end, out); break;
        case Q4_K: int8_rows_of<Q4_KBlock>(p, start, end, out); break;
        case Q6_K: int8_rows_of<Q6_KBlock>(p, start, end, out); break;
    }
}
