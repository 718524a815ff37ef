// tapegrad's own parallel loops: every index is visited once whatever the thread count, small
// loops stay on the calling thread, errors come back to the caller, and nesting runs inline.
#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.hpp>

#include "autodiff/parallel.hpp"
#include "autodiff/thread_choice.hpp"
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

// ThreadChoice driven with chosen times: what the team and one thread would take on an idle
// machine (the team faster) and next to a busy process (the team much slower).
namespace {

using tg::detail::ThreadChoice;

// Runs `calls` calls of one kind of work whose run takes team_s on the team and one_s on one
// thread; returns how many ran on the team.
int run_calls(ThreadChoice& choice, int calls, double team_s, double one_s) {
  int on_team = 0;
  for (int i = 0; i < calls; ++i) {
    const int threads = choice.choose(7, 2);
    BOOST_REQUIRE(threads == 1 || threads == 2);
    on_team += threads == 2;
    choice.record(7, threads, threads == 2 ? team_s : one_s);
  }
  return on_team;
}

}  // namespace

BOOST_AUTO_TEST_CASE(thread_choice_keeps_the_team_while_it_is_faster) {
  ThreadChoice choice;
  // Trials of one thread come after 2, 8, 32, 128, 512, then every 1024 calls: 8 in 4000.
  const int on_team = run_calls(choice, 4000, 1.0, 1.8);
  BOOST_TEST(on_team == 4000 - 8);
  BOOST_TEST(choice.kinds() == 1u);
  BOOST_TEST(choice.choose(7, 1) == 1);  // a size rule that asks for one thread is never overridden
}

BOOST_AUTO_TEST_CASE(thread_choice_leaves_a_slow_team_and_rarely_retries_it) {
  ThreadChoice choice;
  // The team took 5x one thread's time (a join waiting for a descheduled thread).
  const int on_team = run_calls(choice, 4000, 5.0, 1.0);
  // The first call, then the trials at growing intervals (8 in the remaining calls).
  BOOST_TEST(on_team == 1 + 8);
}

BOOST_AUTO_TEST_CASE(thread_choice_follows_the_machine_both_ways) {
  ThreadChoice choice;
  run_calls(choice, 2000, 1.0, 1.8);  // idle
  // Busy: the next slow team run is slower than one thread was, so one thread is tried at once.
  int team_after_busy = 0;
  for (int i = 0; i < 4; ++i) {
    const int threads = choice.choose(7, 2);
    team_after_busy += threads == 2;
    choice.record(7, threads, threads == 2 ? 6.0 : 1.8);
  }
  BOOST_TEST(team_after_busy <= 2);
  BOOST_TEST(run_calls(choice, 100, 6.0, 1.8) <= 10);
  // Idle again: a trial finds the team faster and it takes over (the interval is bounded).
  const int back = run_calls(choice, 3 * ThreadChoice::kMaxInterval, 1.0, 1.8);
  BOOST_TEST(back >= ThreadChoice::kMaxInterval);
}

BOOST_AUTO_TEST_CASE(thread_choice_table_is_bounded) {
  ThreadChoice choice;
  for (std::uint64_t key = 0; key < ThreadChoice::kMaxKinds + 10; ++key) choice.record(key, choice.choose(key, 2), 1.0);
  BOOST_TEST(choice.kinds() <= ThreadChoice::kMaxKinds);
}

BOOST_AUTO_TEST_CASE(serial_choice_runs_the_same_chunks) {
  // Whichever way ThreadChoice goes, a parallel_for call sees the same chunk boundaries.
  Threads t(2);
  const std::int64_t n = tg::detail::kParallelGrain * 4;
  std::vector<std::pair<std::int64_t, std::int64_t>> first;
  for (int call = 0; call < 40; ++call) {
    std::mutex m;
    std::vector<std::pair<std::int64_t, std::int64_t>> seen;
    parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
      std::lock_guard lock(m);
      seen.emplace_back(b, e);
    });
    std::sort(seen.begin(), seen.end());
    if (call == 0) first = seen;
    BOOST_REQUIRE(seen == first);
  }
  BOOST_TEST(first.size() == 2u);
}
