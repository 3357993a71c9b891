// Shared by the compiled kernels (float32.cpp, int8.cpp, attention.cpp): from a count known at run time to code
// compiled for it.
#pragma once

#include <cstdint>
#include <type_traits>

// f(std::integral_constant<int, N>()), N = min(n, Max) for n >= 1: code compiled per count, chosen at run time.
template <int Max, typename F>
inline void for_count(int64_t n, F&& f) {
    if constexpr (Max > 1)
        if (n < Max) return for_count<Max - 1>(n, f);
    f(std::integral_constant<int, Max>());
}
