// Timing and the raw oneDNN primitive, shared by the benchmarks.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#include <tapegrad/tapegrad.hpp>

namespace bench {

// Calls per timed block so that one block takes about budget / 8.
inline int calibrate(const std::function<void()>& f, double budget) {
  f();  // warm-up (and primitive creation)
  int reps = 1;
  for (;;) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (dt > budget / 8 || reps > (1 << 20)) return reps;
    reps *= 2;
  }
}

inline double block(const std::function<void()>& f, int reps) {
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

// Seconds per call of each function, best of 7 alternating blocks.
inline std::vector<double> seconds_per_call(const std::vector<std::function<void()>>& fs, double budget = 0.25) {
  std::vector<int> reps;
  for (const auto& f : fs) reps.push_back(calibrate(f, budget));
  std::vector<double> best(fs.size(), 1e30);
  for (int s = 0; s < 7; ++s)
    for (std::size_t i = 0; i < fs.size(); ++i) best[i] = std::min(best[i], block(fs[i], reps[i]));
  return best;
}
inline double seconds_per_call(const std::function<void()>& f, double budget = 0.25) { return seconds_per_call(std::vector<std::function<void()>>{f}, budget)[0]; }

}  // namespace bench

extern "C" void omp_set_num_threads(int n);  // libgomp, which oneDNN runs on

namespace bench {

// The oneDNN primitive alone: created once, executed on preallocated buffers, on as many threads
// as tapegrad is set to use (oneDNN reads OpenMP's count when it creates and when it runs a
// primitive), so that a reference and tapegrad measured side by side use the same threads.
struct RawDnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  RawDnnl(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    omp_set_num_threads(tapegrad::num_threads());
    const dnnl::memory::desc da({batch, m, k}, dt::f32, tag::abc), db({batch, k, n}, dt::f32, tag::abc),
        dc({batch, m, n}, dt::f32, tag::abc);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(da, db, dc), engine));
    a = dnnl::memory(da, engine);
    b = dnnl::memory(db, engine);
    c = dnnl::memory(dc, engine);
    std::fill_n(static_cast<float*>(a.get_data_handle()), batch * m * k, 0.5f);
    std::fill_n(static_cast<float*>(b.get_data_handle()), batch * k * n, 0.25f);
  }
  void run() {
    omp_set_num_threads(tapegrad::num_threads());
    prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
};

}  // namespace bench
