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
// K kind's sub-block: formats.h). The float kinds' int8 arithmetic reads their tiles (`Tiled`: projection.h's
// `float_tile_at`), a tile's 8 rows at a time in every pass (a short pass without 512-bit registers:
// `tile_tokens`, a chunk of the tile for each row in turn). x86 machines with AVX2, FMA and F16C (every AVX-512 machine too) run the intrinsics
// below; others compile the portable loops (the compiler vectorises them; fmaf is an instruction
// wherever the machine has FMA). Both give the same sums.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "float32_lanes.h"
#include "for_count.h"
#include "formats.h"
#include "projection.h"

namespace {

using specdraft::Out;

constexpr int64_t kRows = 8;       // rows a decode tile reads together
constexpr int64_t kPassRows = 2;   // rows a tile of a longer pass reads together
constexpr int64_t kTokens = 6;     // tokens a tile of a longer pass computes together (2 x 6 sums)
constexpr int64_t kShort = 8;      // the most tokens a short pass reads a row's values once for (8 sums)

constexpr int64_t kAhead = 1;  // tiles a decode tile asks the memory for ahead of reading them

inline void prefetch(const void* p) { __builtin_prefetch(p, 0, 3); }

#include "float32_pairs.h"

// One decode token, R rows from `w` (each `step` bytes on from the last; Tiled: a float kind's tile): from
// their blocks, expanded in registers, or float32 rows. (The kernels below are compiled per kind, so that
// each reads its blocks as if it were the only one.)
template <int64_t kind, bool Tiled, int R>
void decode_tile(const uint8_t* w, int64_t step, int64_t row_bytes, int64_t width, const float* x, float* sums) {
    Lanes acc[R];
    for (int r = 0; r < R; ++r) acc[r] = zero();
    if constexpr (Traits<kind>::dense) {
        int64_t i = 0;
        for (; i + kLanes <= width; i += kLanes) {
            Lanes xv = load(x + i);
#pragma GCC unroll 8
            for (int r = 0; r < R; ++r) fma_into(load((const float*)(w + r * step) + i), xv, acc[r]);
        }
        if (i < width) {
            Lanes xv = load(x + i, width - i);
            for (int r = 0; r < R; ++r) fma_into(load((const float*)(w + r * step) + i, width - i), xv, acc[r]);
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
                // the same piece a tile on (about: a K kind's block in eighths; in a float kind's tile, line r
                // of the 8 rows' piece): memory and arithmetic overlap
                if constexpr (Tiled) {
                    prefetch(w + 4 * b * specdraft::kFloatStep + 64 * r + kAhead * R * row_bytes);
                    piece_values<kind, Tiled>(w + r * step, b, v);
                } else {
                    const uint8_t* p = w + r * step + (b >> shift) * bytes;
                    prefetch(p + (sub * bytes >> shift) + kAhead * R * row_bytes);
                    block_values<kind>(p, sub, v);
                }
                for (int i = 0; i < 4; ++i) fma_into(v[i], load(xb + 8 * i), acc[r]);  // x from L1: registers hold sums
            }
        }
    }
    for (int r = 0; r < R; ++r) sums[r] = total(acc[r]);
}

// A row of blocks of KIND (Tiled: in a float kind's tiles) -> its float32 values out[width] (`expand_row`'s
// values, vectorised).
template <int64_t KIND, bool Tiled = false>
void expand_values(const uint8_t* row, int64_t width, float* out) {
    for (int64_t b = 0; b < width / kBlock; ++b) {
        Lanes v[4];
        piece_values<KIND, Tiled>(row, b, v);
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

// A float kind's tile of 8 rows against the T tokens (stride xs) of a short pass: `row_tokens`' sums, each
// row's read in chunks of kChunk pieces, a chunk of the tile (4 KB, kept in L1) read for each row in turn,
// each row's sums kept between chunks. (A row of a tile alone would read 16 bytes of every 128.)
template <int64_t kind, int T>
void tile_tokens(const uint8_t* tile, int64_t width, const float* x, int64_t xs, int64_t first, const Out& out) {
    constexpr int64_t kChunk = 8;
    Lanes acc[kRows][T];
    for (int r = 0; r < kRows; ++r)
        for (int t = 0; t < T; ++t) acc[r][t] = zero();
    for (int64_t b0 = 0; b0 < width / kBlock; b0 += kChunk) {
        const int64_t b1 = b0 + kChunk < width / kBlock ? b0 + kChunk : width / kBlock;
        for (int r = 0; r < kRows; ++r) {
            // the next chunk (kChunk x 512 bytes), an eighth a row: memory and arithmetic overlap
            const uint8_t* next = tile + (b1 + r * kChunk / kRows) * 4 * specdraft::kFloatStep;
            for (int64_t line = 0; line < kChunk / kRows * 4 * specdraft::kFloatStep; line += 64) prefetch(next + line);
            Lanes a[T];
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) a[t] = acc[r][t];
            for (int64_t b = b0; b < b1; ++b) {
                Lanes v[4];
                piece_values<kind, true>(tile + r * specdraft::kFloatGroup, b, v);
#pragma GCC unroll 4
                for (int i = 0; i < 4; ++i)
#pragma GCC unroll 8
                    for (int t = 0; t < T; ++t) fma_into(v[i], load(x + t * xs + b * kBlock + 8 * i), a[t]);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) acc[r][t] = a[t];
        }
    }
    for (int r = 0; r < kRows; ++r)
        for (int t = 0; t < T; ++t) out.put(t, first + r, total(acc[r][t]));
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

template <int64_t kind, bool Tiled, int R>
void decode_rows(const uint8_t* w, int64_t row_bytes, int64_t width, const float* x, int64_t first, const Out& out) {
    float sums[R];
#ifdef SPECDRAFT_PAIRS
    if constexpr (Tiled && R == kRows) decode_tile_pairs<kind>(row_at<Tiled>(w, row_bytes, first), row_bytes, width, x, sums); else
#endif
    decode_tile<kind, Tiled, R>(row_at<Tiled>(w, row_bytes, first), Tiled ? specdraft::kFloatGroup : row_bytes,
                                row_bytes, width, x, sums);
    for (int r = 0; r < R; ++r) out.put(0, first + r, sums[r]);
}

template <int R, int T>
void pass_tokens(const float* values, int64_t width, const float* x, int64_t xs, int64_t t0, int64_t first,
                 const Out& out) {
    float sums[R * T];
    bool paired = false;
#ifdef SPECDRAFT_PAIRS
    if constexpr (R % 2 == 0)
        if (width % kLanes == 0) {
            dense_pairs<R / 2, T>(values, width, width, x + t0 * xs, xs, sums);
            paired = true;
        }
#endif
    if (!paired) dense_tile<R, T>(values, width, width, x + t0 * xs, xs, sums);
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

// Rows [start, end) of every token, the rows as GGUF lays them or (Tiled) in a float kind's tiles.
template <int64_t kind, bool Tiled>
void project_kind(const Projection& p, int64_t start, int64_t end, const Out& out) {
    const int64_t row_bytes = p.row_bytes, width = p.width, n = p.n, xs = p.xs;
    const uint8_t* w = p.w;
    const float* x = p.x;
    if (n == 1) {
        int64_t r = start;
        for (; r + kRows <= end; r += kRows) decode_rows<kind, Tiled, kRows>(w, row_bytes, width, x, r, out);
        for (; r < end; ++r) decode_rows<kind, Tiled, 1>(w, row_bytes, width, x, r, out);
        return;
    }
    if (n <= kShort) {  // a short pass (a verify step's k + 1 tokens): each row's blocks expanded once, in registers
#ifdef SPECDRAFT_PAIRS
        int64_t paired = start;  // rows computed in pairs; the rest below
        if (Traits<kind>::floats && short_pass_in_pairs<kind, Tiled>(p, paired, end, out)) return;
        start = paired;
#endif
        if constexpr (Tiled) {  // a float kind's tiles, 8 rows at a time
            for (int64_t r = start; r < end; r += kRows)
                for_count<kShort>(n, [&](auto T) { tile_tokens<kind, T>(row_at<Tiled>(w, row_bytes, r), width, x, xs, r, out); });
        } else {
            for (int64_t r = start; r < end; ++r) {
                for (int64_t i = 0; i < row_bytes; i += 64) prefetch(w + (r + 1) * row_bytes + i);  // the next row
                for_count<kShort>(n, [&](auto T) { short_pass_row<kind, T>(w + r * row_bytes, width, x, xs, r, out); });
            }
        }
        return;
    }
    static thread_local std::vector<float> scratch;  // a longer pass: rows expanded into scratch, tiles of 2 x 6 (8 x 6: below)
    constexpr bool dense = Traits<kind>::dense;
    constexpr int64_t expanded = Tiled ? kRows : kPassRows;  // rows expanded at once (a float kind's tile)
    if (!dense) scratch.resize(expanded * width);
    for (int64_t r = start; r < end; r += expanded) {
        const int64_t rows = end - r < expanded ? end - r : expanded;
        if (!Tiled)
            for (int64_t i = 0; i < kPassRows * row_bytes; i += 64) prefetch(w + (r + kPassRows) * row_bytes + i);  // the next rows
        const float* values = (const float*)(w + r * row_bytes);
        if constexpr (!dense) {  // each row's blocks expanded once, read for every token
            for (int64_t i = 0; i < rows; ++i)
                expand_values<kind, Tiled>(row_at<Tiled>(w, row_bytes, r + i), width, scratch.data() + i * width);
            values = scratch.data();
        }
        int64_t i = 0;
#ifdef SPECDRAFT_PAIRS  // a float kind's tile at once: 4 pairs of rows x 6 tokens of sums in 24 registers
        if constexpr (Tiled)
            for (; i + kRows <= rows; i += kRows) pass_rows<kRows>(values + i * width, width, x, xs, n, r + i, out);
#endif
        for (; i + kPassRows <= rows; i += kPassRows) pass_rows<kPassRows>(values + i * width, width, x, xs, n, r + i, out);
        for (; i < rows; ++i) pass_rows<1>(values + i * width, width, x, xs, n, r + i, out);
    }
}

}  // namespace

void specdraft::project_float32(const Projection& p, int64_t start, int64_t end, const Out& out) {
    with_kind(p.kind, [&](auto k) { project_kind<k, false>(p, start, end, out); });
}

void specdraft::project_float_tiles(const Projection& p, int64_t start, int64_t end, const Out& out) {
    with_kind(p.kind, [&](auto k) {  // float32 rows' "tiles" are the rows as they lie (`specdraft_tile`)
        if constexpr (Traits<k>::floats) project_kind<k, !Traits<k>::dense>(p, start, end, out);
    });
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
