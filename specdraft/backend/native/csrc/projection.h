// The projections' boundary, shared by both arithmetics (float32.cpp, int8.cpp) and their entry
// points (entry.cpp): `Projection`, what a call computes; `Out`, where its sums go; which
// instructions a build has.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(SPECDRAFT_PORTABLE)
#include <immintrin.h>
#define SPECDRAFT_AVX2 1
#endif

// What a call computes, y[t, r] = (w[r] . x[t] + bias[r]) (+ residual[t, r]), passed by address:
// every field 8 bytes, in the order of `specdraft.backend.native.calls.Projection`'s
// (`specdraft_projection_offset` says where each is, for a test to compare).
struct Projection {
    int64_t kind;            // F32 or a block kind (formats.h)
    const uint8_t* w;        // [rows, row_bytes]: float32 rows or blocks of `kind`
    int64_t rows;            // w's rows (the int8 arithmetic's tiles depend on it)
    int64_t row_bytes;
    int64_t width;           // weights in a row
    const float* x;          // [n, xs]: the tokens
    int64_t n;
    int64_t xs;
    float* y;                // [n, ys]
    int64_t ys;
    const float* bias;       // [out]
    const float* residual;   // [n, rs], or null: none
    int64_t rs;
    int8_t* qx;              // [n, width]: the tokens quantised (`specdraft_quantize`; F16's, BF16's rounded, float32 [n, width]), or null: float32 arithmetic
    float* xd;               // [n, width / 32]: each quantised block's scale (a K kind's: its super-block's)
    float* xsum;             // [n, width / 32]: each quantised block's scale times the sum of its values
    int32_t* xtotal;         // [n, width / 32]: the sum of each quantised block's values
};

namespace specdraft {

// Where a call's sums go: y[t, r] = sum + bias[r] (+ residual[t, r]).
struct Out {
    float* y;
    int64_t ys;
    const float* bias;
    const float* residual;  // null: none
    int64_t rs;
    void put(int64_t t, int64_t r, float sum) const {
        float v = sum + bias[r];
        if (residual) v += residual[t * rs + r];
        y[t * ys + r] = v;
    }
};

// The float kinds' (F16's, BF16's) tiles, in which the int8 arithmetic reads them: rows in tiles of 8,
// a tile's 8 rows' weights 8g .. 8g + 7 side by side (8 x 16 bytes), so that a decode tile reads one
// stream and two rows' 8 weights lie together (a 512-bit register's). Row r's weights 8g .. at
// float_tile_at(r, g, row_bytes); its next 8, kFloatStep bytes on.
constexpr int64_t kFloatTileRows = 8, kFloatGroup = 16, kFloatStep = kFloatTileRows * kFloatGroup;
inline int64_t float_tile_at(int64_t r, int64_t g, int64_t row_bytes) {
    return r / kFloatTileRows * kFloatTileRows * row_bytes + g * kFloatStep + r % kFloatTileRows * kFloatGroup;
}

// The float32 arithmetic (float32.cpp): rows [start, end) of every token.
void project_float32(const Projection& p, int64_t start, int64_t end, const Out& out);
// The same over a float kind's tiles (`float_tile_at`): the int8 arithmetic's, on its tokens rounded. Rows
// [start, end) are whole tiles (start and end multiples of 8), as every int8 call's are.
void project_float_tiles(const Projection& p, int64_t start, int64_t end, const Out& out);

// The int8 arithmetic (int8.cpp): rows [start, end) of every token, the tokens quantised already
// (`specdraft_quantize`).
void project_int8(const Projection& p, int64_t start, int64_t end, const Out& out);

}  // namespace specdraft
