// The int8 arithmetic's tokens (int8.cpp says what it computes): each token's activations quantised
// per block of 32 for the kinds of 32 weights, per super-block of 256 for the K kinds, rounded to
// float16 (bfloat16) for F16 (BF16), once a pass (`specdraft_quantize`), before any projection reads them.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "projection.h"

namespace {

// A block of 32 activations quantised: q, and returns the sum of q; d and s as above. Every path
// computes the same values: the maximum is exact, the rest one IEEE operation each.
#ifdef SPECDRAFT_AVX2
float top_of(const float* x, int64_t n) {  // max |x_j| of n (a multiple of 8) activations
    const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 top = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 8) top = _mm256_max_ps(top, _mm256_and_ps(_mm256_loadu_ps(x + i), magnitude));
    __m128 t4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
    __m128 t2 = _mm_max_ps(t4, _mm_movehl_ps(t4, t4));
    return _mm_cvtss_f32(_mm_max_ss(t2, _mm_shuffle_ps(t2, t2, 1)));
}

// 32 activations quantised with scale d into q; the sums of q's first 16 and last 16 into sums.
void quantize_with(const float* x, float scale, int8_t* q, int32_t sums[2]) {
    const __m256 inverse = _mm256_set1_ps(scale != 0.0f ? 1.0f / scale : 0.0f);
    const __m256 high = _mm256_set1_ps(127.0f), low = _mm256_set1_ps(-127.0f);
    __m256i n[4];
    for (int i = 0; i < 4; ++i) {
        __m256 r = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), inverse), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        n[i] = _mm256_cvtps_epi32(_mm256_min_ps(high, _mm256_max_ps(low, r)));
    }
    // 32 -> 16 -> 8 bits, then the 4-byte groups back in element order
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
    _mm256_storeu_si256((__m256i*)q, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    for (int half = 0; half < 2; ++half) {
        const __m256i total = _mm256_add_epi32(n[2 * half], n[2 * half + 1]);
        __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
        t = _mm_hadd_epi32(t, t);
        sums[half] = _mm_cvtsi128_si32(_mm_hadd_epi32(t, t));
    }
}
#else
float top_of(const float* x, int64_t n) {
    float top = 0.0f;
    for (int64_t j = 0; j < n; ++j) top = std::fmax(top, std::fabs(x[j]));
    return top;
}

void quantize_with(const float* x, float scale, int8_t* q, int32_t sums[2]) {
    const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
    sums[0] = sums[1] = 0;
    for (int j = 0; j < kBlock; ++j) {
        float v = std::nearbyint(x[j] * inverse);  // the default rounding: to nearest, ties to even
        v = std::fmin(127.0f, std::fmax(-127.0f, v));
        q[j] = int8_t(v);
        sums[j / 16] += int32_t(v);
    }
}
#endif

int32_t quantize_block(const float* x, int8_t* q, float& d, float& s) {
    const float scale = top_of(x, kBlock) / 127.0f;
    int32_t sums[2];
    quantize_with(x, scale, q, sums);
    d = scale;
    s = scale * float(sums[0] + sums[1]);
    return sums[0] + sums[1];
}

// A K kind's super-block of 256 activations: d = max |x| / 127 over the 256, each of its 32s quantised
// with it as `quantize_block` quantises a block (d, s and the sum per 32, d the same for the 8). Q6_K's
// scales are per 16, so its `total` holds each 32's two sums of 16 instead, as int16 halves of the
// int32 (the first 16's the low half; each at most 16 * 127 in magnitude).
template <int64_t KIND>
void quantize_super(const float* x, int8_t* q, float* d, float* s, int32_t* total) {
    const float scale = top_of(x, kSuper) / 127.0f;
    for (int c = 0; c < kSuper / kBlock; ++c) {
        int32_t sums[2];
        quantize_with(x + kBlock * c, scale, q + kBlock * c, sums);
        total[c] = Traits<KIND>::halves16 ? int32_t(uint32_t(uint16_t(sums[0])) | uint32_t(sums[1]) << 16) : sums[0] + sums[1];
        d[c] = scale;
        s[c] = scale * float(sums[0] + sums[1]);
    }
}

// A token of a kind of float weights (F16, BF16) rounded to it (`Traits::token`), as float32 values
// into out[width]: F16's 8 at a time by F16C where the build has it (the same rounding, to nearest even).
template <int64_t KIND>
void round_token(const float* x, int64_t width, float* out) {
    int64_t j = 0;
#ifdef SPECDRAFT_AVX2
    if constexpr (KIND == F16) {
        for (; j + 8 <= width; j += 8) {
            const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(x + j), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            _mm256_storeu_ps(out + j, _mm256_cvtph_ps(h));
        }
    }
#endif
    for (; j < width; ++j) out[j] = Traits<KIND>::token(x[j]);
}

template <int64_t KIND>
void quantize_token(const float* x, int64_t width, int8_t* q, float* d, float* s, int32_t* total) {
    if constexpr (Traits<KIND>::floats) {
        round_token<KIND>(x, width, reinterpret_cast<float*>(q));
    } else if constexpr (Traits<KIND>::super) {
        for (int64_t b = 0; b < width / kBlock; b += kSuper / kBlock)
            quantize_super<KIND>(x + b * kBlock, q + b * kBlock, d + b, s + b, total + b);
    } else {
        for (int64_t b = 0; b < width / kBlock; ++b) total[b] = quantize_block(x + b * kBlock, q + b * kBlock, d[b], s[b]);
    }
}

}  // namespace

// Tokens [start, end) of x quantised for the int8 arithmetic of `kind` into qx, xd, xsum and xtotal
// (the blocks of `width`); for a kind of float weights, rounded into qx as float32 [n, width] (4 width
// bytes a token). Reads kind, x, xs, width, qx, xd, xsum and xtotal.
extern "C" void specdraft_quantize(const Projection* p, int64_t start, int64_t end) {
    const int64_t blocks = p->width / kBlock;
    with_kind(p->kind, [&](auto k) {
        for (int64_t t = start; t < end; ++t)
            quantize_token<k>(p->x + t * p->xs, p->width, p->qx + t * p->width * (Traits<k>::floats ? 4 : 1),
                              p->xd + t * blocks, p->xsum + t * blocks,
                              p->xtotal + t * blocks);
    });
}

