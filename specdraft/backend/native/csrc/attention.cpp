// Attention over a row's cached keys and values, for the CPU step's layers
// (numba_layers.attention.attend): one job is up to kMaxQueries (token, query head) pairs of one kv
// head (a query each) over one span of `span` cache entries at a fixed offset (flash-decoding's
// split, fixed so that a token's result does not depend on the pass it is in). A job's queries of one row take each key and value it loads
// together, as many at once as the registers hold (`kBatch`): a verify pass's tokens read their kv
// head's span once, not once a pair. A query keeps its span's softmax as (max score, sum of
// exp(score - max), the values so weighted); numba joins the spans after, in order.
//
// One order of arithmetic per (token, head, span), whatever the pass, the batch or the path:
//   - a score is q . k in 16 lanes: lane l takes elements l, l + 16, ... in order, each a fused
//     multiply-add from 0; the lanes are added in one tree (l + (l + 8), then + 4, then + 2, then
//     + 1); then times 1 / sqrt(head_dim);
//   - exp(score - max) by `exp_lanes` (the same polynomial as numba_layers.elementwise.exp), 0 where
//     the entry is not seen; their sum in 8 lanes (entry j in lane j % 8, in order), then the tree from + 4;
//   - each output element the fused multiply-adds of the seen entries' weights and values, in
//     order.
// The AVX-512 code (the 16 lanes in one register), the AVX2 code (in two) and the portable loops
// below compute exactly these operations (-ffp-contract=off: no other multiply-add is fused), so they
// give bitwise the same results. Entries a token does not
// see are never read as numbers (their cache slots may hold anything); a span that none of a job's
// queries sees is not read at all (what the arithmetic gives it, -inf, 0 and 0s, written instead).
//
// The cache is paged (specdraft.backend.paged): a span is one page of `span` entries, a row's pages
// found through the pass's table, so where a row's entries lie never changes the arithmetic.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "for_count.h"

#if defined(__AVX2__) && defined(__FMA__) && !defined(SPECDRAFT_PORTABLE)
#include <immintrin.h>
#define SPECDRAFT_ATTENTION_AVX2 1
#if defined(__AVX512F__) && !defined(SPECDRAFT_NO_ZMM)
#define SPECDRAFT_ATTENTION_ZMM 1
#endif
#endif

// A layer's attention for a pass, passed by address: every field 8 bytes, in the order of
// `specdraft.backend.native.calls.Attention`'s.
struct Attention {
    const float* qkv;        // [n, qkv_stride]: each token's q heads, then k, then v (q and k rotated)
    int64_t qkv_stride;
    const int64_t* rows;     // [n]: each token's row in keys and values
    const uint8_t* visible;  // [n, kv] bool: which cache entries each token sees
    int64_t kv;
    const float* keys;       // [pages, kv_heads, span, head_dim]: the layer's pool
    const float* values;     // the same shape
    const int64_t* table;    // [rows, table_stride]: each row's page for each span
    int64_t table_stride;
    int64_t heads;
    int64_t kv_heads;
    int64_t head_dim;        // a multiple of 16
    int64_t span;            // cache entries a job reads (at most kMaxSpan)
    int64_t spans;
    int64_t tokens;          // n
    float* tops;             // [n, heads, spans]: each span's maximum score (-inf: nothing seen)
    float* totals;           // [n, heads, spans]: its sum of exp(score - maximum)
    float* sums;             // [n, heads, spans, head_dim]: its values weighted so
};

namespace {

constexpr int64_t kMaxSpan = 256;
constexpr int64_t kMaxQueries = 6;  // queries of one kv head a job takes at most (`job_queries`)
constexpr float kLog2e = 1.4426950408889634f, kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;

#ifdef SPECDRAFT_ATTENTION_AVX2

// kKeys: keys a query's scores take at a time; kChunk: registers its weighted values take at a time
#if defined(SPECDRAFT_ATTENTION_ZMM)  // 512-bit: a query's 16 lanes in one register; 6 queries at a time
constexpr int kKeys = 4, kChunk = 4, kBatch = 6;
#elif defined(__AVX512VL__)  // 32 vector registers: 2 queries' scores of 4 keys, weighted values of 64 elements
constexpr int kKeys = 4, kChunk = 8, kBatch = 2;
#else  // 16
constexpr int kKeys = 2, kChunk = 4, kBatch = 2;
#endif

inline float lanes_sum(__m256 a) {  // (l + (l + 4)), then + 2, then + 1
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}

// The 8 lanes of each of a, b, c, d added in `lanes_sum`'s tree, four at once: (a, b, c, d).
inline __m128 lanes_sums(__m256 a, __m256 b, __m256 c, __m256 d) {
    const __m256 ab = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    const __m256 cd = _mm256_add_ps(_mm256_permute2f128_ps(c, d, 0x20), _mm256_permute2f128_ps(c, d, 0x31));
    // ab: a's l + (l + 4) in its low half, b's in its high one; cd likewise.
    const __m256 s2 = _mm256_add_ps(_mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(1, 0, 1, 0)),
                                    _mm256_shuffle_ps(ab, cd, _MM_SHUFFLE(3, 2, 3, 2)));
    // s2: (a's + 2, a's, c's, c's) low; b's and d's high.
    const __m256 s1 = _mm256_add_ps(_mm256_shuffle_ps(s2, s2, _MM_SHUFFLE(2, 0, 2, 0)),
                                    _mm256_shuffle_ps(s2, s2, _MM_SHUFFLE(3, 1, 3, 1)));
    // s1: (a, c, a, c) low, (b, d, b, d) high
    return _mm_unpacklo_ps(_mm256_castps256_ps128(s1), _mm256_extractf128_ps(s1, 1));
}

// dots[u][first + r] = q[u] . k[r] (keys k + r * n, r < K) in 16 lanes (AVX-512: one register; AVX2:
// 0-7 in one, 8-15 in another), lanes l and l + 8 then added: 8 lanes. Each key is loaded once for the Q queries.
#ifdef SPECDRAFT_ATTENTION_ZMM
template <int Q, int K>
inline void dot_lanes(const float* const* q, const float* k, int64_t n, __m256 (*dots)[4], int first) {
    __m512 a[Q][K];
    for (int u = 0; u < Q; ++u)
        for (int r = 0; r < K; ++r) a[u][r] = _mm512_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m512 key[K];
        for (int r = 0; r < K; ++r) key[r] = _mm512_loadu_ps(k + r * n + i);
        for (int u = 0; u < Q; ++u) {
            const __m512 x = _mm512_loadu_ps(q[u] + i);
            for (int r = 0; r < K; ++r) a[u][r] = _mm512_fmadd_ps(x, key[r], a[u][r]);
        }
    }
    for (int u = 0; u < Q; ++u)
        for (int r = 0; r < K; ++r) {
            const __m256 high = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a[u][r]), 1));
            dots[u][first + r] = _mm256_add_ps(_mm512_castps512_ps256(a[u][r]), high);
        }
}
#else
template <int Q, int K>
inline void dot_lanes(const float* const* q, const float* k, int64_t n, __m256 (*dots)[4], int first) {
    __m256 a[Q][K], b[Q][K];
    for (int u = 0; u < Q; ++u)
        for (int r = 0; r < K; ++r) a[u][r] = b[u][r] = _mm256_setzero_ps();
    for (int64_t i = 0; i < n; i += 16) {
        __m256 low[K], high[K];
        for (int r = 0; r < K; ++r) {
            low[r] = _mm256_loadu_ps(k + r * n + i);
            high[r] = _mm256_loadu_ps(k + r * n + i + 8);
        }
        for (int u = 0; u < Q; ++u) {
            const __m256 ql = _mm256_loadu_ps(q[u] + i), qh = _mm256_loadu_ps(q[u] + i + 8);
            for (int r = 0; r < K; ++r) {
                a[u][r] = _mm256_fmadd_ps(ql, low[r], a[u][r]);
                b[u][r] = _mm256_fmadd_ps(qh, high[r], b[u][r]);
            }
        }
    }
    for (int u = 0; u < Q; ++u)
        for (int r = 0; r < K; ++r) dots[u][first + r] = _mm256_add_ps(a[u][r], b[u][r]);
}
#endif

// For each query u < Q: scores[u][j] = (q[u] . keys[j]) * scale where seen[u][j], else 0, for j <
// width (a multiple of 8), and tops[u] the largest seen score (-inf: none). Unseen keys are computed
// too, four at a time, and dropped.
template <int Q>
inline void score_keys(const float* const* q, const float* keys, int64_t hd, const uint8_t (*seen)[kMaxSpan],
                       int64_t width, float scale, float (*scores)[kMaxSpan], float* tops) {
    __m128 top[Q];
    for (int u = 0; u < Q; ++u) top[u] = _mm_set1_ps(-INFINITY);
    for (int64_t j = 0; j < width; j += 4) {
        __m256 dots[Q][4];
        for (int first = 0; first < 4; first += kKeys) dot_lanes<Q, kKeys>(q, keys + (j + first) * hd, hd, dots, first);
        for (int u = 0; u < Q; ++u) {
            const __m128 s = _mm_mul_ps(lanes_sums(dots[u][0], dots[u][1], dots[u][2], dots[u][3]), _mm_set1_ps(scale));
            int32_t flags;
            std::memcpy(&flags, seen[u] + j, 4);
            const __m128 keep = _mm_castsi128_ps(_mm_cmpgt_epi32(_mm_cvtepu8_epi32(_mm_cvtsi32_si128(flags)), _mm_setzero_si128()));
            _mm_storeu_ps(scores[u] + j, _mm_and_ps(s, keep));
            top[u] = _mm_max_ps(top[u], _mm_blendv_ps(_mm_set1_ps(-INFINITY), s, keep));
        }
    }
    for (int u = 0; u < Q; ++u) {
        const __m128 t = _mm_max_ps(top[u], _mm_movehl_ps(top[u], top[u]));
        tops[u] = _mm_cvtss_f32(_mm_max_ss(t, _mm_shuffle_ps(t, t, 1)));
    }
}

// out[j] = exp(x[j]) for 8 entries (clamped to [-87, 88], 2^m times a polynomial to r^7).
inline __m256 exp_lanes(__m256 x) {
    const __m256 v = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
    const __m256 m = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(v, _mm256_set1_ps(kLog2e)), _mm256_set1_ps(0.5f)));
    __m256 r = _mm256_sub_ps(v, _mm256_mul_ps(m, _mm256_set1_ps(kLn2Hi)));
    r = _mm256_sub_ps(r, _mm256_mul_ps(m, _mm256_set1_ps(kLn2Lo)));
    const float c[7] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f};
    __m256 p = _mm256_set1_ps(c[0]);
    for (int i = 1; i < 7; ++i) p = _mm256_add_ps(_mm256_set1_ps(c[i]), _mm256_mul_ps(r, p));
    p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_mul_ps(r, p));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(m), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}

// weights[j] = exp(scores[j] - top) where seen[j], else 0; returns their sum (8 lanes, the tree).
inline float weigh(const float* scores, const uint8_t* seen, float top, int64_t n, float* weights) {
    __m256 total = _mm256_setzero_ps();
    for (int64_t j = 0; j < n; j += 8) {
        const __m256 e = exp_lanes(_mm256_sub_ps(_mm256_loadu_ps(scores + j), _mm256_set1_ps(top)));
        const __m256i flags = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i*)(seen + j)));
        const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(flags, _mm256_setzero_si256()));
        const __m256 w = _mm256_and_ps(e, keep);
        _mm256_storeu_ps(weights + j, w);
        total = _mm256_add_ps(total, w);
    }
    return lanes_sum(total);
}

// A register of the weighted values' lanes: 16 with AVX-512, 8 with AVX2.
#ifdef SPECDRAFT_ATTENTION_ZMM
struct Lanes {
    using V = __m512;
    static constexpr int kCount = 16;
    static V zero() { return _mm512_setzero_ps(); }
    static V load(const float* p) { return _mm512_loadu_ps(p); }
    static V set1(float x) { return _mm512_set1_ps(x); }
    static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
    static void store(float* p, V a) { _mm512_storeu_ps(p, a); }
};
#else
struct Lanes {
    using V = __m256;
    static constexpr int kCount = 8;
    static V zero() { return _mm256_setzero_ps(); }
    static V load(const float* p) { return _mm256_loadu_ps(p); }
    static V set1(float x) { return _mm256_set1_ps(x); }
    static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
    static void store(float* p, V a) { _mm256_storeu_ps(p, a); }
};
#endif

// out[u][d0 .. d0 + C lanes) = query u's seen entries' weights times their values, fused
// multiply-adds in entry order; each entry's values loaded once for the Q queries.
template <int Q, int C>
inline void weighted_chunk(const float* values, int64_t head_dim, const float (*weights)[kMaxSpan],
                           const uint8_t (*seen)[kMaxSpan], int64_t n, float* const* out, int64_t d0) {
    constexpr int L = Lanes::kCount;
    Lanes::V acc[Q][C];
    for (int u = 0; u < Q; ++u)
        for (int c = 0; c < C; ++c) acc[u][c] = Lanes::zero();
    for (int64_t j = 0; j < n; ++j) {
        const float* v = values + j * head_dim + d0;
        Lanes::V x[C];
        for (int c = 0; c < C; ++c) x[c] = Lanes::load(v + L * c);
        for (int u = 0; u < Q; ++u) {
            if (!seen[u][j]) continue;
            const Lanes::V e = Lanes::set1(weights[u][j]);
            for (int c = 0; c < C; ++c) acc[u][c] = Lanes::fma(e, x[c], acc[u][c]);
        }
    }
    for (int u = 0; u < Q; ++u)
        for (int c = 0; c < C; ++c) Lanes::store(out[u] + d0 + L * c, acc[u][c]);
}

template <int Q>
inline void weighted_values(const float* values, int64_t head_dim, const float (*weights)[kMaxSpan],
                            const uint8_t (*seen)[kMaxSpan], int64_t n, float* const* out) {
    constexpr int wide = Lanes::kCount * kChunk, rest = 16 / Lanes::kCount;  // head_dim: a multiple of 16
    int64_t d = 0;
    for (; d + wide <= head_dim; d += wide) weighted_chunk<Q, kChunk>(values, head_dim, weights, seen, n, out, d);
    for (; d < head_dim; d += 16) weighted_chunk<Q, rest>(values, head_dim, weights, seen, n, out, d);
}

#else  // portable loops: the same operations

constexpr int kBatch = 2;

inline float lanes_sum(const float a[8]) {
    const float s4[4] = {a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]};
    const float s2[2] = {s4[0] + s4[2], s4[1] + s4[3]};
    return s2[0] + s2[1];
}

inline float dot(const float* q, const float* k, int64_t n) {
    float a[16] = {};
    for (int64_t i = 0; i < n; i += 16)
        for (int l = 0; l < 16; ++l) a[l] = std::fmaf(q[i + l], k[i + l], a[l]);
    for (int l = 0; l < 8; ++l) a[l] += a[l + 8];
    return lanes_sum(a);
}

template <int Q>
inline void score_keys(const float* const* q, const float* keys, int64_t hd, const uint8_t (*seen)[kMaxSpan],
                       int64_t width, float scale, float (*scores)[kMaxSpan], float* tops) {
    for (int u = 0; u < Q; ++u) {
        tops[u] = -INFINITY;
        for (int64_t j = 0; j < width; ++j) {
            scores[u][j] = seen[u][j] ? dot(q[u], keys + j * hd, hd) * scale : 0.0f;
            if (seen[u][j]) tops[u] = std::fmax(tops[u], scores[u][j]);
        }
    }
}

inline float exp_one(float x) {
    const float v = std::fmin(std::fmax(x, -87.0f), 88.0f);
    const float m = std::floor(v * kLog2e + 0.5f);
    float r = v - m * kLn2Hi;
    r = r - m * kLn2Lo;
    const float c[7] = {1.0f / 5040, 1.0f / 720, 1.0f / 120, 1.0f / 24, 1.0f / 6, 0.5f, 1.0f};
    float p = c[0];
    for (int i = 1; i < 7; ++i) p = c[i] + r * p;
    p = 1.0f + r * p;
    const uint32_t bits = uint32_t(int32_t(m) + 127) << 23;
    float scale;
    std::memcpy(&scale, &bits, 4);
    return p * scale;
}

inline float weigh(const float* scores, const uint8_t* seen, float top, int64_t n, float* weights) {
    float total[8] = {};
    for (int64_t j = 0; j < n; ++j) {
        weights[j] = seen[j] ? exp_one(scores[j] - top) : 0.0f;
        total[j % 8] += weights[j];
    }
    return lanes_sum(total);
}

template <int Q>
inline void weighted_values(const float* values, int64_t head_dim, const float (*weights)[kMaxSpan],
                            const uint8_t (*seen)[kMaxSpan], int64_t n, float* const* out) {
    for (int u = 0; u < Q; ++u) {
        for (int64_t d = 0; d < head_dim; ++d) out[u][d] = 0.0f;
        for (int64_t j = 0; j < n; ++j) {
            if (!seen[u][j]) continue;
            for (int64_t d = 0; d < head_dim; ++d) out[u][d] = std::fmaf(weights[u][j], values[j * head_dim + d], out[u][d]);
        }
    }
}

#endif

// Queries q0 .. q0 + Q - 1 of kv head g (query q: token q / group, head g * group + q % group), all of
// one row, over span `span`.
template <int Q>
void attend_queries(const Attention& a, int64_t g, int64_t span, int64_t q0) {
    const int64_t group = a.heads / a.kv_heads, row = a.rows[q0 / group];
    const int64_t hd = a.head_dim, first = span * a.span, count = a.kv - first < a.span ? a.kv - first : a.span;
    const float scale = float(1.0 / std::sqrt(double(hd)));
    const int64_t cache = (a.table[row * a.table_stride + span] * a.kv_heads + g) * a.span * hd;
    const int64_t width = (count + 7) / 8 * 8;  // the flags padded with unseen entries to a multiple of 8
    alignas(32) uint8_t seen[Q][kMaxSpan] = {};
    alignas(32) float scores[Q][kMaxSpan], weights[Q][kMaxSpan];  // unseen entries' scores 0: numbers
    const float* q[Q];
    float* out[Q];
    int64_t at[Q];
    for (int u = 0; u < Q; ++u) {
        const int64_t t = (q0 + u) / group, head = g * group + (q0 + u) % group;
        std::memcpy(seen[u], a.visible + t * a.kv + first, count);
        q[u] = a.qkv + t * a.qkv_stride + head * hd;
        at[u] = (t * a.heads + head) * a.spans + span;
        out[u] = a.sums + at[u] * hd;
    }
    bool anything = false;
    for (int u = 0; u < Q; ++u) anything = anything || std::memchr(seen[u], 1, count) != nullptr;
    if (!anything) {  // what the arithmetic below gives a span none of the queries sees, unread
        for (int u = 0; u < Q; ++u) {
            a.tops[at[u]] = -INFINITY;
            a.totals[at[u]] = 0.0f;
            std::memset(out[u], 0, hd * sizeof(float));
        }
        return;
    }
    float tops[Q];
    score_keys<Q>(q, a.keys + cache, hd, seen, width, scale, scores, tops);
    for (int u = 0; u < Q; ++u) {  // a query that sees nothing: -inf, 0, and (no entry weighted) 0s
        a.tops[at[u]] = tops[u];
        a.totals[at[u]] = tops[u] == -INFINITY ? 0.0f : weigh(scores[u], seen[u], tops[u], width, weights[u]);
    }
    weighted_values<Q>(a.values + cache, hd, weights, seen, count, out);
}

// Queries a job takes of `all` (tokens * group) of a kv head: at most kMaxQueries, and two jobs where
// there are two queries or more (a decode token's query heads split between two threads).
inline int64_t job_queries(int64_t all) {
    const int64_t half = (all + 1) / 2;
    return half < kMaxQueries ? half : kMaxQueries;
}

// Job `job`: chunk c of kv head g's tokens * group queries (job_queries(...) of them from c times that)
// over one span. Chunks vary fastest, then spans: consecutive jobs (one thread's, in numba's share of
// them by their work, `numba_layers.attention`) read the same span of keys and values. A job's queries
// of one row are computed together, kBatch at a time.
void attend_job(const Attention& a, int64_t job) {
    const int64_t group = a.heads / a.kv_heads, all = a.tokens * group, size = job_queries(all);
    const int64_t chunks = (all + size - 1) / size;
    const int64_t chunk = job % chunks, span = (job / chunks) % a.spans, g = job / (chunks * a.spans);
    const int64_t end = (chunk + 1) * size < all ? (chunk + 1) * size : all;
    for (int64_t q = chunk * size; q < end;) {
        int64_t m = 1;  // the queries from q of q's row
        while (q + m < end && m < kBatch && a.rows[(q + m) / group] == a.rows[q / group]) ++m;
        for_count<kBatch>(m, [&](auto Q) { attend_queries<Q>(a, g, span, q); });
        q += m;
    }
}

}  // namespace

// Jobs [start, end) of a layer's attention (job = (kv head * spans + span) * chunks + chunk: the
// chunk's queries of the kv head's tokens * group, query q = token * group + query head in the group;
// chunks = ceil(tokens * group / specdraft_attend_job_queries(tokens * group))).
extern "C" void specdraft_attend(const Attention* a, int64_t start, int64_t end) {
    for (int64_t job = start; job < end; ++job) attend_job(*a, job);
}

// The queries a job takes of `all` of a kv head (for Python to compare with its own count of jobs).
extern "C" int64_t specdraft_attend_job_queries(int64_t all) { return job_queries(all); }

// Where an `Attention` holds the field so named (null: its size); -1 where it has none.
extern "C" int64_t specdraft_attention_offset(const char* field) {
    if (field == nullptr) return sizeof(Attention);
#define SPECDRAFT_FIELD(name) {#name, offsetof(Attention, name)}
    static const struct {
        const char* name;
        size_t offset;
    } fields[] = {SPECDRAFT_FIELD(qkv), SPECDRAFT_FIELD(qkv_stride), SPECDRAFT_FIELD(rows), SPECDRAFT_FIELD(visible),
                  SPECDRAFT_FIELD(kv), SPECDRAFT_FIELD(keys), SPECDRAFT_FIELD(values), SPECDRAFT_FIELD(table),
                  SPECDRAFT_FIELD(table_stride),
                  SPECDRAFT_FIELD(heads), SPECDRAFT_FIELD(kv_heads), SPECDRAFT_FIELD(head_dim),
                  SPECDRAFT_FIELD(span), SPECDRAFT_FIELD(spans), SPECDRAFT_FIELD(tokens),
                  SPECDRAFT_FIELD(tops), SPECDRAFT_FIELD(totals),
                  SPECDRAFT_FIELD(sums)};
#undef SPECDRAFT_FIELD
    for (const auto& f : fields) {
        if (std::strcmp(field, f.name) == 0) return int64_t(f.offset);
    }
    return -1;
}
