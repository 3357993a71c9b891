// GGUF's block formats as the kernels read them, one traits entry per kind (`Traits<KIND>`, as ggml's type
// traits, but known when compiled): its number (as `specdraft.backend.native.formats` numbers it;
// `specdraft_kind` states it back for a test to compare), name, block (weights and bytes), the facts its
// tiles and quantised tokens follow, and its dequantisation to float32 (`piece`, the values a dequantised
// float32 copy holds, gguf's bitwise). Blocks hold 32 weights, or 256 for the K kinds (Q2_K, Q3_K, Q4_K,
// Q5_K, Q6_K, IQ4_XS: a super-block of sub-blocks with their own scales); IQ4_NL's and IQ4_XS's integers
// index a table; F16's and BF16's "blocks" are 32 float weights (`Floats`: no integers; their tiles, projection.h's `float_tile_at`). Both arithmetics read a row in pieces of 32 weights (kBlock): piece b lies in block b >>
// piece_shift, as its sub-block b & (pieces - 1). `with_kind` is the one place a kind's number becomes the
// code compiled for it: every entry point calls it once, and below it the kind is a template argument. A new
// kind is its number, its entry here and in `Kinds`, and its two dot products (float32.cpp's `block_values`,
// int8.cpp's or int8_k.cpp's).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

enum Kind : int64_t { F32 = 0, Q4_1 = 1, Q8_0 = 2, Q5_0 = 3, Q4_K = 4, Q6_K = 5, Q4_0 = 6, Q5_1 = 7, IQ4_NL = 8, Q5_K = 9, IQ4_XS = 10, Q3_K = 11, Q2_K = 12, F16 = 13, BF16 = 14 };  // as `native.formats` numbers them
constexpr int64_t kBlock = 32;     // weights the arithmetics read together: a block, or a K kind's sub-block (a piece)
constexpr int64_t kSuper = 256;    // weights in a K kind's block (its super-block)

float half_to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000) << 16, exponent = (h >> 10) & 0x1f, mantissa = h & 0x3ff;
    uint32_t bits;
    if (exponent == 0x1f) {
        bits = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else {  // subnormal: normalise
        int shift = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            ++shift;
        }
        bits = sign | uint32_t(113 - shift) << 23 | ((mantissa & 0x3ff) << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

// A float32 rounded to float16's nearest (ties to even; past float16's range, infinity), as F16C's
// vcvtps2ph and llama.cpp's fp32_to_fp16 round it.
uint16_t float_to_half(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    const uint32_t sign = (x >> 16) & 0x8000;
    x &= 0x7fffffff;
    if (x >= (127u + 16) << 23) return uint16_t(sign | (x > 0x7f800000u ? 0x7e00 : 0x7c00));  // infinity, NaN
    if (x < 113u << 23) {  // below float16's normals: its subnormals, the rounding by a float32 sum
        const uint32_t magic_bits = ((127u - 15) + (23 - 10) + 1) << 23;
        float v, magic;
        std::memcpy(&v, &x, 4);
        std::memcpy(&magic, &magic_bits, 4);
        v += magic;
        uint32_t r;
        std::memcpy(&r, &v, 4);
        return uint16_t(sign | (r - magic_bits));
    }
    x += (uint32_t(15 - 127) << 23) + 0xfff + ((x >> 13) & 1);  // rebias, and round the 13 bits dropped to even
    return uint16_t(sign | (x >> 13));
}

// A float32 rounded to bfloat16's nearest (ties to even; a NaN kept, quiet), as llama.cpp's fp32_to_bf16.
uint16_t float_to_bfloat(float f) {
    uint32_t x;
    std::memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000u) return uint16_t((x >> 16) | 64);
    return uint16_t((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float bfloat_to_float(uint16_t h) {
    const uint32_t bits = uint32_t(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

// Q4_1 (20 bytes): float16 d at 0, m at 2, qs at 4: element j in byte 4 + j % 16, the low nibble for
// j < 16, the high one after: w = d * q + m (the product exact, one rounding).
inline void q4_1_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p)), m = half_to_float(load_u16(p + 2));
    for (int j = 0; j < 16; ++j) {
        o[j] = std::fmaf(d, float(p[4 + j] & 15), m);
        o[j + 16] = std::fmaf(d, float(p[4 + j] >> 4), m);
    }
}

// Q4_0 (18 bytes): float16 d at 0, qs at 2 as Q4_1's: w = d * (q - 8) (exact).
inline void q4_0_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    for (int j = 0; j < 16; ++j) {
        o[j] = d * float((p[2 + j] & 15) - 8);
        o[j + 16] = d * float((p[2 + j] >> 4) - 8);
    }
}

// IQ4_NL's 16 weights, a nibble's (llama.cpp's kvalues_iq4nl): a non-linear grid, as int8.
constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL (18 bytes): float16 d at 0, qs at 2 as Q4_1's: w = d * kIq4nlValues[q] (exact).
inline void iq4_nl_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    for (int j = 0; j < 16; ++j) {
        o[j] = d * float(kIq4nlValues[p[2 + j] & 15]);
        o[j + 16] = d * float(kIq4nlValues[p[2 + j] >> 4]);
    }
}

// IQ4_XS's sub-block j (0..7) scale, 6 bits, from its block p: the low 4 bits byte 4 + j / 2's nibble
// j % 2, the top 2 bits 2j, 2j + 1 of the 16-bit scales_h at 2; a weight's scale is it less 32.
inline int iq4_xs_scale(const uint8_t* p, int j) {
    return ((p[4 + j / 2] >> (4 * (j % 2))) & 15) | ((load_u16(p + 2) >> (2 * j)) & 3) << 4;
}

// IQ4_XS (136 bytes, 256 weights): float16 d at 0, scales (`iq4_xs_scale`) at 2 and 4, qs at 8: sub-block
// j's 16 bytes at 8 + 16j as IQ4_NL's: w = (d * (scale - 32)) * kIq4nlValues[q] (exact).
inline void iq4_xs_piece(const uint8_t* p, int sub, float* o) {
    const float ds = half_to_float(load_u16(p)) * float(iq4_xs_scale(p, sub) - 32);
    const uint8_t* q = p + 8 + 16 * sub;
    for (int j = 0; j < 16; ++j) {
        o[j] = ds * float(kIq4nlValues[q[j] & 15]);
        o[j + 16] = ds * float(kIq4nlValues[q[j] >> 4]);
    }
}

// Q8_0 (34 bytes): float16 d at 0, 32 int8 q at 2: w = d * q (exact).
inline void q8_0_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    for (int j = 0; j < 32; ++j) o[j] = d * float(int8_t(p[2 + j]));
}

// Element j of a 5-bit kind's block: qh (32 bits, little-endian) at `qh`, then qs: its low 4 bits as
// Q4_1's (qs byte j % 16), its 5th bit qh's bit j.
inline int five_bits(const uint8_t* qh_at, int j) {
    uint32_t qh;
    std::memcpy(&qh, qh_at, 4);
    const uint8_t* qs = qh_at + 4;
    return (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | int((qh >> j) & 1) << 4;
}

// Q5_0 (22 bytes): float16 d at 0, qh at 2, qs at 6 (`five_bits`): w = d * (q - 16) (exact).
inline void q5_0_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    for (int j = 0; j < 32; ++j) o[j] = d * float(five_bits(p + 2, j) - 16);
}

// Q5_1 (24 bytes): float16 d at 0, m at 2, qh at 4, qs at 8 (`five_bits`): w = d * q + m (the product
// exact, one rounding).
inline void q5_1_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p)), m = half_to_float(load_u16(p + 2));
    for (int j = 0; j < 32; ++j) o[j] = std::fmaf(d, float(five_bits(p + 4, j)), m);
}

// Q4_K's sub-block j (0..7) scale and min, 6 bits each, from its 12 bytes s (llama.cpp's
// get_scale_min_k4): j < 4 the low 6 bits of bytes j (scale) and j + 4 (min); j >= 4 byte j + 4's low
// (scale) and high (min) nibble, their top 2 bits the top 2 of bytes j - 4 (scale) and j (min).
inline void q4_k_scale(const uint8_t* s, int j, int& scale, int& min) {
    if (j < 4) {
        scale = s[j] & 63;
        min = s[j + 4] & 63;
    } else {
        scale = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
        min = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
    }
}

// Q4_K (144 bytes, 256 weights): float16 d at 0, dmin at 2, 12 bytes of scales and mins at 4
// (`q4_k_scale`), qs at 16: sub-block j's element e in byte 16 + 32 (j / 2) + e, the low nibble for even
// j, the high one for odd: w = (d * scale) * q - dmin * min (the products exact, one rounding).
inline int q4_k_weight(const uint8_t* p, int sub, int e) { return (p[16 + 32 * (sub / 2) + e] >> (4 * (sub % 2))) & 15; }
inline void q4_k_piece(const uint8_t* p, int sub, float* o) {
    int scale, min;
    q4_k_scale(p + 4, sub, scale, min);
    const float ds = half_to_float(load_u16(p)) * float(scale), dm = half_to_float(load_u16(p + 2)) * float(min);
    for (int e = 0; e < 32; ++e) o[e] = std::fmaf(ds, float(q4_k_weight(p, sub, e)), -dm);
}

// Q5_K (176 bytes, 256 weights): Q4_K's d, dmin and scales (at 0, 2, 4), qh (32 bytes) at 16, qs (128)
// at 48 as Q4_K's: sub-block j's element e has its low 4 bits as Q4_K's, its 5th qh byte e's bit j:
// w = (d * scale) * q - dmin * min (the products exact, one rounding).
inline int q5_k_weight(const uint8_t* p, int sub, int e) {
    return ((p[48 + 32 * (sub / 2) + e] >> (4 * (sub % 2))) & 15) | ((p[16 + e] >> sub) & 1) << 4;
}
inline void q5_k_piece(const uint8_t* p, int sub, float* o) {
    int scale, min;
    q4_k_scale(p + 4, sub, scale, min);
    const float ds = half_to_float(load_u16(p)) * float(scale), dm = half_to_float(load_u16(p + 2)) * float(min);
    for (int e = 0; e < 32; ++e) o[e] = std::fmaf(ds, float(q5_k_weight(p, sub, e)), -dm);
}

// Q2_K (84 bytes, 256 weights): 16 bytes of scales at 0 (byte k: the 16 weights k's scale in its low
// nibble, its min in its high one), qs (64) at 16, float16 d at 80, dmin at 82. Element 128h + 32j + l:
// qs byte 32h + l's bits 2j, 2j + 1: w = (d * scale) * q - dmin * min (the products exact, one rounding).
inline int q2_k_weight(const uint8_t* p, int e) { return (p[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3; }
inline void q2_k_piece(const uint8_t* p, int sub, float* o) {
    const float d = half_to_float(load_u16(p + 80)), dmin = half_to_float(load_u16(p + 82));
    for (int i = 0; i < 32; ++i) {
        const int k = 2 * sub + i / 16;
        o[i] = std::fmaf(d * float(p[k] & 15), float(q2_k_weight(p, 32 * sub + i)), -(dmin * float(p[k] >> 4)));
    }
}

// Q3_K (110 bytes, 256 weights): hmask (32 bytes) at 0, qs (64) at 32, 12 bytes of 6-bit scales at 96,
// float16 d at 108. Element 128h + 32j + l (j < 4, l < 32): its low 2 bits qs byte 32h + l's bits 2j,
// 2j + 1, its 3rd hmask byte l's bit 4h + j: q, 0..7. Scale k (0..15, 16 weights each; k = 4a + c):
// its low 4 bits byte 4 (a % 2) + c's nibble a / 2, its top 2 bits 2a, 2a + 1 of byte 8 + c.
// w = (d * (scale - 32)) * (q - 4) (exact).
inline int q3_k_scale(const uint8_t* p, int k) {
    const int a = k / 4, c = k % 4;
    return ((p[96 + 4 * (a % 2) + c] >> (4 * (a / 2))) & 15) | ((p[104 + c] >> (2 * a)) & 3) << 4;
}
inline int q3_k_weight(const uint8_t* p, int e) {
    const int h = e / 128, j = e % 128 / 32, l = e % 32;
    return ((p[32 + 32 * h + l] >> (2 * j)) & 3) | ((p[l] >> (4 * h + j)) & 1) << 2;
}
inline void q3_k_piece(const uint8_t* p, int sub, float* o) {
    const float d = half_to_float(load_u16(p + 108));
    for (int i = 0; i < 32; ++i)
        o[i] = d * float(q3_k_scale(p, 2 * sub + i / 16) - 32) * float(q3_k_weight(p, 32 * sub + i) - 4);
}

// Q6_K (210 bytes, 256 weights): ql (128 bytes) at 0, qh (64) at 128, 16 int8 scales at 192, float16 d
// at 208. Element 128h + 32k + i (k < 4, i < 32): its low 4 bits in ql byte 64h + 32 (k % 2) + i (the
// low nibble for k < 2, the high one after), its top 2 in qh byte 32h + i (bits 2k, 2k + 1); scale
// n / 16 for element n: w = (d * scale) * (q - 32) (exact).
inline void q6_k_piece(const uint8_t* p, int sub, float* o) {
    const int h = sub / 4, k = sub % 4;
    const uint8_t *ql = p + 64 * h + 32 * (k % 2), *qh = p + 128 + 32 * h;
    const float d = half_to_float(load_u16(p + 208));
    for (int i = 0; i < 32; ++i) {
        const int q = ((ql[i] >> (4 * (k / 2))) & 15) | ((qh[i] >> (2 * k)) & 3) << 4;
        o[i] = d * float(int8_t(p[192 + 8 * h + 2 * k + i / 16])) * float(q - 32);
    }
}

template <int64_t KIND>
struct Traits;

// What every block kind's entry states: a block of `weights` weights in `bytes` bytes, `pieces` of 32 (a
// row's piece b lies in block b >> piece_shift); `bits` of each integer weight; `scales`, the float16 fields
// per row before a tile's integers (d; Q4_1's m, Q4_K's dmin, IQ4_XS's scales_h beside it); for a kind of 32
// weights, `qs`, where its block's integers begin; `offset`, what the bytes of its int8 tiles (a lookup
// kind's looked-up bytes, IQ4_XS's too) exceed its weights by; `ahead`, whether a decode token asks for its
// tiles ahead (tiles.h's `asks_ahead`); `halves16`, whether its tokens' sums are kept per 16 (Q6_K's scales);
// `lookup`, whether its integers index a table of int8 weights (IQ4_NL's `table`: then `offset` is what the
// bytes looked up for vpdpbusd exceed them by, and the weights are signed 8-bit ones wherever they are
// multiplied); `floats`, whether its weights are floats (F32, F16, BF16: no integers, none of int8.cpp's tiles).
template <int64_t WEIGHTS, int64_t BYTES, int BITS, int SCALES, int QS = 0, int32_t OFFSET = 0, bool AHEAD = true,
          bool HALVES16 = false>
struct Facts {
    static constexpr int64_t weights = WEIGHTS, bytes = BYTES;
    static constexpr bool dense = false, super = WEIGHTS == kSuper;
    static constexpr int pieces = int(WEIGHTS / kBlock), piece_shift = super ? 3 : 0;
    static constexpr int bits = BITS, scales = SCALES, qs = QS;
    static constexpr int32_t offset = OFFSET;
    static constexpr bool ahead = AHEAD, halves16 = HALVES16, lookup = false, floats = false;
};

template <>
struct Traits<F32> {
    static constexpr const char* name = "F32";
    static constexpr int64_t weights = 1, bytes = 4;  // a unit: one float32 weight
    static constexpr bool dense = true, super = false, floats = true;
    static float token(float x) { return x; }  // the int8 arithmetic's token: as it is
};

// The kinds of float16 and bfloat16 weights (64 bytes: 32 weights as they lie, each exact in float32;
// TO_FLOAT reads one, FROM_FLOAT rounds a float32 to one). Their int8 arithmetic quantises nothing: it
// rounds each token's activations to the kind (`token`, as llama.cpp's dot products for the kind round
// theirs), then sums as the float32 one does (each product then exact in float32, so a fused multiply-add
// and a product then a sum give the same).
template <float (*TO_FLOAT)(uint16_t), uint16_t (*FROM_FLOAT)(float)>
struct Floats {
    static constexpr int64_t weights = kBlock, bytes = 2 * kBlock;
    static constexpr bool dense = false, super = false, floats = true;
    static constexpr int pieces = 1, piece_shift = 0;
    static float token(float x) { return TO_FLOAT(FROM_FLOAT(x)); }
    static float value(const uint8_t* p) { return TO_FLOAT(load_u16(p)); }
    static void piece(const uint8_t* p, int, float* o) {
        for (int j = 0; j < kBlock; ++j) o[j] = value(p + 2 * j);
    }
};

template <>
struct Traits<F16> : Floats<half_to_float, float_to_half> {
    static constexpr const char* name = "F16";
};

template <>
struct Traits<BF16> : Floats<bfloat_to_float, float_to_bfloat> {
    static constexpr const char* name = "BF16";
};

template <>
struct Traits<Q4_1> : Facts<kBlock, 20, 4, 2, 4, 0, false> {
    static constexpr const char* name = "Q4_1";
    static void piece(const uint8_t* p, int, float* o) { q4_1_piece(p, o); }
};

template <>
struct Traits<Q8_0> : Facts<kBlock, 34, 8, 1, 2, 128, false> {
    static constexpr const char* name = "Q8_0";
    static void piece(const uint8_t* p, int, float* o) { q8_0_piece(p, o); }
};

template <>
struct Traits<Q5_0> : Facts<kBlock, 22, 5, 1, 6, 16> {
    static constexpr const char* name = "Q5_0";
    static void piece(const uint8_t* p, int, float* o) { q5_0_piece(p, o); }
};

template <>
struct Traits<Q4_0> : Facts<kBlock, 18, 4, 1, 2, 8, false> {
    static constexpr const char* name = "Q4_0";
    static void piece(const uint8_t* p, int, float* o) { q4_0_piece(p, o); }
};

template <>
struct Traits<Q5_1> : Facts<kBlock, 24, 5, 2, 8> {
    static constexpr const char* name = "Q5_1";
    static void piece(const uint8_t* p, int, float* o) { q5_1_piece(p, o); }
};

template <>
struct Traits<IQ4_NL> : Facts<kBlock, 18, 4, 1, 2, 128, false> {
    static constexpr const char* name = "IQ4_NL";
    static constexpr bool lookup = true;
    static constexpr const int8_t* table = kIq4nlValues;
    static void piece(const uint8_t* p, int, float* o) { iq4_nl_piece(p, o); }
};

template <>
struct Traits<Q4_K> : Facts<kSuper, 144, 4, 2> {
    static constexpr const char* name = "Q4_K";
    static void piece(const uint8_t* p, int sub, float* o) { q4_k_piece(p, sub, o); }
};

template <>
struct Traits<Q5_K> : Facts<kSuper, 176, 5, 2> {
    static constexpr const char* name = "Q5_K";
    static void piece(const uint8_t* p, int sub, float* o) { q5_k_piece(p, sub, o); }
};

template <>
struct Traits<IQ4_XS> : Facts<kSuper, 136, 4, 2, 0, 128> {  // its scales_h where the others' m lie
    static constexpr const char* name = "IQ4_XS";
    static constexpr bool lookup = true;
    static constexpr const int8_t* table = kIq4nlValues;
    static void piece(const uint8_t* p, int sub, float* o) { iq4_xs_piece(p, sub, o); }
};

template <>
struct Traits<Q2_K> : Facts<kSuper, 84, 2, 2, 0, 0, true, true> {  // its dmin where the others' m lie
    static constexpr const char* name = "Q2_K";
    static void piece(const uint8_t* p, int sub, float* o) { q2_k_piece(p, sub, o); }
};

template <>
struct Traits<Q3_K> : Facts<kSuper, 110, 3, 1, 0, 0, true, true> {
    static constexpr const char* name = "Q3_K";
    static void piece(const uint8_t* p, int sub, float* o) { q3_k_piece(p, sub, o); }
};

template <>
struct Traits<Q6_K> : Facts<kSuper, 210, 6, 1, 0, 0, true, true> {
    static constexpr const char* name = "Q6_K";
    static void piece(const uint8_t* p, int sub, float* o) { q6_k_piece(p, sub, o); }
};

template <int64_t... K>
struct KindList {};
using Kinds = KindList<F32, Q4_1, Q8_0, Q5_0, Q4_K, Q6_K, Q4_0, Q5_1, IQ4_NL, Q5_K, IQ4_XS, Q3_K, Q2_K, F16, BF16>;  // every kind with an entry above

template <int64_t KIND>
using KindOf = std::integral_constant<int64_t, KIND>;

template <typename F, int64_t... K>
bool with_kind_of(KindList<K...>, int64_t kind, F&& f) {
    return ((kind == K && (f(KindOf<K>()), true)) || ...);
}

// f(KindOf<K>()) for the kind numbered `kind`; false (f not called) for a number that is no kind.
template <typename F>
bool with_kind(int64_t kind, F&& f) {
    return with_kind_of(Kinds(), kind, f);
}

// Row r's values as float32 into out[width] (a float32 row is copied).
template <int64_t KIND>
void expand_row(const uint8_t* row, int64_t width, float* out) {
    using T = Traits<KIND>;
    if constexpr (T::dense) {
        std::memcpy(out, row, width * 4);
    } else {
        for (int64_t b = 0; b < width / kBlock; ++b)
            T::piece(row + (b >> T::piece_shift) * T::bytes, int(b & (T::pieces - 1)), out + b * kBlock);
    }
}

}  // namespace
