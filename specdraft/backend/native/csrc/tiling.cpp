// Tiling: a GGUF row's blocks of KIND as the int8 arithmetic's tiles (`specdraft_tile`, the same bytes
// rearranged as int8.cpp lays them; the K kinds' pieces as int8_k.cpp's `tile_pieces` say; the float
// kinds' weights as projection.h's `float_tile_at` says), and the
// float32 values the tiles hold back (`specdraft_tile_values`, for the tests: the values a GGUF row
// dequantises to).

#include <cmath>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "tiles.h"

namespace {

// Row r's GGUF block of a kind of 32 weights into its tiles: block b of half tile `half` (`at` bytes on).
template <int64_t KIND>
void tile_block(const HalfOf<uint8_t>& half, int64_t at, int r, const uint8_t* block) {
    using K = Traits<KIND>;
    uint8_t* q = half.q + at;
    std::memcpy(half.d + at + 2 * r, block, 2);                              // d
    if constexpr (K::scales == 2) std::memcpy(half.m + at + 2 * r, block + 2, 2);  // m
    if constexpr (K::bits == 8) {  // element 4G + e at byte 4r + e of vector G, plus the offset
        for (int j = 0; j < kBlock; ++j)
            q[half.vector * (j / 4) + 4 * r + j % 4] = uint8_t(int32_t(int8_t(block[K::qs + j])) + K::offset);
        return;
    }
    // Element 4G + e (G < 4) is qs[4G + e]'s low nibble, element 4G + e + 16 its high one: vector G's byte
    // 4r + e holds both, so it is qs[4G + e] as it lies (Q5_0: its q's low 4 bits).
    for (int G = 0; G < 4; ++G) std::memcpy(q + half.vector * G + 4 * r, block + K::qs + 4 * G, 4);
    if constexpr (K::bits == 5) {  // the 5th bit of element 4G + e, qh's bit 4G + e, to bit G of the fifth vector's byte 4r + e
        uint32_t qh;
        std::memcpy(&qh, block + K::qs - 4, 4);  // qh just before qs
        for (int e = 0; e < 4; ++e) {
            uint32_t fifth = 0;
            for (int G = 0; G < 8; ++G) fifth |= ((qh >> (4 * G + e)) & 1u) << G;
            q[half.vector * 4 + 4 * r + e] = uint8_t(fifth);
        }
    }
}

// Row r of half tile g's block b of KIND back as float32 values into o (`expand_row`'s).
template <int64_t KIND>
void tile_row_values(const uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b, int r, float* o) {
    using K = Traits<KIND>;
    if constexpr (K::super) {  // the block back as GGUF holds it, then its values
        uint8_t block[K::bytes] = {};
        specdraft::k_block_of<KIND>(tiles, rows, row_bytes, g, b, r, block);
        expand_row<KIND>(block, kSuper, o);
    } else {
        const Half half = half_tile<KIND>(tiles, rows, row_bytes, g);
        const int64_t at = b * half.stride;
        const float d = half_to_float(load_u16(half.d + at + 2 * r));
        if constexpr (K::scales == 2) {
            const float m = half_to_float(load_u16(half.m + at + 2 * r));
            for (int j = 0; j < kBlock; ++j) o[j] = std::fmaf(d, float(tile_weight<KIND>(half, at, r, j)), m);
        } else {
            for (int j = 0; j < kBlock; ++j) o[j] = d * float(tile_weight<KIND>(half, at, r, j));
        }
    }
}

}  // namespace

// GGUF rows [0, rows) of `kind` (rows a multiple of 8, row_bytes each) as the int8 arithmetic's
// tiles (the same bytes rearranged) into out.
extern "C" void specdraft_tile(int64_t kind, const uint8_t* w, int64_t rows, int64_t row_bytes, uint8_t* out) {
    with_kind(kind, [&](auto k) {
        using K = Traits<k>;
        if constexpr (K::dense) {  // float32 rows: as they lie
            std::memcpy(out, w, size_t(rows * row_bytes));
        } else if constexpr (K::floats) {  // float weights (F16, BF16): each 8 weights as they lie, a tile's rows side by side
            for (int64_t r = 0; r < rows; ++r)
                for (int64_t g = 0; g < row_bytes / specdraft::kFloatGroup; ++g)
                    std::memcpy(out + specdraft::float_tile_at(r, g, row_bytes), w + r * row_bytes + g * specdraft::kFloatGroup,
                                specdraft::kFloatGroup);
        } else {
            for (int64_t g = 0; g < rows / kTileRows; ++g) {  // each half tile's rows
                const HalfOf<uint8_t> half = half_tile<k>(out, rows, row_bytes, g);
                for (int64_t b = 0; b < row_bytes / K::bytes; ++b) {
                    for (int r = 0; r < kTileRows; ++r) {
                        const uint8_t* block = w + (g * kTileRows + r) * row_bytes + b * K::bytes;
                        if constexpr (K::super)
                            specdraft::k_tile_block<k>(out, rows, row_bytes, g, b, r, block);
                        else
                            tile_block<k>(half, b * half.stride, r, block);
                    }
                }
            }
        }
    });
}

// Rows ids[0 .. n) of tiles (`specdraft_tile`'s, of `kind`, `rows` rows of width weights) as float32
// values into out [n, width]: the values the GGUF rows dequantise to (`expand_row`'s).
extern "C" void specdraft_tile_values(int64_t kind, const uint8_t* tiles, int64_t rows, int64_t row_bytes,
                                      int64_t width, const int64_t* ids, int64_t n, float* out) {
    with_kind(kind, [&](auto k) {
        if constexpr (Traits<k>::dense) {
            for (int64_t i = 0; i < n; ++i) expand_row<k>(tiles + ids[i] * row_bytes, width, out + i * width);
        } else if constexpr (Traits<k>::floats) {  // each 8 weights where the tiles hold them
            for (int64_t i = 0; i < n; ++i)
                for (int64_t j = 0; j < width; ++j)
                    out[i * width + j] = Traits<k>::value(tiles + specdraft::float_tile_at(ids[i], j / 8, row_bytes) + 2 * (j % 8));
        } else {
            for (int64_t i = 0; i < n; ++i)
                for (int64_t b = 0; b < width / Traits<k>::weights; ++b)
                    tile_row_values<k>(tiles, rows, row_bytes, ids[i] / kTileRows, b, int(ids[i] % kTileRows),
                                       out + i * width + b * Traits<k>::weights);
        }
    });
}
