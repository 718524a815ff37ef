// The raw oneDNN primitive: the reference that tapegrad's products are held to.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <thread>

#include <oneapi/dnnl/dnnl.hpp>
#include <tapegrad/tapegrad.hpp>

extern "C" void omp_set_num_threads(int n);  // libgomp, which oneDNN runs on

namespace bench {

// The oneDNN primitive alone: created once, executed on preallocated buffers, on as many threads
// as tapegrad is set to use (oneDNN reads OpenMP's count when it creates and when it runs a
// primitive), so that a reference and tapegrad measured side by side use the same threads.
// With bf16, A and B are bfloat16 and C float32, as tapegrad's bfloat16 products; trans_a and
// trans_b store A and B transposed (A [k, m], B [n, k] per batch), as a backward's products read
// them.
struct RawDnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  dnnl::matmul prim;
  dnnl::memory a, b, c;
  RawDnnl(std::int64_t batch, std::int64_t m, std::int64_t k, std::int64_t n, bool bf16 = false, bool trans_a = false,
          bool trans_b = false) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    omp_set_num_threads(tapegrad::num_threads());
    const dt in = bf16 ? dt::bf16 : dt::f32;
    const dnnl::memory::desc da({batch, m, k}, in, trans_a ? tag::acb : tag::abc), db({batch, k, n}, in, trans_b ? tag::acb : tag::abc),
        dc({batch, m, n}, dt::f32, tag::abc);
    prim = dnnl::matmul(dnnl::matmul::primitive_desc(dnnl::matmul::desc(da, db, dc), engine));
    a = dnnl::memory(da, engine);
    b = dnnl::memory(db, engine);
    c = dnnl::memory(dc, engine);
    if (bf16) {  // 0.5 and 0.25 in bfloat16 bits
      std::fill_n(static_cast<std::uint16_t*>(a.get_data_handle()), batch * m * k, std::uint16_t{0x3f00});
      std::fill_n(static_cast<std::uint16_t*>(b.get_data_handle()), batch * k * n, std::uint16_t{0x3e80});
    } else {
      std::fill_n(static_cast<float*>(a.get_data_handle()), batch * m * k, 0.5f);
      std::fill_n(static_cast<float*>(b.get_data_handle()), batch * k * n, 0.25f);
    }
  }
  void run() {
    omp_set_num_threads(tapegrad::num_threads());
    prim.execute(stream, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    stream.wait();
  }
};

// The references run on oneDNN's own OpenMP team, whose idle workers spin after each parallel
// run (libgomp's default: 300,000 `pause` iterations, 1.7 ms on the 2-core EPYC) on the core that
// tapegrad's own worker needs. So references are timed in rounds of their own, before tapegrad's,
// and this waits until their team has gone to sleep.
inline void after_references() {
  if (tapegrad::num_threads() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
}

}  // namespace bench
