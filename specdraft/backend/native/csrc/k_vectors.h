// The vector operations the K kinds' int8 dot products run on (`Ymm`: 8 rows in 256-bit registers,
// `Zmm`: 16 in 512-bit ones) and their pieces both of int8_k.cpp's ways of reading a super-block share
// (int8_k.cpp: unpacking as it reads; int8_k_pass.cpp: unpacked once for a whole pass): Q4_K's scales
// and mins (Q5_K's too) and groups; Q6_K's 6-bit groups, scales and offset terms (Q3_K's too, its
// scales unpacked into Q6_K's form); IQ4_XS's table, scales and groups. int8.cpp says what they compute.
#pragma once

#include <cstdint>

#include "formats.h"
#include "projection.h"
#include "tiles.h"

#ifdef SPECDRAFT_AVX2

namespace {


// The vector operations of the K kinds' dot products on the rows one register holds: 8 (a half tile) in
// 256-bit registers (`Ymm`), or 16 (a whole tile) in 512-bit ones (`Zmm`), so that one template of each
// kind's arithmetic (int8_k.cpp's `rows_dot`) serves both. `kTokens`: how many tokens' sums the
// registers hold at once (AVX2 has 16 of them, AVX-512 32).
struct Ymm {
    using I = __m256i;
    using F = __m256;
    static constexpr int64_t kRows = kTileRows, kTokens = 4;
    static I load(const uint8_t* p) { return _mm256_loadu_si256((const __m256i*)p); }
    static I u16s(const uint8_t* p) { return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)p)); }  // a row's a lane
    static I table(const int8_t* t) { return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i*)t)); }
    static I lookup(I table, I nibbles) { return _mm256_shuffle_epi8(table, nibbles); }  // per 128-bit lane
    static I plus128(I a) { return _mm256_xor_si256(a, _mm256_set1_epi8(char(0x80))); }  // int8 w as the byte w + 128
    static I less8(I a, I b) { return _mm256_sub_epi8(a, b); }  // byte by byte
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
        asm("" : "+x"(sum));  // kept in a register here (int8_k_pass.cpp's `group_sum` says why)
        return sum;
    }
    // each lane's two int16 halves: the products of w's bytes (signed) and x's in pairs, by the sign trick
    // (|w| times x with w's sign: each pair below 2 x 128 x 127 < 2^15)
    static I sign_dot16(I w, const int8_t* x) {
        return _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(broadcast4(x), w));
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
    static I u16s(const uint8_t* p) { return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)p)); }
    static I table(const int8_t* t) { return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i*)t)); }
    static I lookup(I table, I nibbles) { return _mm512_shuffle_epi8(table, nibbles); }
    static I plus128(I a) { return _mm512_xor_si512(a, _mm512_set1_epi8(char(0x80))); }
    static I less8(I a, I b) { return _mm512_sub_epi8(a, b); }
    static I zero() { return _mm512_setzero_si512(); }
    static I bytes(int v) { return _mm512_set1_epi8(char(v)); }
    static I words(int32_t v) { return _mm512_set1_epi32(v); }
    static I all(I a, I b) { return _mm512_and_si512(a, b); }
    static I either(I a, I b) { return _mm512_or_si512(a, b); }
    static I add(I a, I b) { return _mm512_add_epi32(a, b); }
    static I sub(I a, I b) { return _mm512_sub_epi32(a, b); }
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
    static I signed_down16(I a, int n) { return _mm512_srai_epi16(a, n); }
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

// Groups of a sub-block whose products int16 holds (`Ymm::dot16`): run x 2 x (2^BITS - 1) x 128 < 2^15
// (Q4_K's 8 groups, a whole sub-block; Q5_K's 4).
template <int BITS>
constexpr int groups16() {
    int run = 8;
    while (run * 2 * ((1 << BITS) - 1) * 128 >= 1 << 15) run /= 2;
    return run;
}

// Bit s of each byte of qh at bit 4, the rest 0 (16-bit shifts: the bit stays in its byte).
template <typename V>
inline typename V::I fifth_bit(typename V::I qh, int s) {
    return V::all(s <= 4 ? V::up16(qh, 4 - s) : V::down16(qh, s - 4), V::bytes(0x10));
}

// Group G of sub-block s of each row of a Q4_K or Q5_K super-block's tiles at q (int8_k.cpp's
// `tile_pieces`): Q4_K's nibble, with Q5_K's 5th bit from its qh vector (35 + G) at bit 4.
template <int64_t KIND, typename V, int64_t VECTOR>
inline typename V::I q4_k_group(const uint8_t* q, int s, int G) {
    const typename V::I w = V::all(V::down16(V::load(q + VECTOR * (3 + 8 * (s / 2) + G)), 4 * (s % 2)), V::bytes(0x0f));
    if constexpr (KIND == Q4_K) return w;
    return V::either(w, fifth_bit<V>(V::load(q + VECTOR * (35 + G)), s));
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

// IQ4_XS's table as its products take it (formats.h's `Traits::table`): w + 128 (its offset) where they
// are vpdpbusd's (unsigned bytes), w itself for the sign trick (kSums16).
template <typename V>
inline typename V::I iq4_xs_table() {
    static_assert(Traits<IQ4_XS>::offset == 128, "the looked-up bytes exceed the weights by 128");
    const typename V::I w = V::table(Traits<IQ4_XS>::table);
    return V::kSums16 ? w : V::plus128(w);
}

// IQ4_XS's scales of each row less 32, one a sub-block (formats.h's `iq4_xs_scale`, lane by lane): its
// scales_l the tile's vector at q, its scales_h where the other kinds' m lie (a 16-bit value a row, at m).
template <typename V>
inline void iq4_xs_scales(const uint8_t* q, const uint8_t* m, typename V::I scale[8]) {
    using I = typename V::I;
    const I low = V::load(q), high = V::u16s(m), low4 = V::words(15), top2 = V::words(3), offset = V::words(32);
    for (int s = 0; s < 8; ++s)
        scale[s] = V::sub(V::either(V::all(V::down32(low, 4 * s), low4), V::up32(V::all(V::down32(high, 2 * s), top2), 4)),
                          offset);
}

// IQ4_XS's group G of sub-block s of each row, looked up in `table` (`iq4_xs_table`): its nibbles in the
// tile's vector 1 + 4s + G % 4 (int8_k.cpp's `tile_pieces`), the low ones for G < 4.
template <typename V, int64_t VECTOR>
inline typename V::I iq4_xs_group(const uint8_t* q, int s, int G, typename V::I table) {
    const typename V::I raw = V::load(q + VECTOR * (1 + 4 * s + G % 4));
    return V::lookup(table, V::all(G < 4 ? raw : V::down16(raw, 4), V::bytes(0x0f)));
}

// Q6_K's group G of piece s (formats.h's sub-block of 32 weights) of each row, 0..63 a byte: ql's
// nibble and qh's 2 bits, where Q6_K's `tile_pieces` lays them.
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

// Without kSums16: the start of a 16's sum, -OFFSET times the token's sum of that 16 (`sums`: its 32's
// two sums of 16, `quantize_super`; half j): Q6_K's 32, Q3_K's 4
template <typename V, int OFFSET = 32>
inline typename V::I q6_k_offset(int32_t sums, int j) {
    return V::words(-OFFSET * int32_t(int16_t(j == 0 ? sums & 0xffff : uint32_t(sums) >> 16)));
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
template <typename V, int SHIFT = 5>  // the offset, 2^SHIFT: Q6_K's 32, Q3_K's 4
inline typename V::I q6_k_less_offsets(typename V::I i, const typename V::I even[4], const typename V::I odd[4],
                                       const int32_t* sums) {
    for (int v = 0; v < 4; ++v) {
        const uint32_t a = uint32_t(sums[2 * v]), c = uint32_t(sums[2 * v + 1]);
        const typename V::I terms = V::add(V::times16(even[v], V::words(int32_t((a & 0xffff) | (c << 16)))),
                                           V::times16(odd[v], V::words(int32_t((a >> 16) | (c & 0xffff0000u)))));
        i = V::sub(i, V::up32(terms, SHIFT));
    }
    return i;
}

// Q3_K's group G of piece s = 4h + j of each row, 0..7 a byte: qs vector 3 + 8h + G's bits 2j, 2j + 1 and
// hmask vector 19 + G's bit 4h + j at bit 2 (int8_k.cpp's `tile_pieces`; 16-bit shifts: the bit stays in
// its byte).
template <typename V, int64_t VECTOR>
inline typename V::I q3_k_group(const uint8_t* q, int s, int G) {
    using I = typename V::I;
    const int h = s / 4, j = s % 4, bit = 4 * h + j;
    const I low = V::all(V::down16(V::load(q + VECTOR * (3 + 8 * h + G)), 2 * j), V::bytes(0x03));
    const I hm = V::load(q + VECTOR * (19 + G));
    return V::either(low, V::all(bit <= 2 ? V::up16(hm, 2 - bit) : V::down16(hm, bit - 2), V::bytes(0x04)));
}

// Q3_K's 16 scales of each row, less 32, as Q6_K's 4 words of int8 (`q6_k_scale_of` reads them): word a
// holds scales 4a .. 4a + 3, each's low 4 bits the tile's scale vector a % 2's nibbles a / 2, its top 2
// bits vector 2's bits 2a, 2a + 1 (formats.h's `q3_k_scale`, byte by byte).
template <typename V, int64_t VECTOR>
inline void q3_k_words(const uint8_t* q, typename V::I words[4]) {
    using I = typename V::I;
    const I packed[3] = {V::load(q), V::load(q + VECTOR), V::load(q + 2 * VECTOR)};
    for (int a = 0; a < 4; ++a) {
        const I low = V::all(V::down32(packed[a % 2], 4 * (a / 2)), V::bytes(0x0f));
        const I high = V::up32(V::all(V::down32(packed[2], 2 * a), V::bytes(0x03)), 4);
        words[a] = V::less8(V::either(low, high), V::bytes(32));
    }
}

// Q2_K's group G of piece s = 4h + j of each row, 0..3 a byte: qs vector 4 + 8h + G's bits 2j, 2j + 1.
template <typename V, int64_t VECTOR>
inline typename V::I q2_k_group(const uint8_t* q, int s, int G) {
    return V::all(V::down16(V::load(q + VECTOR * (4 + 8 * (s / 4) + G)), 2 * (s % 4)), V::bytes(0x03));
}

// The kinds of scales per 16 weights (Q6_K, Q3_K, Q2_K), whose dot products share one template: their
// scales as Q6_K's 4 words of int8 (Q2_K's the low nibbles of its 4 scale vectors; `k16_mins` the high
// ones, its mins), a group's weights, and what the weights' bytes exceed them by (2^shift; Q2_K: none,
// its mins a term of their own).
template <int64_t KIND, typename V, int64_t VECTOR>
inline void k16_words(const uint8_t* q, typename V::I words[4]) {
    if constexpr (KIND == Q3_K) {
        q3_k_words<V, VECTOR>(q, words);
    } else {
        for (int v = 0; v < 4; ++v) words[v] = V::load(q + VECTOR * v);
        if constexpr (KIND == Q2_K)
            for (int v = 0; v < 4; ++v) words[v] = V::all(words[v], V::bytes(0x0f));
    }
}
template <typename V, int64_t VECTOR>
inline void k16_mins(const uint8_t* q, typename V::I mins[4]) {
    for (int v = 0; v < 4; ++v) mins[v] = V::all(V::down32(V::load(q + VECTOR * v), 4), V::bytes(0x0f));
}
template <int64_t KIND, typename V, int64_t VECTOR>
inline typename V::I k16_group(const uint8_t* q, int s, int G) {
    if constexpr (KIND == Q3_K) return q3_k_group<V, VECTOR>(q, s, G);
    if constexpr (KIND == Q2_K) return q2_k_group<V, VECTOR>(q, s, G);
    return q6_k_group<V, VECTOR>(q, s, G);
}
template <int64_t KIND>
constexpr int k16_shift = KIND == Q3_K ? 2 : 5;
template <int64_t KIND>
constexpr bool k16_offset = KIND != Q2_K;  // the weights' bytes exceed them (Q2_K's do not: mins instead)

}  // namespace

#endif
