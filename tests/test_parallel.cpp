// tapegrad's own parallel loops and the workers behind them: every index is visited once
// whatever the thread count, small loops stay on the calling thread, errors come back to the
// caller, nesting runs inline, and a product split over the workers gives one thread's bits.
#define BOOST_TEST_MODULE parallel
#include <boost/test/unit_test.hpp>

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include <tapegrad/tapegrad.hpp>

#include "runtime/parallel.hpp"
#include "runtime/thread_choice.hpp"
#include "runtime/thread_pool.hpp"
#include "kernels/matmul_dnnl.hpp"

extern "C" void omp_set_num_threads(int n);  // libgomp, which oneDNN runs on

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

// The default: OMP_NUM_THREADS when set, else the cores this process may run on (its affinity,
// not the machine's count), whatever the calling thread's OpenMP setting is when tapegrad first
// asks (products set it to 1 for their duration; a first read inside one once kept 1 for the
// process). ctest runs this case alone with OMP_NUM_THREADS=2 (test_parallel_omp_default), and
// with it unset on all cores and under `taskset -c 0` (test_parallel_affinity_default*).
BOOST_AUTO_TEST_CASE(the_default_is_omp_num_threads_or_the_affinity) {
  const char* env = std::getenv("OMP_NUM_THREADS");
  cpu_set_t set;
  CPU_ZERO(&set);
  BOOST_REQUIRE(sched_getaffinity(0, sizeof set, &set) == 0);
  const int wanted = env != nullptr ? std::max(1, std::atoi(env)) : CPU_COUNT(&set);
  omp_set_num_threads(1);
  BOOST_TEST(tg::num_threads() == wanted);
  omp_set_num_threads(env != nullptr ? wanted : 1);
}

BOOST_AUTO_TEST_CASE(every_index_once_for_any_thread_count) {
  for (int threads : {1, 2, 3, 7}) {
    Threads t(threads);
    for (std::int64_t n : {0, 1, 5, 1 << 15, (1 << 16) + 3}) {
      std::vector<std::atomic<int>> hits(static_cast<std::size_t>(n));
      std::atomic<bool> bad_range = false;  // asserted here: Boost.Test's checks are not thread-safe
      parallel_for(n, 1, [&](std::int64_t b, std::int64_t e) {
        if (!(0 <= b && b < e && e <= n)) bad_range = true;
        for (std::int64_t i = std::max<std::int64_t>(b, 0); i < std::min(e, n); ++i) hits[static_cast<std::size_t>(i)]++;
      });
      BOOST_REQUIRE(!bad_range);
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

// Repeated calls: the thread choice runs some of them on the team and some in order on the
// calling thread, and both must keep these promises.
BOOST_AUTO_TEST_CASE(exception_reaches_the_caller_after_all_chunks) {
  Threads t(2);
  for (int call = 0; call < 20; ++call) {
    std::atomic<std::int64_t> done{0};
    BOOST_CHECK_THROW(parallel_for(1 << 20, 1,
                                   [&](std::int64_t b, std::int64_t e) {
                                     done += e - b;
                                     if (b == 0) throw std::runtime_error("first chunk");
                                   }),
                      std::runtime_error);
    BOOST_TEST(done.load() == 1 << 20);
  }
}

BOOST_AUTO_TEST_CASE(nested_loops_run_inline) {
  Threads t(2);
  for (int call = 0; call < 20; ++call) {
    std::atomic<std::int64_t> inner{0};
    std::atomic<int> split{0}, outside{0};  // counted here, asserted by this thread (Boost.Test is not thread-safe)
    parallel_for(1 << 16, 1, [&](std::int64_t, std::int64_t) {
      split += parallel_chunks(1 << 20, 1) != 1;
      split += tg::detail::dnnl_threads_for(1024.0 * 1024 * 1024) != 1;
      outside += !tg::detail::in_parallel_body();
      parallel_for(1 << 16, 1, [&](std::int64_t b, std::int64_t e) { inner += e - b; });
    });
    BOOST_TEST(split.load() == 0);
    BOOST_TEST(outside.load() == 0);
    BOOST_TEST(inner.load() == 2 * (1 << 16));
  }
  BOOST_TEST(!tg::detail::in_parallel_body());
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
  // The same large product with one and with two threads: the split runs the panels of columns
  // its shape fixes (four), as one thread does, each on whichever thread is free.
  const tg::Tensor a = tg::randn({256, 1024}, 1), b = tg::randn({1024, 256}, 2);
  BOOST_REQUIRE(dnnl_threads_for(256.0 * 1024 * 256) == 1);
  tg::set_num_threads(2);
  BOOST_REQUIRE(dnnl_threads_for(256.0 * 1024 * 256) == 2);
  const auto two = tg::matmul(a, b).to_vector<float>();
  tg::set_num_threads(1);
  const auto one = tg::matmul(a, b).to_vector<float>();
  BOOST_TEST(one == two, boost::test_tools::per_element());
}

// Products big enough for two threads, split by batch, by rows and into panels of columns, in float32, bfloat16 and
// float64 (transposed operands take strided layouts, a batch of 1 is broadcast): each element
// has the same bits as on one thread. Each shape's first call with two threads runs on the team
// (the size rule's choice comes first).
BOOST_AUTO_TEST_CASE(split_products_give_one_threads_bits) {
  struct Case {
    std::int64_t batch_a, batch, m, k, n;
    bool a_transposed, b_transposed;
  };
  const Case cases[] = {{1, 1, 1024, 512, 256, false, false}, {8, 8, 128, 256, 128, false, true}, {1, 1, 300, 777, 513, false, true},
                        {3, 3, 1001, 129, 257, true, false},  {1, 6, 200, 300, 400, true, true},  {1, 1, 1002, 129, 257, true, false},
                        // a transposed: with K past 256 oneDNN blocked K by M (bands differed in 140,177 of 153,900 on an
                        // earlier machine); without a batch, bands fixed by the shape (8, 4 and, for the GPT-2 step's
                        // dW with K = 256, 8 of them; 2 of 32 rows); the batched one is cut by its batch
                        {1, 1, 513, 512, 300, true, false},   {1, 1, 300, 700, 200, true, true},  {2, 2, 512, 512, 64, true, false},
                        {1, 1, 3072, 256, 768, true, false},  {1, 1, 64, 2048, 32, true, false},
                        // panels of columns, fixed by the shape (in float32 8, 4, 2 and 2 of them; at most 2 for a transposed b;
                        // bfloat16 panels are at least 192 columns wide, so 4, 1, 1 and 1), a read
                        // whole even when transposed
                        {1, 1, 256, 256, 1000, true, false},  {1, 1, 64, 256, 300, false, false}, {1, 1, 64, 768, 300, false, true},
                        {1, 1, 16, 2048, 130, false, false},
                        // a batch against one column-major b: under AVX2 the batch's pieces are fixed by the shape
                        {2, 1, 70, 129, 300, false, true},    {8, 1, 64, 256, 300, false, true}};
  enum class Kind { float32, bfloat16, float64 };
  for (const Case& c : cases)
    for (const Kind kind : {Kind::float32, Kind::bfloat16, Kind::float64}) {
      Threads t(2);
      BOOST_REQUIRE(tg::detail::dnnl_threads_for(static_cast<double>(c.batch * c.m * c.k * c.n)) == 2);
      const tg::DType dtype = kind == Kind::float64 ? tg::float64 : tg::float32;
      const auto precision = kind == Kind::bfloat16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact;
      const tg::Tensor a = c.a_transposed ? tg::randn({c.batch_a, c.k, c.m}, 3, dtype).transpose(1, 2) : tg::randn({c.batch_a, c.m, c.k}, 3, dtype);
      const tg::Tensor b = c.b_transposed ? tg::randn({c.batch, c.n, c.k}, 4, dtype).transpose(1, 2) : tg::randn({c.batch, c.k, c.n}, 4, dtype);
      // Three calls: ThreadChoice tries one thread at one of them (panels then run in turn).
      std::vector<std::vector<double>> twos;
      for (int call = 0; call < 3; ++call) twos.push_back(tg::matmul(a, b, precision).to_vector<double>());
      tg::set_num_threads(1);
      const auto one = tg::matmul(a, b, precision).to_vector<double>();
      BOOST_TEST_CONTEXT("[" << c.batch_a << "/" << c.batch << ", " << c.m << ", " << c.k << ", " << c.n << "]"
                             << (c.a_transposed ? " a transposed" : "") << (c.b_transposed ? " b transposed" : "")
                             << (kind == Kind::float32 ? " float32" : kind == Kind::bfloat16 ? " bfloat16" : " float64")) {
        for (const auto& two : twos) BOOST_TEST(one == two, boost::test_tools::per_element());
      }
    }
  // The raw gemm calls of the attention tiles, float32 and bfloat16, cut into bands of rows the
  // same way.
  const std::int64_t m = 1024, n = 384, k = 600;
  const auto a = tg::randn({m, k}, 5).to_vector<float>(), b = tg::randn({k, n}, 6).to_vector<float>();
  std::vector<std::uint16_t> a16(a.size()), b16(b.size());
  tg::detail::round_bf16(a.data(), a16.data(), static_cast<std::int64_t>(a.size()));
  tg::detail::round_bf16(b.data(), b16.data(), static_cast<std::int64_t>(b.size()));
  for (const bool bf16 : {false, true})
    for (const bool ta : {false, true})
      for (const bool tb : {false, true}) {
        std::vector<float> one(static_cast<std::size_t>(m * n), 1.0f), two = one;
        const std::int64_t lda = ta ? m : k, ldb = tb ? k : n;
        const auto gemm = [&](std::vector<float>& c) {
          if (bf16) tg::detail::gemm_bf16(ta, tb, m, n, k, 0.5f, a16.data(), lda, b16.data(), ldb, 1.0f, c.data(), n);
          else tg::detail::gemm_f32(ta, tb, m, n, k, 0.5f, a.data(), lda, b.data(), ldb, 1.0f, c.data(), n);
        };
        Threads t(2);
        gemm(two);
        tg::set_num_threads(1);
        gemm(one);
        BOOST_TEST_CONTEXT((bf16 ? "gemm_bf16" : "gemm_f32") << " trans_a " << ta << " trans_b " << tb) {
          BOOST_TEST(one == two, boost::test_tools::per_element());
        }
      }
}

// The workers themselves: every task once, from several calling threads at once (a second
// caller runs its tasks itself while the first one's job is out), with more tasks than threads,
// and after the workers have gone to sleep.
BOOST_AUTO_TEST_CASE(pool_runs_every_task_once_from_any_caller) {
  using tg::detail::pool_run;
  struct Job {
    std::vector<std::atomic<int>> hits;
    std::atomic<int> outside{0};
  };
  const auto task = [](void* p, int i) {
    auto& job = *static_cast<Job*>(p);
    job.hits[static_cast<std::size_t>(i)]++;
    job.outside += !tg::detail::in_pool_task();
  };
  // Whether every task ran once, on the pool: asserted by the caller's main thread, since
  // Boost.Test's checks are not thread-safe.
  auto run_once = [&](int threads, int count) {
    Job job{std::vector<std::atomic<int>>(static_cast<std::size_t>(count)), {}};
    pool_run(threads, count, task, &job);
    return job.outside.load() == 0 &&
           std::all_of(job.hits.begin(), job.hits.end(), [](const std::atomic<int>& h) { return h.load() == 1; });
  };
  for (int threads : {1, 2, 3, 8})
    for (int count : {0, 1, 2, 3, 17, 256, 257}) BOOST_TEST(run_once(threads, count), threads << " threads, " << count << " tasks");
  std::atomic<int> failed = 0;
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c)
    callers.emplace_back([&] {
      for (int i = 0; i < 300; ++i) failed += !run_once(2 + i % 3, 1 + i % 9);
    });
  for (auto& c : callers) c.join();
  BOOST_TEST(failed.load() == 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the workers' spin
  BOOST_TEST(run_once(8, 8));
  BOOST_TEST(tg::detail::pool_workers() == 7);
  BOOST_TEST(!tg::detail::in_pool_task());
}

// ThreadChoice driven with chosen times: what the team and one thread would take on an idle
// machine (the team faster) and next to a busy process (the team much slower). The clock
// advances by each run's time.
namespace {

using tg::detail::ThreadChoice;

struct Machine {
  ThreadChoice choice;
  double now = 0;
  // One call of kind `key` whose run takes team_s on the team and one_s on one thread; whether
  // it ran on the team.
  bool call(std::uint64_t key, double team_s, double one_s) {
    const int threads = choice.choose(key, 2, now);
    BOOST_REQUIRE(threads == 1 || threads == 2);
    now += threads == 2 ? team_s : one_s;
    choice.record(key, threads, threads == 2 ? team_s : one_s, now);
    return threads == 2;
  }
  // `calls` calls of kind 7; how many ran on the team.
  int calls(int n, double team_s, double one_s) {
    int on_team = 0;
    for (int i = 0; i < n; ++i) on_team += call(7, team_s, one_s);
    return on_team;
  }
};

}  // namespace

BOOST_AUTO_TEST_CASE(thread_choice_keeps_the_team_while_it_is_faster) {
  Machine m;
  // One thread is tried once, at the second call, and never again while the team keeps its pace.
  BOOST_TEST(m.calls(4000, 1e-3, 1.8e-3) == 4000 - 1);
  BOOST_TEST(m.choice.kinds() == 1u);
  BOOST_TEST(m.choice.choose(7, 1, m.now) == 1);  // a size rule that asks for one thread is never overridden
  BOOST_TEST(!m.choice.holding(m.now));
}

BOOST_AUTO_TEST_CASE(thread_choice_leaves_a_slow_team_and_rarely_retries_it) {
  Machine m;
  // The team took 5x one thread's time (a join waiting for a descheduled thread): the first
  // call, then trials at growing intervals, held back by holds of 0.05, 0.1, ... 2 s over the
  // 4 s of runs.
  const int on_team = m.calls(4000, 5e-3, 1e-3);
  BOOST_TEST(on_team >= 2);
  BOOST_TEST(on_team <= 12);
  BOOST_TEST(m.choice.holding(m.now));
}

BOOST_AUTO_TEST_CASE(thread_choice_follows_the_machine_both_ways) {
  Machine m;
  m.calls(2000, 1e-3, 1.8e-3);  // idle
  // Busy: the next slow team run is slower than one thread was, so one thread is tried at once.
  BOOST_TEST(m.calls(4, 6e-3, 1.8e-3) <= 2);
  // The next trial of the team confirms it: a hold starts.
  BOOST_TEST(m.calls(100, 6e-3, 1.8e-3) <= 5);
  BOOST_TEST(m.choice.holding(m.now));
  // Idle again: once the hold ends a trial finds the team faster and it takes over.
  const int back = m.calls(3 * ThreadChoice::kMaxInterval, 1e-3, 1.8e-3);
  BOOST_TEST(back >= ThreadChoice::kMaxInterval);
  BOOST_TEST(!m.choice.holding(m.now));
}

BOOST_AUTO_TEST_CASE(thread_choice_a_confirmed_team_is_not_retried_at_every_call) {
  Machine m;
  m.calls(100, 1e-3, 1.8e-3);
  // The team slows to 2x its best but stays faster than one thread (data moved between cores,
  // some load): one trial of one thread confirms the team, which then keeps the work.
  const int on_team = m.calls(1000, 2e-3, 3e-3);
  BOOST_TEST(on_team >= 1000 - 2);
  BOOST_TEST(!m.choice.holding(m.now));
}

BOOST_AUTO_TEST_CASE(thread_choice_busy_machine_holds_every_kind) {
  // 40 kinds of work interleaved on a busy machine: once one kind finds the team slow, new kinds
  // start on one thread and the team is tried about once per hold, not once per kind.
  Machine m;
  int on_team = 0;
  for (int round = 0; round < 500; ++round)
    for (std::uint64_t key = 0; key < 40; ++key) on_team += m.call(key, 5e-3, 1e-3);
  // Each kind's first call, before any trial has shown the team slow, runs on the team (40);
  // then 20 s of runs: holds of 0.05, 0.1, ..., 1.6 s and one trial per 2 s after that (about
  // 14), where trials per kind would have cost about 40 x 6.
  BOOST_TEST(on_team <= 40 + 30);
  // A kind that has never seen the team starts on one thread while the hold lasts.
  BOOST_TEST(m.choice.holding(m.now));
  BOOST_TEST(m.choice.choose(1000, 2, m.now) == 1);
}

BOOST_AUTO_TEST_CASE(thread_choice_small_work_does_not_hold_the_machine) {
  // A team a little slower than one thread (waking it costs more than the split saves) is left
  // for one thread without holding other kinds back.
  Machine m;
  m.calls(100, 1.2e-6, 1e-6);
  BOOST_TEST(!m.choice.holding(m.now));
  BOOST_TEST(m.call(8, 1e-3, 1.8e-3));
}

BOOST_AUTO_TEST_CASE(thread_choice_loops_weigh_both_choices_in_one_run) {
  // A loop's team run brings its chunks' summed times: a slow team is left at once, without a
  // trial on one thread, and a fast one is kept without any.
  ThreadChoice choice;
  BOOST_TEST(choice.choose(1, 2, 0.0) == 2);
  choice.record(1, 2, 1e-3, 1e-3, /*one_thread_estimate=*/1.8e-3);
  for (int i = 0; i < 100; ++i) {
    BOOST_REQUIRE(choice.choose(1, 2, 0.0) == 2);
    choice.record(1, 2, 1e-3, 1e-3, 1.8e-3);
  }
  BOOST_TEST(choice.choose(2, 2, 0.0) == 2);
  choice.record(2, 2, 5e-3, 5e-3, 1e-3);
  BOOST_TEST(choice.choose(2, 2, 0.0) == 1);
}

BOOST_AUTO_TEST_CASE(thread_choice_starts_afresh_for_another_team_size) {
  // A verdict against a team of two (here: too small a piece of work to pay) is not one against
  // a team of four: after set_num_threads changes, the kind tries its new team first.
  Machine m;
  m.calls(100, 1.2e-6, 1e-6);
  BOOST_REQUIRE(m.choice.choose(7, 2, m.now) == 1);
  BOOST_TEST(m.choice.choose(7, 4, m.now) == 4);
  BOOST_TEST(m.choice.kinds() == 1u);
}

BOOST_AUTO_TEST_CASE(thread_choice_table_is_bounded) {
  ThreadChoice choice;
  for (std::uint64_t key = 0; key < ThreadChoice::kMaxKinds + 10; ++key) choice.record(key, choice.choose(key, 2, 0.0), 1.0, 0.0);
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
