// The int8 arithmetic's tiles as its files read them (int8.cpp: the kinds of 32-weight blocks, the
// tokens' quantisation; tiling.cpp: writing tiles and reading their values back; int8_k.cpp: the K
// kinds' tiles): where a half tile lies and a weight in it (`tile_weight`), asking for tiles ahead, a
// token's group of 4 activations against a vector of weights, and the instructions a build has
// (SPECDRAFT_VNNI, SPECDRAFT_ZMM). int8.cpp says what the arithmetic computes.
#pragma once

#include <cstdint>
#include <cstring>

#include "formats.h"
#include "projection.h"

#ifdef SPECDRAFT_AVX2
#if defined(__AVX512VNNI__) && defined(__AVX512VL__) && !defined(SPECDRAFT_NO_VNNI)
#define SPECDRAFT_VNNI 2
#elif defined(__AVXVNNI__) && !defined(SPECDRAFT_NO_VNNI)
#define SPECDRAFT_VNNI 1
#endif
#if defined(SPECDRAFT_VNNI) && SPECDRAFT_VNNI == 2 && defined(__AVX512F__) && defined(__AVX512BW__) && \
    !defined(SPECDRAFT_NO_ZMM)
#define SPECDRAFT_ZMM 1
#endif
#endif

namespace {

using specdraft::Out;

// Into the L2 cache only: the int8 arithmetic's tiles, asked for far ahead where a pass has several
// tokens (it computes long between asks, and the L1's few outstanding misses would hold the stream
// back). Most decode tokens' streams the hardware's prefetcher keeps up with alone (`asks_ahead`).
inline void prefetch_far(const void* p) { __builtin_prefetch(p, 0, 2); }

constexpr int64_t kTileRows = 8;     // rows a half tile interleaves (a 256-bit vector's lanes)
constexpr int64_t kTile = 16;        // rows a whole tile interleaves
constexpr int64_t kInt8Tokens = 16;  // tokens the portable loops hold a half tile's sums for at once
constexpr int64_t kInt8Ahead = 8192;  // bytes of tiles asked for ahead of the block computed (memory's latency)

// A tile's block of `bytes` at `block`: its lines kInt8Ahead on asked for, into L2 (`prefetch_far`),
// where `asks_ahead` says so. The callers decide by the kind and token count their code is compiled
// for: a test of the pass's width inside their loop let the compiler make a second copy of the loop,
// its sums in memory and two blocks at a time, and take it (a slower one).
inline void ask_ahead(const uint8_t* block, int64_t bytes) {
    for (int64_t line = 0; line < bytes; line += 64) prefetch_far(block + kInt8Ahead + line);
}

// Whether a pass of `tokens` over tiles of KIND asks for them ahead: a pass of several tokens always;
// a decode token only where the hardware's prefetcher alone fell behind (`Traits::ahead`: the K kinds,
// each block's vectors read out of order, and Q5_0; benchmarks/results/HISTORY.md).
template <int64_t KIND>
constexpr bool asks_ahead(int tokens) { return tokens > 1 || Traits<KIND>::ahead; }

// Where half h of a tile keeps block 0's scales (d; Q4_1's m) and integers (vector v at q + v * vector),
// and how far on block b + 1's are (stride). Byte: const uint8_t to read tiles, uint8_t to write them.
template <typename Byte>
struct HalfOf {
    Byte* d;
    Byte* m;
    Byte* q;
    int64_t vector;
    int64_t stride;
};
using Half = HalfOf<const uint8_t>;

// Half h (0, 1) of the tile that holds rows 8g .. 8g + 7 (g = 2i + h) of weights w of KIND, `rows` rows long.
template <int64_t KIND, typename Byte>
HalfOf<Byte> half_tile(Byte* w, int64_t rows, int64_t row_bytes, int64_t g) {
    const int64_t i = g / 2, h = g % 2, R = 16 * i + kTile <= rows ? kTile : kTileRows;
    Byte* tile = w + kTile * i * row_bytes;
    const int64_t scales = 2 * Traits<KIND>::scales * R;  // d (and m, Q4_K's dmin) of R rows
    return {tile + 16 * h, tile + 2 * R + 16 * h, tile + scales + 32 * h, 4 * R, R * Traits<KIND>::bytes};
}

// Row r's (0..7) integer weight j (0..31) of a half tile's block of KIND (`at` bytes on from block 0):
// Q4_1's 0..15, Q8_0's -128..127, Q4_0's q - 8, Q5_0's q - 16 (the tile's byte less the kind's offset),
// IQ4_NL's table entry q.
template <int64_t KIND>
inline int32_t tile_weight(const Half& half, int64_t at, int r, int j) {
    using K = Traits<KIND>;
    const int group = j / 4, e = j % 4;
    if constexpr (K::bits == 8) {
        return int32_t(half.q[at + half.vector * group + 4 * r + e]) - K::offset;
    } else {
        const uint8_t byte = half.q[at + half.vector * (group % 4) + 4 * r + e];
        int32_t q = group < 4 ? byte & 15 : byte >> 4;
        if constexpr (K::bits == 5) q |= ((half.q[at + half.vector * 4 + 4 * r + e] >> group) & 1) << 4;
        if constexpr (K::lookup) return K::table[q];
        return q - K::offset;
    }
}

#ifdef SPECDRAFT_AVX2

#if SPECDRAFT_VNNI == 2
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
#elif SPECDRAFT_VNNI == 1
inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_avx_epi32(acc, u, s); }
#endif

inline __m256i broadcast4(const int8_t* p) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

// A group's 4 weights of 8 rows (unsigned) times a token's 4 activations, added to each row's sum.
inline __m256i group_dot(__m256i acc, __m256i w, __m256i x) {
#ifdef SPECDRAFT_VNNI
    return dot_add(acc, w, x);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)));
#endif
}

#endif

}  // namespace

namespace specdraft {

// The K kinds' tiles (int8_k.cpp, compiled there for each K kind): rows 8g .. 8g + 8 halves - 1
// (half tile g, and for 2 halves the tile's other half) against every token; a whole tile (g even) so,
// in 512-bit registers (where SPECDRAFT_ZMM); row r (0..7) of half tile g's super-block b from its GGUF
// block into the tiles, and back.
template <int64_t KIND>
void k_group(const Projection& p, int64_t g, int64_t halves, const Out& out);
// Half tile g of the K kinds against a pass of more than kFewTokens tokens, in 256-bit registers
// (int8_k_pass.cpp: each super-block unpacked once for the whole pass); shorter passes unpack as they read.
constexpr int64_t kFewTokens = 4;
template <int64_t KIND>
void k_pass_half(const Projection& p, int64_t g, const Out& out);
template <int64_t KIND>
void k_whole_tile(const Projection& p, int64_t g, const Out& out);
template <int64_t KIND>
void k_tile_block(uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b, int r, const uint8_t* block);
template <int64_t KIND>
void k_block_of(const uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b, int r, uint8_t* block);

}  // namespace specdraft
