// The float32 arithmetic's passes of several tokens in 512-bit registers (float32.cpp's, included there after
// its 8-lane operations): each register holds two of its 8-lane sums, a token's of two rows (a short pass's,
// a longer pass's tile), low half and high half. Each lane takes the same fused
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

// A row's 32 values at piece b (a float32 row's, or a block's: `row_tokens`' values).
template <int64_t kind>
inline void piece_values(const uint8_t* row, int64_t b, Lanes v[4]) {
    using K = Traits<kind>;
    if constexpr (K::dense) {
        for (int i = 0; i < 4; ++i) v[i] = load((const float*)row + b * kBlock + 8 * i);
    } else {
        block_values<kind>(row + (b >> K::piece_shift) * K::bytes, int(b & (K::pieces - 1)), v);
    }
}

// Rows r and r + 1 (`row` bytes apart) against the T tokens (stride xs) of a short pass: `row_tokens`' sums
// of each into out, the first row's values in the low halves, the second's in the high ones.
template <int64_t kind, int T>
void rows_pair(const uint8_t* w, int64_t row, int64_t width, const float* x, int64_t xs, int64_t r, const Out& out) {
    Pair acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t b = 0; b < width / kBlock; ++b) {
        Lanes low[4], high[4];
        piece_values<kind>(w, b, low);
        piece_values<kind>(w + row, b, high);
#pragma GCC unroll 4
        for (int i = 0; i < 4; ++i) {
            const Pair v = joined(low[i], high[i]);
#pragma GCC unroll 8
            for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(v, both(load(x + t * xs + b * kBlock + 8 * i)), acc[t]);
        }
    }
    for (int t = 0; t < T; ++t) {
        float first, second;
        totals(acc[t], first, second);
        out.put(t, r, first);
        out.put(t, r + 1, second);
    }
}

// A short pass (2 to 8 tokens) of rows [start, end), two rows at a time (a last odd one: false, for the
// 8-lane loop); false too where it does not apply (a float32 row's width not a multiple of 32). For the
// kinds of float weights only: a block kind's values cost more to unpack than the multiply-adds saved.
template <int64_t kind>
bool short_pass_in_pairs(const Projection& p, int64_t& start, int64_t end, const Out& out) {
    if (p.width % kBlock) return false;
    for (; start + 2 <= end; start += 2) {
        for (int64_t i = 0; i < 2 * p.row_bytes; i += 64) prefetch(p.w + (start + 2) * p.row_bytes + i);  // the next two
        for_count<kShort>(p.n, [&](auto T) { rows_pair<kind, T>(p.w + start * p.row_bytes, p.row_bytes, p.width, p.x, p.xs, start, out); });
    }
    return start == end;
}

// Two rows of float32 values (stride `row`, width a multiple of 8) against T tokens: `dense_tile<2, T>`'s
// sums[r * T + t], row 0 in the low halves, row 1 in the high ones.
template <int T>
void dense_pair(const float* w, int64_t row, int64_t width, const float* x, int64_t xs, float* sums) {
    Pair acc[T];
#pragma GCC unroll 8
    for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
    for (int64_t i = 0; i < width; i += kLanes) {
        const Pair wv = joined(load(w + i), load(w + row + i));
#pragma GCC unroll 8
        for (int t = 0; t < T; ++t) acc[t] = _mm512_fmadd_ps(wv, both(load(x + t * xs + i)), acc[t]);
    }
    for (int t = 0; t < T; ++t) totals(acc[t], sums[t], sums[T + t]);
}

}  // namespace

#endif
