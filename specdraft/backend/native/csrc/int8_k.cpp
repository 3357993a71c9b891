// The int8 arithmetic of the K kinds (Q4_K, Q6_K) over their tiles: their layouts (`q4_k_pieces`,
// `q6_k_pieces`) and their dot products against tokens quantised per super-block of 256, in 512-bit
// registers (whole tiles), 256-bit ones (half tiles: a pass of more than kFewTokens tokens from each
// super-block unpacked once, `k_pass`) or portable loops; int8.cpp says what they compute.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "for_count.h"
#include "formats.h"
#include "projection.h"
#include "tiles.h"

namespace {

// Q4_K's tiles: a super-block of R rows at stride 144R holds d[R] and dmin[R] (float16, where the other
// kinds' d and m lie), 3 vectors of 4R bytes (vector v: each row's scale bytes 4v .. 4v + 3 at 4r),
// then 32 vectors (3 + 8c + G: row r's qs bytes 32c + 4G .. 32c + 4G + 3 at 4r, sub-block 2c's
// elements 4G .. 4G + 3 in their low nibbles, sub-block 2c + 1's in their high ones). Row r's pieces
// of its GGUF block, each as copy(where in the tile, where in the block, bytes).
template <typename Byte, typename Copy>
void q4_k_pieces(const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 0, 2);
    copy(half.m + at + 2 * r, 2, 2);
    for (int v = 0; v < 3; ++v) copy(half.q + at + half.vector * v + 4 * r, 4 + 4 * v, 4);
    for (int c = 0; c < 4; ++c)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (3 + 8 * c + G) + 4 * r, 16 + 32 * c + 4 * G, 4);
}

// Q6_K's tiles: a super-block of R rows at stride 210R holds d[R] (float16), then vectors of 4R bytes:
// 4 of scales (vector v: each row's scale bytes 4v .. 4v + 3 at 4r), 32 of ql (4 + 8u + G: row r's ql
// bytes 32u + 4G .. 32u + 4G + 3 at 4r), 16 of qh (36 + 8h + G: its qh bytes 32h + 4G .. + 3). Piece
// 4h + k (formats.h's sub-block: 32 weights, scales 8h + 2k and the next) reads group G's low 4 bits
// from ql vector 4 + 8 (2h + k % 2) + G (the high nibbles for k >= 2), its top 2 from qh vector
// 36 + 8h + G (bits 2k, 2k + 1).
template <typename Byte, typename Copy>
void q6_k_pieces(const HalfOf<Byte>& half, int64_t at, int r, Copy&& copy) {
    copy(half.d + at + 2 * r, 208, 2);
    for (int v = 0; v < 4; ++v) copy(half.q + at + half.vector * v + 4 * r, 192 + 4 * v, 4);
    for (int u = 0; u < 4; ++u)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (4 + 8 * u + G) + 4 * r, 32 * u + 4 * G, 4);
    for (int h = 0; h < 2; ++h)
        for (int G = 0; G < 8; ++G) copy(half.q + at + half.vector * (36 + 8 * h + G) + 4 * r, 128 + 32 * h + 4 * G, 4);
}

// Row r's (0..7) GGUF block of a half tile's Q4_K or Q6_K super-block (`at` bytes on) into block.
void k_untile(int64_t kind, const Half& half, int64_t at, int r, uint8_t* block) {
    const auto copy = [&](const uint8_t* tile, int offset, int n) { std::memcpy(block + offset, tile, n); };
    kind == Q4_K ? q4_k_pieces(half, at, r, copy) : q6_k_pieces(half, at, r, copy);
}

#ifdef SPECDRAFT_AVX2

// The vector operations of the K kinds' dot products on the rows one register holds: 8 (a half tile) in
// 256-bit registers (`Ymm`), or 16 (a whole tile) in 512-bit ones (`Zmm`), so that one template of each
// kind's arithmetic (`q4_k_rows`, `q6_k_rows`) serves both. `kTokens`: how many tokens' sums the
// registers hold at once (AVX2 has 16 of them, AVX-512 32).
struct Ymm {
    using I = __m256i;
    using F = __m256;
    static constexpr int64_t kRows = kTileRows, kTokens = 4;
    static I load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
    static I zero() { return _mm256_setzero_si256(); }
    static I bytes(int v) { return _mm256_set1_epi8(char(v)); }
    static I words(int32_t v) { return _mm256_set1_epi32(v); }
    static I all(I a, I b) { return _mm256_and_si256(a, b); }
    static I either(I a, I b) { return _mm256_or_si256(a, b); }
    static I add(I a, I b) { return _mm256_add_epi32(a, b); }
    static I sub(I a, I b) { return _mm256_sub_epi32(a, b); }
    static I times(I a, I b) { return _mm256_mullo_epi32(a, b); }
    static I times16(I a, I b) { return _mm256_madd_epi16(a, b); }  // 16-bit halves' products, pairs summed
    // acc + each lane's two 16-bit halves times the int16 pair at x (broadcast), the products summed
    static I pair_dot(I acc, I pairs, const int32_t* x) {
#if SPECDRAFT_VNNI == 2
        return _mm256_dpwssd_epi32(acc, pairs, _mm256_set1_epi32(*x));
#elif SPECDRAFT_VNNI == 1
        return _mm256_dpwssd_avx_epi32(acc, pairs, _mm256_set1_epi32(*x));
#else
        return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi32(*x)));
#endif
    }
    static I down16(I a, int n) { return _mm256_srli_epi16(a, n); }
    static I up16(I a, int n) { return _mm256_slli_epi16(a, n); }
    static I down32(I a, int n) { return _mm256_srli_epi32(a, n); }
    static I up32(I a, int n) { return _mm256_slli_epi32(a, n); }
    static I signed_down32(I a, int n) { return _mm256_srai_epi32(a, n); }
    static I dot(I acc, I w, const int8_t* x) { return group_dot(acc, w, broadcast4(x)); }
#ifdef SPECDRAFT_VNNI
    static constexpr bool kSums16 = false;
#else
    // Without VNNI a product of 4 bytes is 3 instructions (vpmaddubsw, vpmaddwd, an add), two of them on
    // the pipes that multiply; a sub-block's products are summed in int16 instead (`dot16`: vpmaddubsw
    // and an add), where no sum can leave int16, and widened once, times the sub-block's scale (`scaled`).
    static constexpr bool kSums16 = true;
#endif
    // acc16 + each lane's two int16 halves: the products of w's bytes (unsigned) and x's (signed) in pairs
    static I dot16(I acc16, I w, const int8_t* x) {
        I sum = _mm256_add_epi16(acc16, _mm256_maddubs_epi16(w, broadcast4(x)));
        asm("" : "+x"(sum));  // kept in a register here (`group_sum`)
        return sum;
    }
    // each lane's scale (below 2^15 in magnitude) in both its int16 halves, for `scaled`
    static I pair(I scale) {
        return _mm256_or_si256(_mm256_and_si256(scale, _mm256_set1_epi32(0xffff)), _mm256_slli_epi32(scale, 16));
    }
    // acc + each lane's two int16 halves, summed, times the lane's scale (`pair`)
    static I scaled(I acc, I sums16, I pair) { return _mm256_add_epi32(acc, _mm256_madd_epi16(sums16, pair)); }
    static I signed_down16(I a, int n) { return _mm256_srai_epi16(a, n); }
    static F halves(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)p)); }
    static F each(float v) { return _mm256_set1_ps(v); }
    static F zeros() { return _mm256_setzero_ps(); }
    static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
    static F real(I a) { return _mm256_cvtepi32_ps(a); }
    static void store(float* p, F a) { _mm256_store_ps(p, a); }
    static F loadf(const float* p) { return _mm256_load_ps(p); }
};

#ifdef SPECDRAFT_ZMM
struct Zmm {
    using I = __m512i;
    using F = __m512;
    static constexpr int64_t kRows = kTile, kTokens = 6;
    static constexpr bool kSums16 = false;  // vpdpbusd: a product of 4 bytes is one instruction
    static I load(const uint8_t* p) { return _mm512_loadu_si512((const void*)p); }
    static I zero() { return _mm512_setzero_si512(); }
    static I bytes(int v) { return _mm512_set1_epi8(char(v)); }
    static I words(int32_t v) { return _mm512_set1_epi32(v); }
    static I all(I a, I b) { return _mm512_and_si512(a, b); }
    static I either(I a, I b) { return _mm512_or_si512(a, b); }
    static I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static I times(I a, I b) { return _mm512_mullo_epi32(a, b); }
    static I times16(I a, I b) { return _mm512_madd_epi16(a, b); }
    static I pair_dot(I acc, I pairs, const int32_t* x) {  // the pair broadcast by the instruction ({1to16})
        asm("vpdpwssd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(pairs), "m"(*x));
        return acc;
    }
    static I down16(I a, int n) { return _mm512_srli_epi16(a, n); }
    static I up16(I a, int n) { return _mm512_slli_epi16(a, n); }
    static I down32(I a, int n) { return _mm512_srli_epi32(a, n); }
    static I up32(I a, int n) { return _mm512_slli_epi32(a, n); }
    static I signed_down32(I a, int n) { return _mm512_srai_epi32(a, n); }
    // The token's group broadcast by the instruction itself, from memory ({1to16}): compilers emit a
    // separate broadcast for _mm512_set1_epi32, one more instruction per product.
    static I dot(I acc, I w, const int8_t* x) {
        asm("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*(const int32_t*)x));
        return acc;
    }
    static F halves(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)p)); }
    static F each(float v) { return _mm512_set1_ps(v); }
    static F zeros() { return _mm512_setzero_ps(); }
    static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
    static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
    static F fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
    static F real(I a) { return _mm512_cvtepi32_ps(a); }
    static void store(float* p, F a) { _mm512_store_ps(p, a); }
};
#endif

// Each row's sums of tokens [t0, t0 + T) (acc[t], V::kRows rows from row0) into out.
template <typename V, int T>
inline void put_rows(const typename V::F acc[T], int64_t row0, int64_t t0, const Out& out) {
    for (int t = 0; t < T; ++t) {
        alignas(64) float sums[V::kRows];
        V::store(sums, acc[t]);
        for (int r = 0; r < V::kRows; ++r) out.put(t0 + t, row0 + r, sums[r]);
    }
}

// A token's 8 sums of a super-block's 32s (each below 2^12 in magnitude) as 4 words of int16 pairs,
// sub-blocks 2j (low half) and 2j + 1 (high half) in word j.
inline void sum_pairs(const int32_t* sums, int32_t pairs[4]) {
    const __m256i v = _mm256_loadu_si256((const __m256i*)sums);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packs_epi32(v, v), 0x08);  // exact: no sum saturates
    _mm_storeu_si128((__m128i*)pairs, _mm256_castsi256_si128(packed));
}

// A Q4_K super-block's scales and mins of each row (the tile's 3 words at q, formats.h's `q4_k_scale`,
// lane by lane) as 4 words of bytes: scales 0-3, 4-7, mins 0-3, 4-7.
template <typename V, int64_t VECTOR>
inline void q4_k_words(const uint8_t* q, typename V::I words[4]) {
    using I = typename V::I;
    const I six = V::bytes(0x3f), low4 = V::bytes(0x0f), top2 = V::bytes(0x03);
    const I a = V::load(q), m = V::load(q + VECTOR), c = V::load(q + 2 * VECTOR);
    words[0] = V::all(a, six);
    words[1] = V::either(V::all(c, low4), V::up32(V::all(V::down32(a, 6), top2), 4));
    words[2] = V::all(m, six);
    words[3] = V::either(V::all(V::down32(c, 4), low4), V::up32(V::all(V::down32(m, 6), top2), 4));
}

// Byte j (0..15) of each row's `q4_k_words`: sub-block j's scale (j < 8), sub-block j - 8's min after
template <typename V>
inline typename V::I q4_k_byte(const typename V::I words[4], int j) {
    return V::all(V::down32(words[j / 4], 8 * (j % 4)), V::words(255));
}

// Each row's mins as int16 pairs, sub-blocks 2j and 2j + 1 in pair j (min bytes 0-3 of word 2, 4-7 of
// word 3), to meet a token's sums paired alike (`q4_k_mins_term`): 4 products a token, not 8.
template <typename V>
inline void q4_k_min_pairs(const typename V::I words[4], typename V::I mins[4]) {
    using I = typename V::I;
    const I byte = V::words(255), high = V::words(0xff0000);
    for (int w = 0; w < 2; ++w) {
        mins[2 * w] = V::either(V::all(words[2 + w], byte), V::all(V::up32(words[2 + w], 8), high));
        mins[2 * w + 1] = V::either(V::all(V::down32(words[2 + w], 16), byte), V::all(V::down32(words[2 + w], 8), high));
    }
}

// n + a token's mins term: its 8 sums of 32 (at sums) paired (`sum_pairs`) against `q4_k_min_pairs`
template <typename V>
inline typename V::I q4_k_mins_term(typename V::I n, const typename V::I mins[4], const int32_t* sums) {
    alignas(16) int32_t pairs[4];
    sum_pairs(sums, pairs);
    for (int j = 0; j < 4; ++j) n = V::pair_dot(n, mins[j], pairs + j);
    return n;
}

// Q6_K's group G of piece s (formats.h's sub-block of 32 weights) of each row, 0..63 a byte: ql's
// nibble and qh's 2 bits, where `q6_k_pieces` lays them.
template <typename V, int64_t VECTOR>
inline typename V::I q6_k_group(const uint8_t* q, int s, int G) {
    using I = typename V::I;
    const int h = s / 4, k = s % 4;
    const I ql = V::load(q + VECTOR * (4 + 8 * (2 * h + k % 2) + G));
    const I qh = V::load(q + VECTOR * (36 + 8 * h + G));
    const I high = k < 2 ? V::up16(qh, 4 - 2 * k) : V::down16(qh, 2 * k - 4);  // bits 2k, 2k + 1 to 4, 5
    return V::either(V::all(V::down16(ql, 4 * (k / 2)), V::bytes(0x0f)), V::all(high, V::bytes(0x30)));
}

// Q6_K's scale `index` (0..15, one for each 16 weights) of each row, int8 sign-extended, from its 4 words
template <typename V>
inline typename V::I q6_k_scale_of(const typename V::I words[4], int index) {
    return V::signed_down32(V::up32(words[index / 4], 24 - 8 * (index % 4)), 24);
}

// kSums16's "- 32 (sum of x)" terms: the 16 scales as int16 pairs (even: bytes 2m, 2m + 2 of word v;
// odd: 2m + 1, 2m + 3), and i less a token's terms against its sums of 16 (at sums, `quantize_super`)
// paired alike: 8 products a token, not 16 (below 32 x 16 x 128 x 2048 < 2^31 in all).
template <typename V>
inline void q6_k_scale_pairs(const typename V::I words[4], typename V::I even[4], typename V::I odd[4]) {
    for (int v = 0; v < 4; ++v) {
        even[v] = V::signed_down16(V::up16(words[v], 8), 8);
        odd[v] = V::signed_down16(words[v], 8);
    }
}
template <typename V>
inline typename V::I q6_k_less_offsets(typename V::I i, const typename V::I even[4], const typename V::I odd[4],
                                       const int32_t* sums) {
    for (int v = 0; v < 4; ++v) {
        const uint32_t a = uint32_t(sums[2 * v]), c = uint32_t(sums[2 * v + 1]);
        const typename V::I terms = V::add(V::times16(even[v], V::words(int32_t((a & 0xffff) | (c << 16)))),
                                           V::times16(odd[v], V::words(int32_t((a >> 16) | (c & 0xffff0000u)))));
        i = V::sub(i, V::up32(terms, 5));
    }
    return i;
}

// The V::kRows rows of Q4_K tiles at `rows` (from row0) against tokens [t0, t0 + T): per super-block,
// each row's scales and mins unpacked from its 3 words at once (formats.h's `q4_k_scale`, lane by
// lane), then per sub-block the rows' integer sums (V::dot) times their scales into i, and the mins
// times the token's sums into n (16-bit products: a min is below 64, a sum of 32 activations below
// 2^12 in magnitude): per sub-block for one token, two sub-blocks an instruction after the sub-blocks
// for several (the same integers); then int8.cpp's float operations.
template <typename V, int64_t VECTOR, int T>
[[gnu::noinline]] void q4_k_rows(const Projection& p, const Half& rows, int64_t row0, int64_t t0, const Out& out) {
    using I = typename V::I;
    const int64_t blocks = p.width / kBlock;
    const I low4 = V::bytes(0x0f);
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
            I dot[T];
            for (int t = 0; t < T; ++t) dot[t] = V::zero();
            for (int G = 0; G < 8; ++G) {
                const I w = V::all(V::down16(V::load(q + VECTOR * (3 + 8 * (s / 2) + G)), 4 * (s % 2)), low4);
                for (int t = 0; t < T; ++t) {
                    const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s + 4 * G;
                    if constexpr (V::kSums16)  // 8 pairs of 4-bit weights and int8s: below 8 x 2 x 15 x 128 < 2^15
                        dot[t] = V::dot16(dot[t], w, x);
                    else
                        dot[t] = V::dot(dot[t], w, x);
                }
            }
            if constexpr (V::kSums16) {
                const I pair = V::pair(scale);
                for (int t = 0; t < T; ++t) i[t] = V::scaled(i[t], dot[t], pair);
            } else {
                for (int t = 0; t < T; ++t) i[t] = V::add(i[t], V::times(dot[t], scale));
            }
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

// The V::kRows rows of Q6_K tiles at `rows` (from row0) against tokens [t0, t0 + T): per sub-block of
// 16, the rows' weights q (0..63: ql's nibble, qh's 2 bits) times the token's activations, less 32
// times their sum (the token's sums per 16: `quantize_super`), times the rows' scales into i; then
// int8.cpp's float operation, fma(d * d_x, float(i), acc). q . x - 32 (sum of x) is (q - 32) . x
// exactly: the integers are those of the definition.
template <typename V, int64_t VECTOR, int T>
[[gnu::noinline]] void q6_k_rows(const Projection& p, const Half& rows, int64_t row0, int64_t t0, const Out& out) {
    using I = typename V::I;
    const int64_t blocks = p.width / kBlock;
    typename V::F acc[T];
    for (int t = 0; t < T; ++t) acc[t] = V::zeros();
    for (int64_t b = 0; b < p.width / kSuper; ++b) {
        const int64_t at = b * rows.stride;
        ask_ahead(rows.d + at, rows.stride);  // every pass (`asks_ahead`)
        const uint8_t* q = rows.q + at;
        I words[4];
        for (int v = 0; v < 4; ++v) words[v] = V::load(q + VECTOR * v);
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
            for (int j = 0; j < 2; ++j) {  // the piece's 16s: scale 2s + j
                const I scale = q6_k_scale_of<V>(words, 2 * s + j);
                I dot[T];
                if constexpr (!V::kSums16) {
                    for (int t = 0; t < T; ++t) {
                        const int32_t sums = p.xtotal[(t0 + t) * blocks + 8 * b + s];  // this 32's two 16s
                        dot[t] = V::words(-32 * int32_t(int16_t(j == 0 ? sums & 0xffff : uint32_t(sums) >> 16)));
                    }
                }
                I pair = scale;  // kSums16: the scale in both int16 halves of each lane
                if constexpr (V::kSums16) pair = V::pair(scale);
                for (int e = 0; e < 4; ++e) {
                    const int G = 4 * j + e;
                    const I w = q6_k_group<V, VECTOR>(q, s, G);
                    for (int t = 0; t < T; ++t) {
                        const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper + kBlock * s + 4 * G;
                        // kSums16: 2 pairs of 6-bit weights and int8s, below 2 x 2 x 63 x 128 < 2^15
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
        if constexpr (V::kSums16) {  // the 16 scales' "- 32 (sum of x)" terms
            I even[4], odd[4];
            q6_k_scale_pairs<V>(words, even, odd);
            for (int t = 0; t < T; ++t) i[t] = q6_k_less_offsets<V>(i[t], even, odd, p.xtotal + (t0 + t) * blocks + 8 * b);
        }
        const typename V::F d = V::halves(rows.d + at);
        for (int t = 0; t < T; ++t) acc[t] = V::fma(V::mul(d, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(i[t]), acc[t]);
    }
    put_rows<V, T>(acc, row0, t0, out);
}

// Passes of several tokens in 256-bit registers: each super-block's weights unpacked once (`K_unpacked`,
// in L1) for every token of the pass, not once for each V::kTokens of them, then read back against
// kPairTokens tokens at a time, a sub-block's sums finished before the next begins (few registers
// live, where the whole super-block's in flight spilled AVX2's 16). The same integers and float
// operations as `q4_k_rows` and `q6_k_rows`, in the same order per row and token.
constexpr int64_t kPassTokens = 32;  // tokens an unpacked super-block serves at once (their sums in memory)
constexpr int kPairTokens = 4;       // tokens read against each unpacked vector together
constexpr int64_t kFewTokens = 4;    // passes of at most this many tokens unpack in registers as they go

// A super-block's unpacked weights: vector (s, G) holds each row's 4 weights of group G of sub-block s
// (0..15 for Q4_K, 0..63 for Q6_K, a byte each), and per sub-block (Q6_K: per 16) the rows' scales as
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

// A Q4_K super-block unpacked (`K_unpacked`) for `k_pass`, with its rows' mins and float scales.
template <typename V, int64_t VECTOR>
struct Q4_KSuper {
    using I = typename V::I;
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
                u.put(2 * c, G, V::all(raw, low4));
                u.put(2 * c + 1, G, V::all(V::down16(raw, 4), low4));
            }
        d = V::halves(rows.d + at);
        dmin = V::halves(rows.m + at);
    }

    // Tokens [t0, t0 + T) against super-block b: i and n as `q4_k_rows` sums them, then its float
    // operations on acc (the tokens' sums, kRows each).
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
            for (int t = 0; t < T; ++t) dot[t] = V::zero();
#pragma GCC unroll 8
            for (int G = 0; G < 8; ++G) {  // kSums16: 8 pairs of 4-bit weights and int8s, below 8 x 2 x 15 x 128 < 2^15
                const I w = u.at(s, G);
                for (int t = 0; t < T; ++t) dot[t] = group_sum<V>(dot[t], w, x[t] + kBlock * s + 4 * G);
            }
            for (int t = 0; t < T; ++t) i[t] = dot_scale<V>(i[t], dot[t], u.scale[s]);
        }
        for (int t = 0; t < T; ++t) {
            const I n = q4_k_mins_term<V>(V::zero(), mins, p.xtotal + (t0 + t) * blocks + 8 * b);
            const typename V::F dx = V::each(p.xd[(t0 + t) * blocks + 8 * b]);
            const typename V::F sum = V::fma(V::mul(d, dx), V::real(i[t]), V::loadf(acc[t]));
            V::store(acc[t], V::fnma(V::mul(dmin, dx), V::real(n), sum));
        }
    }
};

// A Q6_K super-block unpacked for `k_pass`, with its rows' scales as int16 pairs (kSums16's offsets
// terms, `q6_k_less_offsets`) and float scale.
template <typename V, int64_t VECTOR>
struct Q6_KSuper {
    using I = typename V::I;
    K_unpacked<V> u;
    I even[4], odd[4];
    typename V::F d;

    void unpack(const Half& rows, int64_t at) {
        const uint8_t* q = rows.q + at;
        I words[4];
        for (int v = 0; v < 4; ++v) words[v] = V::load(q + VECTOR * v);
        q6_k_scale_pairs<V>(words, even, odd);
        for (int index = 0; index < 16; ++index) u.scale[index] = scale_form<V>(q6_k_scale_of<V>(words, index));
        for (int s = 0; s < 8; ++s)
            for (int G = 0; G < 8; ++G) u.put(s, G, q6_k_group<V, VECTOR>(q, s, G));
        d = V::halves(rows.d + at);
    }

    // Tokens [t0, t0 + T) against super-block b: i as `q6_k_rows` sums it (kSums16: the "- 32 (sum of
    // x)" terms after the sub-blocks), then its float operation on acc.
    template <int T>
    void tokens(const Projection& p, int64_t b, int64_t t0, float (*acc)[V::kRows]) const {
        const int64_t blocks = p.width / kBlock;
        const int8_t* x[T];
        const int32_t* sums[T];  // each 32's two sums of 16 (`quantize_super`)
        for (int t = 0; t < T; ++t) {
            x[t] = p.qx + (t0 + t) * p.width + b * kSuper;
            sums[t] = p.xtotal + (t0 + t) * blocks + 8 * b;
        }
        I i[T];
        for (int t = 0; t < T; ++t) i[t] = V::zero();
#pragma GCC unroll 1
        for (int s = 0; s < 8; ++s) {
#pragma GCC unroll 2
            for (int j = 0; j < 2; ++j) {  // the piece's 16s: scale 2s + j
                I dot[T];
                for (int t = 0; t < T; ++t) {
                    if constexpr (V::kSums16)
                        dot[t] = V::zero();
                    else
                        dot[t] = V::words(-32 * int32_t(int16_t(j == 0 ? sums[t][s] & 0xffff : uint32_t(sums[t][s]) >> 16)));
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
            if constexpr (V::kSums16) i[t] = q6_k_less_offsets<V>(i[t], even, odd, sums[t]);
            V::store(acc[t], V::fma(V::mul(d, V::each(p.xd[(t0 + t) * blocks + 8 * b])), V::real(i[t]), V::loadf(acc[t])));
        }
    }
};

// The V::kRows rows of tiles at `rows` (from row0) against tokens [t0, t0 + n), n <= kPassTokens: each
// super-block unpacked once (Super: `Q4_KSuper`, `Q6_KSuper`), then read against kPairTokens tokens at a
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

// A pass of tokens [t0, t0 + n) over the V::kRows rows at `rows` of p's kind, its vectors VECTOR bytes long.
template <typename V, int64_t VECTOR>
void k_pass_kind(const Projection& p, const Half& rows, int64_t row0, int64_t t0, int64_t n, const Out& out) {
    p.kind == Q4_K ? k_pass<V, Q4_KSuper<V, VECTOR>>(p, rows, row0, t0, n, out)
                   : k_pass<V, Q6_KSuper<V, VECTOR>>(p, rows, row0, t0, n, out);
}

// The V::kRows rows at `rows` (from row0) against every token of the pass: V::kTokens at a time, or in
// 256-bit registers, past kFewTokens tokens, kPassTokens at a time from unpacked super-blocks. The
// vectors' length is compiled in (VECTOR: 64 bytes, or 32 in a last tile of 8 rows), so that each of a
// block's vectors is read at a constant offset.
template <typename V>
void k_rows(const Projection& p, const Half& rows, int64_t row0, const Out& out) {
    if constexpr (V::kRows == kTileRows) {
        if (p.n > kFewTokens) {
            for (int64_t t = 0; t < p.n; t += kPassTokens) {
                const int64_t n = p.n - t < kPassTokens ? p.n - t : kPassTokens;
                rows.vector == 4 * kTile ? k_pass_kind<V, 4 * kTile>(p, rows, row0, t, n, out)
                                         : k_pass_kind<V, 4 * kTileRows>(p, rows, row0, t, n, out);
            }
            return;
        }
    }
    for (int64_t t = 0; t < p.n; t += V::kTokens)
        for_count<V::kTokens>(p.n - t, [&](auto T) {
            if (rows.vector == 4 * kTile)
                p.kind == Q4_K ? q4_k_rows<V, 4 * kTile, T>(p, rows, row0, t, out) : q6_k_rows<V, 4 * kTile, T>(p, rows, row0, t, out);
            else if constexpr (V::kRows == kTileRows)
                p.kind == Q4_K ? q4_k_rows<V, 4 * kTileRows, T>(p, rows, row0, t, out) : q6_k_rows<V, 4 * kTileRows, T>(p, rows, row0, t, out);
        });
}

#else  // portable loops

// Rows 8g .. 8g + 7 of Q4_K tiles against tokens [t0, t0 + T): each row's GGUF block back from the tile,
// then its integers and int8_rows.cpp's float operations, one product at a time.
void q4_k_half(const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q4_K, p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[144];
            k_untile(Q4_K, half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block)), dmin = half_to_float(load_u16(block + 2));
            for (int64_t t = 0; t < T; ++t) {
                const int64_t token = t0 + t;
                const int8_t* x = p.qx + token * p.width + b * kSuper;
                int32_t i = 0, n = 0;
        #pragma GCC unroll 8
        for (int s = 0; s < 8; ++s) {
                    int scale, min, dot = 0;
                    q4_k_scale(block + 4, s, scale, min);
                    for (int e = 0; e < kBlock; ++e) dot += ((block[16 + 32 * (s / 2) + e] >> (4 * (s % 2))) & 15) * x[kBlock * s + e];
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

// Rows 8g .. 8g + 7 of Q6_K tiles against tokens [t0, t0 + T), as `q4_k_half` reads Q4_K's.
void q6_k_half(const Projection& p, int64_t g, int64_t t0, int64_t T, const Out& out) {
    const int64_t blocks = p.width / kBlock;
    const Half half = half_tile(Q6_K, p.w, p.rows, p.row_bytes, g);
    for (int r = 0; r < kTileRows; ++r) {
        float acc[kInt8Tokens] = {};
        for (int64_t b = 0; b < p.width / kSuper; ++b) {
            uint8_t block[210];
            k_untile(Q6_K, half, b * half.stride, r, block);
            const float d = half_to_float(load_u16(block + 208));
            for (int64_t t = 0; t < T; ++t) {
                const int8_t* x = p.qx + (t0 + t) * p.width + b * kSuper;
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
                acc[t] = std::fmaf(d * p.xd[(t0 + t) * blocks + 8 * b], float(i), acc[t]);
            }
        }
        for (int64_t t = 0; t < T; ++t) out.put(t0 + t, g * kTileRows + r, acc[t]);
    }
}

#endif

}  // namespace

void specdraft::k_group(const Projection& p, int64_t g, int64_t halves, const Out& out) {
#ifdef SPECDRAFT_AVX2
    for (int64_t h = 0; h < halves; ++h)
        k_rows<Ymm>(p, half_tile(p.kind, p.w, p.rows, p.row_bytes, g + h), (g + h) * kTileRows, out);
#else
    for (int64_t t = 0; t < p.n; t += kInt8Tokens)
        for (int64_t h = 0; h < halves; ++h) {
            const int64_t T = p.n - t < kInt8Tokens ? p.n - t : kInt8Tokens;
            p.kind == Q4_K ? q4_k_half(p, g + h, t, T, out) : q6_k_half(p, g + h, t, T, out);
        }
#endif
}

#ifdef SPECDRAFT_ZMM
void specdraft::k_whole_tile(const Projection& p, int64_t g, const Out& out) {
    // a whole tile's first half: its d, m and vectors begin where the tile's do, 4 * 16 bytes a vector
    k_rows<Zmm>(p, half_tile(p.kind, p.w, p.rows, p.row_bytes, g), g * kTileRows, out);
}
#endif

void specdraft::k_tile_block(int64_t kind, uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b,
                             int r, const uint8_t* block) {
    const HalfOf<uint8_t> half = half_tile(kind, tiles, rows, row_bytes, g);
    const auto copy = [&](uint8_t* tile, int offset, int n) { std::memcpy(tile, block + offset, n); };
    kind == Q4_K ? q4_k_pieces(half, b * half.stride, r, copy) : q6_k_pieces(half, b * half.stride, r, copy);
}

void specdraft::k_block_of(int64_t kind, const uint8_t* tiles, int64_t rows, int64_t row_bytes, int64_t g, int64_t b,
                           int r, uint8_t* block) {
    const Half half = half_tile(kind, tiles, rows, row_bytes, g);
    k_untile(kind, half, b * half.stride, r, block);
}
