// GGUF's block formats as the kernels read them: each kind's number (as
// `specdraft.backend.native.formats` numbers it; `specdraft_kind` states it back for a test to
// compare), its block (weights and bytes) and its dequantisation to float32 (`expand_row`: the values
// a dequantised float32 copy holds). Both arithmetics read blocks through these; each has its own
// dot product per kind (float32.cpp's `block_values`, int8.cpp's tiles). A new kind is an entry here
// (its number, `block_bytes`, its branch of `expand_row`, `specdraft_kind`'s case) and its two dot
// products.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace {

enum Kind : int64_t { F32 = 0, Q4_1 = 1, Q8_0 = 2 };  // as `native.formats` numbers them (`specdraft_kind`)
constexpr int64_t kBlock = 32;     // weights in a GGUF block

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

int64_t block_bytes(int64_t kind) { return kind == Q4_1 ? 20 : 34; }

// Row r's values as float32 into out[width] (a float32 row is copied).
void expand_row(int64_t kind, const uint8_t* row, int64_t width, float* out) {
    if (kind == F32) {
        std::memcpy(out, row, width * 4);
        return;
    }
    for (int64_t b = 0; b < width / kBlock; ++b) {
        const uint8_t* p = row + b * block_bytes(kind);
        float d = half_to_float(load_u16(p));
        float* o = out + b * kBlock;
        if (kind == Q4_1) {
            float m = half_to_float(load_u16(p + 2));
            for (int j = 0; j < 16; ++j) {
                o[j] = std::fmaf(d, float(p[4 + j] & 15), m);
                o[j + 16] = std::fmaf(d, float(p[4 + j] >> 4), m);
            }
        } else {
            for (int j = 0; j < 32; ++j) o[j] = d * float(int8_t(p[2 + j]));
        }
    }
}

}  // namespace
