// The int8 arithmetic of the K kinds (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) over their tiles (their
// layouts: k_pieces.h's `tile_pieces`): their dot products (`rows_dot`; `half_dot`, the portable loops'), each an overload a kind (its
// `KindOf` the first argument), against tokens quantised per super-block of 256, in 512-bit
// registers (whole tiles), 256-bit ones (half tiles; a pass of more than kFewTokens tokens in
// int8_k_pass.cpp) or portable loops, on k_vectors.h's vector operations; int8.cpp says what they compute.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "for_count.h"
#include "formats.h"
#include "k_pieces.h"
#include "k_vectors.h"
#include "projection.h"
#include "tiles.h"

namespace {

// The kinds of Q4_K's scales and mins (Q4_K, Q5_K), whose dot products share one template.
template <int64_t KIND>
using MinsKind = std::enable_if_t<KIND == Q4_K || KIND == Q5_K, int>;

// Row r's (0..7) GGUF block of a half tile's super-block of KIND (`at` bytes on) into block.
template <int64_t KIND>
void k_untile(const Half& half, int64_t at, int r, uint8_t* block) {
    const auto copy = [&](const uint8_t* tile, int offset, int n) { std::memcpy(block + offset, tile, n); };
    tile_pieces(KindOf<KIND>(), half, at, r, copy);
}

#ifdef SPECDRAFT_AVX2

// Each row's sums of tokens [t0, t0 + T) (acc[t], V::kRows rows from row0) into out.
template <typename V, int T>
inline void put_rows(const typename V::F acc[T], int64_t row0, int64_t t0, const Out& out) {
    for (int t = 0; t < T; ++t) {
        alignas(64) float sums[V::kRows];
        V::store(sums, acc[t]);
        for (int r = 0; r < V::kRows; ++r) out.put(t0 + t, row0 + r, sums[r]);
    }
}

// The V::kRows rows of Q4_K (Q5_K) tiles at `rows` (from row0) against tokens [t0, t0 + T): per
// super-block, each row's scales and mins unpacked from its 3 words at once (formats.h's `q4_k_scale`,
// lane by lane), then per sub-block the rows' integer sums (V::dot) times their scales into i, and the
// mins times the token's sums into n (16-bit products: a min is below 64, a sum of 32 activations below
// 2^12 in magnitude): per sub-block for one token, two sub-blocks an instruction after the sub-blocks
// for several (the same integers); then int8.cpp's float operations.
template <typename V, int64_t VECTOR, int T, int64_t KIND, MinsKind<KIND> = 0>
[[gnu::noinline]] void rows_dot(KindOf<KIND>, const Projection& p, const Half& rows, int64_t row0, int64_t t0, const Out& out) {
    using I = typename V::I;
    constexpr int run = groups16<Traits<KIND>::bits>();  // kSums16: groups summed in int16 before a widening
    const int64_t blocks = p.width / kBlock;
    typename V::F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zeros();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * rows.stride;
        ask_ahead(rows.d + at, rows.stride);  // every pass (`asks_ahead`)
        const uint8_t* q = rows.q + at;
        I words[4];
        q4_k_words<V, VECTOR>(q, words);
        I i[T], one = V::zero();  // one: a single token's mins term (T == 1), summed per sub-block
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            const I scale = q4_k_byte<V>(words, s);
            if constexpr (T == 1) {  // a decode token: its sums as they lie, no pairs to pack (a step reads from memory)
                const I min = q4_k_byte<V>(words, 8 + s);
                one = V::add(one, V::times16(min, V::words(p.xtotal[t0 * blocks + 8 * b + s])));
            }
            I dot[T], pair = scale;
            if constexpr (V::kSums16) pair = V::pair(scale);
            for (int t = 0; t < T; ++t) dot[t] = V::zero();
            for (int G = 0; G < 8; ++G) {
                const I w = q4_k_group<KIND, V, VECTOR>(q, s, G);
                for (int t = 0; t < T; ++t) {
                    const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s + 4 * G;
                    if constexpr (V::kSums16)  // `run` groups' pairs of weights and int8s: below 2^15
                        dot[t] = V::dot16(G % run ? dot[t] : V::zero(), w, x);
                    else
                        dot[t] = V::dot(dot[t], w, x);
                }
                if constexpr (V::kSums16)
                    if (G % run == run - 1)
                        for (int t = 0; t < T; ++t) i[t] = V::scaled(i[t], dot[t], pair);
            }
            if constexpr (!V::kSums16)
                for (int t = 0; t < T; ++t) i[t] = V::add(i[t], V::times(dot[t], scale));
        }
        I mins[4];  // several tokens: the mins term after the sub-blocks (`q4_k_min_pairs`)
        if constexpr (T > 1) q4_k_min_pairs<V>(words, mins);
        const typename V::F d = V::halves(rows.d + at), dmin = V::halves(rows.m + at);
        for (int t = 0; t < T; ++t) {
            I n = one;
            if constexpr (T > 1) n = q4_k_mins_term<V>(n, mins, p.xtotal + (t0 + t) * blocks + 8 * b);
            const typename V::F dx = V::each(p.xd[(t0 + t) * blocks + 8 * b]);
            acc[t] = V::fma(V::mul(d, dx), V::real(i[t]), acc[t]);
            acc[t] = V::fnma(V::mul(dmin, dx), V::real(n), acc[t]);
        }
    }
    put_rows<V, T>(acc, row0, t0, out);
}

// Q2_K's mins term of tokens [t0, t0 + T) against super-block b of the rows at `rows`, onto acc: its mins
// paired as Q6_K's scales are, met by the token's sums of 16 as Q6_K's offsets are (giving 0 less n), then
// fma(dmin * d_x, float(-n), acc).
template <typename V, int64_t VECTOR, int T>
inline void q2_k_mins(const Projection& p, const Half& rows, int64_t b, int64_t t0, typename V::F (&acc)[T]) {
    using I = typename V::I;
    const int64_t blocks = p.width / kBlock, at = b * rows.stride;
    I mins[4], even[4], odd[4];
    k16_mins<V, VECTOR>(rows.q + at, mins);
    q6_k_scale_pairs<V>(mins, even, odd);
    const typename V::F dmin = V::halves(rows.m + at);
    for (int t = 0; t < T; ++t) {
        const I less = q6_k_less_offsets<V, 0>(V::zero(), even, odd, p.xtotal + (t0 + t) * blocks + 8 * b);
        acc[t] = V::fma(V::mul(dmin, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(less), acc[t]);
    }
}

// The V::kRows rows of Q6_K (Q3_K, Q2_K) tiles at `rows` (from row0) against tokens [t0, t0 + T): per
// sub-block of 16, the rows' weights q (Q6_K's 0..63: ql's nibble, qh's 2 bits; Q3_K's 0..7; Q2_K's 0..3)
// times the token's activations, less the offset (32; 4; Q2_K none) times their sum (the token's sums per
// 16: `quantize_super`), times the rows' scales into i; then int8.cpp's float operation, fma(d * d_x,
// float(i), acc). q . x - 32 (sum of x) is (q - 32) . x exactly: the integers are those of the
// definition. Q2_K's mins meet the token's sums of 16 as Q6_K's offsets do, into n, and then
// fma(-(dmin * d_x), float(n), acc), as Q4_K's (computed as fma(dmin * d_x, float(-n), acc): the same).
template <typename V, int64_t VECTOR, int T, int64_t KIND,
          std::enable_if_t<KIND == Q6_K || KIND == Q3_K || KIND == Q2_K, int> = 0>
[[gnu::noinline]] void rows_dot(KindOf<KIND>, const Projection& p, const Half& rows, int64_t row0, int64_t t0, const Out& out) {
    using I = typename V::I;
    constexpr int shift = k16_shift<KIND>;
    const int64_t blocks = p.width / kBlock;
    typename V::F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zeros();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * rows.stride;
        ask_ahead(rows.d + at, rows.stride);  // every pass (`asks_ahead`)
        const uint8_t* q = rows.q + at;
        I words[4];
        k16_words<KIND, V, VECTOR>(q, words);
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            for (int j = 0; j < 2; ++j) {  // the piece's 16s: scale 2s + j
                const I scale = q6_k_scale_of<V>(words, 2 * s + j);
                I dot[T];
                if constexpr (!V::kSums16) {
                    for (int t = 0; t < T; ++t) {
                        dot[t] = k16_offset<KIND> ? q6_k_offset<V, 1 << shift>(p.xtotal[(t0 + t) * blocks + 8 * b + s], j)
                                                  : V::zero();
                    }
                }
                I pair = scale;  // kSums16: the scale in both int16 halves of each lane
                if constexpr (V::kSums16) pair = V::pair(scale);
                for (int e = 0; e < 4; ++e) {
                    const int G = 4 * j + e;
                    const I w = k16_group<KIND, V, VECTOR>(q, s, G);
                    for (int t = 0; t < T; ++t) {
                        const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s + 4 * G;
                        // kSums16: 2 pairs of (at most) 6-bit weights and int8s, below 2 x 2 x 63 x 128 < 2^15
                        if constexpr (V::kSums16) {
                            dot[t] = V::dot16(e % 2 ? dot[t] : V::zero(), w, x);
                            if (e % 2) i[t] = V::scaled(i[t], dot[t], pair);
                        } else {
                            dot[t] = V::dot(dot[t], w, x);
                        }
                    }
                }
                if constexpr (!V::kSums16)
                    for (int t = 0; t < T; ++t) i[t] = V::add(i[t], V::times(dot[t], scale));
            }
        }
        if constexpr (V::kSums16 && k16_offset<KIND>) {  // the 16 scales' "- offset (sum of x)" terms
            I even[4], odd[4];
            q6_k_scale_pairs<V>(words, even, odd);
            for (int t = 0; t < T; ++t)
                i[t] = q6_k_less_offsets<V, shift>(i[t], even, odd, p.xtotal + (t0 + t) * blocks + 8 * b);
        }
        const typename V::F d = V::halves(rows.d + at);
        for (int t = 0; t < T; ++t) acc[t] = V::fma(V::mul(d, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(i[t]), acc[t]);
        if constexpr (!k16_offset<KIND>) q2_k_mins<V, VECTOR, T>(p, rows, b, t0, acc);
    }
    put_rows<V, T>(acc, row0, t0, out);
}

// The V::kRows rows of IQ4_XS tiles at `rows` (from row0) against tokens [t0, t0 + T): per sub-block, the
// rows' looked-up weights times the token's activations (VNNI: the bytes w + 128, the sum from -128 times
// the token's sum of the 32; kSums16: the sign trick, a group's pairs widened at once times the scale),
// times the rows' scales (less 32) into i; then int8.cpp's float operation, fma(d * d_x, float(i), acc).
template <typename V, int64_t VECTOR, int T>
[[gnu::noinline]] void rows_dot(KindOf<IQ4_XS>, const Projection& p, const Half& rows, int64_t row0, int64_t t0, const Out& out) {
    using I = typename V::I;
    const int64_t blocks = p.width / kBlock;
    const I table = iq4_xs_table<V>();
    typename V::F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zeros();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * rows.stride;
        ask_ahead(rows.d + at, rows.stride);  // every pass (`asks_ahead`)
        const uint8_t* q = rows.q + at;
        I scale[8], i[T];
        iq4_xs_scales<V>(q, rows.m + at, scale);
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            I dot[T], pair = scale[s];
            if constexpr (V::kSums16) pair = V::pair(scale[s]);
            if constexpr (!V::kSums16)  // (w + offset) . x less offset (sum of x)
                for (int t = 0; t < T; ++t) dot[t] = V::words(-Traits<IQ4_XS>::offset * p.xtotal[(t0 + t) * blocks + 8 * b + s]);
            for (int G = 0; G < 8; ++G) {
                const I w = iq4_xs_group<V, VECTOR>(q, s, G, table);
                for (int t = 0; t < T; ++t) {
                    const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s + 4 * G;
                    if constexpr (V::kSums16)
                        i[t] = V::scaled(i[t], V::sign_dot16(w, x), pair);
                    else
                        dot[t] = V::dot(dot[t], w, x);
                }
            }
            if constexpr (!V::kSums16)
                for (int t = 0; t < T; ++t) i[t] = V::add(i[t], V::times(dot[t], scale[s]));
        }
        const typename V::F d = V::halves(rows.d + at);
        for (int t = 0; t < T; ++t) acc[t] = V::fma(V::mul(d, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(i[t]), acc[t]);
    }
    put_rows<V, T>(acc, row0, t0, out);
}

// The V::kRows rows at `rows` (from row0) against every token of the pass, V::kTokens at a time. The
// vectors' length is compiled in (VECTOR: 64 bytes, or 32 in a last tile of 8 rows), so that each of a
// block's vectors is read at a constant offset.
template <int64_t KIND, typename V>
void k_rows(const Projection& p, const Half& rows, int64_t row0, const Out& out) {
    for (int64_t t = 0; t < p.n; t += V::kTokens)
        for_count<V::kTokens>(p.n - t, [&](auto T) {
            if (rows.vector == 4 * kTile)
                rows_dot<V, 4 * kTile, T>(KindOf<KIND>(), p, rows, row0, t, out);
            else if constexpr (V::kRows == kTileRows)
                rows_dot<V, 4 * kTileRows, T>(KindOf<KIND>(), p, rows, row0, t, out);
        });
}

#else  // portable loops

// Rows 8g .. 8g + 7 of Q4_K (Q5_K) tiles against tokens [t0, t0 + T): each row's GGUF block back from
// the tile, then its integers and int8.cpp's float operations, one product at a time.
template <int64_t KIND, MinsKind<KIND> = 0>
void half_dot(KindOf<KIND>, const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile<KIND>(p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[Traits<KIND>::bytes];
            k_untile<KIND>(half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block)), dmin = half_to_float(load_u16(block + 2));
            for (int64_t t = 0; t < T; ++t) {
                const int64_t token = t0 + t;
                const int8_t* x = p.qx + token * p.width + b * kSuper;
                int32_t i = 0, n = 0;
        #pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
                    int scale, min, dot = 0;
                    q4_k_scale(block + 4, s, scale, min);
                    for (int e = 0; e < kBlock; ++e)
                        dot += (KIND == Q4_K ? q4_k_weight(block, s, e) : q5_k_weight(block, s, e)) * x[kBlock * s + e];
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

// A Q6_K super-block's integer sum i against a token's activations x, one product at a time: per 16
// weights (formats.h's layout), (q - 32) . x times the 16's scale.
int32_t super_sum(KindOf<Q6_K>, const uint8_t* block, const int8_t* x) {
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
    return i;
}

// A Q2_K super-block's: per 16 weights, q . x times the 16's scale; and its mins term n, each 16's min
// times the sum of its 16 activations.
int32_t super_sum(KindOf<Q2_K>, const uint8_t* block, const int8_t* x) {
    int32_t i = 0;
    for (int k = 0; k < 16; ++k) {
        int32_t dot = 0;
        for (int e = 16 * k; e < 16 * k + 16; ++e) dot += q2_k_weight(block, e) * x[e];
        i += (block[k] & 15) * dot;
    }
    return i;
}
int32_t super_mins(const uint8_t* block, const int8_t* x) {
    int32_t n = 0;
    for (int k = 0; k < 16; ++k) {
        int32_t sum = 0;
        for (int e = 16 * k; e < 16 * k + 16; ++e) sum += x[e];
        n += (block[k] >> 4) * sum;
    }
    return n;
}

// A Q3_K super-block's: per 16 weights, (q - 4) . x times the 16's scale less 32.
int32_t super_sum(KindOf<Q3_K>, const uint8_t* block, const int8_t* x) {
    int32_t i = 0;
    for (int k = 0; k < 16; ++k) {
        int32_t dot = 0;
        for (int e = 16 * k; e < 16 * k + 16; ++e) dot += (q3_k_weight(block, e) - 4) * x[e];
        i += (q3_k_scale(block, k) - 32) * dot;
    }
    return i;
}

// An IQ4_XS super-block's: per sub-block, its grid values . x times its scale less 32.
int32_t super_sum(KindOf<IQ4_XS>, const uint8_t* block, const int8_t* x) {
    int32_t i = 0;
    for (int s = 0; s < 8; ++s) {
        int32_t dot = 0;
        for (int j = 0; j < 16; ++j) {
            const uint8_t byte = block[8 + 16 * s + j];
            dot += kIq4nlValues[byte & 15] * x[kBlock * s + j] + kIq4nlValues[byte >> 4] * x[kBlock * s + 16 + j];
        }
        i += (iq4_xs_scale(block, s) - 32) * dot;
    }
    return i;
}

// Rows 8g .. 8g + 7 of Q6_K (Q3_K, Q2_K, IQ4_XS) tiles against tokens [t0, t0 + T), as Q4_K's `half_dot`
// reads Q4_K's: each super-block's `super_sum`, then fma(d * d_x, float(i), acc) (d at 208 for Q6_K, 108
// for Q3_K, 80 for Q2_K, 0 for IQ4_XS); Q2_K's mins then fma(dmin * d_x, float(-n), acc) (dmin at 82).
template <int64_t KIND, std::enable_if_t<KIND == Q6_K || KIND == Q3_K || KIND == Q2_K || KIND == IQ4_XS, int> = 0>
void half_dot(KindOf<KIND>, const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile<KIND>(p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[Traits<KIND>::bytes];
            k_untile<KIND>(half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block + (KIND == Q6_K ? 208 : KIND == Q3_K ? 108 : KIND == Q2_K ? 80 : 0)));
            for (int64_t t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper;
                const float dx = p.xd[(t0 + t) * blocks + 8 * b];
                acc[t] = std::fmaf(d * dx, float(super_sum(KindOf<KIND>(), block, x)), acc[t]);
                if constexpr (KIND == Q2_K)
                    acc[t] = std::fmaf(half_to_float(load_u16(block + 82)) * dx, float(-super_mins(block, x)), acc[t]);
            }
        }
        for (int64_t t = 0; t < T; ++t) out.put(t0 + t, g * kTileRows + r, acc[t]);
    }
}

#endif

}  // namespace

template <int64_t KIND>
void specdraft::k_group(const Projection& p, int64_t g, int64_t halves, const Out& out) {
#ifdef SPECDRAFT_AVX2
    for (int64_t h = 0; h < halves; ++h) {
        if (p.n > kFewTokens)
            k_pass_half<KIND>(p, g + h, out);  // int8_k_pass.cpp: each super-block unpacked once
        else
            k_rows<KIND, Ymm>(p, half_tile<KIND>(p.w, p.rows, p.row_bytes, g + h), (g + h) * kTileRows, out);
    }
#else
    for (int64_t t = 0; t < p.n; t += kInt8Tokens)
        for (int64_t h = 0; h < halves; ++h)
            half_dot(KindOf<KIND>(), p, g + h, t, p.n - t < kInt8Tokens ? p.n - t : kInt8Tokens, out);
#endif
}

#ifdef SPECDRAFT_ZMM
template <int64_t KIND>
void specdraft::k_whole_tile(const Projection& p, int64_t g, const Out& out) {
    // a whole tile's first half: its d, m and vectors begin where the tile's do, 4 * 16 bytes a vector
    k_rows<KIND, Zmm>(p, half_tile<KIND>(p.w, p.rows, p.row_bytes, g), g * kTileRows, out);
}
#endif

template <int64_t KIND>
void specdraft::k_tile_block(uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b, int r,
                             const uint8_t* block) {
    const HalfOf<uint8_t> half = half_tile<KIND>(tiles, rows, row_bytes, g);
    const auto copy = [&](uint8_t* tile, int offset, int n) { std::memcpy(tile, block + offset, n); };
    tile_pieces(KindOf<KIND>(), half, b * half.stride, r, copy);
}

template <int64_t KIND>
void specdraft::k_block_of(const uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b, int r,
                           uint8_t* block) {
    const Half half = half_tile<KIND>(tiles, rows, row_bytes, g);
    k_untile<KIND>(half, b * half.stride, r, block);
}

// Compiled for each K kind (tiles.h declares them).
template void specdraft::k_group<Q4_K>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_group<Q5_K>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_group<Q6_K>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_group<Q3_K>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_group<Q2_K>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_group<IQ4_XS>(const Projection&, int64_t, int64_t, const Out&);
template void specdraft::k_tile_block<Q4_K>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_tile_block<Q5_K>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_tile_block<Q6_K>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_tile_block<Q3_K>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_tile_block<Q2_K>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_tile_block<IQ4_XS>(uint8_t*, int64_t, int64_t, int64_t, int64_t, int, const uint8_t*);
template void specdraft::k_block_of<Q4_K>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
template void specdraft::k_block_of<Q5_K>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
template void specdraft::k_block_of<Q6_K>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
template void specdraft::k_block_of<Q3_K>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
template void specdraft::k_block_of<Q2_K>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
template void specdraft::k_block_of<IQ4_XS>(const uint8_t*, int64_t, int64_t, int64_t, int64_t, int, uint8_t*);
#ifdef SPECDRAFT_ZMM
template void specdraft::k_whole_tile<Q4_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_whole_tile<Q5_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_whole_tile<Q6_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_whole_tile<Q3_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_whole_tile<Q2_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_whole_tile<IQ4_XS>(const Projection&, int64_t, const Out&);
#endif
