// The K kinds' tiles, one layout a kind (`tile_pieces`, an overload a kind, its `KindOf` the first
// argument): where each piece of a row's GGUF super-block lies in its tiles, as copy(where in the tile,
// where in the block, bytes). int8_k.cpp writes the tiles and reads them back by these; its dot products
// read the vectors where these put them.
#pragma once

#include <cstdint>

#include "formats.h"
#include "tiles.h"

namespace {

// Vectors first .. first + n - 1 of a half tile's super-block (`at` bytes on): row r's 4 bytes of each
// at 4r, the block's bytes from .. from + 4n - 1 in order (copy(where in the tile, where in the block,
// bytes), as `tile_pieces` takes it).
template <typename Byte, typename Copy>
void vectors(const HalfOf<Byte>& half, int64_t at, int r, int first, int from, int n, Copy&& copy) {
    for (int k = 0; k < n; ++k) copy(half.q + at + half.vector * (first + k) + 4 * r, from + 4 * k, 4);
}

// Q4_K's tiles: a super-block of R rows at stride 144R holds d[R] and dmin[R] (float16, where the other
// kinds' d and m lie), 3 vectors of 4R bytes (vector v: each row's scale bytes 4v .. 4v + 3 at 4r),
// then 32 vectors (3 + 8c + G: row r's qs bytes 32c + 4G .. 32c + 4G + 3 at 4r, sub-block 2c's
// elements 4G .. 4G + 3 in their low nibbles, sub-block 2c + 1's in their high ones). Row r's pieces
// of its GGUF block, each as copy(where in the tile, where in the block, bytes); its qs at `qs` in the
// block (Q5_K's after its qh).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<Q4_K>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy, int qs = 16) {
    copy(half.d + at + 2 * r, 0, 2);
    copy(half.m + at + 2 * r, 2, 2);
    vectors(half, at, r, 0, 4, 3, copy);
    vectors(half, at, r, 3, qs, 32, copy);
}

// Q5_K's tiles: Q4_K's (its qs at 48), then 8 vectors of qh (35 + G: row r's qh bytes 4G .. 4G + 3 at 4r).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<Q5_K>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    tile_pieces(KindOf<Q4_K>(), half, at, r, copy, 48);
    vectors(half, at, r, 35, 16, 8, copy);
}

// Q2_K's tiles: a super-block of R rows at stride 84R holds d[R] and dmin[R] (float16, where the other
// kinds' d and m lie), 4 vectors of scales (vector v: row r's scale bytes 4v .. 4v + 3 at 4r), then 16 of
// qs (4 + 8h + G: its qs bytes 32h + 4G .. + 3). Piece 4h + j reads group G from qs vector 4 + 8h + G
// (bits 2j, 2j + 1).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<Q2_K>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 80, 2);
    copy(half.m + at + 2 * r, 82, 2);
    vectors(half, at, r, 0, 0, 4, copy);
    vectors(half, at, r, 4, 16, 16, copy);
}

// Q3_K's tiles: a super-block of R rows at stride 110R holds d[R] (float16), then vectors of 4R bytes: 3 of
// scales (vector v: row r's scale bytes 4v .. 4v + 3 at 4r), 16 of qs (3 + 8h + G: its qs bytes 32h + 4G ..
// + 3), 8 of hmask (19 + G: its hmask bytes 4G .. + 3). Piece 4h + j reads group G's low 2 bits from qs
// vector 3 + 8h + G (bits 2j, 2j + 1), its 3rd from hmask vector 19 + G (bit 4h + j).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<Q3_K>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 108, 2);
    vectors(half, at, r, 0, 96, 3, copy);
    vectors(half, at, r, 3, 32, 16, copy);
    vectors(half, at, r, 19, 0, 8, copy);
}

// IQ4_XS's tiles: a super-block of R rows at stride 136R holds d[R] and scales_h[R] (16 bits, where the
// other kinds' d and m lie), a vector of 4R bytes of scales_l (row r's 4 at 4r), then 32 vectors (1 + 4s +
// c: row r's bytes 4c .. 4c + 3 of sub-block s's 16, at 4r: elements 4c .. 4c + 3 in their low nibbles,
// 16 + 4c .. 16 + 4c + 3 in their high ones).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<IQ4_XS>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 0, 2);
    copy(half.m + at + 2 * r, 2, 2);
    vectors(half, at, r, 0, 4, 1, copy);
    vectors(half, at, r, 1, 8, 32, copy);
}

// Q6_K's tiles: a super-block of R rows at stride 210R holds d[R] (float16), then vectors of 4R bytes:
// 4 of scales (vector v: each row's scale bytes 4v .. 4v + 3 at 4r), 32 of ql (4 + 8u + G: row r's ql
// bytes 32u + 4G .. 32u + 4G + 3 at 4r), 16 of qh (36 + 8h + G: its qh bytes 32h + 4G .. + 3). Piece
// 4h + k (formats.h's sub-block: 32 weights, scales 8h + 2k and the next) reads group G's low 4 bits
// from ql vector 4 + 8 (2h + k % 2) + G (the high nibbles for k >= 2), its top 2 from qh vector
// 36 + 8h + G (bits 2k, 2k + 1).
template <typename Byte, typename Copy>
void tile_pieces(KindOf<Q6_K>, const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 208, 2);
    vectors(half, at, r, 0, 192, 4, copy);
    vectors(half, at, r, 4, 0, 32, copy);
    vectors(half, at, r, 36, 128, 16, copy);
}

}  // namespace
