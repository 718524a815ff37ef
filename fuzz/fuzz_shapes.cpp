// libFuzzer target for shape and view arithmetic: factories, arange, causal_mask,
// broadcast_shapes and attention's pair count on arbitrary integers, and chains of reshape/flatten/permute/transpose/slice/
// narrow/select/expand/squeeze/unsqueeze/concat/stack/sum/mean/max/matmul on tensors whose
// sizes range from 0 to 2^62 and INT64_MAX (zero-size, or expanded views of small storage).
//
// Each call is judged by an oracle written here from the documented rules: the result shape,
// or an error when a rule is broken or the shape would pass 2^48 bytes (sizes with 0 counted as
// 1). A call must throw a tapegrad::Error exactly when the oracle expects one, and otherwise
// return that shape; when the result has at most kSmall elements every value is checked
// against the element of the leaf (or other operand) it must come from, and at the end of the
// chain the leaf's gradient against the number of times each element was viewed. Calls whose
// valid result would really need much memory or time are skipped: the library allocates up to
// 2^48 bytes when asked, and this target runs under -malloc_limit_mb.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <optional>

#include "fuzz_support.hpp"

namespace {
using namespace fuzz;

constexpr std::int64_t kMaxBytes = std::int64_t{1} << 48;
constexpr std::int64_t kSmall = 4096;       // results up to this many elements are computed and checked
constexpr std::int64_t kMaxWork = 1 << 16;  // elements an op may read
constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
constexpr std::int64_t kMin = std::numeric_limits<std::int64_t>::min();

// Whether a tensor may have this shape: no negative size and at most 2^48 bytes.
bool addressable(const Shape& s, tg::DType dtype) {
  __int128 bytes = static_cast<__int128>(tg::itemsize(dtype));
  for (auto d : s) {
    if (d < 0) return false;
    bytes *= std::max<std::int64_t>(d, 1);
    if (bytes > kMaxBytes) return false;
  }
  return true;
}

Shape unravel(std::int64_t i, const Shape& s) {
  Shape at(s.size());
  for (std::size_t d = s.size(); d-- > 0; i /= s[d]) at[d] = i % s[d];
  return at;
}
std::int64_t ravel(const Shape& at, const Shape& s) {
  std::int64_t i = 0;
  for (std::size_t d = 0; d < s.size(); ++d) i = i * s[d] + at[d];
  return i;
}

// Documented conversions (docs/semantics.md §11): what full(shape, v, dtype) must hold.
double converted(double v, tg::DType dtype) {
  switch (dtype) {
    case tg::DType::float64: return v;
    case tg::DType::float32:
      if (std::isfinite(v) && std::abs(v) > std::numeric_limits<float>::max()) return v > 0 ? INFINITY : -INFINITY;
      return static_cast<double>(static_cast<float>(v));
    case tg::DType::bool_: return v != 0.0 ? 1.0 : 0.0;
    case tg::DType::int64:
      if (std::isnan(v)) return 0.0;
      if (v >= 0x1p63) return static_cast<double>(kMax);
      if (v <= -0x1p63) return static_cast<double>(kMin);
      return static_cast<double>(static_cast<std::int64_t>(v));
  }
  return v;
}

// The tensor a chain has reached, and what its elements must be.
struct State {
  Tensor x;
  std::function<double(std::int64_t)> value;       // of the element at row-major index i
  std::function<std::int64_t(std::int64_t)> leaf;  // the leaf element it views (-1: none); empty: not a view
  bool small = true;  // every tensor so far had <= kWork elements (backward allocates their shapes)
};

// The outcome the oracle expects of one call.
enum class Outcome { error, skip, shape };

struct Fuzzer {
  Input& in;

  std::int64_t size() {
    static constexpr std::int64_t kHuge[] = {std::int64_t{1} << 20, std::int64_t{1} << 31, std::int64_t{1} << 40,
                                             std::int64_t{1} << 46, std::int64_t{1} << 47, std::int64_t{1} << 48,
                                             std::int64_t{1} << 62, kMax, -1, -2, kMin};
    const int k = in.in(0, 9);
    return k < 7 ? in.in<std::int64_t>(0, 4) : k < 9 ? in.pick(kHuge) : in.in<std::int64_t>(0, 70);
  }
  // A dim, start, end or index: small and signed, sometimes extreme.
  std::int64_t index() {
    static constexpr std::int64_t kExtreme[] = {kMin, kMin + 1, -(std::int64_t{1} << 62), std::int64_t{1} << 62, kMax - 1, kMax};
    return in.in(0, 7) == 0 ? in.pick(kExtreme) : in.in<std::int64_t>(-6, 6);
  }
  Shape shape(std::size_t max_rank = 5) {
    Shape s(in.in<std::size_t>(0, max_rank));
    for (auto& d : s) d = size();
    return s;
  }
  tg::DType dtype() {
    static constexpr tg::DType kAll[] = {tg::float32, tg::float64, tg::float64, tg::int64, tg::bool_};
    return in.pick(kAll);
  }

  // Runs `call` when the oracle expects a result (checking its shape and dtype) or an error.
  template <class F> std::optional<Tensor> judge(const char* op, Outcome want, const Shape& shape, tg::DType dtype, F&& call) {
    narrate("{}: outcome {} shape {} {}", op, static_cast<int>(want), shape, dtype);
    if (want == Outcome::skip) return std::nullopt;
    if (want == Outcome::error) {
      expect_error<tg::Error>(op, [&] { (void)call(); });
      return std::nullopt;
    }
    Tensor r;
    try {
      r = call();
    } catch (const tg::Error& e) {
      fail("{}: expected shape {} ({}), got an error: {}", op, shape, dtype, e.what());
    }
    require(r.shape() == shape && r.dtype() == dtype, "{}: expected shape {} ({}), got {} ({})", op, shape, dtype, r.shape(), r.dtype());
    return r;
  }

  // Every value of a small result against the oracle's.
  static void check_values(const char* op, const Tensor& r, const std::function<double(std::int64_t)>& value) {
    if (!value || r.numel() > kSmall) return;
    const auto got = values(r);
    for (std::int64_t i = 0; i < static_cast<std::int64_t>(got.size()); ++i) {
      const double want = converted(value(i), r.dtype());
      require(same_values({got[static_cast<std::size_t>(i)]}, {want}), "{}: element {} of shape {} is {}, expected {}", op, i,
              r.shape(), got[static_cast<std::size_t>(i)], want);
    }
  }

  // ---- Standalone calls -------------------------------------------------------------------

  void factories() {
    const Shape s = shape();
    const tg::DType dt = dtype();
    const double v = in.pick({0.0, 1.0, -2.5, 1e300, -1e300, HUGE_VAL, std::nan(""), 3e9, -1e19});
    const Outcome want = !addressable(s, dt) ? Outcome::error : numel_of(s) <= kSmall ? Outcome::shape : Outcome::skip;
    switch (in.in(0, 3)) {
      case 0: judge("empty", want, s, dt, [&] { return tg::empty(s, dt); }); break;
      case 1:
        if (auto r = judge("zeros", want, s, dt, [&] { return tg::zeros(s, dt); })) check_values("zeros", *r, [](std::int64_t) { return 0.0; });
        break;
      case 2:
        if (auto r = judge("ones", want, s, dt, [&] { return tg::ones(s, dt); })) check_values("ones", *r, [](std::int64_t) { return 1.0; });
        break;
      default:
        if (auto r = judge("full", want, s, dt, [&] { return tg::full(s, v, dt); })) check_values("full", *r, [v](std::int64_t) { return v; });
    }
  }

  void arange() {
    static constexpr double kEnds[] = {0.0, 1.0, -1.0, 2.5, 1e300, -1e300, 0x1p48, 0x1p45, 1e-300, HUGE_VAL, -HUGE_VAL, NAN};
    auto number = [&] { return in.flag() ? static_cast<double>(in.in(-20, 20)) : in.pick(kEnds); };
    const double start = number(), end = number(), step = in.flag() ? in.pick({1.0, -1.0, 0.5, 3.0, -0.25}) : number();
    const tg::DType dt = dtype();
    Outcome want = Outcome::error;
    Shape s;
    if (step != 0.0 && std::isfinite(start) && std::isfinite(end) && std::isfinite(step)) {
      const double count = std::max(0.0, std::ceil((end - start) / step));
      if (count <= 0x1p48 && addressable({static_cast<std::int64_t>(count)}, dt)) {
        s = {static_cast<std::int64_t>(count)};
        want = count <= kSmall ? Outcome::shape : Outcome::skip;
      }
    }
    // int64 needs a whole start and step (it would truncate to another sequence).
    if (dt == tg::int64 && (start != std::trunc(start) || step != std::trunc(step))) want = Outcome::error;
    if (auto r = judge("arange", want, s, dt, [&] { return tg::arange(start, end, step, dt); }))
      check_values("arange", *r, [=](std::int64_t i) { return start + static_cast<double>(i) * step; });
  }

  void causal_mask() {
    const std::int64_t q = size(), k = size(), offset = index();
    const Outcome want = !addressable({q, k}, tg::bool_) ? Outcome::error : q * k <= kSmall ? Outcome::shape : Outcome::skip;
    if (auto r = judge("causal_mask", want, {q, k}, tg::bool_, [&] { return tg::causal_mask(q, k, offset); }))
      check_values("causal_mask", *r, [=](std::int64_t i) { return i % k - i / k <= offset ? 1.0 : 0.0; });
  }

  void broadcast_shapes() {
    const Shape a = shape(), b = shape();
    Shape out(std::max(a.size(), b.size()));
    bool ok = std::none_of(a.begin(), a.end(), [](auto d) { return d < 0; }) && std::none_of(b.begin(), b.end(), [](auto d) { return d < 0; });
    for (std::size_t i = 0; ok && i < out.size(); ++i) {
      const std::int64_t p = i < a.size() ? a[a.size() - 1 - i] : 1, q = i < b.size() ? b[b.size() - 1 - i] : 1;
      ok = p == q || p == 1 || q == 1;
      out[out.size() - 1 - i] = p == 1 ? q : p;
    }
    if (!ok) {
      expect_error<tg::ShapeError>("broadcast_shapes", [&] { tg::broadcast_shapes(a, b); });
      return;
    }
    const Shape got = tg::broadcast_shapes(a, b);
    require(got == out, "broadcast_shapes({}, {}) gave {}, expected {}", a, b, got, out);
  }

  // attention() and scaled_dot_product_attention() on views whose sizes reach INT64_MAX: the
  // [..., Q, K] pairs are counted (sizes with 0 counted as 1) and must fit int64 even where no
  // path holds them, the output (and the weights) must be addressable, and D must be >= 1. A
  // valid call runs only when its pairs are few (the values are 0: v is).
  void attention() {
    const Shape lead = in.flag() ? Shape{size()} : Shape{};
    const std::int64_t q = size(), k = size(), d = in.in<std::int64_t>(0, 2), dv = size();
    const bool weights = in.flag();
    auto shape_of = [&](std::int64_t rows, std::int64_t cols) {
      Shape s = lead;
      s.push_back(rows);
      s.push_back(cols);
      return s;
    };
    const Shape qs = shape_of(q, d), ks = shape_of(k, d), vs = shape_of(k, dv);
    for (const Shape* s : {&qs, &ks, &vs})
      if (!addressable(*s, tg::float32)) return;  // the operands themselves cannot exist
    auto view = [](const Shape& s) { return tg::expand(tg::zeros(Shape(s.size(), 1)), s); };
    __int128 pairs = 1, work = 1;
    for (std::int64_t n : shape_of(q, k)) {
      pairs *= std::max<std::int64_t>(n, 1);
      work *= n;
      if (pairs > kMax) break;
    }
    const bool ok = d >= 1 && pairs <= kMax && addressable(shape_of(q, dv), tg::float32) && (!weights || addressable(shape_of(q, k), tg::float32));
    // The result, and what the paths may hold besides: a copy of a strided operand (these are
    // expanded views), per-query rows, the weights.
    auto count = [](const Shape& s) {
      __int128 n = 1;
      for (std::int64_t x : s) n = std::min<__int128>(n * x, __int128{1} << 100);
      return n;
    };
    const __int128 held = count(qs) + count(ks) + count(vs) + 2 * count(shape_of(q, 1)) + count(shape_of(q, dv)) + (weights ? count(shape_of(q, k)) : 0);
    const Outcome want = !ok ? Outcome::error : work * (d + dv) <= kMaxWork && held <= kMaxWork ? Outcome::shape : Outcome::skip;
    const Tensor qv = view(qs), kv = view(ks), vv = view(vs);
    if (auto r = judge(weights ? "scaled_dot_product_attention" : "attention", want, shape_of(q, dv), tg::float32, [&] {
          return weights ? tg::scaled_dot_product_attention(qv, kv, vv).output : tg::attention(qv, kv, vv);
        }))
      check_values("attention", *r, [](std::int64_t) { return 0.0; });
  }

  // ---- Chains ---------------------------------------------------------------------------

  // A view step: `map` takes a multi-index of the result to one of x.
  State view(State s, Tensor r, std::function<Shape(const Shape&)> map) {
    const Shape xs = s.x.shape(), rs = r.shape();
    auto at = [=](std::int64_t i) { return ravel(map(unravel(i, rs)), xs); };
    State out{r, {}, {}, s.small && r.numel() <= kMaxWork};
    if (s.value) out.value = [v = s.value, at](std::int64_t i) { return v(at(i)); };
    if (s.leaf) out.leaf = [l = s.leaf, at](std::int64_t i) { return l(at(i)); };
    return out;
  }

  // A tensor of `s` for a second operand, with values base + row-major index; nullopt when it
  // would be large (a huge zero-size shape is fine).
  std::optional<State> operand(const Shape& s, tg::DType dt, double base) {
    if (!addressable(s, dt) || numel_of(s) > kSmall) return std::nullopt;
    std::vector<double> v(static_cast<std::size_t>(numel_of(s)));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = base + static_cast<double>(i);
    // (Made in dt directly: [0, 2^46] fits as float32 but not as float64.)
    Tensor t = v.empty() ? tg::zeros(s, dt) : tg::from_vector(v, s).to(dt);
    const auto logical = values(t);
    return State{t, [logical](std::int64_t i) { return logical[static_cast<std::size_t>(i)]; }, [](std::int64_t) { return std::int64_t{-1}; }, true};
  }

  // One op applied to s.x; nullopt ends the chain (an error, a skip, or nothing to do).
  std::optional<State> step(const State& s) {
    const Tensor& x = s.x;
    const Shape xs = x.shape();
    const auto rank = static_cast<std::int64_t>(xs.size());
    const tg::DType dt = x.dtype();
    const std::int64_t n = x.numel();
    auto wrap = [&](std::int64_t d, std::int64_t r) -> std::optional<std::size_t> {
      if (r == 0 || d < -r || d >= r) return std::nullopt;
      return static_cast<std::size_t>(d < 0 ? d + r : d);
    };
    switch (in.in(0, 13)) {
      case 0:
      case 1: {  // reshape, flatten
        Shape to = in.flag() ? Shape{-1} : shape();
        for (auto& d : to)
          if (in.in(0, 5) == 0) d = -1;
        Outcome want = Outcome::shape;
        std::int64_t known = 1, infer = -1;
        for (std::size_t i = 0; i < to.size(); ++i) {
          if (to[i] == -1 && infer < 0) infer = static_cast<std::int64_t>(i);
          else if (to[i] < 0 || __builtin_mul_overflow(known, to[i], &known)) want = Outcome::error;
        }
        if (want != Outcome::error && infer >= 0) {
          if (known == 0 || n % known != 0) want = Outcome::error;
          else to[static_cast<std::size_t>(infer)] = n / known;
        }
        if (want != Outcome::error && (!addressable(to, dt) || numel_of(to) != n)) want = Outcome::error;
        if (want == Outcome::shape && n > kSmall && !x.is_contiguous()) want = Outcome::skip;  // may copy
        auto r = judge("reshape", want, to, dt, [&] { return tg::reshape(x, to); });
        if (!r) return std::nullopt;
        return view(s, *r, [xs, to](const Shape& at) { return unravel(ravel(at, to), xs); });
      }
      case 2: {  // permute
        std::vector<std::int64_t> dims(static_cast<std::size_t>(rank));
        for (std::size_t i = 0; i < dims.size(); ++i) dims[i] = static_cast<std::int64_t>(i);
        for (std::size_t i = dims.size(); i > 1; --i) std::swap(dims[i - 1], dims[in.in<std::size_t>(0, i - 1)]);
        for (auto& d : dims)
          if (in.flag()) d -= rank;
        if (in.in(0, 5) == 0) dims.push_back(index());
        if (in.in(0, 5) == 0 && !dims.empty()) dims[in.in<std::size_t>(0, dims.size() - 1)] = index();
        Outcome want = static_cast<std::int64_t>(dims.size()) == rank ? Outcome::shape : Outcome::error;
        std::vector<std::size_t> w;
        std::vector<bool> seen(xs.size());
        for (auto d : dims) {
          const auto k = wrap(d, rank);
          if (!k || seen[*k]) {
            want = Outcome::error;
            break;
          }
          seen[*k] = true;
          w.push_back(*k);
        }
        Shape out;
        if (want == Outcome::shape)
          for (auto k : w) out.push_back(xs[k]);
        auto r = judge("permute", want, out, dt, [&] { return tg::permute(x, dims); });
        if (!r) return std::nullopt;
        return view(s, *r, [w](const Shape& at) {
          Shape src(at.size());
          for (std::size_t i = 0; i < w.size(); ++i) src[w[i]] = at[i];
          return src;
        });
      }
      case 3: {  // transpose
        const std::int64_t d0 = in.flag() ? index() : in.in<std::int64_t>(-rank, std::max<std::int64_t>(rank - 1, 0));
        const std::int64_t d1 = in.flag() ? index() : in.in<std::int64_t>(-rank, std::max<std::int64_t>(rank - 1, 0));
        const auto a = wrap(d0, rank), b = wrap(d1, rank);
        Shape out = xs;
        if (a && b) std::swap(out[*a], out[*b]);
        auto r = judge("transpose", a && b ? Outcome::shape : Outcome::error, out, dt, [&] { return tg::transpose(x, d0, d1); });
        if (!r) return std::nullopt;
        return view(s, *r, [a = *a, b = *b](Shape at) {
          std::swap(at[a], at[b]);
          return at;
        });
      }
      case 4:
      case 5: {  // slice
        const std::int64_t dim = in.flag() ? index() : in.in<std::int64_t>(0, std::max<std::int64_t>(rank - 1, 0));
        const std::int64_t start = index(), end = in.flag() ? index() : size(), step = in.flag() ? in.in<std::int64_t>(-1, 4) : size();
        const auto d = wrap(dim, rank);
        Shape out = xs;
        std::int64_t first = 0;
        if (d) {
          const std::int64_t len = xs[*d];
          auto clamp = [len](std::int64_t i) { return std::clamp(i < 0 ? i + len : i, std::int64_t{0}, len); };
          first = clamp(start);
          const std::int64_t last = std::max(clamp(end), first);
          out[*d] = step < 1 || last == first ? 0 : 1 + (last - first - 1) / step;
        }
        auto r = judge("slice", d && step >= 1 ? Outcome::shape : Outcome::error, out, dt, [&] { return tg::slice(x, dim, start, end, step); });
        if (!r) return std::nullopt;
        return view(s, *r, [d = *d, first, step](Shape at) {
          at[d] = first + at[d] * step;
          return at;
        });
      }
      case 6: {  // narrow
        const std::int64_t dim = in.flag() ? index() : in.in<std::int64_t>(0, std::max<std::int64_t>(rank - 1, 0));
        const std::int64_t start = in.flag() ? index() : in.in<std::int64_t>(0, 4), length = in.flag() ? size() : in.in<std::int64_t>(0, 4);
        const auto d = wrap(dim, rank);
        const bool ok = d && start >= 0 && length >= 0 && start <= xs[*d] && length <= xs[*d] - start;
        Shape out = xs;
        if (ok) out[*d] = length;
        auto r = judge("narrow", ok ? Outcome::shape : Outcome::error, out, dt, [&] { return tg::narrow(x, dim, start, length); });
        if (!r) return std::nullopt;
        return view(s, *r, [d = *d, start](Shape at) {
          at[d] += start;
          return at;
        });
      }
      case 7: {  // select
        const std::int64_t dim = in.flag() ? index() : in.in<std::int64_t>(0, std::max<std::int64_t>(rank - 1, 0));
        const std::int64_t index_ = in.flag() ? index() : in.in<std::int64_t>(-3, 3);
        const auto d = wrap(dim, rank);
        const bool ok = d && index_ >= -xs[*d] && index_ < xs[*d];
        Shape out = xs;
        if (d) out.erase(out.begin() + static_cast<std::ptrdiff_t>(*d));
        auto r = judge("select", ok ? Outcome::shape : Outcome::error, out, dt, [&] { return tg::select(x, dim, index_); });
        if (!r) return std::nullopt;
        const std::int64_t at_index = index_ < 0 ? index_ + xs[*d] : index_;
        return view(s, *r, [d = *d, at_index](Shape at) {
          at.insert(at.begin() + static_cast<std::ptrdiff_t>(d), at_index);
          return at;
        });
      }
      case 8: {  // expand
        const auto lead = in.in<std::size_t>(0, 2);
        Shape to(lead + xs.size());
        for (std::size_t i = 0; i < to.size(); ++i) {
          const std::int64_t have = i < lead ? 1 : xs[i - lead];
          const int k = in.in(0, 3);
          to[i] = k == 0 ? -1 : k == 1 && have != 1 ? have : size();
        }
        if (in.in(0, 7) == 0 && !to.empty()) to.erase(to.begin());
        Shape out = to;
        bool ok = to.size() >= xs.size();
        const std::size_t lead_ = ok ? to.size() - xs.size() : 0;
        for (std::size_t i = 0; ok && i < to.size(); ++i) {
          const std::int64_t have = i < lead_ ? 1 : xs[i - lead_];
          out[i] = to[i] == -1 && i >= lead_ ? have : to[i];
          ok = out[i] >= 0 && (have == out[i] || have == 1);
        }
        ok = ok && addressable(out, dt);
        auto r = judge("expand", ok ? Outcome::shape : Outcome::error, out, dt, [&] { return tg::expand(x, to); });
        if (!r) return std::nullopt;
        return view(s, *r, [xs, lead_](const Shape& at) {
          Shape src(xs.size());
          for (std::size_t i = 0; i < xs.size(); ++i) src[i] = xs[i] == 1 ? 0 : at[i + lead_];
          return src;
        });
      }
      case 9: {  // squeeze, unsqueeze
        const bool un = in.flag();
        const std::int64_t dim = in.flag() ? index() : in.in<std::int64_t>(-rank - 1, rank);
        const auto d = wrap(dim, rank + (un ? 1 : 0));
        Shape out = xs;
        bool ok = d.has_value();
        if (ok && un) out.insert(out.begin() + static_cast<std::ptrdiff_t>(*d), 1);
        if (ok && !un) {
          ok = xs[*d] == 1;
          out.erase(out.begin() + static_cast<std::ptrdiff_t>(*d));
        }
        auto r = judge(un ? "unsqueeze" : "squeeze", ok ? Outcome::shape : Outcome::error, out, dt,
                       [&] { return un ? tg::unsqueeze(x, dim) : tg::squeeze(x, dim); });
        if (!r) return std::nullopt;
        return view(s, *r, [d = *d, un](Shape at) {
          if (un) at.erase(at.begin() + static_cast<std::ptrdiff_t>(d));
          else at.insert(at.begin() + static_cast<std::ptrdiff_t>(d), 0);
          return at;
        });
      }
      case 10: return join(s);
      case 11: return reduce(s);
      default: return matmul(s);
    }
  }

  // concat or stack of x with one or two other operands.
  std::optional<State> join(const State& s) {
    const bool stacking = in.flag();
    const Shape xs = s.x.shape();
    const auto rank = static_cast<std::int64_t>(xs.size());
    const std::int64_t dim = in.flag() ? index() : in.in<std::int64_t>(-rank - 1, rank);
    const auto others = in.in(1, 2);
    std::vector<State> parts{s};
    for (int i = 0; i < others; ++i) {
      Shape os = xs;
      const int k = in.in(0, 7);
      if (k == 0) os = shape();
      else if (!stacking && !os.empty()) os[static_cast<std::size_t>(std::clamp<std::int64_t>(dim < 0 ? dim + rank : dim, 0, rank - 1))] = size();
      const tg::DType odt = in.in(0, 7) == 0 ? dtype() : s.x.dtype();
      auto o = operand(os, odt, 5000.0 * (i + 1));
      if (!o) return std::nullopt;
      parts.insert(parts.begin() + in.in<std::ptrdiff_t>(0, static_cast<std::ptrdiff_t>(parts.size())), *o);
    }
    const Tensor& first = parts[0].x;
    const auto r0 = static_cast<std::int64_t>(first.dim());
    const std::int64_t join_rank = stacking ? r0 + 1 : r0;
    bool ok = r0 >= 0 && join_rank > 0 && dim >= -join_rank && dim < join_rank;
    const std::size_t d = ok ? static_cast<std::size_t>(dim < 0 ? dim + join_rank : dim) : 0;
    Shape out = first.shape();
    if (stacking) out.insert(out.begin() + static_cast<std::ptrdiff_t>(ok ? d : 0), 0);
    __int128 total = 0;
    std::vector<std::int64_t> starts;
    for (const auto& p : parts) {
      ok = ok && p.x.dtype() == first.dtype() && p.x.dim() == first.dim();
      for (std::int64_t k = 0; ok && k < r0; ++k)
        ok = (stacking ? true : static_cast<std::size_t>(k) == d) || p.x.size(k) == first.size(k);
      if (stacking) ok = ok && p.x.shape() == first.shape();
      starts.push_back(static_cast<std::int64_t>(total));
      total += stacking ? 1 : (ok ? p.x.size(static_cast<std::int64_t>(d)) : 0);
    }
    ok = ok && total <= kMax;
    if (ok) out[d] = static_cast<std::int64_t>(total);
    ok = ok && addressable(out, first.dtype());
    const Outcome want = !ok ? Outcome::error : numel_of(out) <= kSmall ? Outcome::shape : Outcome::skip;
    std::vector<Tensor> ts;
    for (const auto& p : parts) ts.push_back(p.x);
    auto r = judge(stacking ? "stack" : "concat", want, out, first.dtype(), [&] { return stacking ? tg::stack(ts, dim) : tg::concat(ts, dim); });
    if (!r) return std::nullopt;
    // Element at index `at` comes from the part whose range along d holds at[d].
    auto source = [parts, starts, d, stacking, out](std::int64_t i) {
      Shape at = unravel(i, out);
      std::size_t p = starts.size() - 1;
      while (starts[p] > at[d]) --p;
      at[d] -= starts[p];
      if (stacking) at.erase(at.begin() + static_cast<std::ptrdiff_t>(d));
      return std::pair{p, ravel(at, parts[p].x.shape())};
    };
    State next{*r, {}, {}, s.small};
    if (s.value)
      next.value = [parts, source](std::int64_t i) {
        auto [p, j] = source(i);
        return parts[p].value(j);
      };
    if (s.leaf)
      next.leaf = [parts, source](std::int64_t i) {
        auto [p, j] = source(i);
        return parts[p].leaf ? parts[p].leaf(j) : -1;
      };
    return next;
  }

  // sum, mean or max over some dims.
  std::optional<State> reduce(const State& s) {
    const Tensor& x = s.x;
    const Shape xs = x.shape();
    const auto rank = static_cast<std::int64_t>(xs.size());
    std::vector<std::int64_t> dims(in.in<std::size_t>(0, 3));
    for (auto& d : dims) d = in.flag() ? index() : in.in<std::int64_t>(-rank, std::max<std::int64_t>(rank - 1, 0));
    const bool keepdim = in.flag();
    const int which = in.in(0, 2);
    bool ok = tg::is_floating(x.dtype());
    std::vector<bool> reduced(xs.size(), dims.empty());
    for (auto d : dims) {
      const bool in_range = rank > 0 && d >= -rank && d < rank;
      const auto k = static_cast<std::size_t>(in_range ? (d < 0 ? d + rank : d) : 0);
      ok = ok && in_range && !reduced[k];
      if (ok) reduced[k] = true;
    }
    Shape out, kept = xs;
    std::int64_t count = 1;
    for (std::size_t k = 0; k < xs.size(); ++k) {
      if (reduced[k]) count *= xs[k], kept[k] = 1;
      if (!reduced[k] || keepdim) out.push_back(kept[k]);
    }
    if (ok && which == 2 && count == 0 && numel_of(kept) > 0) ok = false;  // the max of nothing
    const Outcome want = !ok ? Outcome::error : x.numel() <= kMaxWork && numel_of(out) <= kSmall ? Outcome::shape : Outcome::skip;
    static constexpr const char* kNames[] = {"sum", "mean", "max"};
    auto r = judge(kNames[which], want, out, x.dtype(), [&] {
      return which == 0 ? tg::sum(x, dims, keepdim) : which == 1 ? tg::mean(x, dims, keepdim) : tg::max(x, dims, keepdim);
    });
    if (!r || !s.value) return r ? std::optional<State>(State{*r, {}, {}, s.small}) : std::nullopt;
    // The folds, in double, then rounded to the dtype as the library documents (sums accumulate
    // in double; mean divides the rounded sum by the count in the tensor's dtype).
    std::vector<double> acc(static_cast<std::size_t>(numel_of(kept)), which == 2 ? -INFINITY : 0.0);
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      Shape at = unravel(i, xs);
      for (std::size_t k = 0; k < at.size(); ++k)
        if (reduced[k]) at[k] = 0;
      double& a = acc[static_cast<std::size_t>(ravel(at, kept))];
      const double v = s.value(i);
      a = which == 2 ? (std::isnan(a) || a >= v ? a : v) : a + v;
    }
    const bool f32 = x.dtype() == tg::float32;
    for (auto& a : acc) {
      if (f32) a = static_cast<float>(a);
      if (which == 1) a = f32 ? static_cast<double>(static_cast<float>(a) / static_cast<float>(count)) : a / static_cast<double>(count);
    }
    return State{*r, [acc](std::int64_t i) { return acc[static_cast<std::size_t>(i)]; }, {}, s.small};
  }

  std::optional<State> matmul(const State& s) {
    const Tensor& a = s.x;
    const Shape as = a.shape();
    Shape bs = shape(4);
    if (in.in(0, 3) != 0 && as.size() >= 2 && bs.size() >= 2) bs[bs.size() - 2] = as.back();  // usually the inner dims agree
    const tg::DType bdt = in.in(0, 7) == 0 ? dtype() : a.dtype();
    const bool bf16 = in.in(0, 3) == 0;
    auto b = operand(bs, bdt, 0.0);
    if (!b) return std::nullopt;
    bool ok = tg::is_floating(a.dtype()) && a.dtype() == bdt && as.size() >= 2 && bs.size() >= 2 && (!bf16 || bdt == tg::float32);
    ok = ok && as.back() == bs[bs.size() - 2];
    Shape out;
    if (ok) {
      const std::size_t r = std::max(as.size(), bs.size());
      for (std::size_t i = 0; ok && i + 2 < r; ++i) {
        const std::int64_t p = i + as.size() >= r ? as[i + as.size() - r] : 1, q = i + bs.size() >= r ? bs[i + bs.size() - r] : 1;
        ok = p == q || p == 1 || q == 1;
        out.push_back(p == 1 ? q : p);
      }
      out.push_back(as[as.size() - 2]);
      out.push_back(bs.back());
      ok = ok && addressable(out, a.dtype());
    }
    const std::int64_t k = ok ? as.back() : 0;
    const bool cheap = !ok || numel_of(out) == 0 || (numel_of(out) <= kSmall && a.numel() <= kMaxWork && numel_of(out) * k <= kMaxWork);
    narrate("matmul of a {} (strides {}) and b {} {}{}", as, a.strides(), bs, bdt, bf16 ? " in bfloat16" : "");
    auto r = judge("matmul", !ok ? Outcome::error : cheap ? Outcome::shape : Outcome::skip, out, a.dtype(), [&] {
      return tg::matmul(a, b->x, bf16 ? tg::MatmulPrecision::bfloat16 : tg::MatmulPrecision::exact);
    });
    if (!r) return std::nullopt;
    State next{*r, {}, {}, s.small};
    if (a.dtype() == tg::float64 && s.value) {  // integer values: exact in float64 whatever the order of the sums
      next.value = [=, av = s.value, bv = b->value](std::int64_t i) {
        const Shape at = unravel(i, out);
        Shape ia(as.size()), ib(bs.size());
        for (std::size_t d = 0; d + 2 < as.size(); ++d) ia[d] = as[d] == 1 ? 0 : at[d + out.size() - as.size()];
        for (std::size_t d = 0; d + 2 < bs.size(); ++d) ib[d] = bs[d] == 1 ? 0 : at[d + out.size() - bs.size()];
        ia[as.size() - 2] = at[out.size() - 2];
        ib[bs.size() - 1] = at[out.size() - 1];
        double sum = 0;
        for (std::int64_t j = 0; j < k; ++j) {
          ia[as.size() - 1] = j;
          ib[bs.size() - 2] = j;
          sum += av(ravel(ia, as)) * bv(ravel(ib, bs));
        }
        return sum;
      };
      check_values("matmul", *r, next.value);
    }
    return next;
  }

  // A leaf of a random shape (values 0, 1, 2...; zero-size when huge), or an expanded view of
  // a small leaf when the shape has too many elements; then up to four ops, and a backward.
  void chain() {
    Shape s0 = shape();
    const tg::DType dt = dtype();
    if (!addressable(s0, dt)) {
      expect_error<tg::ShapeError>("zeros", [&] { tg::zeros(s0, dt); });
      return;
    }
    Shape small = s0;
    if (numel_of(s0) > kSmall)
      for (auto& d : small) d = std::min<std::int64_t>(d, 1);
    auto leaf_state = operand(small, dt, 0.0);
    Tensor leaf = leaf_state->x;
    if (tg::is_floating(dt) && in.flag()) leaf.set_requires_grad();
    State s{leaf, leaf_state->value, [](std::int64_t i) { return i; }, numel_of(small) <= kMaxWork};
    if (small != s0) {
      auto r = judge("expand", Outcome::shape, s0, dt, [&] { return tg::expand(leaf, s0); });
      s = view(s, *r, [small](const Shape& at) {
        Shape src(small.size());
        for (std::size_t i = 0; i < small.size(); ++i) src[i] = small[i] == 1 ? 0 : at[i];
        return src;
      });
    }
    const int ops = in.in(1, 4);
    for (int i = 0; i < ops; ++i) {
      auto next = step(s);
      if (!next) return;
      s = std::move(*next);
      check_values("chain", s.x, s.value);
    }
    if (!s.small || !s.x.requires_grad() || s.x.numel() > kSmall) return;
    tg::backward({s.x}, {tg::ones_like(s.x)});
    const Tensor g = leaf.grad();
    require(g.defined() && g.shape() == leaf.shape(), "the leaf's gradient has shape {}, expected {}", g.defined() ? g.shape() : Shape{}, leaf.shape());
    if (!s.leaf) return;
    std::vector<double> count(static_cast<std::size_t>(leaf.numel()), 0.0);
    for (std::int64_t i = 0; i < s.x.numel(); ++i)
      if (const std::int64_t j = s.leaf(i); j >= 0) count[static_cast<std::size_t>(j)] += 1;
    require(same_values(values(g), count), "the leaf's gradient {} differs from the view counts {}", values(g), count);
  }

  // 8 for attention (the seeds were written when the choice was 0-7: they keep their meaning).
  void run() {
    switch (in.in(0, 8)) {
      case 0: return factories();
      case 1: return arange();
      case 2: return causal_mask();
      case 3: return broadcast_shapes();
      case 8: return attention();
      default: return chain();
    }
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return run_one(data, size, [](Input& in) { Fuzzer{in}.run(); });
}
