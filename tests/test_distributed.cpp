// The distributed room in one process: the micro-batch tree every process count shares, and
// DataParallel's gradients, options and errors. The multi-process runs are ctest entries under
// mpirun (tests/distributed/distributed.cmake).
#define BOOST_TEST_MODULE distributed
#include <cstring>

#include <tapegrad/distributed/data_parallel.hpp>

#include "distributed/sum_tree.hpp"
#include "files.hpp"
#include "support.hpp"

namespace tg = tapegrad;
using tg::Tensor;
using tg_test::check_throws;

namespace {

// The tree written out level by level, independently of TreeStack: adjacent pairs summed, an
// odd one out passed up.
std::vector<float> level_by_level(std::vector<std::vector<float>> v) {
  while (v.size() > 1) {
    std::vector<std::vector<float>> next;
    for (std::size_t i = 0; i < v.size(); i += 2) {
      if (i + 1 == v.size()) {
        next.push_back(v[i]);
        continue;
      }
      std::vector<float> s(v[i].size());
      for (std::size_t e = 0; e < s.size(); ++e) s[e] = v[i][e] + v[i + 1][e];
      next.push_back(s);
    }
    v = std::move(next);
  }
  return v[0];
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Leaves whose sums round differently in different orders: magnitudes 2^-20 to 2^20.
std::vector<std::vector<float>> wild_leaves(std::int64_t m, std::int64_t n, std::uint64_t seed) {
  tg::Generator gen(seed);
  std::vector<std::vector<float>> out(static_cast<std::size_t>(m), std::vector<float>(static_cast<std::size_t>(n)));
  for (auto& leaf : out)
    for (float& x : leaf) x = static_cast<float>(std::ldexp(gen.normal(), static_cast<int>(gen.next_u64() % 41) - 20));
  return out;
}

// What P processes compute: each sums its range on a TreeStack, then every cover is combined.
std::vector<float> by_processes(const std::vector<std::vector<float>>& leaves, std::int64_t p) {
  const auto m = static_cast<std::int64_t>(leaves.size());
  const auto n = static_cast<std::int64_t>(leaves[0].size());
  std::vector<tg::detail::TreeNode> nodes;
  std::vector<std::vector<float>> values;
  for (std::int64_t r = 0; r < p; ++r) {
    tg::detail::TreeStack<std::vector<float>> stack(m);
    for (std::int64_t k = m / p * r; k < m / p * (r + 1); ++k)
      stack.push(k, leaves[static_cast<std::size_t>(k)], [](std::vector<float>& a, const std::vector<float>& b) {
        for (std::size_t e = 0; e < a.size(); ++e) a[e] += b[e];
      });
    const auto cover = tg::detail::tree_cover(m, m / p * r, m / p * (r + 1));
    BOOST_REQUIRE_EQUAL(cover.size(), stack.nodes().size());
    for (std::size_t i = 0; i < cover.size(); ++i) {
      BOOST_CHECK_EQUAL(cover[i].begin(), stack.nodes()[i].first.begin());
      nodes.push_back(cover[i]);
      values.push_back(stack.nodes()[i].second);
    }
  }
  std::vector<const float*> pointers;
  for (const auto& v : values) pointers.push_back(v.data());
  std::vector<float> out(static_cast<std::size_t>(n));
  tg::detail::tree_sum(m, nodes, pointers, out.data(), n);
  return out;
}

}  // namespace

BOOST_AUTO_TEST_SUITE(micro_batch_tree)

// The heart of the exact reduction: for every M up to 24 and every process count dividing it,
// the covers combine to the bits of the tree written out level by level.
BOOST_AUTO_TEST_CASE(every_process_count_dividing_m_gives_the_trees_bits) {
  bool order_matters = false;
  for (std::int64_t m = 1; m <= 24; ++m) {
    const auto leaves = wild_leaves(m, 7, static_cast<std::uint64_t>(m));
    const std::vector<float> tree = level_by_level(leaves);
    std::vector<float> in_order = leaves[0];
    for (std::size_t k = 1; k < leaves.size(); ++k)
      for (std::size_t e = 0; e < in_order.size(); ++e) in_order[e] += leaves[k][e];
    order_matters = order_matters || !same_bits(in_order, tree);
    for (std::int64_t p = 1; p <= m; ++p)
      if (m % p == 0) BOOST_CHECK_MESSAGE(same_bits(by_processes(leaves, p), tree), "M = " << m << ", P = " << p);
  }
  BOOST_CHECK_MESSAGE(order_matters, "the leaves never told one order of summing from another: the test could not fail");
}

BOOST_AUTO_TEST_CASE(covers_are_the_largest_nodes_inside_a_range) {
  auto ranges = [](std::int64_t m, std::int64_t first, std::int64_t last) {
    std::vector<std::pair<std::int64_t, std::int64_t>> out;
    for (const auto& n : tg::detail::tree_cover(m, first, last)) out.emplace_back(n.begin(), n.end(m));
    return out;
  };
  using R = std::vector<std::pair<std::int64_t, std::int64_t>>;
  BOOST_CHECK(ranges(12, 0, 12) == (R{{0, 12}}));
  BOOST_CHECK(ranges(12, 0, 6) == (R{{0, 4}, {4, 6}}));
  BOOST_CHECK(ranges(12, 6, 12) == (R{{6, 8}, {8, 12}}));
  BOOST_CHECK(ranges(12, 3, 6) == (R{{3, 4}, {4, 6}}));
  BOOST_CHECK(ranges(12, 8, 12) == (R{{8, 12}}));
}

BOOST_AUTO_TEST_CASE(a_cover_with_a_hole_is_refused) {
  const std::vector<float> a(3, 1.0f);
  std::vector<float> out(3);
  check_throws<tg::ValueError>([&] { tg::detail::tree_sum<float>(4, {{1, 0}, {0, 3}}, {a.data(), a.data()}, out.data(), 3); },
                               {"tree_sum", "micro-batch 2 of 4"});
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

tg::Decoder small_decoder(tg::DType dtype = tg::float32) {
  return tg::Decoder({.vocab = 11, .max_len = 6, .dim = 8, .heads = 2, .layers = 1, .dropout = 0.2, .dtype = dtype, .seed = 4});
}

// Large enough that the kernels split their work over two threads.
tg::Decoder medium_decoder() {
  return tg::Decoder({.vocab = 11, .max_len = 64, .dim = 64, .heads = 4, .layers = 1, .dropout = 0.2, .dtype = tg::float64, .seed = 4});
}

struct Batch {
  Tensor x, y;
};
Batch micro_batch(std::int64_t k, std::int64_t rows = 2, std::int64_t length = 6) {
  const auto n = static_cast<std::size_t>(rows * length);
  std::vector<std::int64_t> x(n), y(n);
  for (std::size_t i = 0; i < n; ++i) {
    x[i] = static_cast<std::int64_t>((i * 7 + static_cast<std::size_t>(k) * 3) % 11);
    y[i] = static_cast<std::int64_t>((i * 5 + static_cast<std::size_t>(k)) % 11);
  }
  return {tg::from_vector(x, {rows, length}), tg::from_vector(y, {rows, length})};
}

Tensor loss_of(tg::Decoder& model, std::int64_t k, std::int64_t rows = 2, std::int64_t length = 6) {
  const Batch b = micro_batch(k, rows, length);
  return tg::cross_entropy(model.forward(b.x), b.y);
}

}  // namespace

BOOST_AUTO_TEST_SUITE(data_parallel)

// One process: .grad after synchronize() is the tree's sum of the micro-batch gradients, over M,
// with dropout keyed by micro-batch; whatever the bucket size and the reduction.
BOOST_AUTO_TEST_CASE(the_gradient_is_the_trees_mean_of_the_micro_batches) {
  const std::int64_t m = 6;
  tg::Decoder reference = small_decoder();
  std::map<std::string, std::vector<std::vector<float>>> per_micro_batch;
  for (std::int64_t k = 0; k < m; ++k) {
    tg::key_generators(reference, 9, k);
    tg::backward(loss_of(reference, k));
    for (auto& p : reference.named_parameters()) {
      per_micro_batch[p.name].push_back(p.tensor.grad().to_vector<float>());
      p.tensor.zero_grad();
    }
  }
  tg::ProcessGroup group;
  for (const std::int64_t bucket_bytes : {std::int64_t{1}, std::int64_t{1} << 20})
    for (const tg::GradientReduction reduction : {tg::GradientReduction::exact, tg::GradientReduction::fast}) {
      tg::Decoder model = small_decoder();
      tg::DataParallel dp(group, model, {.micro_batches = m, .bucket_bytes = bucket_bytes, .reduction = reduction});
      BOOST_CHECK_EQUAL(dp.first_micro_batch(), 0);
      BOOST_CHECK_EQUAL(dp.end_micro_batch(), m);
      for (std::int64_t k = 0; k < m; ++k) {
        tg::key_generators(model, 9, k);
        dp.backward(loss_of(model, k));
        for (const auto& p : model.named_parameters()) BOOST_CHECK(!p.tensor.grad().defined());  // the sums hold them
      }
      dp.synchronize();
      for (const auto& p : model.named_parameters()) {
        std::vector<float> expected = level_by_level(per_micro_batch[p.name]);
        for (float& x : expected) x /= static_cast<float>(m);
        BOOST_CHECK_MESSAGE(same_bits(p.tensor.grad().to_vector<float>(), expected), p.name << ", bucket_bytes " << bucket_bytes);
      }
      BOOST_CHECK_EQUAL(dp.stats().steps, 1);
    }
}

// A parameter no micro-batch reaches counts a zero gradient (every bucket must complete).
BOOST_AUTO_TEST_CASE(an_unreached_parameter_gets_a_zero_gradient) {
  tg::ProcessGroup group;
  tg::Decoder model = small_decoder();
  tg::DataParallel dp(group, model, {.micro_batches = 2});
  const Tensor first = model.named_parameters().front().tensor;
  for (int k = 0; k < 2; ++k) dp.backward(tg::sum(first * first));
  dp.synchronize();
  for (const auto& p : model.named_parameters()) {
    const auto g = p.tensor.grad().to_vector<double>();
    const bool zero = std::all_of(g.begin(), g.end(), [](double v) { return v == 0; });
    BOOST_CHECK_MESSAGE(zero == (p.name != model.named_parameters().front().name), p.name);
  }
}

// Training gives the same parameters on one thread and on two, and with or without sharded
// optimizer state (one process owns everything, but the sharded path still runs).
BOOST_AUTO_TEST_CASE(training_has_the_same_bits_on_any_thread_count_and_sharding) {
  const int threads_before = tg::num_threads();
  auto train = [](int threads, bool shard) {
    tg::set_num_threads(threads);
    tg::ProcessGroup group;
    tg::Decoder model = medium_decoder();
    tg::DataParallel dp(group, model, {.micro_batches = 3, .bucket_bytes = 4096, .shard_optimizer_state = shard});
    tg::AdamW opt(dp.optimizer_parameters(), {.lr = 1e-2});
    for (int step = 0; step < 3; ++step) {
      for (std::int64_t k = dp.first_micro_batch(); k < dp.end_micro_batch(); ++k) {
        tg::key_generators(model, 1, step * 3 + k);
        dp.backward(loss_of(model, step * 3 + k, 4, 64));
      }
      dp.synchronize();
      dp.clip_grad_norm(0.1);
      opt.step();
      dp.share_parameters();
    }
    std::vector<double> out;
    for (const auto& p : model.named_parameters()) {
      const auto v = p.tensor.to_vector<double>();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };
  const auto one = train(1, false);
  for (const auto& [threads, shard] : {std::pair{2, false}, std::pair{1, true}, std::pair{2, true}}) {
    const auto other = train(threads, shard);
    BOOST_CHECK_MESSAGE(std::memcmp(one.data(), other.data(), one.size() * sizeof(double)) == 0,
                        threads << " threads, shard " << shard);
  }
  tg::set_num_threads(threads_before);
}

BOOST_AUTO_TEST_CASE(clip_grad_norm_is_clip_grad_norms_with_sharded_state_too) {
  tg::ProcessGroup group;
  for (const bool shard : {false, true}) {
    tg::Decoder model = small_decoder(), plain = small_decoder();
    tg::DataParallel dp(group, model, {.micro_batches = 1, .shard_optimizer_state = shard});
    dp.backward(loss_of(model, 0));
    dp.synchronize();
    tg::backward(loss_of(plain, 0));
    BOOST_CHECK_EQUAL(dp.clip_grad_norm(0.05), tg::clip_grad_norm(plain.parameters(), 0.05));
    const auto a = model.named_parameters(), b = plain.named_parameters();
    for (std::size_t i = 0; i < a.size(); ++i) BOOST_CHECK(a[i].tensor.grad().to_vector<float>() == b[i].tensor.grad().to_vector<float>());
  }
}

// A parameter that does not train is given rank 0's value and nothing else: no bucket, no
// gradient, not the optimizer's.
BOOST_AUTO_TEST_CASE(frozen_parameters_are_left_out) {
  tg::ProcessGroup group;
  tg::Decoder model = small_decoder();
  const auto named = model.named_parameters();
  Tensor frozen = named.front().tensor;
  frozen.set_requires_grad(false);
  tg::DataParallel dp(group, model, {.micro_batches = 2});
  for (const auto& p : dp.optimizer_parameters()) BOOST_CHECK(p.name != named.front().name);
  BOOST_CHECK_EQUAL(dp.optimizer_parameters().size(), named.size() - 1);
  for (std::int64_t k = 0; k < 2; ++k) dp.backward(loss_of(model, k));
  dp.synchronize();
  BOOST_CHECK(!frozen.grad().defined());
  for (std::size_t i = 1; i < named.size(); ++i) BOOST_CHECK_MESSAGE(named[i].tensor.grad().defined(), named[i].name);
}

// A mistake caught before any gradient joined the sums leaves DataParallel usable.
BOOST_AUTO_TEST_CASE(a_refused_micro_batch_can_be_run_again) {
  tg::ProcessGroup group;
  tg::Decoder model = small_decoder();
  tg::DataParallel dp(group, model, {.micro_batches = 1, .shard_optimizer_state = true});
  check_throws<tg::ValueError>([&] { dp.clip_grad_norm(1.0); }, {"DataParallel::clip_grad_norm", "synchronize() first"});
  check_throws<tg::ValueError>([&] { dp.share_parameters(); }, {"DataParallel::share_parameters", "after synchronize()"});
  Tensor detached;
  {
    tg::NoGradGuard no_grad;
    detached = loss_of(model, 0);
  }
  check_throws<tg::GraphError>([&] { dp.backward(detached); }, {"DataParallel::backward", "'loss'", "does not require grad"});
  dp.backward(loss_of(model, 0));
  dp.synchronize();
  check_throws<tg::ValueError>([&] { dp.clip_grad_norm(0.0); }, {"DataParallel::clip_grad_norm", "'max_norm'", "got 0"});
  BOOST_CHECK(dp.clip_grad_norm(1.0) > 0);
}

// With sharded state, the parameters the others updated must arrive before the next step or a
// checkpoint: forgetting share_parameters() is refused, not trained on.
BOOST_AUTO_TEST_CASE(a_sharded_step_must_be_shared) {
  tg::ProcessGroup group;
  tg::Decoder model = small_decoder();
  tg::DataParallel dp(group, model, {.micro_batches = 1, .shard_optimizer_state = true});
  tg::AdamW opt(dp.optimizer_parameters());
  BOOST_CHECK(dp.parameters_shared());
  dp.backward(loss_of(model, 0));
  dp.synchronize();
  opt.step();
  BOOST_CHECK(!dp.parameters_shared());
  check_throws<tg::ValueError>([&] { dp.backward(loss_of(model, 1)); }, {"DataParallel::backward", "share_parameters()"});
  tg::TrainingState state{.model = model, .optimizer = opt};
  const tg_test::TempDir dir;
  check_throws<tg::ValueError>([&] { tg::save_training_state(dir / "unshared.safetensors", state, dp); },
                               {"save_training_state", "share_parameters()"});
  BOOST_CHECK(dir.entries().empty());
  dp.share_parameters();
  dp.backward(loss_of(model, 1));
}

BOOST_AUTO_TEST_CASE(key_generators_depends_on_seed_name_and_index_alone) {
  tg::Decoder a = small_decoder(), b = small_decoder();
  tg::key_generators(a, 5, 17);
  a.named_generators().front().generator.get().next_u64();  // a stream's past does not matter
  tg::key_generators(a, 5, 17);
  tg::key_generators(b, 5, 17);
  BOOST_CHECK_EQUAL(a.named_generators().front().generator.get().next_u64(), b.named_generators().front().generator.get().next_u64());
  tg::key_generators(b, 5, 18);
  tg::key_generators(a, 5, 17);
  BOOST_CHECK_NE(a.named_generators().front().generator.get().next_u64(), b.named_generators().front().generator.get().next_u64());
}

BOOST_AUTO_TEST_CASE(bad_options_and_calls_are_refused) {
  tg::ProcessGroup group;
  tg::Decoder model = small_decoder();
  check_throws<tg::ValueError>([&] { tg::DataParallel(group, model, {.micro_batches = 0}); }, {"DataParallel", "micro_batches", "got 0"});
  check_throws<tg::ValueError>([&] { tg::DataParallel(group, model, {.bucket_bytes = 0}); }, {"DataParallel", "bucket_bytes", "got 0"});
  tg::Dropout empty_module(0.5);  // a module without parameters
  check_throws<tg::ValueError>([&] { tg::DataParallel(group, empty_module); }, {"DataParallel", "no parameters"});
  tg::DataParallel dp(group, model, {.micro_batches = 2});
  check_throws<tg::ValueError>([&] { dp.synchronize(); }, {"DataParallel::synchronize", "0 of its 2 micro-batches"});
  check_throws<tg::ShapeError>([&] { dp.backward(model.forward(micro_batch(0).x)); }, {"DataParallel::backward", "'loss'", "one element"});
  check_throws<tg::ValueError>([&] { dp.owner("nothing"); }, {"DataParallel::owner", "'nothing'"});
  dp.backward(loss_of(model, 0));
  dp.backward(loss_of(model, 1));
  check_throws<tg::ValueError>([&] { dp.backward(loss_of(model, 2)); }, {"DataParallel::backward", "all its 2 micro-batches", "synchronize"});
  check_throws<tg::ValueError>([] { tg::ProcessGroup({.timeout_seconds = 0}); }, {"ProcessGroup", "timeout_seconds", "got 0"});
  check_throws<tg::ValueError>([&] { group.broadcast({tg::zeros({2})}, 1); }, {"ProcessGroup::broadcast", "'root'", "[0, 1)", "got 1"});
}

BOOST_AUTO_TEST_CASE(set_grad_checks_the_gradient) {
  Tensor w = tg::zeros({2, 3}).set_requires_grad();
  w.set_grad(tg::ones({2, 3}));
  BOOST_CHECK(w.grad().to_vector<float>() == std::vector<float>(6, 1.0f));
  w.set_grad(Tensor());
  BOOST_CHECK(!w.grad().defined());
  check_throws<tg::ShapeError>([&] { w.set_grad(tg::ones({3, 2})); }, {"Tensor::set_grad", "'gradient'", "[2, 3]", "[3, 2]"});
  check_throws<tg::DTypeError>([&] { w.set_grad(tg::ones({2, 3}, tg::float64)); }, {"Tensor::set_grad", "'gradient'", "float64"});
  check_throws<tg::GraphError>([&] { w.set_grad(tg::ones({2, 3}).set_requires_grad()); }, {"Tensor::set_grad", "no history"});
  Tensor plain = tg::zeros({2});
  check_throws<tg::GraphError>([&] { plain.set_grad(tg::ones({2})); }, {"Tensor::set_grad", "not a leaf that requires grad"});
}

BOOST_AUTO_TEST_SUITE_END()
