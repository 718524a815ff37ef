// tapegrad's own parallel loops: every index is visited once whatever the thread count, small
// loops stay on the calling thread, errors come back to the caller, and nesting runs inline.
#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <atomic>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.hpp>

#include "autodiff/parallel.hpp"
#include "ops/matmul_kernels.hpp"

namespace tg = tapegrad;
using tg::detail::parallel_chunks;
using tg::detail::parallel_for;

namespace {

// Restores the setting (ctest runs this suite with OMP_NUM_THREADS=1).
struct Threads {
  int saved = tg::num_threads();
  explicit Threads(int n) { tg::set_num_threads(n); }
  ~Threads() { tg::set_num_threads(saved); }
};

}  // namespace

BOOST_AUTO_TEST_CASE(every_index_once_for_any_thread_count) {
  for (int threads : {1, 2, 3, 7}) {
    Threads t(threads);
    for (std::int64_t n : {0, 1, 5, 1 << 15, (1 << 16) + 3}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
        BOOST_REQUIRE(0 <= b && b < e && e <= n);
        for (std::int64_t i = b; i < e; ++i) hits[static_cast<std::size_t>(i)]++;
      });
      for (const auto& h : hits) BOOST_REQUIRE_EQUAL(h.load(), 1);
    }
  }
}

BOOST_AUTO_TEST_CASE(small_work_and_one_thread_stay_serial) {
  Threads t(4);
  BOOST_TEST(parallel_chunks(tg::detail::kParallelGrain - 1, 1) == 1);
  BOOST_TEST(parallel_chunks(1, 1 << 30) == 1);  // one item cannot be split
  BOOST_TEST(parallel_chunks(tg::detail::kParallelGrain * 8, 1) == 4);
  BOOST_TEST(parallel_chunks(tg::detail::kParallelGrain, 2) == 2);  // cost scales the work
  tg::set_num_threads(1);
  BOOST_TEST(parallel_chunks(1 << 30, 1) == 1);
}

BOOST_AUTO_TEST_CASE(exception_reaches_the_caller_after_all_chunks) {
  Threads t(2);
  std::atomic<std::int64_t> done{0};
  BOOST_CHECK_THROW(parallel_for(1 << 20, 1,
                                 [&](std::int64_t b, std::int64_t e) {
                                   done += e - b;
                                   if (b == 0) throw std::runtime_error("first chunk");
                                 }),
                    std::runtime_error);
  BOOST_TEST(done.load() == 1 << 20);
}

BOOST_AUTO_TEST_CASE(nested_loops_run_inline) {
  Threads t(2);
  std::atomic<std::int64_t> inner{0};
  parallel_for(1 << 16, 1, [&](std::int64_t, std::int64_t) {
    BOOST_TEST(parallel_chunks(1 << 20, 1) == 1);
    parallel_for(1 << 16, 1, [&](std::int64_t b, std::int64_t e) { inner += e - b; });
  });
  BOOST_TEST(inner.load() == 2 * (1 << 16));
}

BOOST_AUTO_TEST_CASE(the_setting_is_process_wide) {
  Threads t(3);
  int seen = 0, chunks = 0;
  std::thread other([&] {
    seen = tg::num_threads();
    chunks = parallel_chunks(tg::detail::kParallelGrain * 8, 1);
  });
  other.join();
  BOOST_TEST(seen == 3);
  BOOST_TEST(chunks == 3);
  BOOST_CHECK_THROW(tg::set_num_threads(0), tg::ValueError);
  BOOST_TEST(tg::num_threads() == 3);
}

BOOST_AUTO_TEST_CASE(products_get_threads_by_size) {
  using tg::detail::dnnl_threads_for;
  Threads t(2);
  BOOST_TEST(dnnl_threads_for(64.0 * 64 * 64) == 1);      // microseconds of work: the caller alone
  BOOST_TEST(dnnl_threads_for(1024.0 * 1024 * 1024) == 2);  // milliseconds: every thread
  tg::set_num_threads(1);
  BOOST_TEST(dnnl_threads_for(1024.0 * 1024 * 1024) == 1);
  // The same large product with one and with two threads (primitives are made per thread count).
  const tg::Tensor a = tg::randn({256, 1024}, 1), b = tg::randn({1024, 256}, 2);
  BOOST_REQUIRE(dnnl_threads_for(256.0 * 1024 * 256) == 1);
  tg::set_num_threads(2);
  BOOST_REQUIRE(dnnl_threads_for(256.0 * 1024 * 256) == 2);
  const auto two = tg::matmul(a, b).to_vector<float>();
  tg::set_num_threads(1);
  const auto one = tg::matmul(a, b).to_vector<float>();
  for (std::size_t i = 0; i < one.size(); ++i) BOOST_REQUIRE_SMALL(static_cast<double>(one[i] - two[i]), 1e-3);
}
