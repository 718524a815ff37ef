// The tape: recording, backward from one or several outputs, accumulation, no-grad, clearing,
// depth, threads, user-defined ops, the gradient-ready hook and misuse.
#define BOOST_TEST_MODULE tape
#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "support.hpp"

namespace tg = tapegrad;
using namespace tg_test;
using tg::Tensor;

struct ClearTape {
  ~ClearTape() { tg::clear_tape(); }
};
BOOST_TEST_GLOBAL_FIXTURE(ClearTape);

BOOST_AUTO_TEST_SUITE(recording)

BOOST_AUTO_TEST_CASE(records_only_when_an_input_requires_grad) {
  tg::clear_tape();
  Tensor a = tg::ones({3}), b = tg::ones({3});
  Tensor c = a * b + 1.0;
  BOOST_TEST(tg::tape_size() == 0u);
  BOOST_TEST(!c.requires_grad());
  a.set_requires_grad();
  Tensor d = a * b;
  BOOST_TEST(tg::tape_size() == 1u);
  BOOST_TEST(d.requires_grad());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(no_grad_scope_records_nothing_and_nests) {
  tg::clear_tape();
  Tensor x = tg::ones({2}).set_requires_grad();
  {
    tg::NoGradGuard outer;
    {
      tg::NoGradGuard inner;
      BOOST_TEST(!tg::is_grad_enabled());
    }
    BOOST_TEST(!tg::is_grad_enabled());
    Tensor y = tg::exp(x);
    BOOST_TEST(!y.requires_grad());
  }
  BOOST_TEST(tg::is_grad_enabled());
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(backward_pass)

BOOST_AUTO_TEST_CASE(a_value_used_twice_gets_both_contributions) {
  Tensor x = tg::tensor({3.0}, tg::float64).set_requires_grad();
  tg::backward(x * x + x);  // d/dx = 2x + 1
  BOOST_TEST(x.grad().item() == 7.0);
  tg::clear_tape();
}

// A number on the left of +, -, * and / works as on the right, in the tensor's dtype.
BOOST_AUTO_TEST_CASE(scalar_on_either_side_of_an_operator) {
  for (tg::DType dtype : {tg::float32, tg::float64}) {
    Tensor x = tg::tensor({1.0, 4.0}, dtype).set_requires_grad();
    const Tensor y = (1.0 - x) + (2.0 + x) + 8.0 / x + 3.0 * x;  // 3 + 8/x + 3x
    BOOST_TEST(y.dtype() == dtype);
    BOOST_TEST(y.to_vector<double>() == (std::vector<double>{14, 17}));
    tg::backward(tg::sum(y));  // -8/x^2 + 3
    BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{-5, 2.5}));
    tg::clear_tape();
  }
}

BOOST_AUTO_TEST_CASE(gradients_accumulate_across_backward_calls_until_zeroed) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor y = tg::sum(x * 3.0);
  tg::backward(y);
  tg::backward(y);
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{6, 6}));
  x.zero_grad();
  BOOST_TEST(!x.grad().defined());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(several_outputs_with_their_upstream_gradients) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor a = x * 2.0;  // da/dx = 2
  Tensor b = x * x;    // db/dx = 2x
  tg::backward({a, b}, {tg::tensor({1.0, 10.0}, tg::float64), tg::tensor({100.0, 1000.0}, tg::float64)});
  // 2 * [1, 10] + 2 * [1, 2] * [100, 1000]
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{202, 4020}));
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_leaf_as_output_gets_the_upstream_gradient_as_a_copy) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor g = tg::tensor({5.0, 6.0}, tg::float64);
  tg::backward({x}, {g});
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{5, 6}));
  BOOST_TEST(!x.grad().shares_storage_with(g));
}

BOOST_AUTO_TEST_CASE(broadcast_inputs_get_summed_gradients) {
  Tensor bias = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  Tensor x = tg::ones({4, 3}, tg::float64);
  tg::backward(tg::sum(x + bias));
  BOOST_TEST(bias.grad().to_vector<double>() == (std::vector<double>{4, 4, 4}));
  BOOST_TEST(bias.grad().is_contiguous());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_chain_of_100000_ops_does_not_overflow_the_stack) {
  Tensor x = tg::tensor({0.5}, tg::float64).set_requires_grad();
  Tensor y = x;
  for (int i = 0; i < 100000; ++i) y = y * 1.0 + 0.0;
  BOOST_TEST(tg::tape_size() == 200000u);
  tg::backward(y);
  BOOST_TEST(x.grad().item() == 1.0);
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(clearing)

BOOST_AUTO_TEST_CASE(clear_releases_saved_tensors_and_detaches_outputs) {
  Tensor x = tg::randn({64}, 1, tg::float64).set_requires_grad();
  std::weak_ptr<tg::detail::TensorImpl> saved;
  Tensor y;
  {
    Tensor big = tg::randn({64}, 2, tg::float64);
    saved = big.impl_ptr();
    y = tg::sum(big * x);  // mul keeps both operands for its backward
  }
  BOOST_TEST(!saved.expired());  // the tape still holds it
  tg::clear_tape();
  BOOST_TEST(saved.expired());
  BOOST_TEST(tg::tape_size() == 0u);
  BOOST_TEST(!y.requires_grad());
  check_throws<tg::GraphError>([&] { tg::backward(y); }, {"backward", "does not require grad", "cleared"});
  // A detached intermediate can be used in a new graph as a constant.
  Tensor z = tg::sum(y * x);
  tg::backward(z);
  BOOST_TEST(x.grad().defined());
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(memory_stays_flat_over_many_steps) {
  Tensor w = tg::randn({8, 8}, 2, tg::float64).set_requires_grad();
  Tensor x = tg::randn({4, 8}, 3, tg::float64);
  std::size_t peak = 0;
  for (int step = 0; step < 2000; ++step) {
    const Tensor loss = tg::mean(tg::tanh(tg::matmul(x, w)));
    tg::backward(loss);
    peak = std::max(peak, tg::tape_size());
    w.zero_grad();
    tg::clear_tape();
  }
  BOOST_TEST(peak == 4u);  // matmul, tanh, sum, div (mean)
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(lifetime)

BOOST_AUTO_TEST_CASE(a_graph_is_freed_with_its_last_tensor_without_clear_tape) {
  tg::clear_tape();
  Tensor x = tg::randn({64}, 1, tg::float64).set_requires_grad();
  std::weak_ptr<tg::detail::TensorImpl> saved;
  {
    Tensor big = tg::randn({64}, 2, tg::float64);
    saved = big.impl_ptr();
    const Tensor y = tg::sum(big * x);  // mul keeps both operands for its backward
    BOOST_TEST(tg::tape_size() == 2u);
    tg::backward(y);
    BOOST_TEST(!saved.expired());  // y is alive: its graph may be differentiated again
  }
  BOOST_TEST(saved.expired());
  BOOST_TEST(tg::tape_size() == 0u);
  BOOST_TEST(x.grad().defined());  // the gradient outlives the graph
}

BOOST_AUTO_TEST_CASE(backward_can_run_twice_on_a_kept_graph) {
  Tensor x = tg::tensor({2.0}, tg::float64).set_requires_grad();
  const Tensor y = x * x * x;  // 3x^2 = 12
  tg::backward(y);
  tg::backward(y);
  BOOST_TEST(x.grad().item() == 24.0);
}

BOOST_AUTO_TEST_CASE(a_loop_that_never_clears_stays_flat_with_or_without_backward) {
  tg::clear_tape();
  Tensor w = tg::randn({8, 8}, 2, tg::float64).set_requires_grad();
  const Tensor x = tg::randn({4, 8}, 3, tg::float64);
  std::size_t peak = 0;
  for (int step = 0; step < 2000; ++step) {
    const Tensor loss = tg::mean(tg::tanh(tg::matmul(x, w)));
    if (step % 2 == 0) tg::backward(loss);
    peak = std::max(peak, tg::tape_size());
  }
  BOOST_TEST(peak == 4u);  // one step's nodes at a time: matmul, tanh, sum, div (mean)
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(a_chain_of_a_million_ops_is_freed_without_recursion) {
  tg::clear_tape();
  Tensor x = tg::tensor({0.5}, tg::float64).set_requires_grad();
  {
    Tensor y = x;
    for (int i = 0; i < 1000000; ++i) y = y * 1.0;
    BOOST_TEST(tg::tape_size() == 1000000u);
  }  // y's destructor frees every node; recursion would overflow the stack here
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(a_graph_can_be_handed_to_another_thread) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor y;
  std::thread([&] { y = tg::sum(x * x); }).join();  // recorded on the other thread's tape
  BOOST_TEST(y.requires_grad());
  tg::backward(y);
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{2, 4}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_CASE(a_leaf_that_stopped_requiring_grad_gets_no_gradient) {
  Tensor w = tg::ones({2}, tg::float64).set_requires_grad();
  const Tensor y = tg::sum(w * 2.0);
  w.set_requires_grad(false);
  tg::backward(y);
  BOOST_TEST(!w.grad().defined());
}

BOOST_AUTO_TEST_CASE(nodes_freed_on_another_thread_while_their_tape_records) {
  // One thread records onto its tape while another frees the nodes it hands over: both change
  // the same list, under the tape's lock (`./dev tsan` reports a race if the lock is taken out).
  const Tensor w = tg::ones({4}, tg::float64).set_requires_grad();
  std::mutex m;
  std::deque<Tensor> handed;
  std::atomic<bool> done{false};
  std::size_t left_on_tape = 1;
  std::thread recorder([&] {
    const std::size_t before = tg::tape_size();
    for (int i = 0; i < 2000; ++i) {
      Tensor y = w * 2.0;  // a node on this thread's tape
      std::lock_guard lock(m);
      handed.push_back(std::move(y));
    }
    done = true;
    // Every node is freed by the other thread: its count drops back (within a minute, not forever).
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(1);
    while (tg::tape_size() != before && std::chrono::steady_clock::now() < deadline) std::this_thread::yield();
    left_on_tape = tg::tape_size() - before;
  });
  std::thread freer([&] {
    for (;;) {
      std::unique_lock lock(m);
      if (handed.empty()) {
        if (done) break;
        lock.unlock();
        std::this_thread::yield();
        continue;
      }
      Tensor y = std::move(handed.front());
      handed.pop_front();
      lock.unlock();  // y's node leaves the recorder's tape here, while it records
    }
  });
  freer.join();
  recorder.join();
  BOOST_TEST(left_on_tape == 0u);
}

BOOST_AUTO_TEST_CASE(clear_tape_on_the_recording_thread_during_another_threads_backward) {
  // Thread A records an op whose backward waits; thread B runs backward through it while A
  // clears its tape. B's pass holds what it reads, so it finishes with the right gradient
  // (and no use-after-free under AddressSanitizer).
  Tensor w = tg::ones({100}, tg::float64).set_requires_grad();
  Tensor h;
  std::atomic<int> stage{0};
  std::thread a([&] {
    std::vector<Tensor> outs{tg::zeros({100}, tg::float64)};
    const Tensor big = tg::full({100}, 3.0, tg::float64);
    tg::record_op("slow_scale", std::vector<Tensor>{w}, outs, [big, &stage](std::span<const Tensor> g, const std::vector<bool>&) {
      stage = 1;
      while (stage != 2) std::this_thread::yield();
      return std::vector<Tensor>{g[0] * big};
    }, std::vector<Tensor>{big});
    h = outs[0];
    stage = -1;
    while (stage != 1) std::this_thread::yield();
    tg::clear_tape();
    stage = 2;
  });
  while (stage != -1) std::this_thread::yield();
  std::thread b([&] { tg::backward({h}, {tg::ones({100}, tg::float64)}); });
  a.join();
  b.join();
  BOOST_TEST(w.grad().to_vector<double>() == std::vector<double>(100, 3.0));
}

BOOST_AUTO_TEST_CASE(a_graph_cleared_by_its_recording_thread_is_an_error_not_a_missing_gradient) {
  Tensor w = tg::tensor({1.0, 2.0, 3.0}, tg::float64).set_requires_grad();
  // A graph half recorded on a thread that has ended (nobody can clear it) keeps working.
  Tensor h;
  std::thread([&] { h = w * 2.0; }).join();
  const Tensor loss = tg::sum(h * h);
  // A graph half recorded on a thread that then clears its tape: the gradient cannot reach w,
  // and backward says so rather than leaving w.grad() silently short.
  Tensor h2, loss2;
  std::atomic<int> stage{0};
  std::thread owner([&] {
    h2 = w * 2.0;
    stage = 1;
    while (stage != 2) std::this_thread::yield();
    tg::clear_tape();
    stage = 3;
  });
  while (stage != 1) std::this_thread::yield();
  loss2 = tg::sum(h2 * h2);
  stage = 2;
  while (stage != 3) std::this_thread::yield();
  owner.join();
  check_throws<tg::GraphError>([&] { tg::backward(loss2); }, {"released by clear_tape()", "mul"});
  tg::backward(loss);  // the graph nobody cleared still works
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{8, 16, 24}));
}

BOOST_AUTO_TEST_SUITE(reentrancy)

namespace {
// An identity op whose backward runs `inside` before passing the gradient through.
Tensor identity_with(const Tensor& x, std::function<void()> inside) {
  std::vector<Tensor> outs{tg::zeros(x.shape(), x.dtype())};
  tg::copy_(outs[0], x.detach());
  tg::record_op("mine", std::vector<Tensor>{x}, outs, [inside](std::span<const Tensor> g, const std::vector<bool>&) {
    inside();
    return std::vector<Tensor>{g[0]};
  });
  return outs[0];
}
}  // namespace

BOOST_AUTO_TEST_CASE(a_backward_may_record_ops_with_grad_mode_on) {
  tg::clear_tape();
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  const Tensor y = identity_with(x, [x] {
    tg::EnableGradGuard on;
    Tensor t = x;
    for (int i = 0; i < 100; ++i) t = t * 1.0;  // 100 new nodes while the pass walks its own
    BOOST_TEST(t.requires_grad());
  });
  tg::backward(tg::sum(y));
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{1, 1}));
  BOOST_TEST(tg::tape_size() == 1u);  // mine (y is alive); the sum and the 100 nodes died with their tensors
}

BOOST_AUTO_TEST_CASE(a_gradient_computed_with_grad_mode_on_reaches_leaves_without_its_graph) {
  // Found by fuzz/fuzz_tape.cpp. The backward below returns recorded tensors (g * b needs b,
  // which requires grad). A leaf must get their values only: a gradient that required grad
  // would hold the node that made it, which holds the other leaf, whose gradient holds a node
  // holding the first: a cycle that kept both nodes alive after every tensor was gone.
  tg::clear_tape();
  {
    Tensor a = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
    Tensor b = tg::tensor({3.0, 4.0}, tg::float64).set_requires_grad();
    std::vector<Tensor> outs{tg::zeros({2}, tg::float64)};
    tg::record_op("user_mul", std::vector<Tensor>{a, b}, outs, [a, b](std::span<const Tensor> g, const std::vector<bool>&) {
      tg::EnableGradGuard on;
      return std::vector<Tensor>{g[0] * b, g[0] * a};
    });
    tg::backward(tg::sum(outs[0]));
    BOOST_TEST(a.grad().to_vector<double>() == (std::vector<double>{3, 4}));
    BOOST_TEST(b.grad().to_vector<double>() == (std::vector<double>{1, 2}));
    BOOST_TEST(!a.grad().requires_grad());
    BOOST_TEST(!b.grad().requires_grad());
  }
  BOOST_TEST(tg::tape_size() == 0u);  // every node died with the tensors
}

BOOST_AUTO_TEST_CASE(a_backward_may_run_a_nested_backward_and_gradcheck) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  double nested = 0;
  bool checked = false;
  const Tensor y = identity_with(x, [&] {
    Tensor z = tg::tensor({3.0}, tg::float64).set_requires_grad();
    tg::EnableGradGuard on;
    tg::backward(tg::sum(z * z));
    nested = z.grad().item();
    checked = tg::gradcheck([](const std::vector<Tensor>& v) { return std::vector<Tensor>{tg::tanh(v[0])}; },
                            {tg::tensor({0.3}, tg::float64).set_requires_grad()})
                  .ok;
  });
  tg::backward(tg::sum(y * 2.0));
  BOOST_TEST(nested == 6.0);
  BOOST_TEST(checked);
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{2, 2}));
}

BOOST_AUTO_TEST_CASE(a_gradient_computed_with_grad_mode_on_is_stored_without_its_graph) {
  tg::clear_tape();
  {
    Tensor x = tg::tensor({3.0}, tg::float64).set_requires_grad();
    std::vector<Tensor> outs{tg::zeros({1}, tg::float64)};
    tg::record_op("differentiable", std::vector<Tensor>{x}, outs, [x](std::span<const Tensor> g, const std::vector<bool>&) {
      tg::EnableGradGuard on;
      return std::vector<Tensor>{x * 2.0 * g[0]};  // carries a graph back to x
    });
    tg::backward(tg::sum(outs[0]));
    BOOST_TEST(x.grad().item() == 6.0);
    BOOST_TEST(!x.grad().requires_grad());  // otherwise x -> x.grad -> node -> x never frees
    tg::mul_(x.grad(), 0.5);                 // and in-place updates of it work
  }
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(clear_tape_inside_a_backward_is_a_graph_error) {
  Tensor x = tg::tensor({1.0}, tg::float64).set_requires_grad();
  const Tensor y = identity_with(x, [] { tg::clear_tape(); });
  check_throws<tg::GraphError>([&] { tg::backward(tg::sum(y)); }, {"clear_tape", "inside a backward"});
  BOOST_TEST(!x.grad().defined());
  tg::backward(tg::sum(x * 1.0));  // the tape still works afterwards
  BOOST_TEST(x.grad().item() == 1.0);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(gradient_ready_hook)

namespace {
// What BackwardOptions::on_gradient_ready was called with, in order: the leaf and its gradient.
struct Fired {
  std::vector<std::pair<Tensor, Tensor>> calls;
  tg::BackwardOptions options(bool create_graph = false) {
    tg::BackwardOptions o;
    o.create_graph = create_graph;
    o.on_gradient_ready = [this](const Tensor& leaf, const Tensor& g) { calls.emplace_back(leaf, g); };
    return o;
  }
  std::vector<Tensor> gradients_of(const Tensor& leaf) const {
    std::vector<Tensor> out;
    for (const auto& [l, g] : calls)
      if (l.impl() == leaf.impl()) out.push_back(g);
    return out;
  }
};

// x * w as a user op whose backward appends `name` to `log`: shows when the pass runs it.
Tensor logged_mul(const Tensor& x, const Tensor& w, const char* name, std::vector<std::string>& log) {
  Tensor out;
  {
    tg::NoGradGuard off;
    out = x * w;
  }
  std::vector<Tensor> outs{out};
  tg::record_op(name, std::vector<Tensor>{x, w}, outs, [x = x.detach(), w = w.detach(), name, &log](std::span<const Tensor> g, const std::vector<bool>&) {
    log.emplace_back(name);
    return std::vector<Tensor>{g[0] * w, g[0] * x};
  });
  return outs[0];
}

// x passed on, but its backward sends no gradient: the nodes under it are reached by no gradient.
Tensor cut(const Tensor& x) {
  std::vector<Tensor> outs{x.detach() * 1.0};
  tg::record_op("cut", std::vector<Tensor>{x}, outs, [](std::span<const Tensor>, const std::vector<bool>&) { return std::vector<Tensor>(1); });
  return outs[0];
}

void ensure_once_with_its_grad(const Fired& fired, const Tensor& leaf, const std::string& what) {
  const std::vector<Tensor> got = fired.gradients_of(leaf);
  BOOST_REQUIRE_MESSAGE(got.size() == 1u, what << " fired " << got.size() << " times");
  BOOST_TEST(got[0].to_vector<double>() == leaf.grad().to_vector<double>());  // bitwise
  BOOST_TEST(!leaf.grad().shares_storage_with(got[0]));  // kept by the hook, so .grad is a copy
}
}  // namespace

BOOST_AUTO_TEST_CASE(each_reached_leaf_fires_once_with_what_goes_into_its_grad) {
  Tensor a = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor b = tg::tensor({3.0, 4.0}, tg::float64).set_requires_grad();
  Tensor unused = tg::ones({2}, tg::float64).set_requires_grad();
  Tensor switched_off = tg::tensor({5.0, 6.0}, tg::float64).set_requires_grad();
  Tensor cut_off = tg::tensor({7.0, 8.0}, tg::float64).set_requires_grad();
  // a * cut_off runs no backward (cut sends nothing): a still fires once it is skipped, cut_off never.
  const Tensor loss = tg::sum(a * b) + tg::sum(cut(a * cut_off)) + tg::sum(switched_off * 2.0);
  switched_off.set_requires_grad(false);
  Fired fired;
  tg::backward({loss}, {tg::ones({}, tg::float64)}, fired.options());
  BOOST_TEST(fired.calls.size() == 2u);
  ensure_once_with_its_grad(fired, a, "a");
  ensure_once_with_its_grad(fired, b, "b");
  BOOST_TEST(a.grad().to_vector<double>() == (std::vector<double>{3, 4}));
  for (const Tensor* t : {&unused, &switched_off, &cut_off}) {
    BOOST_TEST(fired.gradients_of(*t).empty());
    BOOST_TEST(!t->grad().defined());
  }
}

BOOST_AUTO_TEST_CASE(a_leaf_used_by_several_nodes_fires_after_the_last_with_the_sum) {
  Tensor w = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  const Tensor x = tg::tensor({3.0, 4.0}, tg::float64);
  std::vector<std::string> log;
  const Tensor first = logged_mul(x, w, "first", log);  // the oldest node: its backward runs last
  // w * w is a tied parameter: one node whose two inputs are both w.
  const Tensor loss = tg::sum(first * 2.0 + w * w + w * x);
  Fired fired;
  tg::BackwardOptions options = fired.options();
  options.on_gradient_ready = [&](const Tensor& leaf, const Tensor& g) {
    log.emplace_back("w ready");
    fired.calls.emplace_back(leaf, g);
  };
  tg::backward({loss}, {tg::ones({}, tg::float64)}, options);
  BOOST_TEST(log == (std::vector<std::string>{"first", "w ready"}));
  ensure_once_with_its_grad(fired, w, "w");
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{11, 16}));  // 2x + 2w + x
}

BOOST_AUTO_TEST_CASE(a_leaf_fires_as_soon_as_its_gradient_is_complete_not_at_the_end) {
  const Tensor x = tg::tensor({1.0, 2.0}, tg::float64);
  Tensor w1 = tg::tensor({2.0, 3.0}, tg::float64).set_requires_grad();
  Tensor w2 = tg::tensor({4.0, 5.0}, tg::float64).set_requires_grad();
  Tensor w3 = tg::tensor({6.0, 7.0}, tg::float64).set_requires_grad();
  std::vector<std::string> log;
  const Tensor h = logged_mul(logged_mul(logged_mul(x, w1, "op1", log), w2, "op2", log), w3, "op3", log);
  tg::BackwardOptions options;
  options.on_gradient_ready = [&](const Tensor& leaf, const Tensor&) {
    log.emplace_back(leaf.impl() == w1.impl() ? "w1" : leaf.impl() == w2.impl() ? "w2" : "w3");
  };
  tg::backward({tg::sum(h)}, {tg::ones({}, tg::float64)}, options);
  BOOST_TEST(log == (std::vector<std::string>{"op3", "w3", "op2", "w2", "op1", "w1"}));
}

BOOST_AUTO_TEST_CASE(a_hook_that_throws_stops_the_pass_and_changes_no_grad) {
  const Tensor x = tg::tensor({1.0, 2.0}, tg::float64);
  Tensor w1 = tg::tensor({2.0, 3.0}, tg::float64).set_requires_grad();
  Tensor w2 = tg::tensor({4.0, 5.0}, tg::float64).set_requires_grad();
  Tensor w3 = tg::tensor({6.0, 7.0}, tg::float64).set_requires_grad();
  const Tensor loss = tg::sum(x * w1 * w2 * w3);
  tg::backward(loss);  // every .grad holds something the failed pass must leave as it is
  const std::vector<std::vector<double>> before{w1.grad().to_vector<double>(), w2.grad().to_vector<double>(),
                                                w3.grad().to_vector<double>()};
  std::vector<Tensor> fired;
  tg::BackwardOptions options;
  options.on_gradient_ready = [&](const Tensor& leaf, const Tensor&) {
    fired.push_back(leaf);
    if (leaf.impl() == w2.impl()) throw std::runtime_error("hook: reducing w2 failed");
  };
  check_throws<std::runtime_error>([&] { tg::backward({loss}, {tg::ones({}, tg::float64)}, options); }, {"reducing w2 failed"});
  BOOST_REQUIRE(fired.size() == 2u);  // w3, then w2; the pass stopped before w1's
  BOOST_TEST((fired[0].impl() == w3.impl() && fired[1].impl() == w2.impl()));
  BOOST_TEST(w1.grad().to_vector<double>() == before[0]);
  BOOST_TEST(w2.grad().to_vector<double>() == before[1]);
  BOOST_TEST(w3.grad().to_vector<double>() == before[2]);  // its hook fired before the throw
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_create_graph_pass_fires_and_its_grad_keeps_its_graph) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  {
    Fired fired;
    tg::backward({tg::sum(x * x * x)}, {tg::ones({}, tg::float64)}, fired.options(true));
    ensure_once_with_its_grad(fired, x, "x");
    BOOST_TEST(fired.calls[0].second.requires_grad());
  }
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{3, 12}));  // 3x^2
  BOOST_REQUIRE(x.grad().requires_grad());
  const Tensor second = tg::grad({tg::sum(x.grad())}, {x})[0];  // 6x
  BOOST_TEST(second.to_vector<double>() == (std::vector<double>{6, 12}));
  x.zero_grad();  // frees the cycle leaf -> .grad -> graph -> leaf
}

BOOST_AUTO_TEST_CASE(a_leaf_passed_as_an_output_fires_with_its_grad_output) {
  Tensor x = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  {
    Fired fired;
    tg::backward({x}, {tg::tensor({5.0, 6.0}, tg::float64)}, fired.options());
    ensure_once_with_its_grad(fired, x, "x alone");
    BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{5, 6}));
  }
  x.zero_grad();
  // Passed twice and also reached through a node: once, with the three contributions summed.
  Fired fired;
  tg::backward({x, x * 2.0, x}, {tg::tensor({5.0, 6.0}, tg::float64), tg::tensor({1.0, 1.0}, tg::float64), tg::tensor({10.0, 20.0}, tg::float64)},
               fired.options());
  ensure_once_with_its_grad(fired, x, "x with a node");
  BOOST_TEST(x.grad().to_vector<double>() == (std::vector<double>{17, 28}));
}

BOOST_AUTO_TEST_CASE(a_nested_pass_counts_its_own_leaves) {
  Tensor w = tg::tensor({1.0, 2.0}, tg::float64).set_requires_grad();
  Tensor z = tg::tensor({3.0}, tg::float64).set_requires_grad();
  Fired outer, inner;
  // An identity on w whose backward runs a pass of its own, with its own hook, on another leaf.
  std::vector<Tensor> outs{w.detach() * 1.0};
  tg::record_op("nested", std::vector<Tensor>{w}, outs, [&](std::span<const Tensor> g, const std::vector<bool>&) {
    tg::EnableGradGuard on;
    tg::backward({tg::sum(z * z)}, {tg::ones({}, tg::float64)}, inner.options());
    return std::vector<Tensor>{g[0]};
  });
  tg::backward({tg::sum(outs[0] * w)}, {tg::ones({}, tg::float64)}, outer.options());
  BOOST_TEST(inner.calls.size() == 1u);
  ensure_once_with_its_grad(inner, z, "z");
  BOOST_TEST(outer.calls.size() == 1u);
  ensure_once_with_its_grad(outer, w, "w");
  BOOST_TEST(w.grad().to_vector<double>() == (std::vector<double>{2, 4}));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(misuse)

BOOST_AUTO_TEST_CASE(backward_errors_name_the_problem) {
  Tensor c = tg::ones({2});
  check_throws<tg::GraphError>([&] { tg::backward(tg::sum(c)); }, {"backward", "outputs[0]", "does not require grad"});
  Tensor x = tg::ones({2}).set_requires_grad();
  Tensor y = x * 2.0;
  check_throws<tg::ShapeError>([&] { tg::backward(y); }, {"backward", "'output'", "one element", "[2]"});
  check_throws<tg::ShapeError>([&] { tg::backward({y}, {tg::ones({3})}); }, {"grad_outputs[0]", "[2]", "[3]"});
  check_throws<tg::DTypeError>([&] { tg::backward({y}, {tg::ones({2}, tg::float64)}); }, {"grad_outputs[0]", "float32", "float64"});
  check_throws<tg::ValueError>([&] { tg::backward({y}, {}); }, {"backward", "1 outputs", "0 grad_outputs"});
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_user_op_whose_backward_returns_a_wrong_shape_is_named) {
  Tensor x = tg::ones({3}, tg::float64).set_requires_grad();
  Tensor y = tg::zeros({3}, tg::float64);
  std::vector<Tensor> outs{y};
  tg::record_op("my_op", std::vector<Tensor>{x}, outs, [](std::span<const Tensor>, const std::vector<bool>&) {
    return std::vector<Tensor>{tg::ones({4}, tg::float64)};
  });
  check_throws<tg::GraphError>([&] { tg::backward(tg::sum(outs[0])); }, {"my_op", "input 0", "[3]", "[4]"});
  tg::clear_tape();
}

BOOST_AUTO_TEST_CASE(a_user_op_with_a_bad_output_records_nothing) {
  tg::clear_tape();
  Tensor x = tg::ones({2}, tg::float64).set_requires_grad();
  std::vector<Tensor> outs{tg::zeros({2}, tg::float64), tg::zeros({2}, tg::int64)};
  auto no_op = [](std::span<const Tensor>, const std::vector<bool>&) { return std::vector<Tensor>(1); };
  check_throws<tg::DTypeError>([&] { tg::record_op("bad_op", std::vector<Tensor>{x}, outs, no_op); }, {"bad_op", "output 1", "int64"});
  BOOST_TEST(tg::tape_size() == 0u);
  BOOST_TEST(!outs[0].requires_grad());  // not linked to a node that does not exist
  std::vector<Tensor> undefined{Tensor()};
  check_throws<tg::Error>([&] { tg::record_op("bad_op", std::vector<Tensor>{x}, undefined, no_op); }, {"bad_op", "output 0", "undefined"});
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(record_op_outputs_must_be_new_tensors) {
  Tensor x = tg::ones({2}, tg::float64).set_requires_grad();
  auto pass = [](std::span<const Tensor> g, const std::vector<bool>&) { return std::vector<Tensor>{g[0]}; };
  std::vector<Tensor> itself{x};
  check_throws<tg::GraphError>([&] { tg::record_op("again", std::vector<Tensor>{x}, itself, pass); }, {"again", "output 0", "already requires grad"});
  std::vector<Tensor> recorded{x * 2.0};
  // The usual cause, a forward computed with grad mode on, is named with its fix.
  check_throws<tg::GraphError>([&] { tg::record_op("again", std::vector<Tensor>{x}, recorded, pass); },
                               {"again", "output 0", "already requires grad", "compute the forward under NoGradGuard"});
}

BOOST_AUTO_TEST_CASE(record_op_refuses_an_input_as_output_a_repeated_output_and_an_empty_backward) {
  const Tensor w = tg::ones({2}, tg::float64).set_requires_grad();
  const Tensor c = tg::ones({2}, tg::float64);  // a constant input: it does not require grad
  auto pass = [](std::span<const Tensor> g, const std::vector<bool>&) { return std::vector<Tensor>{g[0], g[0]}; };
  std::vector<Tensor> is_input{c};
  check_throws<tg::GraphError>([&] { tg::record_op("mine", std::vector<Tensor>{w, c}, is_input, pass); }, {"mine", "output 0", "input 1"});
  BOOST_TEST(!c.requires_grad());
  const Tensor fresh = tg::zeros({2}, tg::float64);
  std::vector<Tensor> twice{fresh, fresh};
  check_throws<tg::GraphError>([&] { tg::record_op("mine", std::vector<Tensor>{w}, twice, pass); }, {"mine", "outputs 0 and 1", "same"});
  std::vector<Tensor> one{tg::zeros({2}, tg::float64)};
  check_throws<tg::ValueError>([&] { tg::record_op("mine", std::vector<Tensor>{w}, one, tg::BackwardFn()); }, {"record_op", "'backward'", "empty"});
  BOOST_TEST(tg::tape_size() == 0u);
}

BOOST_AUTO_TEST_CASE(a_backward_that_fails_half_way_leaves_gradients_untouched) {
  Tensor x = tg::ones({3}, tg::float64).set_requires_grad();
  Tensor y = tg::zeros({3}, tg::float64);
  std::vector<Tensor> outs{y};
  // my_op's backward fails; x also reaches the loss directly, through a later node that runs first.
  tg::record_op("failing_op", std::vector<Tensor>{x}, outs, [](std::span<const Tensor>, const std::vector<bool>&) -> std::vector<Tensor> {
    throw tg::GraphError("failing_op: deliberately broken backward");
  });
  const Tensor loss = tg::sum(outs[0] + x * 2.0);
  BOOST_CHECK_THROW(tg::backward(loss), tg::GraphError);
  BOOST_TEST(!x.grad().defined());  // the direct path's gradient was not applied either
  tg::clear_tape();
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(threads)

namespace {
std::vector<double> train(std::uint64_t seed, tg::DType dtype) {
  Tensor w = tg::randn({6, 3}, seed, dtype).set_requires_grad();
  const Tensor x = tg::randn({5, 6}, seed + 1, dtype);
  const Tensor target = tg::randn({5, 3}, seed + 2, dtype);
  for (int step = 0; step < 200; ++step) {
    const Tensor loss = tg::mean(tg::pow(tg::matmul(x, w) - target, 2.0));
    tg::backward(loss);
    {
      tg::NoGradGuard no_grad;
      w = (w - w.grad() * 0.1).detach().set_requires_grad();
    }
    tg::clear_tape();
  }
  return w.to_vector<double>();
}
}  // namespace

BOOST_AUTO_TEST_CASE(each_thread_has_its_own_tape) {
  for (auto dtype : {tg::float64, tg::float32}) {  // float32 runs oneDNN on both threads at once
    const auto a_alone = train(10, dtype), b_alone = train(20, dtype);
    std::vector<double> a_threaded, b_threaded;
    std::thread ta([&] { a_threaded = train(10, dtype); });
    std::thread tb([&] { b_threaded = train(20, dtype); });
    ta.join();
    tb.join();
    BOOST_TEST(a_threaded == a_alone);  // bit-identical
    BOOST_TEST(b_threaded == b_alone);
  }
}

BOOST_AUTO_TEST_SUITE_END()
