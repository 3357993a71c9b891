// The int8 arithmetic (int8.cpp says what it computes) for the kinds it reads in place, row by row, as
// llama.cpp's dot products read them: Q4_K and Q6_K against tokens quantised per 256 (q8_K's: one
// scale d_x for a super-block, `specdraft_quantize`). For each block and token, from the integers q of
// the block's weights (formats.h's layouts) and x of the token's:
//   Q4_K:  i = sum_s scale_s (sum_j q_sj x_sj), n = sum_s min_s (sum_j x_sj)   (s: 8 sub-blocks of 32)
//          acc = fma(d * d_x, float(i), acc), then acc = fma(-(dmin * d_x), float(n), acc)
//   Q6_K:  i = sum_s scale_s (sum_j (q_sj - 32) x_sj)                   (s: 16 sub-blocks of 16)
//          acc = fma(d * d_x, float(i), acc)
// block after block from acc = 0, then y = acc + bias (+ residual) as `Out::put` adds them. The integers
// are exact on every path (|i| < 2^31; float(i) rounds the same everywhere) and every float operation
// is one of the above, in scalar, per row and token: every path and pass width gives bitwise the same
// sums. The AVX2 code reaches the integers by vpmaddubsw and vpmaddwd (the scales as vpmaddwd's
// multipliers; Q6_K's signed q - 32 by the sign trick), 32 weights a vector, or with AVX-512 two
// sub-blocks' 64 (Q6_K's sign by a mask); the portable loops one product at a time. A row's block is
// unpacked once for up to kRowTokens tokens.

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

// The same 8 scales and 8 mins as bytes, all at once (formats.h's `q4_k_scale` on 4 bytes in parallel):
// words 0, 1 the scales, 2, 3 the mins.
inline void q4_k_scale_bytes(const uint8_t* p, uint32_t out[4]) {
    uint32_t a, b, c;
    std::memcpy(&a, p + 4, 4);
    std::memcpy(&b, p + 8, 4);
    std::memcpy(&c, p + 12, 4);
    out[0] = a & 0x3f3f3f3f;
    out[1] = (c & 0x0f0f0f0f) | ((a >> 6) & 0x03030303) << 4;
    out[2] = b & 0x3f3f3f3f;
    out[3] = ((c >> 4) & 0x0f0f0f0f) | ((b >> 6) & 0x03030303) << 4;
}

inline int32_t q4_k_mins(const int32_t min[8], const int32_t* totals) {
    int32_t n = 0;
    for (int s = 0; s < 8; ++s) n += min[s] * totals[s];
    return n;
}

#ifdef SPECDRAFT_AVX2
inline int32_t total(__m256i v) {  // the sum of 8 int32 lanes (exact: any order)
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    return _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1)));
}
#endif

#if defined(SPECDRAFT_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && !defined(SPECDRAFT_NO_ZMM)

// Two 256-bit halves as one 512-bit vector: a low, b high.
inline __m512i join(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

// 64 unsigned weights w times 64 int8 x, pairs summed (no saturation: 2 * 63 * 127 < 2^15), then pairs
// of pairs times `scales` (int16 lanes) summed: 16 int32.
inline __m512i products(__m512i w, __m512i x, __m512i scales) {
    return _mm512_madd_epi16(_mm512_maddubs_epi16(w, x), scales);
}

// Q4_K: sub-blocks 2c (the low nibbles of qs bytes 32c ..) and 2c + 1 (their high ones) in one vector,
// their scales the multipliers of its low and high halves' pairs.
struct Q4_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 144;
    __m512i q[4], scales[4];
    __m256i mins;  // 8 int32
    float d, dmin;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p));
        dmin = _cvtsh_ss(load_u16(p + 2));
        alignas(16) uint32_t bytes[4];
        q4_k_scale_bytes(p, bytes);
        const __m512i scale = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i*)bytes)));
        mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(bytes + 2)));
        for (int c = 0; c < 4; ++c) {
            const __m256i raw = _mm256_loadu_si256((const __m256i*)(p + 16 + 32 * c));
            q[c] = _mm512_and_si512(join(raw, _mm256_srli_epi16(raw, 4)), _mm512_set1_epi8(15));
            scales[c] = _mm512_permutexvar_epi16(join(_mm256_set1_epi16(short(2 * c)), _mm256_set1_epi16(short(2 * c + 1))), scale);
        }
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        __m512i sums = _mm512_setzero_si512();
        for (int c = 0; c < 4; ++c)
            sums = _mm512_add_epi32(sums, products(q[c], _mm512_loadu_si512((const void*)(x + 64 * c)), scales[c]));
        const __m256i n = _mm256_mullo_epi32(mins, _mm256_loadu_si256((const __m256i*)totals));
        return q4_k_step(d, dmin, dx, _mm512_reduce_add_epi32(sums), total(n), acc);
    }
};

// Q6_K: pieces 4h + 2j and 4h + 2j + 1 (vector 2h + j): the low 4 bits from ql bytes 64h .. 64h + 63
// (their low nibbles for j = 0, high for j = 1), the top 2 from qh bytes 32h .. (bits 4j, 4j + 2);
// q - 32 as its magnitude and a mask of its negative bytes (x negated there); its 4 scales (16
// weights each) the multipliers of its pairs, 8 each.
struct Q6_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 210;
    __m512i magnitude[4], scales[4];
    __mmask64 negative[4];
    float d;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p + 208));
        const __m512i spread = _mm512_set_epi16(3, 3, 3, 3, 3, 3, 3, 3, 2, 2, 2, 2, 2, 2, 2, 2,
                                                1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);  // lane i: scale i / 8
        for (int h = 0; h < 2; ++h) {
            const __m512i ql = _mm512_loadu_si512((const void*)(p + 64 * h));
            const __m256i qh = _mm256_loadu_si256((const __m256i*)(p + 128 + 32 * h));
            for (int j = 0; j < 2; ++j) {
                const __m512i low = _mm512_and_si512(_mm512_srli_epi16(ql, 4 * j), _mm512_set1_epi8(15));
                const __m512i high = _mm512_and_si512(join(_mm256_srli_epi16(qh, 4 * j), _mm256_srli_epi16(qh, 4 * j + 2)),
                                                      _mm512_set1_epi8(3));
                const __m512i w = _mm512_sub_epi8(_mm512_or_si512(low, _mm512_slli_epi16(high, 4)), _mm512_set1_epi8(32));
                magnitude[2 * h + j] = _mm512_abs_epi8(w);
                negative[2 * h + j] = _mm512_movepi8_mask(w);
                int32_t four;
                std::memcpy(&four, p + 192 + 8 * h + 4 * j, 4);
                const __m128i scale = _mm_cvtepi8_epi16(_mm_cvtsi32_si128(four));  // 4 int16
                scales[2 * h + j] = _mm512_permutexvar_epi16(spread, _mm512_castsi128_si512(scale));
            }
        }
    }
    float step(const int8_t* x, float dx, const int32_t*, float acc) const {
        __m512i sums = _mm512_setzero_si512();
        for (int v = 0; v < 4; ++v) {
            const __m512i xv = _mm512_loadu_si512((const void*)(x + 64 * v));
            const __m512i signed_x = _mm512_mask_sub_epi8(xv, negative[v], _mm512_setzero_si512(), xv);
            sums = _mm512_add_epi32(sums, products(magnitude[v], signed_x, scales[v]));
        }
        return scaled_step(d, dx, _mm512_reduce_add_epi32(sums), acc);
    }
};

#elif defined(SPECDRAFT_AVX2)

inline __m256i load32(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }

inline __m256i nibbles(__m256i raw, int shift) {  // bits shift .. shift + 3 of each byte
    return _mm256_and_si256(_mm256_srli_epi16(raw, shift), _mm256_set1_epi8(15));
}

// 32 unsigned weights w (each <= 63) times 32 int8 x, pairs summed (no saturation: 2 * 63 * 127 < 2^15),
// then pairs of pairs times `scales` (int16 lanes) summed: 8 int32.
inline __m256i products(__m256i w, const int8_t* x, __m256i scales) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, _mm256_loadu_si256((const __m256i*)x)), scales);
}

// Q4_K: each sub-block's 32 q (0..15) as bytes; its scale the multiplier of its pairs.
struct Q4_KBlock {
    static constexpr int64_t kWeights = 256, kBytes = 144;
    __m256i q[8], scales[8];
    __m256i mins;  // 8 int32
    float d, dmin;
    void load(const uint8_t* p) {
        d = _cvtsh_ss(load_u16(p));
        dmin = _cvtsh_ss(load_u16(p + 2));
        alignas(16) uint32_t bytes[4];
        q4_k_scale_bytes(p, bytes);
        mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(bytes + 2)));
        for (int c = 0; c < 4; ++c) {
            const __m256i raw = load32(p + 16 + 32 * c);
            q[2 * c] = nibbles(raw, 0);
            q[2 * c + 1] = nibbles(raw, 4);
        }
        for (int s = 0; s < 8; ++s) scales[s] = _mm256_set1_epi16(int16_t((bytes[s / 4] >> (8 * (s % 4))) & 0xff));
    }
    float step(const int8_t* x, float dx, const int32_t* totals, float acc) const {
        __m256i sums = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) sums = _mm256_add_epi32(sums, products(q[s], x + 32 * s, scales[s]));
        const __m256i n = _mm256_mullo_epi32(mins, _mm256_loadu_si256((const __m256i*)totals));
        return q4_k_step(d, dmin, dx, total(sums), total(n), acc);
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

static_assert(Q4_KBlock::kBytes == 144 && Q6_KBlock::kBytes == 210, "formats.h's sizes");

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
        case Q4_K: int8_rows_of<Q4_KBlock>(p, start, end, out); break;
        case Q6_K: int8_rows_of<Q6_KBlock>(p, start, end, out); break;
    }
}
