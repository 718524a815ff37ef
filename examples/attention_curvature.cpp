// attention_curvature: gradients of gradients through one attention layer. docs/attention-backprop.md
// ("Curvature: gradients of gradients through attention") reads its output.
//
//   ./build/examples/attention_curvature                  # the table and the figure
//   ./build/examples/attention_curvature --quick          # five temperatures (what ctest runs)
//
// Part 1 takes Hessian-vector products of two losses through q = x Wq, k = x Wk, v = x Wv and
// causal scaled_dot_product_attention (a regression, and a next-token cross-entropy through Wo)
// with respect to x and every weight, and compares each with central differences of the
// gradient, which need first derivatives only; a probe shows that one product whose backward
// records nothing would fail that check. Part 2 treats the head's scores S as the variable and
// finds the largest eigenvalue of the Hessian of L(masked_softmax(S / T) v) by power iteration on
// HVPs, for a range of softmax temperatures T and three masks. Each eigenpair is checked against
// central differences of the gradient along its eigenvector (is it an eigenpair?) and against
// the dense Hessian's spectrum (is it the largest?). Exits 1 when any check misses its tolerance.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

#include "support/plot.hpp"

namespace tg = tapegrad;
namespace ex = tapegrad_examples;
using tg::Tensor;
using Vec = std::vector<double>;

namespace {

constexpr std::int64_t kTokens = 8, kChannels = 6, kHead = 4, kVocab = 5, kPadded = 2;
// n tokens (T is the temperature), C channels, one head of width D, a vocabulary of 5.
// Central differences of the gradient: the truncation error is O(h^2) and the rounding error
// O(eps |g| / h); both are near 1e-10 relative at this step, four orders below the tolerance,
// while a missing second-order term is an O(1) relative error.
constexpr double kStep = 1e-5, kTolerance = 1e-6;

double dot(const Vec& a, const Vec& b) { return std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }
double norm(const Vec& a) { return std::sqrt(dot(a, a)); }
double max_abs(const Vec& a) {
  double m = 0;
  for (double x : a) m = std::max(m, std::abs(x));
  return m;
}

// ---- Part 1: HVPs through the layer against differences of its gradient ----------------------

struct Layer {
  Tensor x, wq, wk, wv, wo;        // float64 leaves
  Tensor regression_target;        // [T, D]: the previous token's first D features
  Tensor next_ids;                 // [T] int64: the next token's id, ignored at the last position
};

Layer make_layer(std::uint64_t seed) {
  tg::Generator gen(seed);
  // A 5-symbol sequence embedded by a fixed table, so that "the next token" is a function of x,
  // plus a fixed vector per position: without it a repeated symbol has the same key as its
  // earlier copy, and two tied scores never saturate however low the temperature.
  const Vec table_v = tg::randn({kVocab, kChannels}, gen, tg::float64).to_vector<double>();
  const Vec position_v = tg::randn({kTokens, kChannels}, gen, tg::float64).to_vector<double>();
  std::vector<std::int64_t> ids(kTokens);
  for (auto& id : ids) id = static_cast<std::int64_t>(gen.next_u64() % kVocab);
  Vec x(kTokens * kChannels), target(kTokens * kHead, 0.0);
  std::vector<std::int64_t> next(kTokens, -100);
  for (std::int64_t t = 0; t < kTokens; ++t) {
    for (std::int64_t c = 0; c < kChannels; ++c)
      x[static_cast<std::size_t>(t * kChannels + c)] = table_v[static_cast<std::size_t>(ids[static_cast<std::size_t>(t)] * kChannels + c)] +
                                                       position_v[static_cast<std::size_t>(t * kChannels + c)];
    if (t > 0)
      for (std::int64_t d = 0; d < kHead; ++d)
        target[static_cast<std::size_t>(t * kHead + d)] = x[static_cast<std::size_t>((t - 1) * kChannels + d)];
    if (t + 1 < kTokens) next[static_cast<std::size_t>(t)] = ids[static_cast<std::size_t>(t + 1)];
  }
  // Query and key weights larger than 1/sqrt(C): scores spread over a few units, so the
  // temperature sweep of part 2 passes from saturated to uniform weights.
  const double qk = 2.0 / std::sqrt(double(kChannels)), vo = 1.0 / std::sqrt(double(kChannels));
  Layer l{tg::from_vector(x, {kTokens, kChannels}),
          tg::randn({kChannels, kHead}, gen, tg::float64) * qk,
          tg::randn({kChannels, kHead}, gen, tg::float64) * qk,
          tg::randn({kChannels, kHead}, gen, tg::float64) * vo,
          tg::randn({kHead, kVocab}, gen, tg::float64) / std::sqrt(double(kHead)),
          tg::from_vector(target, {kTokens, kHead}),
          tg::from_vector(std::span<const std::int64_t>(next), {kTokens})};
  for (Tensor* p : {&l.x, &l.wq, &l.wk, &l.wv, &l.wo}) *p = p->detach().set_requires_grad();
  return l;
}

using Product = Tensor (*)(const Tensor&, const Tensor&);
Tensor library_matmul(const Tensor& a, const Tensor& b) { return tg::matmul(a, b); }

// A product whose backward computes its gradients without recording them: right to first order,
// but a create_graph pass gets gradients with no history through it, so every second-order term
// that passes through it is missing. It is what a built-in op was before it was made
// second-order, and the probe that shows part 1's check would notice.
Tensor first_order_matmul(const Tensor& a, const Tensor& b) {
  Tensor out;
  {
    tg::NoGradGuard off;
    out = tg::matmul(a, b);
  }
  std::vector<Tensor> inputs{a, b}, outputs{out};
  tg::record_op("first_order_matmul", inputs, outputs, [ad = a.detach(), bd = b.detach()](std::span<const Tensor> g, const std::vector<bool>& needs) {
    tg::NoGradGuard off;
    return std::vector<Tensor>{needs[0] ? tg::matmul(g[0], tg::transpose(bd, 0, 1)) : Tensor(),
                               needs[1] ? tg::matmul(tg::transpose(ad, 0, 1), g[0]) : Tensor()};
  });
  return outputs[0];
}

// The attention output O [T, D] of the layer at (x, Wq, Wk, Wv); value_product makes v.
Tensor attend(const std::vector<Tensor>& p, Product value_product = library_matmul) {
  const Tensor q = tg::matmul(p[0], p[1]), k = tg::matmul(p[0], p[2]), v = value_product(p[0], p[3]);
  return tg::scaled_dot_product_attention(q, k, v, tg::causal_mask(kTokens, kTokens)).output;
}

struct HvpCheck {
  double largest = 0;    // max |H v|
  double abs_error = 0;  // max |H v - numeric|
  double rel_error = 0;  // abs_error / max |numeric|
  double seconds = 0;
};

// H v from the tape (hessian_vector_product: a create_graph backward, then a backward of the
// gradient) against (g(p + h v) - g(p - h v)) / 2h, where g is an ordinary first-order grad().
HvpCheck check_hvp(const std::function<Tensor(const std::vector<Tensor>&)>& loss, const std::vector<Tensor>& at,
                   std::uint64_t seed) {
  tg::Generator gen(seed);
  std::vector<Tensor> dir;
  for (const Tensor& p : at) dir.push_back(tg::randn(p.shape(), gen, tg::float64));
  tg::hessian_vector_product(loss, at, dir);  // once untimed: the first call pays one-time setup
  const auto start = std::chrono::steady_clock::now();
  const std::vector<Tensor> hv = tg::hessian_vector_product(loss, at, dir);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  auto gradient = [&](double s) {
    std::vector<Tensor> moved;
    for (std::size_t i = 0; i < at.size(); ++i) moved.push_back((at[i].detach() + dir[i] * s).detach().set_requires_grad());
    return tg::grad({loss(moved)}, moved);
  };
  const std::vector<Tensor> plus = gradient(kStep), minus = gradient(-kStep);
  HvpCheck r{.seconds = seconds};
  double scale = 0;
  bool nan = false;
  for (std::size_t i = 0; i < at.size(); ++i) {
    const Vec a = hv[i].to_vector<double>(), gp = plus[i].to_vector<double>(), gm = minus[i].to_vector<double>();
    for (std::size_t e = 0; e < a.size(); ++e) {
      const double numeric = (gp[e] - gm[e]) / (2 * kStep);
      scale = std::max(scale, std::abs(numeric));
      r.largest = std::max(r.largest, std::abs(a[e]));
      r.abs_error = std::max(r.abs_error, std::abs(a[e] - numeric));
      nan = nan || std::isnan(a[e]);
    }
  }
  r.rel_error = nan ? std::nan("") : r.abs_error / scale;  // a NaN must fail the check, not vanish in max
  return r;
}

// When an HVP disagrees, the culprit is an op whose backward is not differentiable yet: each op
// of the chain alone, by gradgradcheck, names it.
bool second_order_by_op(const Layer& l) {
  const Tensor S = tg::randn({kTokens, kTokens}, 11, tg::float64).set_requires_grad();
  const Tensor causal = tg::causal_mask(kTokens, kTokens);
  struct Case {
    const char* name;
    tg::GradcheckFn f;
    std::vector<Tensor> inputs;
  };
  const std::vector<Case> cases = {
      {"matmul", [](const std::vector<Tensor>& p) { return std::vector{tg::matmul(p[0], p[1])}; }, {l.x, l.wq}},
      {"scaled_dot_product_attention (causal)",
       [&](const std::vector<Tensor>& p) { return std::vector{tg::scaled_dot_product_attention(p[0], p[1], p[2], causal).output}; },
       {tg::matmul(l.x, l.wq).detach().set_requires_grad(), tg::matmul(l.x, l.wk).detach().set_requires_grad(),
        tg::matmul(l.x, l.wv).detach().set_requires_grad()}},
      {"masked_softmax(S / T), T = 2", [&](const std::vector<Tensor>& p) { return std::vector{tg::masked_softmax(p[0] * 0.5, causal)}; }, {S}},
      {"mse_loss", [&](const std::vector<Tensor>& p) { return std::vector{tg::mse_loss(p[0], l.regression_target)}; },
       {tg::randn({kTokens, kHead}, 12, tg::float64).set_requires_grad()}},
      {"cross_entropy", [&](const std::vector<Tensor>& p) { return std::vector{tg::cross_entropy(p[0], l.next_ids)}; },
       {tg::randn({kTokens, kVocab}, 13, tg::float64).set_requires_grad()}},
  };
  bool all = true;
  for (const Case& c : cases) {
    const tg::GradcheckResult r = tg::gradgradcheck(c.f, c.inputs);
    fmt::print("  {:<40} {}\n", c.name, r.ok ? "second-order exact (gradgradcheck OK)" : "NOT second-order: " + r.report());
    all = all && r.ok;
  }
  return all;
}

// ---- Part 2: the Hessian with respect to the scores ------------------------------------------

struct MaskCase {
  std::string name;
  Tensor allowed;  // undefined: every key
};

// Symmetric eigenvalues by cyclic Jacobi rotations, ascending. For the dense cross-check only:
// 64 scores here.
Vec symmetric_eigenvalues(Vec a, std::size_t n) {
  auto at = [&](std::size_t i, std::size_t j) -> double& { return a[i * n + j]; };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, total = 0;
    for (std::size_t i = 0; i < n; ++i)
      for (std::size_t j = 0; j < n; ++j) (i == j ? total : off) += at(i, j) * at(i, j);
    if (off <= 1e-30 * (total + off)) break;
    for (std::size_t p = 0; p + 1 < n; ++p)
      for (std::size_t q = p + 1; q < n; ++q) {
        if (at(p, q) == 0) continue;
        const double theta = (at(q, q) - at(p, p)) / (2 * at(p, q));
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (std::size_t k = 0; k < n; ++k) {  // columns p and q
          const double kp = at(k, p), kq = at(k, q);
          at(k, p) = c * kp - s * kq, at(k, q) = s * kp + c * kq;
        }
        for (std::size_t k = 0; k < n; ++k) {  // rows p and q
          const double pk = at(p, k), qk = at(q, k);
          at(p, k) = c * pk - s * qk, at(q, k) = s * pk + c * qk;
        }
      }
  }
  Vec eig(n);
  for (std::size_t i = 0; i < n; ++i) eig[i] = at(i, i);
  std::sort(eig.begin(), eig.end());
  return eig;
}

// The directions along which L(S) cannot curve, whatever T is: a masked score is never read, and
// adding one number to every allowed score of a row leaves its softmax unchanged. Their
// eigenvalue is exactly 0 (part 2 prints that it is); power iteration works on the rest, where a
// crowd of exact zeros would otherwise stall it whenever an extreme eigenvalue is near 0.
struct Flat {
  std::vector<std::vector<std::size_t>> allowed_of_row;
  Vec project(Vec u) const {  // onto the complement of the flat directions
    Vec r(u.size(), 0.0);
    for (const auto& row : allowed_of_row) {
      double mean = 0;
      for (std::size_t e : row) mean += u[e] / static_cast<double>(row.size());
      for (std::size_t e : row) r[e] = u[e] - mean;
    }
    return r;
  }
};

Flat flat_directions(const Tensor& allowed) {
  const Vec a = allowed.defined() ? tg::to(tg::expand(allowed, {kTokens, kTokens}), tg::float64).to_vector<double>()
                                  : Vec(static_cast<std::size_t>(kTokens * kTokens), 1.0);
  Flat f;
  for (std::int64_t i = 0; i < kTokens; ++i) {
    f.allowed_of_row.emplace_back();
    for (std::int64_t j = 0; j < kTokens; ++j)
      if (a[static_cast<std::size_t>(i * kTokens + j)] != 0) f.allowed_of_row.back().push_back(static_cast<std::size_t>(i * kTokens + j));
  }
  return f;
}

struct Power {
  double value = 0;  // the eigenvalue of H
  Vec vector, h_vector;  // u and the tape's H u
  int iterations = 0;
  double residual = 0;   // ||H u - value u||
};

// The dominant eigenpair of H + shift I by power iteration, returned as an eigenpair of H. With
// shift >= the spectral radius the shifted matrix is positive semi-definite, so its dominant
// eigenvalue is H's largest plus the shift and is never tied with its own negative. Stops when
// ||H u - lambda u|| <= tol * scale.
Power power_iteration(const std::function<Vec(const Vec&)>& hvp, double shift, Vec u, double scale, double tol, int max_iterations) {
  double n = norm(u);
  for (double& e : u) e /= n;
  Power r;
  for (r.iterations = 1; r.iterations <= max_iterations; ++r.iterations) {
    const Vec hu = hvp(u);
    Vec w(u.size()), residual(u.size());
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = hu[i] + shift * u[i];
    const double lambda = dot(u, w);
    for (std::size_t i = 0; i < w.size(); ++i) residual[i] = w[i] - lambda * u[i];
    r = {lambda - shift, u, hu, r.iterations, norm(residual)};
    n = norm(w);
    if (r.residual <= tol * scale || n == 0) break;
    for (std::size_t i = 0; i < w.size(); ++i) u[i] = w[i] / n;
  }
  return r;
}

struct Row {
  std::string mask;
  double temperature = 0;
  double max_weight = 0;       // mean over rows with >= 2 allowed keys of max_j A_ij
  double grad_norm = 0;        // ||dL/dS||
  double lambda_max = 0;       // by power iteration on HVPs
  double lambda_min = 0;       // from the dense Hessian, for context
  std::int64_t top_row = 0;    // the query row holding most of lambda_max's eigenvector
  std::int64_t top_keys = 0;   // its allowed keys
  double top_gap = 0;          // the gap between its two largest allowed scores
  std::int64_t top_keys_pair[2] = {0, 0};  // and their keys
  int iterations = 0;          // HVPs spent: the spectral radius's and lambda_max's power iterations
  double fd_error = 0;         // ||H u (tape) - H u (central differences)|| / rho along the eigenvector
  double residual = 0;         // ||H u - lambda u|| / rho
  double dense_error = 0;      // |power - dense| / rho
  bool ok() const { return fd_error <= kTolerance && residual <= kTolerance && dense_error <= kTolerance; }
};

// Power iteration stops at a residual of kConverged * rho: the eigenvalue is then within that
// of a true one, ten times inside the dense check's tolerance.
constexpr double kConverged = 1e-7;
constexpr int kMaxIterations = 20000;

Row curvature(const MaskCase& m, double temperature, const Tensor& scores, const Tensor& v, const Tensor& target, std::uint64_t seed) {
  // L(S) = mse(masked_softmax(S / T) v, y): the layer's regression loss as a function of the
  // head's scores, with v held fixed.
  const auto loss = [&](const Tensor& s) { return tg::mse_loss(tg::matmul(tg::masked_softmax(s * (1.0 / temperature), m.allowed), v), target); };
  const auto grad_at = [&](const Vec& s) {
    const Tensor leaf = tg::from_vector(s, scores.shape()).set_requires_grad();
    return tg::grad({loss(leaf)}, {leaf})[0].to_vector<double>();
  };
  const Flat flat = flat_directions(m.allowed);
  const auto hvp = [&](const Vec& u) {
    return flat.project(tg::hessian_vector_product(loss, scores, tg::from_vector(u, scores.shape())).to_vector<double>());
  };
  const Vec s0 = scores.to_vector<double>();

  Row row{.mask = m.name, .temperature = temperature};
  const Vec a = tg::masked_softmax(scores * (1.0 / temperature), m.allowed).to_vector<double>();
  int counted = 0;
  for (const auto& keys : flat.allowed_of_row) {
    double top = 0;
    for (std::size_t e : keys) top = std::max(top, a[e]);
    if (keys.size() >= 2) row.max_weight += top, ++counted;  // a row with one key has A = 1 whatever T is
  }
  row.max_weight /= counted;
  row.grad_norm = norm(grad_at(s0));

  tg::Generator gen(seed);
  const Vec u0 = flat.project(tg::randn(scores.shape(), gen, tg::float64).to_vector<double>());
  // H is indefinite, and plain power iteration finds the eigenvalue of largest magnitude, often
  // the negative one. So the spectral radius rho first, coarsely (||H u|| approaches it from
  // below even when +-rho are both eigenvalues), then H + rho I, whose dominant eigenvalue is
  // lambda_max + rho.
  const Power radius = power_iteration([&](const Vec& u) { return hvp(hvp(u)); }, 0, u0, 1, 0, 30);
  const double rho = std::sqrt(std::max(radius.value, 0.0)), scale = rho > 0 ? rho : 1;
  const Power top = power_iteration(hvp, rho, u0, scale, kConverged, kMaxIterations);
  row.lambda_max = top.value;
  row.iterations = 2 * radius.iterations + top.iterations;
  row.residual = top.residual / scale;

  // Where the top eigenvector lives: the row with most of its weight, and that row's margin.
  double best = -1;
  for (std::int64_t i = 0; i < kTokens; ++i) {
    double share = 0;
    for (std::size_t e : flat.allowed_of_row[static_cast<std::size_t>(i)]) share += top.vector[e] * top.vector[e];
    if (share > best) best = share, row.top_row = i;
  }
  {
    std::vector<std::size_t> keys = flat.allowed_of_row[static_cast<std::size_t>(row.top_row)];
    std::sort(keys.begin(), keys.end(), [&](std::size_t e, std::size_t f) { return s0[e] > s0[f]; });
    row.top_keys = static_cast<std::int64_t>(keys.size());
    if (keys.size() >= 2) {
      row.top_gap = s0[keys[0]] - s0[keys[1]];
      row.top_keys_pair[0] = static_cast<std::int64_t>(keys[0]) % kTokens, row.top_keys_pair[1] = static_cast<std::int64_t>(keys[1]) % kTokens;
    }
  }

  // Check 1, first derivatives only: the tape's H u against (g(S + h u) - g(S - h u)) / 2h.
  {
    Vec plus = s0, minus = s0;
    for (std::size_t i = 0; i < s0.size(); ++i) plus[i] += kStep * top.vector[i], minus[i] -= kStep * top.vector[i];
    const Vec gp = flat.project(grad_at(plus)), gm = flat.project(grad_at(minus));
    Vec r(s0.size());
    for (std::size_t i = 0; i < s0.size(); ++i) r[i] = (gp[i] - gm[i]) / (2 * kStep) - top.h_vector[i];
    row.fd_error = norm(r) / scale;
  }
  // Check 2: the dense Hessian (one backward per score) has it as its largest eigenvalue. Its
  // smallest is printed beside it: power iteration on rho I - H would find it too, but stalls
  // whenever it sits among the near-zero eigenvalues of saturated rows.
  const Vec dense = symmetric_eigenvalues(tg::hessian(loss, scores).to_vector<double>(), s0.size());
  row.dense_error = std::abs(dense.back() - row.lambda_max) / scale;
  row.lambda_min = dense.front();
  return row;
}

}  // namespace

int main(int argc, char** argv) try {
  int threads = 0;
  bool quick = false, no_files = false;
  std::string out = "attention_curvature_out";
  CLI::App app{"attention_curvature: Hessian-vector products through attention, checked, and the score Hessian's extreme "
               "eigenvalues against temperature and masking"};
  app.add_option("--threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  app.add_flag("--quick", quick, "five temperatures instead of eighteen (the ctest run)");
  app.add_option("--out", out, "directory for curvature_vs_temperature.png");
  app.add_flag("--no-files", no_files, "write no figure");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("attention_curvature: {} thread(s) (--threads N to choose)\n", tg::num_threads());
  fmt::print("n = {} tokens, C = {} channels, one head of width D = {}, float64; checks: central differences of the gradient, "
             "step {:g}, tolerance {:g} (relative)\n\n",
             kTokens, kChannels, kHead, kStep, kTolerance);
  bool ok = true;
  const Layer l = make_layer(7);

  fmt::print("Part 1. Hessian-vector products through q = x Wq, k = x Wk, v = x Wv, causal attention\n");
  fmt::print("  H v from the tape against (g(p + h v) - g(p - h v)) / 2h for a random direction v over every input\n");
  const std::vector<Tensor> core{l.x, l.wq, l.wk, l.wv};
  struct LossCase {
    const char* name;
    std::function<Tensor(const std::vector<Tensor>&)> f;
    std::vector<Tensor> inputs;
  };
  const std::vector<LossCase> losses = {
      {"regression: mse_loss(O, previous token's features), wrt x, Wq, Wk, Wv",
       [&](const std::vector<Tensor>& p) { return tg::mse_loss(attend(p), l.regression_target); }, core},
      {"next token: cross_entropy(O Wo, next id), wrt x, Wq, Wk, Wv, Wo",
       [&](const std::vector<Tensor>& p) { return tg::cross_entropy(tg::matmul(attend(p), p[4]), l.next_ids); },
       {l.x, l.wq, l.wk, l.wv, l.wo}},
  };
  bool hvp_ok = true;
  std::uint64_t seed = 100;
  for (const LossCase& c : losses) {
    const HvpCheck r = check_hvp(c.f, c.inputs, ++seed);
    const bool pass = r.rel_error <= kTolerance;  // false on NaN
    fmt::print("  {}\n    max |Hv| = {:.3f}, max |Hv - numeric| = {:.1e}, max relative error = {:.1e}  {}  ({:.1f} ms per HVP)\n", c.name,
               r.largest, r.abs_error, r.rel_error, pass ? "OK" : "FAILS", 1e3 * r.seconds);
    hvp_ok = hvp_ok && pass;
  }
  {
    // The probe: the regression check again with a value projection whose backward records nothing.
    const HvpCheck r = check_hvp([&](const std::vector<Tensor>& p) { return tg::mse_loss(attend(p, first_order_matmul), l.regression_target); },
                                 core, 101);
    const bool caught = !(r.rel_error <= kTolerance);
    fmt::print("  probe: the same regression check with v = x Wv from a product whose backward records nothing (first-order only)\n"
               "    max relative error = {:.2f}: {}\n",
               r.rel_error, caught ? "caught" : "NOT caught");
    ok = ok && caught;
  }
  fmt::print("  every op of the chain alone:\n");
  const bool ops_ok = second_order_by_op(l);
  ok = ok && hvp_ok && ops_ok;

  // The head's scores at the layer's weights, and its values: the variables of part 2.
  const Tensor scores = (tg::matmul(tg::matmul(l.x, l.wq), tg::transpose(tg::matmul(l.x, l.wk), 0, 1)) / std::sqrt(double(kHead))).detach();
  const Tensor v = tg::matmul(l.x, l.wv).detach();
  {
    const Vec s = scores.to_vector<double>();
    double spread = 0;  // mean over rows of max - min
    for (std::int64_t i = 0; i < kTokens; ++i) {
      const auto first = s.begin() + i * kTokens;
      spread += (*std::max_element(first, first + kTokens) - *std::min_element(first, first + kTokens)) / kTokens;
    }
    fmt::print("\nPart 2. The Hessian of L(S) = mse_loss(masked_softmax(S / T, mask) v, y) with respect to the scores S [{0}, {0}]\n",
               kTokens);
    fmt::print("  S = q k^T / sqrt(D) at the layer's weights: a row's scores span {:.2f} on average\n", spread);
  }
  std::vector<bool> pad(static_cast<std::size_t>(kTokens), true);
  for (std::int64_t j = kTokens - kPadded; j < kTokens; ++j) pad[static_cast<std::size_t>(j)] = false;
  const std::vector<MaskCase> masks = {{"causal", tg::causal_mask(kTokens, kTokens)},
                                       {"full", Tensor()},
                                       {fmt::format("padding (keys {}-{})", kTokens - kPadded, kTokens - 1), tg::from_bools(pad, {1, kTokens})}};

  // The flat directions that power iteration projects out must be flat: H is exactly 0 on every
  // masked score, and H times a row-constant shift is 0 up to rounding.
  for (const MaskCase& m : masks) {
    const auto loss = [&](const Tensor& s) { return tg::mse_loss(tg::matmul(tg::masked_softmax(s, m.allowed), v), l.regression_target); };
    const Flat flat = flat_directions(m.allowed);
    const std::size_t n = static_cast<std::size_t>(kTokens * kTokens);
    double shift = 0;
    for (const auto& keys : flat.allowed_of_row) {
      Vec u(n, 0.0);
      for (std::size_t e : keys) u[e] = 1;
      shift = std::max(shift, max_abs(tg::hessian_vector_product(loss, scores, tg::from_vector(u, scores.shape())).to_vector<double>()));
    }
    Vec allowed(n, 0.0);
    for (const auto& keys : flat.allowed_of_row)
      for (std::size_t e : keys) allowed[e] = 1;
    const Vec h = tg::hessian(loss, scores).to_vector<double>();
    double masked = 0;
    std::size_t count = 0;
    for (std::size_t e = 0; e < n; ++e)
      if (allowed[e] == 0) {
        ++count;
        for (std::size_t f = 0; f < n; ++f) masked = std::max(masked, std::abs(h[e * n + f]));
      }
    fmt::print("  {:<20} T = 1: H (row shift) max |.| = {:.1e};  H at the {:>2} masked scores: max |.| = {:g}\n", m.name, shift, count, masked);
    ok = ok && masked == 0 && shift <= 1e-12;
  }

  const Vec temperatures = quick ? Vec{0.03, 0.1, 0.5, 2, 10}
                                 : Vec{0.02, 0.03, 0.05, 0.07, 0.1, 0.15, 0.2, 0.3, 0.5, 0.7, 1, 1.5, 2, 3, 5, 7, 10, 20};
  fmt::print("\n  lambda_max: power iteration on HVPs, shifted by the spectral radius rho so that it dominates; checks, each\n"
             "  over rho with tolerance {:g}: the tape's H u against central differences of the gradient along the\n"
             "  eigenvector (fd), the residual ||H u - lambda_max u|| (resid), the dense Hessian's largest eigenvalue (dense).\n"
             "  lambda_min: the dense Hessian's smallest. maxA: mean over rows of the largest weight. top row: the query row\n"
             "  holding most of the eigenvector (its allowed keys), gap/T: that row's two largest allowed scores apart, over T\n\n",
             kTolerance);
  fmt::print("  {:<20} {:>5} {:>6} {:>9} {:>10} {:>10} {:>10} {:>9} {:>6} {:>5} {:>7} {:>7} {:>7}\n", "mask", "T", "maxA", "|dL/dS|",
             "lambda_max", "lambda_min", "T^2 l_max", "top row", "gap/T", "HVPs", "fd", "resid", "dense");
  std::vector<Row> rows;
  for (const MaskCase& m : masks) {
    for (double t : temperatures) {
      const Row r = curvature(m, t, scores, v, l.regression_target, 500);
      fmt::print("  {:<20} {:>5g} {:>6.3f} {:>9.2e} {:>10.3e} {:>10.3e} {:>10.3e} {:>9} {:>6.2f} {:>5} {:>7.0e} {:>7.0e} {:>7.0e}{}\n", r.mask,
                 r.temperature, r.max_weight, r.grad_norm, r.lambda_max, r.lambda_min, t * t * r.lambda_max,
                 fmt::format("q{} ({})", r.top_row, r.top_keys), r.top_gap / t, r.iterations, r.fd_error, r.residual, r.dense_error,
                 r.ok() ? "" : "  FAILS");
      ok = ok && r.ok();
      rows.push_back(r);
    }
    fmt::print("\n");
  }
  for (const MaskCase& m : masks) {
    const Row* peak = nullptr;
    for (const Row& r : rows)
      if (r.mask == m.name && (!peak || r.lambda_max > peak->lambda_max)) peak = &r;
    fmt::print("  {:<20} largest lambda_max {:.3e} at T = {:g}: row q{} ({} keys), its top two scores (keys {} and {}) {:.3f} = {:.2f} T "
               "apart; mean max weight {:.3f}\n",
               m.name, peak->lambda_max, peak->temperature, peak->top_row, peak->top_keys, peak->top_keys_pair[0], peak->top_keys_pair[1],
               peak->top_gap, peak->top_gap / peak->temperature, peak->max_weight);
  }

  if (!no_files) {
    std::filesystem::create_directories(out);
    // lambda_max in the scores only: T^2 lambda_max (the logits' curvature) is in the table, and
    // six lines would put the legend over the data.
    ex::LinePlot plot{"Largest eigenvalue of d2L/dS2 (one head's scores S, A = softmax(S/T))",
                      "log10 T (softmax temperature: sharper to the left)", "lambda_max (log scale)", {}, true};
    for (const MaskCase& m : masks) {
      ex::Series s{m.name, {}, {}};
      for (const Row& r : rows)
        if (r.mask == m.name && r.lambda_max > 0) s.x.push_back(std::log10(r.temperature)), s.y.push_back(r.lambda_max);
      plot.series.push_back(std::move(s));
    }
    const std::string path = out + "/curvature_vs_temperature.png";
    ex::plot_lines(path, plot);
    fmt::print("\nwrote {}\n", path);
  }
  fmt::print("\n{}\n", ok ? "OK: every Hessian-vector product and eigenpair agrees with central differences of the gradient"
                          : "FAILED: see the lines marked FAILS / NOT second-order above");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "attention_curvature: {}\n", e.what());
  return 1;
}
