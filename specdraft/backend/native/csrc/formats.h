// GGUF's block formats as the kernels read them: each kind's number (as
// `specdraft.backend.native.formats` numbers it; `specdraft_kind` states it back for a test to
// compare), its block (weights and bytes) and its dequantisation to float32 (`piece_values`, the
// values a dequantised float32 copy holds, gguf's bitwise). Blocks hold 32 weights, or 256 for the K
// kinds (Q4_K, Q6_K: a super-block of sub-blocks with their own scales). Both arithmetics read a row
// in pieces of 32 weights (kBlock): piece b lies in block b >> piece_shift(kind), as its sub-block
// b & (pieces - 1). Each arithmetic has its own dot product per kind (float32.cpp's `block_values`,
// int8.cpp's). A new kind is an entry here (its number, `block_bytes`, its `piece_values`,
// `specdraft_kind`'s case) and its two dot products.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

enum Kind : int64_t { F32 = 0, Q4_1 = 1, Q8_0 = 2, Q5_0 = 3, Q4_K = 4, Q6_K = 5 };  // as `native.formats` numbers them
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

uint16_t load_u16(const uint8_t* p) {
    uint16_t v;
    std::memcpy(&v, p, 2);
    return v;
}

inline bool k_kind(int64_t kind) { return kind == Q4_K || kind == Q6_K; }

// log2 of the pieces of 32 weights in a block of `kind`: a row's piece b is sub-block b & ((1 << shift) - 1)
// of its block b >> shift.
inline int piece_shift(int64_t kind) { return k_kind(kind) ? 3 : 0; }

inline int64_t block_weights(int64_t kind) { return k_kind(kind) ? kSuper : kBlock; }

inline int64_t block_bytes(int64_t kind) {
    switch (kind) {
        case Q4_1: return 20;
        case Q8_0: return 34;
        case Q5_0: return 22;
        case Q4_K: return 144;
        case Q6_K: return 210;
    }
    return 4;  // F32: a weight
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

// Q8_0 (34 bytes): float16 d at 0, 32 int8 q at 2: w = d * q (exact).
inline void q8_0_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    for (int j = 0; j < 32; ++j) o[j] = d * float(int8_t(p[2 + j]));
}

// Q5_0 (22 bytes): float16 d at 0, qh (32 bits, little-endian) at 2, qs at 6: element j's low 4 bits as
// Q4_1's (byte 6 + j % 16), its 5th bit qh's bit j: w = d * (q - 16) (exact).
inline void q5_0_piece(const uint8_t* p, float* o) {
    const float d = half_to_float(load_u16(p));
    uint32_t qh;
    std::memcpy(&qh, p + 2, 4);
    for (int j = 0; j < 32; ++j) {
        const int q = (j < 16 ? p[6 + j] & 15 : p[6 + j - 16] >> 4) | int((qh >> j) & 1) << 4;
        o[j] = d * float(q - 16);
    }
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
inline void q4_k_piece(const uint8_t* p, int sub, float* o) {
    int scale, min;
    q4_k_scale(p + 4, sub, scale, min);
    const float ds = half_to_float(load_u16(p)) * float(scale), dm = half_to_float(load_u16(p + 2)) * float(min);
    const uint8_t* q = p + 16 + 32 * (sub / 2);
    const int shift = 4 * (sub % 2);
    for (int e = 0; e < 32; ++e) o[e] = std::fmaf(ds, float((q[e] >> shift) & 15), -dm);
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

// Piece `sub` (32 weights) of the block at p as float32 into out[32].
inline void piece_values(int64_t kind, const uint8_t* p, int sub, float* out) {
    switch (kind) {
        case Q4_1: q4_1_piece(p, out); break;
        case Q8_0: q8_0_piece(p, out); break;
        case Q5_0: q5_0_piece(p, out); break;
        case Q4_K: q4_k_piece(p, sub, out); break;
        case Q6_K: q6_k_piece(p, sub, out); break;
    }
}

// Row r's values as float32 into out[width] (a float32 row is copied).
inline void expand_row(int64_t kind, const uint8_t* row, int64_t width, float* out) {
    if (kind == F32) {
        std::memcpy(out, row, width * 4);
        return;
    }
    const int shift = piece_shift(kind);
    for (int64_t b = 0; b < width / kBlock; ++b)
        piece_values(kind, row + (b >> shift) * block_bytes(kind), int(b & ((1 << shift) - 1)), out + b * kBlock);
}

}  // namespace
