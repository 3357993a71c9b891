// The float32 arithmetic's passes of several tokens in 512-bit registers (float32.cpp's, included there after
// its 8-lane operations): each register holds two of its 8-lane sums, a token's of two rows (a short pass's,
// a longer pass's tile; a decode token's over a float kind's tile, whose two rows' 8 weights lie side by
// side: one load), low half and high half. Each lane takes the same fused
// multiply-adds in the same order as in `row_tokens` and `dense_tile`, and its 8 lanes are added in the same
// tree (`total`): the same sums bitwise, with half the multiply-add instructions. AVX-512 builds only
// (`SPECDRAFT_PAIRS`); the others, and float32 rows whose width is not a multiple of 8, keep the 8-lane loops.
#pragma once

#if defined(SPECDRAFT_AVX2) && defined(__AVX512F__) && !defined(SPECDRAFT_NO_ZMM)
#define SPECDRAFT_PAIRS 1

namespace {

using Pair = __m512;

inline Pair both(Lanes a) { return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(a))); }

inline Pair joined(Lanes low, Lanes high) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(low)), _mm256_castps_pd(high), 1));
}

inline void totals(Pair a, float& low, float& high) {
    low = total(_mm512_castps512_ps256(a));
    high = total(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)));
}

// A float kind's 16 weights at p (two rows' 8, side by side in its tiles): one load, one conversion.
template <int64_t kind>
inline Pair float_pair(const uint8_t* p) {
    const __m256i h = _mm256_loadu_si256((const __m256i*)p);
    if constexpr (kind == F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The sums of P pairs of rows against T tokens into out (rows r .. r + 2P - 1), a pair's first row's in the low halves.
template <int P, int T>
inline void put_pairs(Pair (&acc)[P][T], int64_t r, const Out& out) {
    for (int q = 0; q < P; ++q)
        for (int t = 0; t < T; ++t) {
            float low, high;
            totals(acc[q][t], low, high);
            out.put(t, r + 2 * q, low);
            out.put(t, r + 2 * q + 1, high);
        }
}

// P pairs of rows against the T tokens (stride xs) of a short pass: `row_tokens`' sums of each into out. Rows
// r and r + 1 at `first` and `row_bytes` on (P = 1, their values joined a register); in a float kind's tiles
// (Tiled), rows r .. r + 2P - 1 side by side from `first`, a pair's 16 weights one load.
template <int64_t kind, bool Tiled, int P, int T>
void rows_pairs(const uint8_t* first, int64_t row_bytes, int64_t width, const float* x, int64_t xs, int64_t r,
                const Out& out) {
    static_assert(P == 1 || Tiled, "pairs of rows side by side: a float kind's tiles");
    Pair acc[P][T];
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[q][t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < width / kBlock; ++b) {
        Lanes low[4], high[4];  // P = 1's two rows' values (not Tiled)
        if constexpr (!Tiled) {
            piece_values<kind>(first, b, low);
            piece_values<kind>(first + row_bytes, b, high);
        } else {  // this pass's lines of the same piece a tile on: memory and arithmetic overlap
            for (int i = 0; i < 4; ++i)
                for (int line = 0; line < 2 * P * specdraft::kFloatGroup; line += 64)
                    prefetch(first + kRows * row_bytes + (4 * b + i) * specdraft::kFloatStep + line);
        }
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            Pair v[P];
#pragma GCC unroll 4
            for (int q = 0; q < P; ++q) {
                if constexpr (Tiled) v[q] = float_pair<kind>(first + 2 * q * specdraft::kFloatGroup + (4 * b + i) * specdraft::kFloatStep);
                else v[q] = joined(low[i], high[i]);
            }
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) {
                const Pair xv = both(load(x + t * xs + b * kBlock + 8 * i));
#pragma GCC unroll 4
                for (int q = 0; q < P; ++q) acc[q][t] = _mm512_fmadd_ps(v[q], xv, acc[q][t]);
            }
        }
    }
    put_pairs<P, T>(acc, r, out);
}

// A short pass (2 to 8 tokens) of rows [start, end), two rows at a time (a last odd one: false, for the
// 8-lane loop; in a float kind's tiles, four at a time); false too where it does not apply (a float32 row's
// width not a multiple of 32). For the kinds of float weights only: a block kind's values cost more to
// unpack than the multiply-adds saved.
template <int64_t kind, bool Tiled>
bool short_pass_in_pairs(const Projection& p, int64_t& start, int64_t end, const Out& out) {
    if (p.width % kBlock) return false;
    for_count<kShort>(p.n, [&](auto T) {
        // pairs at once: in a float kind's tiles, a tile's 4 (2 past 6 tokens: 32 registers); else 1
        constexpr int P = !Tiled ? 1 : T <= 6 ? 4 : 2;
        for (; start + 2 * P <= end; start += 2 * P) {
            if (!Tiled)
                for (int64_t i = 0; i < 2 * p.row_bytes; i += 64) prefetch(p.w + (start + 2) * p.row_bytes + i);  // the next two
            rows_pairs<kind, Tiled, P, T>(row_at<Tiled>(p.w, p.row_bytes, start), p.row_bytes, p.width, p.x, p.xs, start, out);
        }
    });
    return start == end;
}

// A decode token against a float kind's tile of 8 rows (at `tile`), two rows a register: `decode_tile`'s
// sums, the rows' 8 weights read side by side as they lie.
template <int64_t kind>
void decode_tile_pairs(const uint8_t* tile, int64_t row_bytes, int64_t width, const float* x, float* sums) {
    Pair acc[4];
    for (int q = 0; q < 4; ++q) acc[q] = _mm512_setzero_ps();
    for (int64_t b = 0; b < width / kBlock; ++b) {
        const uint8_t* block = tile + 4 * b * specdraft::kFloatStep;  // piece b of the 8 rows: 512 bytes
        for (int64_t line = 0; line < 4 * specdraft::kFloatStep; line += 64) prefetch(block + line + kAhead * kRows * row_bytes);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const Pair xv = both(load(x + b * kBlock + 8 * i));
#pragma GCC unroll 4
            for (int q = 0; q < 4; ++q)  // rows 2q, 2q + 1
                acc[q] = _mm512_fmadd_ps(float_pair<kind>(block + 2 * q * specdraft::kFloatGroup + i * specdraft::kFloatStep), xv, acc[q]);
        }
    }
    for (int q = 0; q < 4; ++q) totals(acc[q], sums[2 * q], sums[2 * q + 1]);
}

// 2P rows of float32 values (stride `row`, width a multiple of 8) against T tokens: `dense_tile<2P, T>`'s
// sums[r * T + t], rows 2q and 2q + 1 the low and high halves of a register.
template <int P, int T>
void dense_pairs(const float* w, int64_t row, int64_t width, const float* x, int64_t xs, float* sums) {
    Pair acc[P][T];
#pragma GCC unroll 8
    for (int q = 0; q < P; ++q)
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[q][t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < width; i += kLanes) {
        Pair wv[P];
#pragma GCC unroll 4
        for (int q = 0; q < P; ++q) wv[q] = joined(load(w + 2 * q * row + i), load(w + (2 * q + 1) * row + i));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) {
            const Pair xv = both(load(x + t * xs + i));
#pragma GCC unroll 4
            for (int q = 0; q < P; ++q) acc[q][t] = _mm512_fmadd_ps(wv[q], xv, acc[q][t]);
        }
    }
    for (int q = 0; q < P; ++q)
        for (int t = 0; t < T; ++t) totals(acc[q][t], sums[2 * q * T + t], sums[(2 * q + 1) * T + t]);
}

}  // namespace

#endif
