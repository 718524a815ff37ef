// Comparisons and boolean logic. Results are bool tensors and are never recorded on the tape.
#include "ops/op.hpp"
#include "tapegrad/ops/compare.hpp"

namespace tapegrad {
namespace {
using namespace detail;

template <class F> Tensor compare(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_same_dtype(op, a, b);
  Tensor out = new_tensor(broadcast_args(op, "a", a.shape(), "b", b.shape()), DType::bool_, op);
  visit_any(a.dtype(), [&]<class T>(Tag<T>) { map_into<bool, T, T>(out, f, a, b); });
  return out;
}

template <class F> Tensor logic(const char* op, const Tensor& a, const Tensor& b, F f) {
  check_dtype(op, "a", a, DType::bool_);
  check_dtype(op, "b", b, DType::bool_);
  return compare(op, a, b, f);
}

template <class F> bool reduce_bool(const char* op, const Tensor& a, bool start, F f) {
  check_dtype(op, "a", a, DType::bool_);
  bool acc = start;
  StridedLoop<1> loop(a.shape().data(), a.shape().size(), {a.strides().data()});
  const bool* p = static_cast<const bool*>(a.raw_data());
  loop.for_each_run([&](auto off, std::int64_t n, auto inner) {
    for (std::int64_t i = 0; i < n; ++i) acc = f(acc, p[off[0] + i * inner[0]]);
  });
  return acc;
}

}  // namespace

Tensor eq(const Tensor& a, const Tensor& b) { return compare("eq", a, b, [](auto x, auto y) { return x == y; }); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare("ne", a, b, [](auto x, auto y) { return x != y; }); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare("lt", a, b, [](auto x, auto y) { return x < y; }); }
Tensor le(const Tensor& a, const Tensor& b) { return compare("le", a, b, [](auto x, auto y) { return x <= y; }); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare("gt", a, b, [](auto x, auto y) { return x > y; }); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare("ge", a, b, [](auto x, auto y) { return x >= y; }); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return logic("logical_and", a, b, [](bool x, bool y) { return x && y; }); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logic("logical_or", a, b, [](bool x, bool y) { return x || y; }); }
Tensor logical_not(const Tensor& a) {
  check_dtype("logical_not", "a", a, DType::bool_);
  Tensor out = new_tensor(a.shape(), DType::bool_, "logical_not");
  map_into<bool, bool>(out, [](bool x) { return !x; }, a);
  return out;
}
bool any(const Tensor& a) { return reduce_bool("any", a, false, [](bool acc, bool v) { return acc || v; }); }
bool all(const Tensor& a) { return reduce_bool("all", a, true, [](bool acc, bool v) { return acc && v; }); }

}  // namespace tapegrad
