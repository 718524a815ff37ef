#include "reference.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

namespace tg_test {

std::int64_t Ref::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

std::vector<std::int64_t> Ref::unravel(std::int64_t flat) const {
  std::vector<std::int64_t> index(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

std::int64_t Ref::ravel(const std::vector<std::int64_t>& index) const {
  std::int64_t flat = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

double Ref::at_broadcast(const std::vector<std::int64_t>& index) const {
  const std::size_t lead = index.size() - shape.size();
  std::vector<std::int64_t> own(shape.size());
  for (std::size_t d = 0; d < shape.size(); ++d) own[d] = shape[d] == 1 ? 0 : index[lead + d];
  return v[static_cast<std::size_t>(ravel(own))];
}

tapegrad::Shape ref_broadcast(const tapegrad::Shape& a, const tapegrad::Shape& b) {
  const std::size_t n = std::max(a.size(), b.size());
  tapegrad::Shape out(n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::int64_t x = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const std::int64_t y = i < n - b.size() ? 1 : b[i - (n - b.size())];
    if (x != y && x != 1 && y != 1) throw std::logic_error("reference: shapes do not broadcast");
    out[i] = x == 1 ? y : x;
  }
  return out;
}

Ref ref_map(const std::vector<Ref>& in, const std::function<double(const std::vector<double>&)>& f) {
  Ref out;
  for (const auto& r : in) out.shape = ref_broadcast(out.shape, r.shape);
  out.v.resize(static_cast<std::size_t>(out.numel()));
  std::vector<double> args(in.size());
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    const auto index = out.unravel(i);
    for (std::size_t k = 0; k < in.size(); ++k) args[k] = in[k].at_broadcast(index);
    out.v[static_cast<std::size_t>(i)] = f(args);
  }
  return out;
}

Ref ref_reduce(const Ref& in, std::vector<std::int64_t> dims, bool keepdim,
               const std::function<double(const std::vector<double>&)>& f) {
  const auto rank = static_cast<std::int64_t>(in.shape.size());
  std::vector<bool> reduced(in.shape.size(), dims.empty());
  for (auto d : dims) reduced[static_cast<std::size_t>(d < 0 ? d + rank : d)] = true;
  Ref kept{in.shape, {}};
  for (std::size_t d = 0; d < kept.shape.size(); ++d)
    if (reduced[d]) kept.shape[d] = 1;
  std::vector<std::vector<double>> groups(static_cast<std::size_t>(kept.numel()));
  for (std::int64_t i = 0; i < in.numel(); ++i) {
    auto index = in.unravel(i);
    for (std::size_t d = 0; d < index.size(); ++d)
      if (reduced[d]) index[d] = 0;
    groups[static_cast<std::size_t>(kept.ravel(index))].push_back(in.v[static_cast<std::size_t>(i)]);
  }
  for (const auto& g : groups) kept.v.push_back(f(g));
  if (!keepdim) {
    tapegrad::Shape s;
    for (std::size_t d = 0; d < kept.shape.size(); ++d)
      if (!reduced[d]) s.push_back(kept.shape[d]);
    kept.shape = s;
  }
  return kept;
}

Ref ref_gather(const Ref& in, const tapegrad::Shape& shape,
               const std::function<std::vector<std::int64_t>(const std::vector<std::int64_t>&)>& source) {
  Ref out{shape, {}};
  for (std::int64_t i = 0; i < out.numel(); ++i)
    out.v.push_back(in.v[static_cast<std::size_t>(in.ravel(source(out.unravel(i))))]);
  return out;
}

Ref ref_matmul(const Ref& a, const Ref& b) {
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  const std::int64_t m = a.shape[ra - 2], k = a.shape[ra - 1], n = b.shape[rb - 1];
  tapegrad::Shape batch = ref_broadcast(tapegrad::Shape(a.shape.begin(), a.shape.end() - 2),
                                        tapegrad::Shape(b.shape.begin(), b.shape.end() - 2));
  Ref out{batch, {}};
  out.shape.push_back(m);
  out.shape.push_back(n);
  out.v.assign(static_cast<std::size_t>(out.numel()), 0.0);
  for (std::int64_t i = 0; i < out.numel(); ++i) {
    auto index = out.unravel(i);
    const std::int64_t row = index[index.size() - 2], col = index.back();
    double acc = 0;
    for (std::int64_t p = 0; p < k; ++p) {
      index[index.size() - 2] = row;
      index.back() = p;
      const double x = a.at_broadcast(index);
      index[index.size() - 2] = p;
      index.back() = col;
      acc += x * b.at_broadcast(index);
    }
    out.v[static_cast<std::size_t>(i)] = acc;
  }
  return out;
}

Ref ref_take(const Ref& x, std::size_t d, const tapegrad::Shape& index_shape, const std::vector<std::int64_t>& ids) {
  const Ref index{index_shape, {}};
  tapegrad::Shape shape(x.shape.begin(), x.shape.begin() + static_cast<std::ptrdiff_t>(d));
  shape.insert(shape.end(), index_shape.begin(), index_shape.end());
  shape.insert(shape.end(), x.shape.begin() + static_cast<std::ptrdiff_t>(d) + 1, x.shape.end());
  return ref_gather(x, shape, [&](const std::vector<std::int64_t>& out) {
    const auto first = out.begin() + static_cast<std::ptrdiff_t>(d), last = first + static_cast<std::ptrdiff_t>(index_shape.size());
    std::vector<std::int64_t> in(out.begin(), first);
    in.push_back(ids[static_cast<std::size_t>(index.ravel(std::vector<std::int64_t>(first, last)))]);
    in.insert(in.end(), last, out.end());
    return in;
  });
}

Ref ref_take_along(const Ref& x, std::size_t d, const tapegrad::Shape& index_shape, const std::vector<std::int64_t>& ids) {
  const Ref index{index_shape, {}};
  return ref_gather(x, index_shape, [&](std::vector<std::int64_t> at) {
    at[d] = ids[static_cast<std::size_t>(index.ravel(at))];
    return at;
  });
}

Ref ref_argmax(const Ref& x, std::size_t d, bool keepdim) {
  Ref out{x.shape, {}};
  out.shape[d] = 1;
  out.v.assign(static_cast<std::size_t>(out.numel()), 0.0);
  std::vector<double> top(out.v.size(), -std::numeric_limits<double>::infinity());
  // Row-major order meets the positions along d in increasing order: strict > keeps the first.
  for (std::int64_t i = 0; i < x.numel(); ++i) {
    auto index = x.unravel(i);
    const std::int64_t j = index[d];
    index[d] = 0;
    const auto r = static_cast<std::size_t>(out.ravel(index));
    if (x.v[static_cast<std::size_t>(i)] > top[r]) {
      top[r] = x.v[static_cast<std::size_t>(i)];
      out.v[r] = static_cast<double>(j);
    }
  }
  if (!keepdim) out.shape.erase(out.shape.begin() + static_cast<std::ptrdiff_t>(d));
  return out;
}

}  // namespace tg_test
