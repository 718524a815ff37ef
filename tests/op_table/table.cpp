// The op table's registry: the argument collector, the deterministic patterns, and the table
// itself, made of the family files' entries (op_table/*.cpp).
#include <stdexcept>

#include "op_table/common.hpp"

namespace tg_test {
namespace tg = tapegrad;
using tg::Shape;
using tg::Tensor;

namespace {
thread_local ArgCollector* collector = nullptr;
thread_local ArgLayout::Kind arg_layout = ArgLayout::as_made;
}  // namespace

Tensor relaid(const Tensor& t, ArgLayout::Kind kind) {
  tg::NoGradGuard no_grad;
  if (kind == ArgLayout::transposed && t.dim() >= 2) {
    std::vector<std::int64_t> rev;
    for (auto d = t.dim() - 1; d >= 0; --d) rev.push_back(d);
    return tg::permute(tg::contiguous(tg::permute(t, rev)), rev);
  }
  Shape wide = t.shape();
  wide.push_back(2);
  const Tensor view = tg::select(tg::zeros(wide, t.dtype()), -1, 0);
  tg::copy_(view, t);
  return view;
}

ArgCollector::ArgCollector() : previous_(collector) { collector = this; }
ArgCollector::~ArgCollector() { collector = previous_; }
ArgLayout::ArgLayout(Kind kind) : previous_(arg_layout) { arg_layout = kind; }
ArgLayout::~ArgLayout() { arg_layout = previous_; }

Tensor arg(Tensor t) {
  if (arg_layout != ArgLayout::as_made && t.defined() && t.dim() >= 1 && (t.dtype() == tg::bool_ || t.dtype() == tg::int64))
    t = relaid(t, arg_layout);
  if (collector != nullptr) collector->args.push_back(t);
  return t;
}

bool pattern_value(std::int64_t flat) { return (flat * 7) % 3 != 0; }

Tensor pattern_mask(const Shape& shape) {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<bool> v;
  for (std::int64_t i = 0; i < n; ++i) v.push_back(pattern_value(i));
  return arg(tg::from_bools(v, shape));
}

std::int64_t pattern_id(std::int64_t flat, std::int64_t n) { return (flat * 5 + 2) % n; }

Tensor pattern_ids(const Shape& shape, std::int64_t n) {
  std::int64_t count = 1;
  for (auto s : shape) count *= s;
  std::vector<std::int64_t> v;
  for (std::int64_t i = 0; i < count; ++i) v.push_back(pattern_id(i, n));
  return arg(tg::from_vector(std::span<const std::int64_t>(v), shape));
}

namespace {

// Functions, not globals: Boost.Test builds the table while registering data test cases, during
// static initialisation, when another file's globals may not exist yet.
std::vector<OpInfo> build() {
  std::vector<OpInfo> t;
  for (auto add : {table::add_elementwise, table::add_reductions, table::add_views, table::add_softmax, table::add_attention,
                   table::add_matmul, table::add_indexing, table::add_losses, table::add_normalization, table::add_rotary,
                   table::add_attention_paths})
    add(t);
  return t;
}

}  // namespace

const std::vector<OpInfo>& op_table() {
  static const std::vector<OpInfo> table = build();
  return table;
}

std::vector<std::string> op_names() {
  std::vector<std::string> names;
  for (const auto& op : op_table()) names.push_back(op.name);
  return names;
}

const OpInfo& find_op(const std::string& name) {
  for (const auto& op : op_table())
    if (op.name == name) return op;
  throw std::logic_error("no op named " + name);
}

}  // namespace tg_test
