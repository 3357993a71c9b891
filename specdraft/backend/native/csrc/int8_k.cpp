// The int8 arithmetic of the K kinds (Q4_K, Q6_K) over their tiles: their layouts (`q4_k_pieces`,
// `q6_k_pieces`) and their dot products against tokens quantised per super-block of 256, in 512-bit
// registers (whole tiles), 256-bit ones (half tiles) or portable loops; int8.cpp says what they compute.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "for_count.h"
#include "formats.h"
#include "projection.h"
#include "tiles.h"

namespace {

// Q4_K's tiles: a super-block of R rows at stride 144R holds d[R] and dmin[R] (float16, where the other
// kinds' d and m lie), 3 vectors of 4R bytes (vector v: each row's scale bytes 4v .. 4v + 3 at 4r),
// then 32 vectors (3 + 8c + G: row r's qs bytes 32c + 4G .. 32c + 4G + 3 at 4r, sub-block 2c's
// elements 4G .. 4G + 3 in their low nibbles, sub-block 2c + 1's in their high ones). Row r's pieces
// of its GGUF block, each as copy(where in the tile, where in the block, bytes).
template <typename Byte, typename Copy>
void q4_k_pieces(const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 0, 2);
    copy(half.m + at + 2 * r, 2, 2);
    for (int v = 0; v < 3; ++v) copy(half.q + at + half.vector * v + 4 * r, 4 + 4 * v, 4);
    for (int c = 0; c < 4; ++c)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (3 + 8 * c + G) + 4 * r, 16 + 32 * c + 4 * G, 4);
}

// Q6_K's tiles: a super-block of R rows at stride 210R holds d[R] (float16), then vectors of 4R bytes:
// 4 of scales (vector v: each row's scale bytes 4v .. 4v + 3 at 4r), 32 of ql (4 + 8u + G: row r's ql
// bytes 32u + 4G .. 32u + 4G + 3 at 4r), 16 of qh (36 + 8h + G: its qh bytes 32h + 4G .. + 3). Piece
// 4h + k (formats.h's sub-block: 32 weights, scales 8h + 2k and the next) reads group G's low 4 bits
// from ql vector 4 + 8 (2h + k % 2) + G (the high nibbles for k >= 2), its top 2 from qh vector
// 36 + 8h + G (bits 2k, 2k + 1).
template <typename Byte, typename Copy>
void q6_k_pieces(const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 208, 2);
    for (int v = 0; v < 4; ++v) copy(half.q + at + half.vector * v + 4 * r, 192 + 4 * v, 4);
    for (int u = 0; u < 4; ++u)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (4 + 8 * u + G) + 4 * r, 32 * u + 4 * G, 4);
    for (int h = 0; h < 2; ++h)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (36 + 8 * h + G) + 4 * r, 128 + 32 * h + 4 * G, 4);
}

// Row r's (0..7) GGUF block of a half tile's Q4_K or Q6_K super-block (`at` bytes on) into block.
void k_untile(int64_t kind, const Half& half, int64_t at, int r, uint8_t* block) {
    const auto copy = [&](const uint8_t* tile, int offset, int n) { std::memcpy(block + offset, tile, n); };
    kind == Q4_K ? q4_k_pieces(half, at, r, copy) : q6_k_pieces(half, at, r, copy);
}

#ifdef SPECDRAFT_AVX2

constexpr int64_t kQ4KTokens = 4;  // tokens a Q4_K tile's sums (acc, and per super-block i and n) are held for

// Rows 8g .. 8g + 7 (half tile g) of Q4_K tiles against tokens [t0, t0 + T): per super-block, each row's
// scales and mins unpacked from its 3 words at once (formats.h's `q4_k_scale`, lane by lane), then per
// sub-block the rows' integer sums (group_dot) times their scales into i, and mins times the token's
// sums into n; then int8_rows.cpp's float operations.
template <int T>
[[gnu::noinline]] void q4_k_half(const Projection& p, int64_t g, int64_t t0, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q4_K, p.w, p.rows, p.row_bytes, g);
    const __m256i six = _mm256_set1_epi32(0x3f3f3f3f), low4 = _mm256_set1_epi32(0x0f0f0f0f), top2 = _mm256_set1_epi32(0x03030303);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * half.stride;
        if (T > 1) ask_ahead(half.d + at, half.stride);
        const uint8_t* q = half.q + at;
        const __m256i a = _mm256_loadu_si256((const __m256i*)q), m = _mm256_loadu_si256((const __m256i*)(q + half.vector)),
                      c = _mm256_loadu_si256((const __m256i*)(q + 2 * half.vector));
        const __m256i words[4] = {  // bytes: scales 0-3, 4-7, mins 0-3, 4-7
            _mm256_and_si256(a, six),
            _mm256_or_si256(_mm256_and_si256(c, low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(a, 6), top2), 4)),
            _mm256_and_si256(m, six),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(c, 4), low4), _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(m, 6), top2), 4))};
        __m256i i[T], n[T];
        for (int t = 0; t < T; ++t) i[t] = n[t] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const __m256i scale = _mm256_and_si256(_mm256_srli_epi32(words[s / 4], 8 * (s % 4)), _mm256_set1_epi32(255));
            const __m256i min = _mm256_and_si256(_mm256_srli_epi32(words[2 + s / 4], 8 * (s % 4)), _mm256_set1_epi32(255));
            __m256i w[8];
            for (int G = 0; G < 8; ++G) {
                const __m256i raw = _mm256_loadu_si256((const __m256i*)(q + half.vector * (3 + 8 * (s / 2) + G)));
                w[G] = _mm256_and_si256(_mm256_srli_epi16(raw, 4 * (s % 2)), _mm256_set1_epi8(15));
            }
            for (int t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s;
                __m256i dot = _mm256_setzero_si256();
                for (int G = 0; G < 8; ++G) dot = group_dot(dot, w[G], broadcast4(x + 4 * G));
                i[t] = _mm256_add_epi32(i[t], _mm256_mullo_epi32(dot, scale));
                n[t] = _mm256_add_epi32(n[t], _mm256_mullo_epi32(min, _mm256_set1_epi32(p.xtotal[(t0 + t) * blocks + 8 * b + s])));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(half.d + at)));
        const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(half.m + at)));
        for (int t = 0; t < T; ++t) {
            const __m256 dx = _mm256_set1_ps(p.xd[(t0 + t) * blocks + 8 * b]);
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, dx), _mm256_cvtepi32_ps(i[t]), acc[t]);
            acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, dx), _mm256_cvtepi32_ps(n[t]), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        alignas(32) float sums[kTileRows];
        _mm256_store_ps(sums, acc[t]);
        for (int r = 0; r < kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, sums[r]);
    }
}

// Signed weights w (|w| <= 32) of 8 rows' groups times a token's 4 activations x, added to each row's
// sum: |w| times x with w's sign.
inline __m256i signed_group_dot(__m256i acc, __m256i magnitude, __m256i w, __m256i x) {
    return group_dot(acc, magnitude, _mm256_sign_epi8(x, w));
}

// Piece s's scale j (0, 1: its first or second 16 weights) of 8 rows, sign-extended, from the scale words.
inline __m256i q6_k_scale(const __m256i words[4], int s, int j) {
    const int index = 2 * s + j;
    return _mm256_srai_epi32(_mm256_slli_epi32(words[index / 4], 24 - 8 * (index % 4)), 24);
}

// Rows 8g .. 8g + 7 (half tile g) of Q6_K tiles against tokens [t0, t0 + T): per piece its groups'
// weights q - 32 from ql and qh, the rows' integer sums per 16 weights times their scales into i; then
// int8_rows.cpp's float operation, fma(d * d_x, float(i), acc).
template <int T>
[[gnu::noinline]] void q6_k_half(const Projection& p, int64_t g, int64_t t0, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q6_K, p.w, p.rows, p.row_bytes, g);
    __m256 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * half.stride;
        if (T > 1) ask_ahead(half.d + at, half.stride);
        const uint8_t* q = half.q + at;
        __m256i words[4];
        for (int v = 0; v < 4; ++v) words[v] = _mm256_loadu_si256((const __m256i*)(q + half.vector * v));
        __m256i i[T];
        for (int t = 0; t < T; ++t) i[t] = _mm256_setzero_si256();
        for (int s = 0; s < 8; ++s) {
            const int h = s / 4, k = s % 4;
            __m256i w[8], magnitude[8];
            for (int G = 0; G < 8; ++G) {
                const __m256i ql = _mm256_loadu_si256((const __m256i*)(q + half.vector * (4 + 8 * (2 * h + k % 2) + G)));
                const __m256i qh = _mm256_loadu_si256((const __m256i*)(q + half.vector * (36 + 8 * h + G)));
                const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (k / 2)), _mm256_set1_epi8(15));
                const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * k), _mm256_set1_epi8(3));
                w[G] = _mm256_sub_epi8(_mm256_or_si256(low, _mm256_slli_epi16(high, 4)), _mm256_set1_epi8(32));
                magnitude[G] = _mm256_abs_epi8(w[G]);
            }
            const __m256i first = q6_k_scale(words, s, 0), second = q6_k_scale(words, s, 1);
            for (int t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s;
                __m256i dot[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
                for (int G = 0; G < 8; ++G) dot[G / 4] = signed_group_dot(dot[G / 4], magnitude[G], w[G], broadcast4(x + 4 * G));
                i[t] = _mm256_add_epi32(i[t], _mm256_add_epi32(_mm256_mullo_epi32(dot[0], first), _mm256_mullo_epi32(dot[1], second)));
            }
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(half.d + at)));
        for (int t = 0; t < T; ++t)
            acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(p.xd[(t0 + t) * blocks + 8 * b])), _mm256_cvtepi32_ps(i[t]), acc[t]);
    }
    for (int t = 0; t < T; ++t) {
        alignas(32) float sums[kTileRows];
        _mm256_store_ps(sums, acc[t]);
        for (int r = 0; r < kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, sums[r]);
    }
}

#ifdef SPECDRAFT_ZMM

// Rows 8g .. 8g + 15 (a whole tile, g even) of Q4_K against tokens [t0, t0 + T): `q4_k_half`'s operations
// on both halves at once in 512-bit registers.
template <int T>
[[gnu::noinline]] void q4_k_tile(const Projection& p, int64_t g, int64_t t0, const Out& out) {
    const int64_t blocks = p.width / kBlock, stride = kTile * block_bytes(Q4_K), vector = 4 * kTile;
    const __m512i six = _mm512_set1_epi32(0x3f3f3f3f), low4 = _mm512_set1_epi32(0x0f0f0f0f), top2 = _mm512_set1_epi32(0x03030303);
    const uint8_t* tile = p.w + (g / 2) * kTile * p.row_bytes;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < p.width / kSuper; ++b, tile += stride) {
        if (T > 1) ask_ahead(tile, stride);
        const uint8_t* q = tile + 4 * kTile;
        const __m512i a = _mm512_loadu_si512((const void*)q), m = _mm512_loadu_si512((const void*)(q + vector)),
                      c = _mm512_loadu_si512((const void*)(q + 2 * vector));
        const __m512i words[4] = {
            _mm512_and_si512(a, six),
            _mm512_or_si512(_mm512_and_si512(c, low4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(a, 6), top2), 4)),
            _mm512_and_si512(m, six),
            _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(c, 4), low4), _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(m, 6), top2), 4))};
        __m512i i[T], n[T];
        for (int t = 0; t < T; ++t) i[t] = n[t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
            const __m512i scale = _mm512_and_si512(_mm512_srli_epi32(words[s / 4], 8 * (s % 4)), _mm512_set1_epi32(255));
            const __m512i min = _mm512_and_si512(_mm512_srli_epi32(words[2 + s / 4], 8 * (s % 4)), _mm512_set1_epi32(255));
            __m512i w[8];
            for (int G = 0; G < 8; ++G) {
                const __m512i raw = _mm512_loadu_si512((const void*)(q + vector * (3 + 8 * (s / 2) + G)));
                w[G] = _mm512_and_si512(_mm512_srli_epi16(raw, 4 * (s % 2)), _mm512_set1_epi8(15));
            }
            for (int t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s;
                __m512i chain[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
                for (int G = 0; G < 8; ++G) {
                    int32_t group;
                    std::memcpy(&group, x + 4 * G, 4);
                    chain[G % 2] = _mm512_dpbusd_epi32(chain[G % 2], w[G], _mm512_set1_epi32(group));
                }
                i[t] = _mm512_add_epi32(i[t], _mm512_mullo_epi32(_mm512_add_epi32(chain[0], chain[1]), scale));
                n[t] = _mm512_add_epi32(n[t], _mm512_mullo_epi32(min, _mm512_set1_epi32(p.xtotal[(t0 + t) * blocks + 8 * b + s])));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)tile));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(tile + 2 * kTile)));
        for (int t = 0; t < T; ++t) {
            const __m512 dx = _mm512_set1_ps(p.xd[(t0 + t) * blocks + 8 * b]);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, dx), _mm512_cvtepi32_ps(i[t]), acc[t]);
            acc[t] = _mm512_fnmadd_ps(_mm512_mul_ps(dmin, dx), _mm512_cvtepi32_ps(n[t]), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        alignas(64) float sums[2 * kTileRows];
        _mm512_store_ps(sums, acc[t]);
        for (int r = 0; r < 2 * kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, sums[r]);
    }
}

// Rows 8g .. 8g + 15 (a whole tile, g even) of Q6_K against tokens [t0, t0 + T): `q6_k_half`'s operations
// on both halves at once in 512-bit registers (x negated where w is negative by a mask).
template <int T>
[[gnu::noinline]] void q6_k_tile(const Projection& p, int64_t g, int64_t t0, const Out& out) {
    const int64_t blocks = p.width / kBlock, stride = kTile * block_bytes(Q6_K), vector = 4 * kTile;
    const uint8_t* tile = p.w + (g / 2) * kTile * p.row_bytes;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < p.width / kSuper; ++b, tile += stride) {
        if (T > 1) ask_ahead(tile, stride);
        const uint8_t* q = tile + 2 * kTile;
        __m512i words[4];
        for (int v = 0; v < 4; ++v) words[v] = _mm512_loadu_si512((const void*)(q + vector * v));
        __m512i i[T];
        for (int t = 0; t < T; ++t) i[t] = _mm512_setzero_si512();
        for (int s = 0; s < 8; ++s) {
            const int h = s / 4, k = s % 4;
            __m512i magnitude[8], weights[8];
            for (int G = 0; G < 8; ++G) {
                const __m512i ql = _mm512_loadu_si512((const void*)(q + vector * (4 + 8 * (2 * h + k % 2) + G)));
                const __m512i qh = _mm512_loadu_si512((const void*)(q + vector * (36 + 8 * h + G)));
                const __m512i low = _mm512_and_si512(_mm512_srli_epi16(ql, 4 * (k / 2)), _mm512_set1_epi8(15));
                const __m512i high = _mm512_and_si512(_mm512_srli_epi16(qh, 2 * k), _mm512_set1_epi8(3));
                const __m512i w = _mm512_sub_epi8(_mm512_or_si512(low, _mm512_slli_epi16(high, 4)), _mm512_set1_epi8(32));
                magnitude[G] = _mm512_abs_epi8(w);
                weights[G] = w;
            }
            __m512i scale[2];
            for (int j = 0; j < 2; ++j) {
                const int index = 2 * s + j;
                scale[j] = _mm512_srai_epi32(_mm512_slli_epi32(words[index / 4], 24 - 8 * (index % 4)), 24);
            }
            for (int t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s;
                __m512i dot[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
                for (int G = 0; G < 8; ++G) {
                    int32_t group;
                    std::memcpy(&group, x + 4 * G, 4);
                    const __m512i bx = _mm512_set1_epi32(group);
                    dot[G / 4] = _mm512_dpbusd_epi32(dot[G / 4], magnitude[G], _mm512_mask_sub_epi8(bx, _mm512_movepi8_mask(weights[G]), _mm512_setzero_si512(), bx));
                }
                i[t] = _mm512_add_epi32(i[t], _mm512_add_epi32(_mm512_mullo_epi32(dot[0], scale[0]), _mm512_mullo_epi32(dot[1], scale[1])));
            }
        }
        const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)tile));
        for (int t = 0; t < T; ++t)
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(d, _mm512_set1_ps(p.xd[(t0 + t) * blocks + 8 * b])), _mm512_cvtepi32_ps(i[t]), acc[t]);
    }
    for (int t = 0; t < T; ++t) {
        alignas(64) float sums[2 * kTileRows];
        _mm512_store_ps(sums, acc[t]);
        for (int r = 0; r < 2 * kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, sums[r]);
    }
}

#endif

#else  // portable loops

// Rows 8g .. 8g + 7 of Q4_K tiles against tokens [t0, t0 + T): each row's GGUF block back from the tile,
// then its integers and int8_rows.cpp's float operations, one product at a time.
void q4_k_half(const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q4_K, p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[144];
            k_untile(Q4_K, half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block)), dmin = half_to_float(load_u16(block + 2));
            for (int64_t t = 0; t < T; ++t) {
                const int64_t token = t0 + t;
                const int8_t* x = p.qx + token * p.width + b * kSuper;
                int32_t i = 0, n = 0;
                for (int s = 0; s < 8; ++s) {
                    int scale, min, dot = 0;
                    q4_k_scale(block + 4, s, scale, min);
                    for (int e = 0; e < kBlock; ++e) dot += ((block[16 + 32 * (s / 2) + e] >> (4 * (s % 2))) & 15) * x[kBlock * s + e];
                    i += scale * dot;
                    n += min * p.xtotal[token * blocks + 8 * b + s];
                }
                const float dx = p.xd[token * blocks + 8 * b];
                acc[t] = std::fmaf(-(dmin * dx), float(n), std::fmaf(d * dx, float(i), acc[t]));
            }
        }
        for (int64_t t = 0; t < T; ++t) out.put(t0 + t, g * kTileRows + r, acc[t]);
    }
}

// Rows 8g .. 8g + 7 of Q6_K tiles against tokens [t0, t0 + T), as `q4_k_half` reads Q4_K's.
void q6_k_half(const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q6_K, p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[210];
            k_untile(Q6_K, half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block + 208));
            for (int64_t t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper;
                int32_t i = 0;
                for (int j = 0; j < 16; ++j) {  // the 16 weights of scale j
                    int32_t dot = 0;
                    for (int e = 16 * j; e < 16 * j + 16; ++e) {
                        const int h = e / 128, k = e % 128 / 32, l = e % 32;
                        const int low = (block[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
                        const int high = (block[128 + 32 * h + l] >> (2 * k)) & 3;
                        dot += ((low | high << 4) - 32) * x[e];
                    }
                    i += int32_t(int8_t(block[192 + j])) * dot;
                }
                acc[t] = std::fmaf(d * p.xd[(t0 + t) * blocks + 8 * b], float(i), acc[t]);
            }
        }
        for (int64_t t = 0; t < T; ++t) out.put(t0 + t, g * kTileRows + r, acc[t]);
    }
}

#endif

}  // namespace

void specdraft::k_group(const Projection& p, int64_t g, int64_t halves, const Out& out) {
#ifdef SPECDRAFT_AVX2
    for (int64_t h = 0; h < halves; ++h)
        for (int64_t t = 0; t < p.n; t += kQ4KTokens)
            for_count<kQ4KTokens>(p.n - t, [&](auto T) {
                p.kind == Q4_K ? q4_k_half<T>(p, g + h, t, out) : q6_k_half<T>(p, g + h, t, out);
            });
#else
    for (int64_t t = 0; t < p.n; t += kInt8Tokens)
        for (int64_t h = 0; h < halves; ++h) {
            const int64_t T = p.n - t < kInt8Tokens ? p.n - t : kInt8Tokens;
            p.kind == Q4_K ? q4_k_half(p, g + h, t, T, out) : q6_k_half(p, g + h, t, T, out);
        }
#endif
}

#ifdef SPECDRAFT_ZMM
void specdraft::k_whole_tile(const Projection& p, int64_t g, const Out& out) {
    for (int64_t t = 0; t < p.n; t += kQ4KTokens)
        for_count<kQ4KTokens>(p.n - t, [&](auto T) {
            p.kind == Q4_K ? q4_k_tile<T>(p, g, t, out) : q6_k_tile<T>(p, g, t, out);
        });
}
#endif

void specdraft::k_tile_block(int64_t kind, uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b,
                             int r, const uint8_t* block) {
    const HalfOf<uint8_t> half = half_tile(kind, tiles, rows, row_bytes, g);
    const auto copy = [&](uint8_t* tile, int offset, int n) { std::memcpy(tile, block + offset, n); };
    kind == Q4_K ? q4_k_pieces(half, b * half.stride, r, copy) : q6_k_pieces(half, b * half.stride, r, copy);
}

void specdraft::k_block_of(int64_t kind, const uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b,
                           int r, uint8_t* block) {
    const Half half = half_tile(kind, tiles, rows, row_bytes, g);
    k_untile(kind, half, b * half.stride, r, block);
}
