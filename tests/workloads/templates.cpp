// C++ built -O2 -fomit-frame-pointer: deep template instantiations, a lambda through
// std::sort, and a std::function: most frames are inlined or frameless.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <vector>

template <int N> struct Layer {
    __attribute__((noinline)) static double run(std::vector<double> &v, const std::function<bool(double, double)> &less) {
        return Layer<N - 1>::run(v, less) + N;
    }
};
template <> struct Layer<0> {
    __attribute__((noinline)) static double run(std::vector<double> &v, const std::function<bool(double, double)> &less) {
        for (auto &x : v) x = std::rand();
        std::sort(v.begin(), v.end(), [&](double a, double b) { return less(a, b); });
        return v[0];
    }
};

int main(int argc, char **argv) {
    double secs = argc > 1 ? std::atof(argv[1]) : 5;
    std::vector<double> v(50000);
    std::function<bool(double, double)> less = [](double a, double b) {
        for (int i = 0; i < 10; i++) { a *= 1.0000001; b *= 1.0000001; }
        return a < b;
    };
    auto start = std::chrono::steady_clock::now();
    double sink = 0;
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < secs)
        sink += Layer<6>::run(v, less);
    return sink == 42 ? 1 : 0;
}
