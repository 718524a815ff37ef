// Helpers shared by the test suites.
#pragma once

#include <cmath>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <variant>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <fmt/ranges.h>
#include <tapegrad/tapegrad.hpp>

namespace tg_test {

using tapegrad::Shape;
using tapegrad::Tensor;

// m with ALiBi's slopes (tests that hold them beside a masking).
inline tapegrad::AttentionMasking with_slopes(tapegrad::AttentionMasking m, const Tensor& slopes) {
  m.alibi_slopes = slopes;
  return m;
}

// Checks that `call` throws exactly E (not a subclass: each kind of mistake has its own class)
// and that the message contains every fragment.
template <class E, class F>
void check_throws(F&& call, const std::vector<std::string>& fragments) {
  try {
    call();
    BOOST_ERROR("expected an exception mentioning '" << (fragments.empty() ? "" : fragments[0]) << "'");
  } catch (const E& e) {
    const std::string msg = e.what();
    BOOST_CHECK_MESSAGE(typeid(e) == typeid(E), "message '" << msg << "' came in " << typeid(e).name() << ", expected exactly "
                                                            << typeid(E).name());
    for (const auto& f : fragments)
      BOOST_CHECK_MESSAGE(msg.find(f) != std::string::npos, "message '" << msg << "' lacks '" << f << "'");
  }
}

// |a - b| <= atol + rtol |b| elementwise, reporting the first failure with its index.
inline void check_close(const std::vector<double>& a, const std::vector<double>& b, double atol, double rtol,
                        const std::string& what) {
  BOOST_REQUIRE_MESSAGE(a.size() == b.size(), what << ": sizes " << a.size() << " vs " << b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    // Both NaN, or the same infinity: +inf against -inf is a mismatch.
    const bool same_nonfinite = std::isnan(a[i]) ? std::isnan(b[i]) : std::isinf(a[i]) && a[i] == b[i];
    if (same_nonfinite) continue;
    if (!(std::abs(a[i] - b[i]) <= atol + rtol * std::abs(b[i]))) {
      BOOST_ERROR(what << ": element " << i << " is " << a[i] << ", expected " << b[i]);
      return;
    }
  }
}

inline void check_close(const Tensor& a, const std::vector<double>& expected, double atol, const std::string& what) {
  check_close(a.to_vector<double>(), expected, atol, 0.0, what);
}

// Decoding ids [1, T] through a KV cache per block, the first `first` positions in one call and
// then one at a time, gives the logits of the full forward at every step (float64 models).
inline void check_decoding_equals_forward(const tapegrad::Decoder& model, const Tensor& ids, std::int64_t first, const std::string& what) {
  namespace tg = tapegrad;
  tg::NoGradGuard no_grad;
  const Tensor full = model.forward(ids);
  std::vector<tg::KVCache> caches(model.blocks.size());
  for (std::int64_t t = 0; t < ids.size(1); t = t == 0 ? first : t + 1) {
    const std::int64_t end = t == 0 ? first : t + 1;
    Tensor x = model.tok.forward(tg::slice(ids, 1, t, end));
    std::visit([&]<class P>(const P& p) { if constexpr (!std::is_same_v<P, std::monostate>) x = p.forward(x, t); }, model.pos);
    for (std::size_t i = 0; i < model.blocks.size(); ++i) x = model.blocks[i].decode(x, caches[i]);
    check_close(model.logits(x).to_vector<double>(), tg::slice(full, 1, t, end).to_vector<double>(), 1e-12, 1e-12,
                fmt::format("{}: step at {}", what, t));
  }
}

}  // namespace tg_test
