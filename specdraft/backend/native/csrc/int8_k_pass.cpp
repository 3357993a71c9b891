// The K kinds' passes of more than kFewTokens tokens in 256-bit registers (`specdraft::k_pass_half`):
// each super-block of a half tile unpacked once for the whole pass, then read against kPairTokens
// tokens at a time. The same integers and float operations as int8_k.cpp's `rows_dot` (each kind's),
// in the same order per row and token; int8.cpp says what they compute.

#include <cstdint>
#include <cstring>

#include "for_count.h"
#include "formats.h"
#include "k_vectors.h"
#include "projection.h"
#include "tiles.h"

#ifdef SPECDRAFT_AVX2

namespace {

// A super-block is unpacked once (`K_unpacked`, in L1) for every token of the pass, not once for each
// Ymm::kTokens of them as int8_k.cpp's code does, and read back a sub-block at a time, its sums finished
// before the next begins (few registers live, where a whole super-block in flight spilled AVX2's 16).
constexpr int64_t kPassTokens = 32;  // tokens an unpacked super-block serves at once (their sums in memory)
constexpr int kPairTokens = 4;       // tokens read against each unpacked vector together

// A super-block's unpacked weights: vector (s, G) holds each row's 4 weights of group G of sub-block s
// (0..15 for Q4_K, 0..31 for Q5_K, 0..63 for Q6_K, 0..7 for Q3_K, 0..3 for Q2_K, IQ4_XS's looked up as `iq4_xs_table` gives them, a byte each), and per sub-block (Q6_K: per 16) the rows' scales as
// `dot_scale` reads them.
template <typename V>
struct K_unpacked {
    alignas(32) uint8_t w[8][8][sizeof(typename V::I)];
    alignas(32) typename V::I scale[16];
    void put(int s, int G, typename V::I v) { std::memcpy(w[s][G], &v, sizeof v); }
    typename V::I at(int s, int G) const { return V::load(w[s][G]); }
};

// A sub-block's scale of each row as `dot_scale` takes it: kSums16, in both int16 halves of each lane
template <typename V>
inline typename V::I scale_form(typename V::I scale) {
    if constexpr (V::kSums16) return V::pair(scale);
    return scale;
}
// acc + a sub-block's sums (dot) times its scale (`scale_form`)
template <typename V>
inline typename V::I dot_scale(typename V::I acc, typename V::I dot, typename V::I scale) {
    acc = V::kSums16 ? V::scaled(acc, dot, scale) : V::add(acc, V::times(dot, scale));
    asm("" : "+x"(acc));  // as `group_sum`'s
    return acc;
}
// dot + group G's 4 weights of each row (w) times the token's 4 activations at x
template <typename V>
inline typename V::I group_sum(typename V::I dot, typename V::I w, const int8_t* x) {
    if constexpr (V::kSums16)
        dot = V::dot16(dot, w, x);
    else
        dot = V::dot(dot, w, x);
    // The sum in a register here: without this the compiler computed a sub-block's products first, spilled
    // them to the stack and summed them after (AVX2's 16 registers): a pass a tenth to a sixth slower.
    asm("" : "+x"(dot));
    return dot;
}

// Tokens [t0, t0 + T)'s activations of super-block b, and the sums `quantize_super` keeps of them (each
// 32's; Q6_K's each 32's two 16s).
template <int T>
struct SuperTokens {
    const int8_t* x[T];
    const int32_t* sums[T];
    SuperTokens(const Projection& p, int64_t b, int64_t t0) {
        for (int t = 0; t < T; ++t) {
            x[t] = p.qx + (t0 + t) * p.width + b * kSuper;
            sums[t] = p.xtotal + (t0 + t) * (p.width / kBlock) + 8 * b;
        }
    }
};

// A K kind's super-block unpacked (`K_unpacked`) for `k_pass`: one specialisation a kind.
template <int64_t KIND, typename V, int64_t VECTOR>
struct Super;

// Q4_K's (and Q5_K's: `Super<Q5_K>`), with its rows' mins and float scales.
template <int64_t KIND, typename V, int64_t VECTOR>
struct MinsSuper {
    using I = typename V::I;
    static constexpr int run = V::kSums16 ? groups16<Traits<KIND>::bits>() : 8;  // groups a scaled sum takes
    K_unpacked<V> u;
    I mins[4];
    typename V::F d, dmin;

    void unpack(const Half& rows, int64_t at) {
        const uint8_t* q = rows.q + at;
        I words[4];
        q4_k_words<V, VECTOR>(q, words);
        q4_k_min_pairs<V>(words, mins);
        for (int s = 0; s < 8; ++s) u.scale[s] = scale_form<V>(q4_k_byte<V>(words, s));
        const I low4 = V::bytes(0x0f);
        for (int c = 0; c < 4; ++c)  // sub-blocks 2c and 2c + 1: a vector's low and high nibbles
            for (int G = 0; G < 8; ++G) {
                const I raw = V::load(q + VECTOR * (3 + 8 * c + G));
                I even = V::all(raw, low4), odd = V::all(V::down16(raw, 4), low4);
                if constexpr (KIND == Q5_K) {  // the 5th bits (`q4_k_group`)
                    const I qh = V::load(q + VECTOR * (35 + G));
                    even = V::either(even, fifth_bit<V>(qh, 2 * c));
                    odd = V::either(odd, fifth_bit<V>(qh, 2 * c + 1));
                }
                u.put(2 * c, G, even);
                u.put(2 * c + 1, G, odd);
            }
        d = V::halves(rows.d + at);
        dmin = V::halves(rows.m + at);
    }

    // Tokens [t0, t0 + T) against super-block b: i and n as Q4_K's `rows_dot` sums them (`run` groups
    // summed at a time), then its float operations on acc (the tokens' sums, kRows each).
    template <int T>
    void tokens(const Projection& p, int64_t b, int64_t t0, float (*acc)[V::kRows]) const {
        const int64_t blocks = p.width / kBlock;
        const int8_t* x[T];
        for (int t = 0; t < T; ++t) x[t] = p.qx + (t0 + t) * p.width + b * kSuper;
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 1
        for (int s = 0; s < 8; ++s) {
            I dot[T];
#pragma GCC unroll 8
            for (int G = 0; G < 8; ++G) {  // kSums16: `run` pairs of weights and int8s, below 2^15
                const I w = u.at(s, G);
                for (int t = 0; t < T; ++t) dot[t] = group_sum<V>(G % run ? dot[t] : V::zero(), w, x[t] + kBlock * s + 4 * G);
                if (G % run == run - 1)
                    for (int t = 0; t < T; ++t) i[t] = dot_scale<V>(i[t], dot[t], u.scale[s]);
            }
        }
        for (int t = 0; t < T; ++t) {
            const I n = q4_k_mins_term<V>(V::zero(), mins, p.xtotal + (t0 + t) * blocks + 8 * b);
            const typename V::F dx = V::each(p.xd[(t0 + t) * blocks + 8 * b]);
            const typename V::F sum = V::fma(V::mul(d, dx), V::real(i[t]), V::loadf(acc[t]));
            V::store(acc[t], V::fnma(V::mul(dmin, dx), V::real(n), sum));
        }
    }
};

template <typename V, int64_t VECTOR>
struct Super<Q4_K, V, VECTOR> : MinsSuper<Q4_K, V, VECTOR> {};
template <typename V, int64_t VECTOR>
struct Super<Q5_K, V, VECTOR> : MinsSuper<Q5_K, V, VECTOR> {};

// IQ4_XS's, with its rows' float scales.
template <typename V, int64_t VECTOR>
struct Super<IQ4_XS, V, VECTOR> {
    using I = typename V::I;
    K_unpacked<V> u;
    typename V::F d;

    void unpack(const Half& rows, int64_t at) {
        const uint8_t* q = rows.q + at;
        I scale[8];
        iq4_xs_scales<V>(q, rows.m + at, scale);
        const I table = iq4_xs_table<V>();
        for (int s = 0; s < 8; ++s) {
            u.scale[s] = scale_form<V>(scale[s]);
            for (int G = 0; G < 8; ++G) u.put(s, G, iq4_xs_group<V, VECTOR>(q, s, G, table));
        }
        d = V::halves(rows.d + at);
    }

    // Tokens [t0, t0 + T) against super-block b: i as IQ4_XS's `rows_dot` sums it, then its float operation
    // on acc.
    template <int T>
    void tokens(const Projection& p, int64_t b, int64_t t0, float (*acc)[V::kRows]) const {
        const int64_t blocks = p.width / kBlock;
        const SuperTokens<T> in(p, b, t0);
        const auto& [x, sums] = in;
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 1
        for (int s = 0; s < 8; ++s) {
            I dot[T];
            if constexpr (!V::kSums16)  // (w + offset) . x less offset (sum of x)
                for (int t = 0; t < T; ++t) dot[t] = V::words(-Traits<IQ4_XS>::offset * sums[t][s]);
#pragma GCC unroll 8
            for (int G = 0; G < 8; ++G) {
                const I w = u.at(s, G);
                for (int t = 0; t < T; ++t) {
                    if constexpr (V::kSums16)  // the sign trick: a group's pairs below 2^15, widened times the scale
                        i[t] = dot_scale<V>(i[t], V::sign_dot16(w, x[t] + kBlock * s + 4 * G), u.scale[s]);
                    else
                        dot[t] = group_sum<V>(dot[t], w, x[t] + kBlock * s + 4 * G);
                }
            }
            if constexpr (!V::kSums16)
                for (int t = 0; t < T; ++t) i[t] = dot_scale<V>(i[t], dot[t], u.scale[s]);
        }
        for (int t = 0; t < T; ++t)
            V::store(acc[t], V::fma(V::mul(d, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(i[t]), V::loadf(acc[t])));
    }
};

// Q6_K's (and Q3_K's: `Super<Q3_K>`), with its rows' scales as int16 pairs (kSums16's offsets terms,
// `q6_k_less_offsets`) and float scale.
template <int64_t KIND, typename V, int64_t VECTOR>
struct SixteensSuper {
    using I = typename V::I;
    static constexpr int shift = k16_shift<KIND>;  // the offset, 2^shift
    K_unpacked<V> u;
    I even[4], odd[4];  // the scales' pairs; Q2_K's: its mins' (`k16_mins`), for its mins term
    typename V::F d, dmin;

    void unpack(const Half& rows, int64_t at) {
        const uint8_t* q = rows.q + at;
        I words[4];
        k16_words<KIND, V, VECTOR>(q, words);
        for (int index = 0; index < 16; ++index) u.scale[index] = scale_form<V>(q6_k_scale_of<V>(words, index));
        if constexpr (!k16_offset<KIND>) {
            k16_mins<V, VECTOR>(q, words);
            dmin = V::halves(rows.m + at);
        }
        q6_k_scale_pairs<V>(words, even, odd);
        for (int s = 0; s < 8; ++s)
            for (int G = 0; G < 8; ++G) u.put(s, G, k16_group<KIND, V, VECTOR>(q, s, G));
        d = V::halves(rows.d + at);
    }

    // Tokens [t0, t0 + T) against super-block b: i as Q6_K's `rows_dot` sums it (kSums16: the "- offset (sum
    // of x)" terms after the sub-blocks), then its float operation on acc.
    template <int T>
    void tokens(const Projection& p, int64_t b, int64_t t0, float (*acc)[V::kRows]) const {
        const int64_t blocks = p.width / kBlock;
        const SuperTokens<T> in(p, b, t0);  // each 32's two sums of 16
        const auto& [x, sums] = in;
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 1
        for (int s = 0; s < 8; ++s) {
#pragma GCC unroll 2
            for (int j = 0; j < 2; ++j) {  // the piece's 16s: scale 2s + j
                I dot[T];
                for (int t = 0; t < T; ++t) {
                    if constexpr (V::kSums16 || !k16_offset<KIND>)
                        dot[t] = V::zero();
                    else
                        dot[t] = q6_k_offset<V, 1 << shift>(sums[t][s], j);
                }
#pragma GCC unroll 4
                for (int e = 0; e < 4; ++e) {
                    const I w = u.at(s, 4 * j + e);
                    for (int t = 0; t < T; ++t) {
                        // kSums16: 2 pairs of 6-bit weights and int8s, below 2 x 2 x 63 x 128 < 2^15
                        dot[t] = group_sum<V>(e % 2 || !V::kSums16 ? dot[t] : V::zero(), w, x[t] + kBlock * s + 4 * (4 * j + e));
                        if (V::kSums16 && e % 2) i[t] = dot_scale<V>(i[t], dot[t], u.scale[2 * s + j]);
                    }
                }
                if constexpr (!V::kSums16)
                    for (int t = 0; t < T; ++t) i[t] = dot_scale<V>(i[t], dot[t], u.scale[2 * s + j]);
            }
        }
        for (int t = 0; t < T; ++t) {
            if constexpr (V::kSums16 && k16_offset<KIND>) i[t] = q6_k_less_offsets<V, shift>(i[t], even, odd, sums[t]);
            const typename V::F dx = V::each(p.xd[(t0 + t) * blocks + 8 * b]);
            typename V::F sum = V::fma(V::mul(d, dx), V::real(i[t]), V::loadf(acc[t]));
            if constexpr (!k16_offset<KIND>)  // Q2_K's mins, as its `rows_dot` takes them
                sum = V::fma(V::mul(dmin, dx), V::real(q6_k_less_offsets<V, 0>(V::zero(), even, odd, sums[t])), sum);
            V::store(acc[t], sum);
        }
    }
};

template <typename V, int64_t VECTOR>
struct Super<Q6_K, V, VECTOR> : SixteensSuper<Q6_K, V, VECTOR> {};
template <typename V, int64_t VECTOR>
struct Super<Q3_K, V, VECTOR> : SixteensSuper<Q3_K, V, VECTOR> {};
template <typename V, int64_t VECTOR>
struct Super<Q2_K, V, VECTOR> : SixteensSuper<Q2_K, V, VECTOR> {};

// The V::kRows rows of tiles at `rows` (from row0) against tokens [t0, t0 + n), n <= kPassTokens: each
// super-block unpacked once (`Super` of the kind), then read against kPairTokens tokens at a
// time, the tokens' sums in memory.
template <typename V, typename Super>
[[gnu::noinline]] void k_pass(const Projection& p, const Half& rows, int64_t row0, int64_t t0, int64_t n, const Out& out) {
    alignas(64) float acc[kPassTokens][V::kRows] = {};
    Super super;
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * rows.stride;
        ask_ahead(rows.d + at, rows.stride);
        super.unpack(rows, at);
        for (int64_t t = 0; t < n; t += kPairTokens)
            for_count<kPairTokens>(n - t, [&](auto T) { super.template tokens<T>(p, b, t0 + t, acc + t); });
    }
    for (int64_t t = 0; t < n; ++t)
        for (int r = 0; r < V::kRows; ++r) out.put(t0 + t, row0 + r, acc[t][r]);
}

}  // namespace

template <int64_t KIND>
void specdraft::k_pass_half(const Projection& p, int64_t g, const Out& out) {
    const Half rows = half_tile<KIND>(p.w, p.rows, p.row_bytes, g);
    for (int64_t t = 0; t < p.n; t += kPassTokens) {
        const int64_t n = p.n - t < kPassTokens ? p.n - t : kPassTokens;
        rows.vector == 4 * kTile ? k_pass<Ymm, Super<KIND, Ymm, 4 * kTile>>(p, rows, g * kTileRows, t, n, out)
                                 : k_pass<Ymm, Super<KIND, Ymm, 4 * kTileRows>>(p, rows, g * kTileRows, t, n, out);
    }
}

template void specdraft::k_pass_half<Q4_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_pass_half<Q5_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_pass_half<Q6_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_pass_half<Q3_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_pass_half<Q2_K>(const Projection&, int64_t, const Out&);
template void specdraft::k_pass_half<IQ4_XS>(const Projection&, int64_t, const Out&);

#endif
