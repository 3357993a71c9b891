// The projections' int8 arithmetic (a `Projection` with quantised tokens, projection.h).
//
// Each token's x is quantised in blocks of 32 (quantize.cpp's `quantize_token`): d = max |x| / 127, q = x * (1 / d)
// rounded to the nearest integer, ties to even (all 0 where d = 0), s = d * (sum of q). A weight
// block against a token's block is then an integer sum i = sum_j wq_j * q_j, exact in every path,
// and the row's sum for the token is, block after block in order,
//   acc = fma(dw * d, float(i), acc)      (i is below 2^24 in magnitude: exact as a float)
//   acc = fma(mw, s, acc)                 (Q4_1's and Q5_1's m: mw * sum_j x_j ~ mw * d * sum_j q_j)
// from acc = 0, then y = acc + bias (+ residual) as `Out::put` adds them. The paths differ only in
// how they reach each i (VNNI's `vpdpbusd`, AVX2's `vpmaddubsw` + `vpmaddwd`, or portable loops);
// every float operation is the one above, per row and token, so every path and pass width gives
// bitwise the same sums.
//
// (Q4_0's i = sum_j (q_j - 8) x_j, Q5_0's sum_j (q_j - 16) x_j: their w is q less the offset; IQ4_NL's
// sum_j table[q_j] x_j.) A K kind's tokens are quantised per super-block
// of 256 instead (one d over the 256, each 32 of it quantised with that d as above: `quantize_super`),
// and its blocks meet them as llama.cpp's q8_K dot products do: Q4_K (and Q5_K) per super-block
//   i = sum_s scale_s (sum_j q_sj x_sj), n = sum_s min_s (sum_j x_sj)        (s: 8 sub-blocks of 32)
//   acc = fma(d * d_x, float(i), acc), then acc = fma(-(dmin * d_x), float(n), acc)
// (int8_k.cpp's `rows_dot` for Q4_K), and Q6_K per super-block
//   i = sum_s scale_s (sum_j (q_sj - 32) x_sj)                              (s: 16 sub-blocks of 16)
//   acc = fma(d * d_x, float(i), acc)
// (its `rows_dot`, as q . x - 32 (sum of x); |i| < 2^31, float(i) rounding the same everywhere), and
// IQ4_XS per super-block
//   i = sum_s (scale_s - 32) (sum_j table[q_sj] x_sj)                        (s: 8 sub-blocks of 32)
//   acc = fma(d * d_x, float(i), acc);
// Q3_K as Q6_K (its scales less 32, its weights q - 4), and Q2_K as Q6_K without an offset, then its
// mins as Q4_K's per 16: acc = fma(-(dmin * d_x), float(n), acc), n = sum_k min_k (sum_j x_kj).
//
// The int8 arithmetic reads the weights as tiles (tiling.cpp's `specdraft_tile` writes them from GGUF rows, the
// same bytes rearranged). Rows 16i .. 16i + 15 are tile i (where the rows are 8 more than a multiple
// of 16, the last tile has 8); a tile of R rows holds its block b at w + 16i * row_bytes + b * R * block bytes:
//   d[R] float16 (Q4_1, Q5_1: then m[R]), then the integers as vectors of 4R bytes whose byte 4r + e is row
//   r's element 4G + e of a group G of 4 elements: Q4_1 (Q4_0) 4 vectors, vector v holding group v in its
//   low nibbles and group v + 4 in its high ones; Q8_0 8 vectors, one a group, each w + 128; Q5_0 (Q5_1)
//   Q4_1's 4 vectors of its q's low 4 bits, then a fifth whose byte 4r + e holds in bit G the 5th bit
//   of element 4G + e; IQ4_NL Q4_0's; the K kinds (a block a super-block of 256) as their
//   `tile_pieces` say (int8_k.cpp): their bytes in 4-byte groups, vectors of 4R bytes likewise.
// A group's 4 activations, broadcast, then meet a vector's rows in one instruction that sums them per
// row. A tile's half h (rows 8h .. 8h + 7) is 16 bytes of d and of m and 32 of each vector, at fixed
// offsets: 256-bit code reads a half, 512-bit code a whole tile, one load a vector; and each block of
// a tile is one stretch of memory, read front to back.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "for_count.h"
#include "formats.h"
#include "projection.h"
#include "tiles.h"

namespace {

// The float operations of a half tile's block of KIND for one token, row by row (the portable loops').
template <int64_t KIND>
inline void tile_block_sums(const Half& half, int64_t at, const int32_t i[kTileRows], float dx, float sx, float* acc) {
    for (int r = 0; r < kTileRows; ++r) {
        float a = std::fmaf(half_to_float(load_u16(half.d + at + 2 * r)) * dx, float(i[r]), acc[r]);
        if constexpr (Traits<KIND>::scales == 2) a = std::fmaf(half_to_float(load_u16(half.m + at + 2 * r)), sx, a);
        acc[r] = a;
    }
}

#ifdef SPECDRAFT_AVX2

// A lookup kind's table (formats.h's `Traits::table`) in each 128-bit lane, as the bytes its products
// take: w + 128 (its offset) for VNNI's unsigned bytes, w itself for the sign trick.
template <int64_t KIND>
inline __m256i lookup_table() {
    static_assert(Traits<KIND>::offset == 128, "a lookup kind's looked-up bytes exceed its weights by 128");
    const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)Traits<KIND>::table));
#ifdef SPECDRAFT_VNNI
    return _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));  // w + 128
#else
    return w;
#endif
}

// Group G (0..7) of a half tile's block at q (`vector` bytes apart): its 8 rows' 4 weights each, as
// bytes the instructions below take (Q4_1's 0..15; Q5_0's q, 0..31; Q8_0's w + 128 for VNNI, w without it;
// IQ4_NL's nibbles looked up in its table as Q8_0's are).
// The bytes exceed the weights by `Traits::offset` (their dot product less offset * sum of x): Q4_1's
// none, Q5_0's 16, Q8_0's 128 with VNNI (without, the weights themselves come back).
template <int64_t KIND>
inline __m256i group_weights(const uint8_t* q, int64_t vector, int G) {
    if constexpr (Traits<KIND>::bits < 8) {
        const __m256i raw = _mm256_loadu_si256((const __m256i*)(q + vector * (G % 4))), nibble = _mm256_set1_epi8(15);
        const __m256i low = _mm256_and_si256(G < 4 ? raw : _mm256_srli_epi16(raw, 4), nibble);
        if constexpr (Traits<KIND>::lookup) return _mm256_shuffle_epi8(lookup_table<KIND>(), low);
        if constexpr (Traits<KIND>::bits == 4) return low;
        // bit G of each byte of the fifth vector to bit 4 (16-bit shifts: the bit stays in its byte)
        const __m256i bit = _mm256_and_si256(_mm256_loadu_si256((const __m256i*)(q + vector * 4)), _mm256_set1_epi8(char(1 << G)));
        return _mm256_or_si256(low, G <= 4 ? _mm256_slli_epi16(bit, 4 - G) : _mm256_srli_epi16(bit, G - 4));
    }
    const __m256i w = _mm256_loadu_si256((const __m256i*)(q + vector * G));
#ifdef SPECDRAFT_VNNI
    return w;
#else
    return _mm256_xor_si256(w, _mm256_set1_epi8(char(0x80)));  // w + 128 -> w
#endif
}

// Block b's integer sums of H half tiles' rows against T tokens, into sums[h][t] (8 rows a register):
// `Block` says where they lie. One function a way of reaching them (VNNI's `vpdpbusd`; AVX2's
// `vpmaddubsw` + `vpmaddwd` on unsigned weights, or on signed ones by the sign trick); the integers are
// the same whichever.
struct Block {
    const Half* half;         // each half tile's
    int64_t at;               // the block's bytes on from block 0, in each half tile
    const int8_t* x;          // token 0's activations of the block; token t's at x + t * width
    int64_t width;
    const int32_t* xtotal;    // token 0's sum of them; token t's at xtotal + t * blocks
    int64_t blocks;
    const int8_t* group(int t, int G) const { return x + t * width + 4 * G; }
    int32_t total(int t) const { return xtotal[t * blocks]; }
};

#ifdef SPECDRAFT_VNNI
// (w + offset) . x = w . x + offset * (sum of x): the offset's term first.
template <int64_t KIND, int H, int T>
[[gnu::always_inline]] inline void block_sums(const Block& k, __m256i (&sums)[H][T]) {
    for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) sums[h][t] = _mm256_set1_epi32(-Traits<KIND>::offset * k.total(t));
    for (int G = 0; G < 8; ++G) {
        __m256i bx[T];
        for (int t = 0; t < T; ++t) bx[t] = broadcast4(k.group(t, G));
        for (int h = 0; h < H; ++h) {
            const __m256i w = group_weights<KIND>(k.half[h].q + k.at, k.half[h].vector, G);
            for (int t = 0; t < T; ++t) sums[h][t] = dot_add(sums[h][t], w, bx[t]);
        }
    }
}
#else
// Unsigned weights (fewer than 8 bits) times x: 16-bit sums of `run` groups' pairs, then 32 bits. Each
// 16-bit sum is at most run x 2 x (largest weight) x 127 < 2^15 (Q4_1: 8 x 2 x 15 x 127; Q5_0: 4 x 2 x 31 x
// 127), so the integers are those of a 32-bit sum of each pair. Q5_0's bytes are w + 16: less offset x
// (sum of x).
template <int BITS>
constexpr int sums16_run() {
    int run = 8;
    while (run * 2 * ((1 << BITS) - 1) * 127 >= 1 << 15) run /= 2;
    return run;
}

template <int64_t KIND, int H, int T>
[[gnu::always_inline]] inline void unsigned_sums(const Block& k, __m256i (&sums)[H][T]) {
    constexpr int run = sums16_run<Traits<KIND>::bits>();
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) sums[h][t] = _mm256_set1_epi32(-Traits<KIND>::offset * k.total(t));
#pragma GCC unroll 8
    for (int G0 = 0; G0 < 8; G0 += run) {
        __m256i pairs[H][T];
        for (int G = G0; G < G0 + run; ++G) {
            __m256i bx[T];
            for (int t = 0; t < T; ++t) bx[t] = broadcast4(k.group(t, G));
            for (int h = 0; h < H; ++h) {
                const __m256i w = group_weights<KIND>(k.half[h].q + k.at, k.half[h].vector, G);
                for (int t = 0; t < T; ++t) {
                    const __m256i product = _mm256_maddubs_epi16(w, bx[t]);
                    pairs[h][t] = G == G0 ? product : _mm256_add_epi16(pairs[h][t], product);
                }
            }
        }
        for (int h = 0; h < H; ++h)
            for (int t = 0; t < T; ++t) sums[h][t] = _mm256_add_epi32(sums[h][t], _mm256_madd_epi16(pairs[h][t], ones));
    }
}

// Signed weights (Q8_0's, IQ4_NL's) times x by the sign trick: |w| times x with w's sign (|pair| <= 2 * 128 * 127).
template <int64_t KIND, int H, int T>
[[gnu::always_inline]] inline void signed_sums(const Block& k, __m256i (&sums)[H][T]) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) sums[h][t] = _mm256_setzero_si256();
    for (int G = 0; G < 8; ++G) {
        for (int h = 0; h < H; ++h) {
            const __m256i w = group_weights<KIND>(k.half[h].q + k.at, k.half[h].vector, G), magnitude = _mm256_abs_epi8(w);
            for (int t = 0; t < T; ++t) {
                const __m256i signed_x = _mm256_sign_epi8(broadcast4(k.group(t, G)), w);
                sums[h][t] = _mm256_add_epi32(sums[h][t], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
            }
        }
    }
}

template <int64_t KIND, int H, int T>
[[gnu::always_inline]] inline void block_sums(const Block& k, __m256i (&sums)[H][T]) {
    if constexpr (Traits<KIND>::bits < 8 && !Traits<KIND>::lookup)
        unsigned_sums<KIND>(k, sums);
    else
        signed_sums<KIND>(k, sums);
}
#endif

// Rows 8g .. 8g + 8H - 1 (half tile g, and for H = 2 the tile's other half g + 1) against tokens [t0,
// t0 + T) of weights of KIND: each block read whole before the next (`block_sums`), the H x T sums in
// registers from block to block (H, T and KIND known when compiled, as `int8_tile`'s are; AVX2 has 16
// registers), then int8.cpp's float operations.
template <int64_t KIND, int H, int T>
[[gnu::noinline]] void int8_halves(const Projection& p, int64_t g, int64_t t0, const Out& out) {  // as `int8_tile`
    const int64_t blocks = p.width / kBlock;
    Half half[H];
    for (int h = 0; h < H; ++h) half[h] = half_tile<KIND>(p.w, p.rows, p.row_bytes, g + h);
    const float* xd = p.xd + t0 * blocks;
    const float* xsum = p.xsum + t0 * blocks;
    __m256 acc[H][T];
    for (int h = 0; h < H; ++h)
        for (int t = 0; t < T; ++t) acc[h][t] = _mm256_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = b * half[0].stride;
        if (asks_ahead<KIND>(T)) ask_ahead(half[0].d + at, half[0].stride);
        __m256i sums[H][T];
        block_sums<KIND>(Block{half, at, p.qx + t0 * p.width + b * kBlock, p.width, p.xtotal + t0 * blocks + b, blocks}, sums);
        for (int h = 0; h < H; ++h) {
            const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(half[h].d + at)));
            for (int t = 0; t < T; ++t)
                acc[h][t] = _mm256_fmadd_ps(_mm256_mul_ps(dw, _mm256_set1_ps(xd[t * blocks + b])), _mm256_cvtepi32_ps(sums[h][t]), acc[h][t]);
            if constexpr (Traits<KIND>::scales == 2) {
                const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(half[h].m + at)));
                for (int t = 0; t < T; ++t) acc[h][t] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xsum[t * blocks + b]), acc[h][t]);
            }
        }
    }
    for (int h = 0; h < H; ++h) {
        for (int t = 0; t < T; ++t) {
            alignas(32) float sums[kTileRows];
            _mm256_store_ps(sums, acc[h][t]);
            for (int r = 0; r < kTileRows; ++r) out.put(t0 + t, (g + h) * kTileRows + r, sums[r]);
        }
    }
}

constexpr int64_t kHalvesTokens[3] = {0, 4, 2};  // tokens H halves' sums are held for at once (AVX2's 16 registers)

// Rows 8g .. 8g + 8 halves - 1 (half tile g, and for 2 halves the tile's other half) against every
// token, kHalvesTokens[halves] at a time.
template <int64_t KIND>
void int8_group(const Projection& p, int64_t g, int64_t halves, const Out& out) {
    if constexpr (Traits<KIND>::super) {
        specdraft::k_group<KIND>(p, g, halves, out);
    } else {
        const auto each = [&](auto H) {
            for (int64_t t = 0; t < p.n; t += kHalvesTokens[H])
                for_count<kHalvesTokens[H]>(p.n - t, [&](auto T) { int8_halves<KIND, H, T>(p, g, t, out); });
        };
        halves == 2 ? each(std::integral_constant<int, 2>()) : each(std::integral_constant<int, 1>());
    }
}

#ifdef SPECDRAFT_ZMM

constexpr int64_t kTileTokens = 16;  // tokens a whole tile's sums are held for at once, in registers

// A lookup kind's 8 groups of nibbles looked up in its table, as `group_weights` does.
template <int64_t KIND>
inline void look_up(__m512i w[8]) {
    const __m512i table = _mm512_broadcast_i32x4(_mm256_castsi256_si128(lookup_table<KIND>()));
    for (int G = 0; G < 8; ++G) w[G] = _mm512_shuffle_epi8(table, w[G]);
}

// Rows 8g .. 8g + 15 (a whole tile, g even) against tokens [t0, t0 + T) of weights of KIND: `int8_halves`'
// operations on both halves at once in 512-bit registers (one load a vector; one broadcast of a token's
// group serves 16 rows). T and KIND are known when compiled, so that the T sums stay in registers from
// block to block and no token tests the kind (one loop for any T kept its sums in memory, and a
// verify step took longer).
// Not inlined: inlined into its caller (`for_count`'s), the 1-token code ran several times slower in
// the kernel alone (the cause not traced; the figures: benchmarks/results/HISTORY.md).
template <int64_t KIND, int T>
[[gnu::noinline]] void int8_tile(const Projection& p, int64_t g, int64_t t0, const Out& out) {
    static_assert(T >= 1 && T <= kTileTokens, "a tile's sums for at most kTileTokens tokens");
    using K = Traits<KIND>;
    const int64_t blocks = p.width / kBlock, stride = kTile * K::bytes;
    const int64_t head = 2 * K::scales * kTile;
    const __m512i nibble = _mm512_set1_epi8(15);
    const int8_t* qx = p.qx + t0 * p.width;
    const float* xd = p.xd + t0 * blocks;
    const float* xsum = p.xsum + t0 * blocks;
    const int32_t* xtotal = p.xtotal + t0 * blocks;
    const uint8_t* tile = p.w + (g / 2) * kTile * p.row_bytes;
    __m512 acc[T];
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < blocks; ++b, tile += stride) {
        if (asks_ahead<KIND>(T)) ask_ahead(tile, stride);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)tile));
        __m512 mw = _mm512_setzero_ps();
        __m512i w[8];
        if constexpr (K::bits < 8) {
            if constexpr (K::scales == 2) mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(tile + 2 * kTile)));
            for (int v = 0; v < 4; ++v) {
                __m512i raw = _mm512_loadu_si512((const void*)(tile + head + 4 * kTile * v));
                w[v] = _mm512_and_si512(raw, nibble);
                w[v + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), nibble);
            }
            if constexpr (K::lookup) look_up<KIND>(w);
            if constexpr (K::bits == 5) {  // bit G of the fifth vector's bytes to bit 4 of group G's
                const __m512i fifth = _mm512_loadu_si512((const void*)(tile + head + 4 * kTile * 4));
                for (int G = 0; G < 8; ++G) {
                    const __m512i bit = _mm512_and_si512(fifth, _mm512_set1_epi8(char(1 << G)));
                    w[G] = _mm512_or_si512(w[G], G <= 4 ? _mm512_slli_epi16(bit, 4 - G) : _mm512_srli_epi16(bit, G - 4));
                }
            }
        } else {
            for (int G = 0; G < 8; ++G) w[G] = _mm512_loadu_si512((const void*)(tile + head + 4 * kTile * G));
        }
        for (int t = 0; t < T; ++t) {
            const int64_t at = t * blocks + b;
            const int8_t* x = qx + t * p.width + b * kBlock;
            // Two chains of dependent sums (integer: any grouping gives the same sum); Q8_0: (w + 128) . x
            // = w . x + 128 * (sum of x)
            __m512i chain[2] = {_mm512_set1_epi32(-K::offset * xtotal[at]), _mm512_setzero_si512()};
            for (int G = 0; G < 8; ++G) {
                int32_t group;
                std::memcpy(&group, x + 4 * G, 4);
                chain[G % 2] = _mm512_dpbusd_epi32(chain[G % 2], w[G], _mm512_set1_epi32(group));
            }
            const __m512i sums = _mm512_add_epi32(chain[0], chain[1]);
            acc[t] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(xd[at])), _mm512_cvtepi32_ps(sums), acc[t]);
            if constexpr (K::scales == 2) acc[t] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xsum[at]), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        alignas(64) float sums[2 * kTileRows];
        _mm512_store_ps(sums, acc[t]);
        for (int r = 0; r < 2 * kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, sums[r]);
    }
}

// A whole tile (g even) against every token of the pass, kTileTokens at a time.
template <int64_t KIND>
void int8_whole_tile(const Projection& p, int64_t g, const Out& out) {
    if constexpr (Traits<KIND>::super) {
        specdraft::k_whole_tile<KIND>(p, g, out);
    } else {
        for (int64_t t = 0; t < p.n; t += kTileTokens)
            for_count<kTileTokens>(p.n - t, [&](auto n) { int8_tile<KIND, n>(p, g, t, out); });
    }
}
#endif

#else  // portable loops: the same integer sums and float operations

// Rows 8g .. 8g + 7 (a half tile of KIND) against tokens [t0, t0 + T).
template <int64_t KIND>
void int8_half(const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile<KIND>(p.w, p.rows, p.row_bytes, g);
    float acc[kInt8Tokens][kTileRows] = {};
    for (int64_t b = 0; b < blocks; ++b) {
        const int64_t at = b * half.stride;
        int32_t w[kTileRows][kBlock];
        for (int r = 0; r < kTileRows; ++r)
            for (int j = 0; j < kBlock; ++j) w[r][j] = tile_weight<KIND>(half, at, r, j);
        for (int64_t t = 0; t < T; ++t) {
            const int64_t token = t0 + t, at = token * blocks + b;
            const int8_t* x = p.qx + token * p.width + b * kBlock;
            int32_t i[kTileRows];
            for (int r = 0; r < kTileRows; ++r) {
                i[r] = 0;
                for (int j = 0; j < kBlock; ++j) i[r] += w[r][j] * int32_t(x[j]);
            }
            tile_block_sums<KIND>(half, b * half.stride, i, p.xd[at], p.xsum[at], acc[t]);
        }
    }
    for (int64_t t = 0; t < T; ++t)
        for (int r = 0; r < kTileRows; ++r) out.put(t0 + t, g * kTileRows + r, acc[t][r]);
}

template <int64_t KIND>
void int8_group(const Projection& p, int64_t g, int64_t halves, const Out& out) {
    if constexpr (Traits<KIND>::super) {
        specdraft::k_group<KIND>(p, g, halves, out);
    } else {
        for (int64_t t = 0; t < p.n; t += kInt8Tokens)
            for (int64_t h = 0; h < halves; ++h) int8_half<KIND>(p, g + h, t, p.n - t < kInt8Tokens ? p.n - t : kInt8Tokens, out);
    }
}

#endif

// Rows [start, end) of tiles of KIND: each tile whole where the range holds it, else its half tiles.
template <int64_t KIND>
void project_kind(const Projection& p, int64_t start, int64_t end, const Out& out) {
    for (int64_t g = start / kTileRows; g < end / kTileRows;) {
        const int64_t halves = g % 2 == 0 && g + 1 < end / kTileRows ? 2 : 1;
#ifdef SPECDRAFT_ZMM
        if (halves == 2) {
            int8_whole_tile<KIND>(p, g, out);
            g += halves;
            continue;
        }
#endif
        int8_group<KIND>(p, g, halves, out);
        g += halves;
    }
}

}  // namespace

void specdraft::project_int8(const Projection& p, int64_t start, int64_t end, const Out& out) {
    with_kind(p.kind, [&](auto k) {
        if constexpr (!Traits<k>::floats) project_kind<k>(p, start, end, out);
    });
}

// Which code this build runs: 0 the portable loops; 2 AVX2 (its int8 sums by vpmaddubsw), 3 AVX2 with
// AVX-VNNI, 4 AVX2 with AVX-512 VNNI (the int8 sums by vpdpbusd), 5 that reading whole tiles in
// 512-bit registers.
extern "C" int64_t specdraft_blocks_version() {
#if defined(SPECDRAFT_ZMM)
    return 5;
#elif defined(SPECDRAFT_VNNI)
    return 2 + SPECDRAFT_VNNI;
#elif defined(SPECDRAFT_AVX2)
    return 2;
#else
    return 0;
#endif
}
