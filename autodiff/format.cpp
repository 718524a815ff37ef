// Human-readable rendering of a tensor, numpy style.
#include <string>

#include "autodiff/loops.hpp"

namespace tapegrad {
namespace {

constexpr std::int64_t kSummariseAbove = 1000;
constexpr std::int64_t kEdgeItems = 3;

struct Printer {
  const Tensor& t;
  bool summarise;
  std::string out;

  void element(std::int64_t offset) {
    detail::visit_any(t.dtype(), [&]<class T>(detail::Tag<T>) {
      const T v = static_cast<const T*>(t.raw_data())[offset];
      if constexpr (std::is_same_v<T, bool>) out += v ? "True" : "False";
      else if constexpr (std::is_same_v<T, std::int64_t>) out += fmt::format("{}", v);
      else out += fmt::format("{:.6g}", v);
    });
  }

  void separator(std::size_t d) { out += d + 1 < t.shape().size() ? ",\n" + std::string(d + 1, ' ') : ", "; }

  void level(std::size_t d, std::int64_t offset) {
    if (d == t.shape().size()) return element(offset);
    const std::int64_t n = t.shape()[d];
    const bool cut = summarise && n > 2 * kEdgeItems;
    out += '[';
    for (std::int64_t i = 0; i < n; ++i) {
      if (i > 0) separator(d);
      if (cut && i == kEdgeItems) {
        out += "...";
        separator(d);
        i = n - kEdgeItems;
      }
      level(d + 1, offset + i * t.strides()[d]);
    }
    out += ']';
  }
};

}  // namespace

std::string to_string(const Tensor& t) {
  if (!t.defined()) return "tensor(undefined)";
  // A zero-size tensor is summarised too: [2^40, 0] has no element but 2^40 empty rows.
  Printer p{t, t.numel() > kSummariseAbove || t.numel() == 0, {}};
  p.out = fmt::format("tensor(shape={}, dtype={}{})\n", detail::shape_str(t.shape()), t.dtype(),
                      t.requires_grad() ? ", requires_grad" : "");
  p.level(0, 0);
  return p.out;
}

}  // namespace tapegrad
