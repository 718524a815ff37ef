// libFuzzer target: bytes become calls of masked_softmax, scaled_dot_product_attention,
// multihead_attention and matmul with arbitrary ranks, shapes, dtypes, masks, offsets and values
// (±inf and NaN included), forward and backward.
//
// The contract checked: a call either throws a tapegrad::Error (a documented argument error) or
// returns; when every input is finite and moderate (|x| <= 1e3; any finite scores for
// masked_softmax), every output and gradient is finite. Anything else - another exception, a
// crash, a sanitizer report, a hang - is a finding.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include <fuzzer/FuzzedDataProvider.h>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Shape;
using tg::Tensor;

namespace {

struct Input {
  FuzzedDataProvider& fdp;

  double value() {
    static constexpr double kSpecial[] = {0.0, 1.0, -1.0, 0.5, 1e4, -1e4, 1e6, -1e6, 1.7e38, -1.7e38, 1e300, -1e300,
                                          INFINITY, -INFINITY, NAN};
    return fdp.ConsumeBool() ? kSpecial[fdp.ConsumeIntegralInRange<std::size_t>(0, std::size(kSpecial) - 1)]
                             : fdp.ConsumeFloatingPointInRange<double>(-8.0, 8.0);
  }

  Shape shape(std::size_t min_rank, std::size_t max_rank, std::int64_t max_dim = 4) {
    Shape s(fdp.ConsumeIntegralInRange<std::size_t>(min_rank, max_rank));
    for (auto& d : s) d = fdp.ConsumeIntegralInRange<std::int64_t>(0, max_dim);
    return s;
  }

  tg::DType float_dtype() {
    // Mostly floating; sometimes another dtype to reach the dtype checks.
    switch (fdp.ConsumeIntegralInRange<int>(0, 9)) {
      case 0: return tg::int64;
      case 1: return tg::bool_;
      case 2:
      case 3:
      case 4: return tg::float32;
      default: return tg::float64;
    }
  }

  Tensor tensor(const Shape& s, tg::DType dtype) {
    std::int64_t n = 1;
    for (auto d : s) n *= d;
    std::vector<double> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(value());
    Tensor t = tg::from_vector(v, s).to(dtype);
    if (tg::is_floating(dtype) && fdp.ConsumeBool()) t.set_requires_grad();
    // Sometimes a transposed view of the same values.
    if (t.dim() >= 2 && fdp.ConsumeBool()) t = tg::transpose(tg::contiguous(tg::transpose(t.detach(), 0, -1)), 0, -1).set_requires_grad(t.requires_grad());
    return t;
  }

  Tensor mask(const Shape& s) {
    if (fdp.ConsumeBool()) return Tensor();
    std::int64_t n = 1;
    for (auto d : s) n *= d;
    std::vector<bool> v;
    for (std::int64_t i = 0; i < n; ++i) v.push_back(fdp.ConsumeBool());
    return tg::from_bools(v, s);
  }

  // Usually a shape that fits the op; sometimes a random one, for the shape checks.
  Shape maybe(Shape fitting) { return fdp.ConsumeIntegralInRange<int>(0, 7) == 0 ? shape(0, 4) : fitting; }
};

// Aborts (a finding) with the op and every input printed.
void require_finite(const Tensor& t, const char* what, const char* op, const std::vector<Tensor>& inputs) {
  if (!t.defined()) return;
  for (double v : t.to_vector<double>())
    if (!std::isfinite(v)) {
      std::fprintf(stderr, "%s: non-finite %s from finite inputs\n%s\n", op, what, tg::to_string(t).c_str());
      for (const auto& x : inputs)
        if (x.defined()) std::fprintf(stderr, "input %s\n", tg::to_string(x).c_str());
      std::abort();
    }
}

// Whether every floating input holds only finite values of magnitude <= limit (as stored, after
// conversion to the input's dtype).
bool inputs_within(const std::vector<Tensor>& inputs, double limit) {
  for (const auto& x : inputs)
    if (x.defined() && tg::is_floating(x.dtype()))
      for (double v : x.to_vector<double>())
        if (!(std::abs(v) <= limit)) return false;
  return true;
}

void run(Input& in) {
  std::vector<Tensor> outputs, leaves;
  bool check = false;
  const char* op = "?";
  switch (in.fdp.ConsumeIntegralInRange<int>(0, 3)) {
    case 0: {
      op = "masked_softmax";
      const Shape s = in.shape(0, 4);
      const Tensor scores = in.tensor(s, in.float_dtype());
      leaves = {scores};
      outputs = {tg::masked_softmax(scores, in.mask(in.maybe(Shape(s.end() - std::min<std::size_t>(s.size(), 2), s.end()))))};
      check = inputs_within(leaves, std::numeric_limits<double>::max());
      break;
    }
    case 1: {
      op = "scaled_dot_product_attention";
      const Shape lead = in.shape(0, 2, 3);
      const std::int64_t q = in.fdp.ConsumeIntegralInRange<std::int64_t>(0, 5), k = in.fdp.ConsumeIntegralInRange<std::int64_t>(0, 5),
                         d = in.fdp.ConsumeIntegralInRange<std::int64_t>(0, 4), dv = in.fdp.ConsumeIntegralInRange<std::int64_t>(0, 4);
      auto with = [&](std::int64_t a, std::int64_t b) { Shape s = lead; s.push_back(a); s.push_back(b); return in.maybe(s); };
      const tg::DType dt = in.float_dtype();
      leaves = {in.tensor(with(q, d), dt), in.tensor(with(k, d), dt), in.tensor(with(k, dv), dt)};
      const Tensor mask = in.fdp.ConsumeBool() ? tg::causal_mask(q, k, in.fdp.ConsumeIntegralInRange<std::int64_t>(-6, 6)) : in.mask(in.maybe({q, k}));
      auto [o, w] = tg::scaled_dot_product_attention(leaves[0], leaves[1], leaves[2], mask);
      outputs = {o, w};
      check = inputs_within(leaves, 1e3);
      break;
    }
    case 2: {
      op = "multihead_attention";
      auto dim = [&](std::int64_t lo, std::int64_t hi) { return in.fdp.ConsumeIntegralInRange<std::int64_t>(lo, hi); };
      const std::int64_t b = dim(0, 2), q = dim(0, 4), k = dim(0, 4), h = dim(0, 3), d = dim(0, 3), dv = dim(0, 3), cq = dim(1, 3),
                         cc = dim(1, 3), co = dim(1, 3);
      const tg::DType dt = in.float_dtype();
      const std::int64_t hh = std::max<std::int64_t>(h, 1);
      tg::MhaActivations act{in.tensor(in.maybe({b, q, cq}), dt), in.tensor(in.maybe({b, k, cc}), dt)};
      if (in.fdp.ConsumeBool()) act.bias = in.tensor(in.maybe({1, hh, q, k}), dt);
      tg::MhaParameters p{in.tensor(in.maybe({cq, hh * d}), dt), in.tensor(in.maybe({cc, hh * d}), dt),
                          in.tensor(in.maybe({cc, hh * dv}), dt), in.tensor(in.maybe({hh * dv, co}), dt)};
      if (in.fdp.ConsumeBool()) p.b_o = in.tensor(in.maybe({co}), dt);
      if (in.fdp.ConsumeBool()) p.b_q = in.tensor(in.maybe({hh * d}), dt);
      tg::MhaMasks m{in.mask(in.maybe({b, k})), in.mask(in.maybe({b, q})), in.mask(in.maybe({hh, q, k}))};
      leaves = {act.query, act.context, act.bias, p.w_q, p.w_k, p.w_v, p.w_o, p.b_o, p.b_q};
      auto [o, w] = tg::multihead_attention(act, p, m, h, in.fdp.ConsumeBool(), dim(-6, 6));
      outputs = {o, w};
      check = inputs_within(leaves, 1e3);
      break;
    }
    default: {
      op = "matmul";
      const Shape sa = in.shape(0, 4), sb = in.shape(0, 4);
      const tg::DType dt = in.float_dtype();
      leaves = {in.tensor(sa, dt), in.tensor(sb, in.fdp.ConsumeIntegralInRange<int>(0, 15) == 0 ? in.float_dtype() : dt)};
      outputs = {tg::matmul(leaves[0], leaves[1], in.fdp.ConsumeBool() ? tg::MatmulPrecision::exact : tg::MatmulPrecision::bfloat16)};
      check = inputs_within(leaves, 1e3);
      break;
    }
  }
  if (check)
    for (const auto& o : outputs) require_finite(o, "output", op, leaves);
  std::vector<Tensor> recorded, grads;
  for (const auto& o : outputs)
    if (o.defined() && o.requires_grad()) {
      recorded.push_back(o);
      grads.push_back(tg::ones_like(o));
    }
  if (recorded.empty()) return;
  tg::backward(recorded, grads);
  if (check)
    for (const auto& l : leaves)
      if (l.defined() && l.requires_grad()) require_finite(l.grad(), "gradient", op, leaves);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzedDataProvider fdp(data, size);
  Input in{fdp};
  try {
    run(in);
  } catch (const tg::Error&) {
    // A documented argument error: the expected outcome for bad input.
  }
  tg::clear_tape();
  return 0;
}
