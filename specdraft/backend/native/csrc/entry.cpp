// Projections y[t, r] = (w[r] . x[t] + b[r]) (+ residual[t, r]) over float32 rows or GGUF blocks
// (formats.h), in one of two arithmetics: float32 (float32.cpp) or int8 (GGUF blocks held as tiles
// against activations quantised per token: int8.cpp says how). Each is one order of arithmetic per
// token, whatever the pass. This file holds the entry points and the boundary's statement.
//
// Called from numba's parallel loops, one call per block of rows (`specdraft.backend.native.calls`):
// a `Projection` by address, and the rows [start, end) to compute; with the int8 arithmetic the
// tokens are quantised first, once (`specdraft_quantize`).

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "formats.h"
#include "projection.h"

extern "C" void specdraft_project(const Projection* p, int64_t start, int64_t end) {
    const specdraft::Out out{p->y, p->ys, p->bias, p->residual, p->rs};
    bool floats = true;
    with_kind(p->kind, [&](auto k) { floats = Traits<k>::floats; });
    if (p->qx == nullptr) {  // float32 arithmetic
        specdraft::project_float32(*p, start, end, out);
    } else if (!floats) {  // int8 arithmetic: the tokens quantised already (`specdraft_quantize`)
        specdraft::project_int8(*p, start, end, out);
    } else {  // a kind of float weights' int8 arithmetic: the float32 one over its tiles, on its tokens rounded (`specdraft_quantize`)
        Projection rounded = *p;
        rounded.x = reinterpret_cast<const float*>(p->qx);
        rounded.xs = p->width;
        specdraft::project_float_tiles(rounded, start, end, out);
    }
}

// The formats and the boundary as the kernel states them, for Python to compare with its own
// statement (`specdraft.backend.native.formats`, `calls.Projection`; tests/backend/test_blocks.py).

// A kind's name, and into weights and bytes those of its unit (a float32 weight, or a block); null
// for a number that is no kind.
extern "C" const char* specdraft_kind(int64_t kind, int64_t* weights, int64_t* bytes) {
    const char* name = nullptr;
    with_kind(kind, [&](auto k) {
        name = Traits<k>::name;
        *weights = Traits<k>::weights;
        *bytes = Traits<k>::bytes;
    });
    return name;
}

// Where a `Projection` holds the field so named (null: its size); -1 where it has none.
extern "C" int64_t specdraft_projection_offset(const char* field) {
    if (field == nullptr) return sizeof(Projection);
    static const struct {
        const char* name;
        size_t offset;
    } fields[] = {{"kind", offsetof(Projection, kind)}, {"w", offsetof(Projection, w)},
                  {"rows", offsetof(Projection, rows)}, {"row_bytes", offsetof(Projection, row_bytes)}, {"width", offsetof(Projection, width)},
                  {"x", offsetof(Projection, x)}, {"n", offsetof(Projection, n)}, {"xs", offsetof(Projection, xs)},
                  {"y", offsetof(Projection, y)}, {"ys", offsetof(Projection, ys)},
                  {"bias", offsetof(Projection, bias)}, {"residual", offsetof(Projection, residual)},
                  {"rs", offsetof(Projection, rs)}, {"qx", offsetof(Projection, qx)},
                  {"xd", offsetof(Projection, xd)}, {"xsum", offsetof(Projection, xsum)},
                  {"xtotal", offsetof(Projection, xtotal)}};
    for (const auto& f : fields) {
        if (std::strcmp(field, f.name) == 0) return int64_t(f.offset);
    }
    return -1;
}
