// The problem the options describe (sizes, masks, bias shape, seeded random numbers), and which
// of its gradients the masks make exactly zero.
#include <cmath>
#include <stdexcept>

#include <fmt/format.h>

#include "attention_backprop/walkthrough.hpp"
#include "support/parse.hpp"

namespace tg = tapegrad;

namespace attention_backprop {
namespace {

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts{""};
  for (char c : s) {
    if (c == sep) parts.emplace_back();
    else parts.back().push_back(c);
  }
  return parts;
}

// "11101,11111": one group of '0'/'1' per batch entry, `width` long; "none" for no mask.
Tensor bool_rows(const std::string& text, const char* option, std::int64_t batch, std::int64_t width) {
  if (text == "none") return Tensor();
  const auto groups = split(text, ',');
  std::vector<bool> bits;
  if (static_cast<std::int64_t>(groups.size()) != batch)
    throw std::invalid_argument(fmt::format("{} '{}': expected {} comma-separated groups (one per batch entry)", option, text, batch));
  for (const auto& g : groups) {
    if (static_cast<std::int64_t>(g.size()) != width || g.find_first_not_of("01") != std::string::npos)
      throw std::invalid_argument(fmt::format("{} '{}': each group must be {} characters 0 or 1, got '{}'", option, text, width, g));
    for (char c : g) bits.push_back(c == '1');
  }
  return tg::from_bools(bits, {batch, width});
}

// "h:i" blocks query i in head h (every key), "h:i:j" blocks one pair; comma-separated.
Tensor blocked_pairs(const std::string& text, const Sizes& n) {
  if (text == "none") return Tensor();
  std::vector<bool> allowed(static_cast<std::size_t>(n.h * n.q * n.k), true);
  for (const auto& item : split(text, ',')) {
    const auto f = split(item, ':');
    std::vector<std::int64_t> v;
    try {
      for (const auto& x : f) v.push_back(tapegrad_examples::parse_int(x, "--block"));
    } catch (const std::invalid_argument&) {
      v.clear();  // reported below with the item and the rule
    }
    if ((v.size() != 2 && v.size() != 3) || v[0] < 0 || v[0] >= n.h || v[1] < 0 || v[1] >= n.q ||
        (v.size() == 3 && (v[2] < 0 || v[2] >= n.k)))
      throw std::invalid_argument(fmt::format("--block '{}': expected h:i or h:i:j with h < {}, i < {}, j < {}", item, n.h, n.q, n.k));
    for (std::int64_t j = 0; j < n.k; ++j)
      if (v.size() == 2 || v[2] == j) allowed[static_cast<std::size_t>((v[0] * n.q + v[1]) * n.k + j)] = false;
  }
  return tg::from_bools(allowed, {1, n.h, n.q, n.k});
}

// The defaults show each kind of mask once: batch 0's last key and query 1 are masked, and
// head 1 may not attend from query 2 (an empty row in one head only).
std::string default_rows(std::int64_t batch, std::int64_t width, std::int64_t masked) {
  std::string s;
  for (std::int64_t b = 0; b < batch; ++b) {
    if (b > 0) s += ',';
    for (std::int64_t j = 0; j < width; ++j) s += b == 0 && j == masked ? '0' : '1';
  }
  return s;
}

}  // namespace

Problem make_problem(const Options& o) {
  Problem p;
  p.n = {o.batch, o.queries, o.keys, o.heads, o.d, o.dv, o.query_dim, o.context_dim, o.out_dim};
  const Sizes& n = p.n;
  p.key_mask = bool_rows(o.key_mask == "default" ? (n.k > 1 ? default_rows(n.b, n.k, n.k - 1) : "none") : o.key_mask,
                         "--key-mask", n.b, n.k);
  p.query_mask = bool_rows(o.query_mask == "default" ? (n.q > 1 ? default_rows(n.b, n.q, 1) : "none") : o.query_mask,
                           "--query-mask", n.b, n.q);
  p.attention_mask = blocked_pairs(o.block == "default" ? (n.h > 1 && n.q > 2 ? "1:2" : "none") : o.block, n);
  p.causal = o.causal;
  p.causal_offset = o.offset;
  derive_masks(p);

  tg::Generator gen(o.seed);
  const bool f32 = o.dtype == "float32";
  // Values the library's dtype holds exactly, so that it and the float64 chain start equal.
  auto draw = [&](const Shape& shape, double scale) {
    Tensor t = tg::mul(tg::randn(shape, gen, tg::float64), scale);
    return f32 ? tg::to(tg::to(t, tg::float32), tg::float64) : t;
  };
  auto fan = [](std::int64_t in) { return 1.0 / std::sqrt(static_cast<double>(in)); };
  const std::int64_t hd = n.h * n.d, hdv = n.h * n.dv;
  Vars& g = p.given;
  at(g, Var::query) = draw({n.b, n.q, n.cq}, 1.0);
  at(g, Var::context) = draw({n.b, n.k, n.cctx}, 1.0);
  // Larger query and key weights make the attention peaked enough to be interesting.
  at(g, Var::w_q) = draw({n.cq, hd}, 2 * fan(n.cq));
  at(g, Var::w_k) = draw({n.cctx, hd}, 2 * fan(n.cctx));
  at(g, Var::w_v) = draw({n.cctx, hdv}, fan(n.cctx));
  at(g, Var::w_o) = draw({hdv, n.cout}, fan(hdv));
  at(g, Var::b_q) = draw({hd}, 0.2);
  at(g, Var::b_k) = draw({hd}, 0.2);
  at(g, Var::b_v) = draw({hdv}, 0.2);
  at(g, Var::b_o) = draw({n.cout}, 0.5);
  if (o.bias == "full") at(g, Var::bias) = draw({n.b, n.h, n.q, n.k}, 1.0);
  else if (o.bias == "heads") at(g, Var::bias) = draw({1, n.h, 1, n.k}, 1.0);
  else if (o.bias == "pairs") at(g, Var::bias) = draw({n.q, n.k}, 1.0);
  p.R = draw({n.b, n.q, n.cout}, 1.0);
  return p;
}

std::string mask_options(const Problem& p) {
  auto rows = [](const Tensor& m) {
    if (!m.defined()) return std::string("none");
    const auto bits = m.to_vector<bool>();
    std::string s;
    for (std::size_t e = 0; e < bits.size(); ++e) {
      if (e > 0 && e % static_cast<std::size_t>(m.size(1)) == 0) s += ',';
      s += bits[e] ? '1' : '0';
    }
    return s;
  };
  std::vector<std::string> blocked;
  if (p.attention_mask.defined()) {
    const auto bits = p.attention_mask.to_vector<bool>();
    for (std::int64_t h = 0; h < p.n.h; ++h)
      for (std::int64_t i = 0; i < p.n.q; ++i)
        for (std::int64_t j = 0; j < p.n.k; ++j)
          if (!bits[static_cast<std::size_t>((h * p.n.q + i) * p.n.k + j)]) blocked.push_back(fmt::format("{}:{}:{}", h, i, j));
  }
  return fmt::format("key_mask {}, query_mask {}, attention_mask {}", rows(p.key_mask), rows(p.query_mask),
                     blocked.empty() ? std::string("none") : "blocks (h:i:j) " + fmt::format("{}", fmt::join(blocked, ",")));
}

std::string describe_masks(const Problem& p) {
  const Sizes& n = p.n;
  std::int64_t masked = 0;
  std::vector<std::string> empty, suppressed, unused;
  for (std::int64_t b = 0; b < n.b; ++b) {
    for (std::int64_t h = 0; h < n.h; ++h)
      for (std::int64_t i = 0; i < n.q; ++i) {
        bool any = false;
        for (std::int64_t j = 0; j < n.k; ++j) {
          const bool ok = p.allowed_host[static_cast<std::size_t>(((b * n.h + h) * n.q + i) * n.k + j)];
          any = any || ok;
          masked += !ok;
        }
        if (!any) empty.push_back(fmt::format("(b{} h{} q{})", b, h, i));
      }
    for (std::int64_t i = 0; i < n.q; ++i)
      if (!p.active_host[static_cast<std::size_t>(b * n.q + i)]) suppressed.push_back(fmt::format("(b{} q{})", b, i));
    for (std::int64_t j = 0; j < n.k; ++j)
      if (!p.used_host[static_cast<std::size_t>(b * n.k + j)]) unused.push_back(fmt::format("(b{} k{})", b, j));
  }
  auto list = [](const std::vector<std::string>& v) { return v.empty() ? std::string("none") : fmt::format("{}", fmt::join(v, " ")); };
  return fmt::format(
      "  masked pairs: {} of {}\n  empty rows (no allowed key in that head): {}\n"
      "  suppressed queries (no allowed key in any head, output forced to 0): {}\n  unused keys (no query of any head may attend): {}\n",
      masked, n.b * n.h * n.q * n.k, list(empty), list(suppressed), list(unused));
}

std::pair<std::vector<bool>, std::string> exact_zeros(const Problem& p, Var x, const Shape& shape) {
  const Sizes& n = p.n;
  std::size_t numel = 1;
  for (auto s : shape) numel *= static_cast<std::size_t>(s);
  std::vector<bool> z(numel, false);
  auto allowed = [&](std::int64_t b, std::int64_t h, std::int64_t i, std::int64_t j) {
    return p.allowed_host[static_cast<std::size_t>(((b * n.h + h) * n.q + i) * n.k + j)];
  };
  auto active = [&](std::int64_t b, std::int64_t i) { return p.active_host[static_cast<std::size_t>(b * n.q + i)]; };
  const std::int64_t inner = shape.empty() ? 1 : shape.back();
  switch (x) {
    case Var::y:
    case Var::merged:
    case Var::query:  // [B, Q, C]
      for (std::size_t e = 0; e < numel; ++e) z[e] = !p.active_host[e / static_cast<std::size_t>(inner)];
      return {z, "rows of suppressed queries"};
    case Var::context:
      for (std::size_t e = 0; e < numel; ++e) z[e] = !p.used_host[e / static_cast<std::size_t>(inner)];
      return {z, "rows of unused keys"};
    case Var::O_h:
    case Var::A:  // [B, H, Q, W]
      for (std::size_t e = 0; e < numel; ++e) {
        const auto row = static_cast<std::int64_t>(e) / inner;
        z[e] = !active(row / (n.h * n.q), row % n.q);
      }
      return {z, "rows of suppressed queries"};
    case Var::S:
    case Var::raw:
      for (std::size_t e = 0; e < numel; ++e) z[e] = !p.allowed_host[e];
      return {z, "masked entries (empty rows included)"};
    case Var::q_h:
    case Var::k_h:
    case Var::v_h: {  // a query row (or key row) of a head with no allowed pair
      const bool keys = x != Var::q_h;
      for (std::size_t e = 0; e < numel; ++e) {
        const auto row = static_cast<std::int64_t>(e) / inner, b = row / (n.h * (keys ? n.k : n.q)),
                   h = row / (keys ? n.k : n.q) % n.h, r = row % (keys ? n.k : n.q);
        bool any = false;
        for (std::int64_t o = 0; o < (keys ? n.q : n.k); ++o) any = any || (keys ? allowed(b, h, o, r) : allowed(b, h, r, o));
        z[e] = !any;
      }
      return {z, keys ? "keys no query of the head may attend to" : "empty rows"};
    }
    case Var::bias: {  // entries that are masked everywhere the bias is broadcast to
      std::vector<bool> reached(numel, false);
      const Shape padded = [&] {
        Shape s(4 - shape.size(), 1);
        s.insert(s.end(), shape.begin(), shape.end());
        return s;
      }();
      const std::int64_t full[4] = {n.b, n.h, n.q, n.k};
      for (std::int64_t b = 0; b < n.b; ++b)
        for (std::int64_t h = 0; h < n.h; ++h)
          for (std::int64_t i = 0; i < n.q; ++i)
            for (std::int64_t j = 0; j < n.k; ++j) {
              const std::int64_t c[4] = {b, h, i, j};
              std::int64_t e = 0;
              for (int d = 0; d < 4; ++d) e = e * padded[static_cast<std::size_t>(d)] + (padded[static_cast<std::size_t>(d)] == full[d] ? c[d] : 0);
              if (allowed(b, h, i, j)) reached[static_cast<std::size_t>(e)] = true;
            }
      for (std::size_t e = 0; e < numel; ++e) z[e] = !reached[e];
      return {z, "entries masked wherever they are added"};
    }
    default:
      return {std::vector<bool>(), std::string()};
  }
}

}  // namespace attention_backprop
