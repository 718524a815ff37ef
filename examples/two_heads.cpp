// The worked example of docs/semantics.md §6.4, step by step: two heads, every kind of mask, and
// a query whose output is suppressed (b_o included) because it may attend to nothing.
#include <cmath>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;
using tg::Tensor;

namespace {

void show(const char* what, const Tensor& t) { fmt::print("{}:\n{}\n\n", what, tg::to_string(t).substr(tg::to_string(t).find('\n') + 1)); }

}  // namespace

int main(int argc, char** argv) {
  int threads = 0;
  CLI::App app{"two_heads: the worked example of docs/semantics.md 6.4, step by step"};
  app.add_option("--threads", threads, "threads (0: the default)")->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tg::set_num_threads(threads);
  fmt::print("two_heads: {} thread(s) (--threads N to choose)\n", tg::num_threads());
  // B = 1, Q = 2, K = 3, heads = 2, D = Dv = 1.
  const tg::MhaActivations act{.query = tg::tensor({{{1, 1}, {1, 1}}}, tg::float64),
                               .context = tg::tensor({{{0, 1, 2, 1}, {1, 0, 4, 4}, {100, 100, 99, 99}}}, tg::float64)};
  const tg::MhaParameters par{.w_q = tg::tensor({{1, 0}, {0, 1}}, tg::float64),
                              .w_k = tg::tensor({{1, 0}, {0, 1}, {0, 0}, {0, 0}}, tg::float64),
                              .w_v = tg::tensor({{0, 0}, {0, 0}, {1, 0}, {0, 1}}, tg::float64),
                              .w_o = tg::tensor({{1, 2}, {3, -1}}, tg::float64),
                              .b_o = tg::tensor({1, 2}, tg::float64)};
  const tg::MhaMasks masks{.key_mask = tg::mask({{true, true, false}}),
                           .query_mask = tg::mask({{true, false}}),
                           .attention_mask = tg::mask({{{true, true, true}, {true, true, true}}, {{false, true, true}, {false, true, true}}})};

  fmt::print("Step 1: projections (head h owns channel h of each, since D = Dv = 1)\n\n");
  const Tensor q = tg::matmul(act.query, par.w_q), k = tg::matmul(act.context, par.w_k), v = tg::matmul(act.context, par.w_v);
  show("q = query w_q   [B, Q, H*D]", q);
  show("k = context w_k [B, K, H*D]", k);
  show("v = context w_v [B, K, H*Dv]", v);

  fmt::print("Step 2-3: per-head scores q_h k_h^T / sqrt(D)\n\n");
  const Tensor qh = tg::permute(q, {0, 2, 1}), kh = tg::permute(k, {0, 2, 1});  // [B, H, L] with D = 1
  const Tensor scores = tg::unsqueeze(qh, -1) * tg::unsqueeze(kh, -2);        // [B, H, Q, K]
  show("scores [B, H, Q, K]", scores);

  fmt::print("Step 4: allowed = key_mask[b,j] & query_mask[b,i] & attention_mask[h,i,j]\n\n");
  const Tensor allowed = tg::logical_and(tg::logical_and(tg::reshape(masks.key_mask, {1, 1, 1, 3}), tg::reshape(masks.query_mask, {1, 1, 2, 1})),
                                         masks.attention_mask);
  show("allowed", allowed);

  fmt::print("Step 5-7: multihead_attention\n\n");
  auto [out, attention] = tg::multihead_attention(act, par, masks, /*heads=*/2);
  show("attention = masked_softmax(scores, allowed)  (query 0: head 0 [0.268941, 0.731059, 0], head 1 [0, 1, 0])", attention);
  const Tensor v_heads = tg::unsqueeze(tg::transpose(tg::select(v, 0, 0), 0, 1), -1);     // [H, K, Dv]
  const Tensor summaries = tg::matmul(tg::select(attention, 0, 0), v_heads);              // [H, Q, Dv]
  fmt::print("head summaries of query 0 (attention_h v_h): [{:.6f}, {:.6f}]   (docs/semantics.md §6.4: [3.462117, 4])\n\n",
             summaries.to_vector<double>()[0], summaries.to_vector<double>()[2]);
  show("output = concat(summaries) w_o + b_o   (query 0: [16.462117, 4.924234])", out);
  fmt::print("query 1 has query_mask False: no allowed key in any head, so its attention is zero in both\n"
             "heads and its output is exactly [0, 0], with b_o = [1, 2] suppressed after the projection.\n");

  const auto o = out.to_vector<double>();
  const bool ok = std::abs(o[0] - 16.462117) < 1e-6 && std::abs(o[1] - 4.924234) < 1e-6 && o[2] == 0 && o[3] == 0;
  return ok ? 0 : 1;
}
