// attention_backprop: every intermediate gradient of multi-head attention, stage by stage, in
// the order backward computes them, each checked against float64 central differences, with
// heatmaps of A, dA and dS. docs/attention-backprop.md reads its output step by step.
//
//   ./build/examples/attention_backprop                    # masked keys, empty rows, a suppressed query
//   ./build/examples/attention_backprop --causal --queries 5 --keys 4 --offset -1 --bias pairs
//
// How the check works: the forward is re-run in float64 as a chain of public ops (staged.cpp).
// For each intermediate X, X is made a leaf and the tape gives dL/dX; independently, L is
// re-evaluated with each entry of X moved by +-h (no backward code involved) to estimate the same
// derivative. The library's fused multihead_attention, and its attention node on its own, must
// then give the same gradients as the staged chain. Exits 1 if any stage disagrees beyond the
// stated tolerance, or if an entry that must be exactly zero is not.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <unistd.h>

#include <CLI/CLI.hpp>

#include "attention_backprop/library_runs.hpp"
#include "attention_backprop/walkthrough.hpp"

namespace tg = tapegrad;
namespace ab = attention_backprop;
using ab::Var;
using tg::Tensor;

namespace {

// Central differences: step and tolerance (|tape - numeric| <= atol + rtol |numeric|, per entry).
constexpr double kStep = 1e-5, kFdAtol = 1e-7, kFdRtol = 1e-6;

// Each stage in the order backward reaches it. `library` names the function of tapegrad that
// computes this gradient inside multihead_attention (kept in this one table so that it can follow
// the library's files).
struct StageInfo {
  Var var;
  const char* stage;
  const char* grad;
  const char* shape;
  const char* formula;
  const char* library;
};
constexpr StageInfo kStages[] = {
    {Var::out, "loss", "dout", "[B, Q, Cout]", "dout = R   (L = Σ out ⊙ R)", "ops/reduction.cpp: sum backward; ops/elementwise_binary.cpp: mul backward"},
    {Var::y, "step 7: suppress inactive queries", "dy", "[B, Q, Cout]", "dy = where(active[b,i], dout, 0)",
     "ops/where.cpp: where backward (ops/multihead_attention.cpp: attend_projected, rows_where)"},
    {Var::b_o, "output projection bias", "db_o", "[Cout]", "db_o = Σ_b,i dy[b,i,:]", "ops/multihead_attention_projections.cpp: merge_heads_project backward"},
    {Var::w_o, "output projection", "dw_o", "[H·Dv, Cout]", "dw_o = Σ_b mergedᵀ dy", "ops/multihead_attention_projections.cpp: merge_heads_project backward"},
    {Var::merged, "output projection input", "dmerged", "[B, Q, H·Dv]", "dmerged = dy w_oᵀ", "ops/multihead_attention_projections.cpp: merge_heads_project backward"},
    {Var::O_h, "head merge", "dO", "[B, H, Q, Dv]", "dO[b,h,i,:] = dmerged[b,i,h·Dv:(h+1)·Dv]",
     "ops/multihead_attention_projections.cpp: merge_heads_project backward (dmerged read through strides)"},
    {Var::v_h, "weighted sum, values", "dv", "[B, H, K, Dv]", "dv = Aᵀ dO", "kernels/attention_weights.cpp: the weights path's backward (weighted_matmul)"},
    {Var::A, "weighted sum, weights", "dA", "[B, H, Q, K]", "dA = dO vᵀ", "kernels/attention_weights.cpp: the weights path's backward (product)"},
    {Var::S, "masked softmax", "dS", "[B, H, Q, K]", "dS = A ⊙ (dA − rowsum(A ⊙ dA))",
     "kernels/attention_softmax.cpp: attention_softmax_backward, called by kernels/attention_weights.cpp: the weights path's backward"},
    {Var::bias, "additive bias", "dbias", "bias shape", "dbias = sum_to(dS, bias shape)", "ops/attention.cpp: the node's backward (sum_to)"},
    {Var::raw, "1/√D scale", "d(qkᵀ)", "[B, H, Q, K]", "d(q kᵀ) = dS / √D",
     "kernels/attention_weights.cpp: the weights path's backward (folds 1/√D into dS when the bias needs no gradient, else ops/attention.cpp applies it to dq and dk)"},
    {Var::q_h, "scores, queries", "dq", "[B, H, Q, D]", "dq = (dS k) / √D", "kernels/attention_weights.cpp: the weights path's backward (weighted_matmul)"},
    {Var::k_h, "scores, keys", "dk", "[B, H, K, D]", "dk = (dSᵀ q) / √D", "kernels/attention_weights.cpp: the weights path's backward (weighted_matmul)"},
    {Var::w_v, "value projection", "dw_v", "[Cctx, H·Dv]", "dw_v = Σ_b context'ᵀ dv   (dv with heads merged)", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::b_v, "value projection bias", "db_v", "[H·Dv]", "db_v = Σ_b,j dv[b,j,:]", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::w_k, "key projection", "dw_k", "[Cctx, H·D]", "dw_k = Σ_b context'ᵀ dk", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::b_k, "key projection bias", "db_k", "[H·D]", "db_k = Σ_b,j dk[b,j,:]", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::w_q, "query projection", "dw_q", "[Cq, H·D]", "dw_q = Σ_b query'ᵀ dq", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::b_q, "query projection bias", "db_q", "[H·D]", "db_q = Σ_b,i dq[b,i,:]", "ops/multihead_attention_projections.cpp: project_heads backward"},
    {Var::query, "step 0: query rows", "dquery", "[B, Q, Cq]", "dquery = where(active, dq w_qᵀ, 0)",
     "ops/multihead_attention_projections.cpp: project_heads backward, ops/where.cpp: where backward (ops/multihead_attention.cpp: rows_where)"},
    {Var::context, "step 0: context rows", "dcontext", "[B, K, Cctx]", "dcontext = where(used, dk w_kᵀ + dv w_vᵀ, 0)",
     "ops/multihead_attention_projections.cpp: project_heads backward, ops/where.cpp: where backward (ops/multihead_attention.cpp: rows_where)"},
};

std::string shape_str(const tg::Shape& s) { return fmt::format("[{}]", fmt::join(s, ", ")); }

std::string index_str(const tg::Shape& shape, std::size_t e) {
  tg::Shape idx(shape.size());
  for (std::size_t d = shape.size(); d-- > 0;) {
    idx[d] = static_cast<std::int64_t>(e) % shape[d];
    e /= static_cast<std::size_t>(shape[d]);
  }
  return shape_str(idx);
}

struct Gap {
  double max = 0;  // largest |got - want|
  bool ok = true;  // every entry within atol + rtol |want|
};
Gap gap(const Tensor& got, const Tensor& want, double atol, double rtol) {
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  Gap r;
  for (std::size_t e = 0; e < g.size(); ++e) {
    const double d = std::abs(g[e] - w[e]);
    r.max = std::max(r.max, d);
    r.ok = r.ok && d <= atol + rtol * std::abs(w[e]);  // NaN fails
  }
  return r;
}

struct StageResult {
  const StageInfo* info;
  Tensor tape, numeric;
  Gap fd;
  std::optional<Gap> library;
  double largest = 0;
  std::size_t zeros = 0;
  bool zeros_ok = true;
  bool ok() const { return fd.ok && (!library || library->ok) && zeros_ok; }
};

std::string verdict(bool ok) { return ok ? "OK" : "DISAGREES"; }

}  // namespace

int main(int argc, char** argv) try {
  ab::Options o;
  bool no_color = false, no_files = false;
  CLI::App app{"attention_backprop: every gradient of multi-head attention, stage by stage, checked against central differences"};
  app.add_option("--batch", o.batch, "B")->check(CLI::Range(1, 8));
  app.add_option("--heads", o.heads, "H")->check(CLI::Range(1, 8));
  app.add_option("--d", o.d, "D, the query/key width per head")->check(CLI::Range(1, 16));
  app.add_option("--dv", o.dv, "Dv, the value width per head")->check(CLI::Range(1, 16));
  app.add_option("--queries", o.queries, "Q")->check(CLI::Range(1, 16));
  app.add_option("--keys", o.keys, "K")->check(CLI::Range(1, 16));
  app.add_option("--query-dim", o.query_dim, "Cq, the query's channels")->check(CLI::Range(1, 16));
  app.add_option("--context-dim", o.context_dim, "Cctx, the context's channels")->check(CLI::Range(1, 16));
  app.add_option("--out-dim", o.out_dim, "Cout, the output's channels")->check(CLI::Range(1, 16));
  app.add_flag("--causal", o.causal, "key j is allowed for query i only if j <= i + offset");
  app.add_option("--offset", o.offset, "the causal offset (any sign)")->check(CLI::Range(-1000, 1000));
  app.add_option("--key-mask", o.key_mask, "B groups of K 0/1, e.g. 11110,11111; 'none'; 'default' masks batch 0's last key");
  app.add_option("--query-mask", o.query_mask, "B groups of Q 0/1; 'none'; 'default' masks batch 0's query 1");
  app.add_option("--block", o.block, "attention-mask pairs to block: h:i (a whole row) or h:i:j, comma-separated; 'none'; 'default' = 1:2");
  app.add_option("--bias", o.bias, "additive score bias: full [B,H,Q,K], heads [1,H,1,K], pairs [Q,K], none")
      ->check(CLI::IsMember({"none", "full", "heads", "pairs"}));
  app.add_option("--seed", o.seed, "seed for inputs, parameters, bias and R");
  app.add_option("--dtype", o.dtype, "the library run checked against the float64 chain")->check(CLI::IsMember({"float32", "float64"}));
  app.add_option("--show-batch", o.show_batch, "batch entry of the A | dA | dS line-up")->check(CLI::NonNegativeNumber);
  app.add_option("--show-head", o.show_head, "head of the A | dA | dS line-up")->check(CLI::NonNegativeNumber);
  app.add_option("--out", o.out, "folder for the PNG figures");
  app.add_flag("--no-color", no_color, "plain numbers, no ANSI colours (also when stdout is not a terminal)");
  app.add_flag("--no-files", no_files, "do not write the PNG figures");
  CLI11_PARSE(app, argc, argv);
  fmt::print("attention_backprop: {} thread(s) (OMP_NUM_THREADS or tg::set_num_threads to choose)\n", tg::num_threads());
  o.colour = !no_color && isatty(fileno(stdout)) != 0;
  o.files = !no_files;
  if (o.show_batch >= o.batch || o.show_head >= o.heads) throw std::invalid_argument("--show-batch / --show-head out of range");

  const ab::Problem p = ab::make_problem(o);
  const ab::Sizes& n = p.n;
  const tg::DType dtype = o.dtype == "float32" ? tg::float32 : tg::float64;
  // The library against the float64 chain: rounding of float64, or of float32, and no more.
  const double lib_atol = dtype == tg::float64 ? 1e-10 : 2e-5, lib_rtol = dtype == tg::float64 ? 1e-9 : 2e-4;

  ab::Vars base;
  {
    tg::NoGradGuard no_grad;
    base = ab::forward(p);
  }
  const double L = ab::loss(p, base).item();
  fmt::print("attention_backprop: B={} H={} Q={} K={} D={} Dv={} Cq={} Cctx={} Cout={}, seed {}, library run in {}\n", n.b, n.h, n.q,
             n.k, n.d, n.dv, n.cq, n.cctx, n.cout, o.seed, o.dtype);
  fmt::print("masks: {}, causal {}\n", ab::mask_options(p), o.causal ? fmt::format("yes, offset {}", o.offset) : "no");
  fmt::print("bias: {}\n", at(p.given, Var::bias).defined() ? shape_str(at(p.given, Var::bias).shape()) + " (" + o.bias + ")" : "none");
  fmt::print("{}", ab::describe_masks(p));
  fmt::print("loss: L = Σ out ⊙ R = {:.6f}, R a fixed random [B, Q, Cout] tensor (so dL/dout = R, not all ones)\n\n", L);
  fmt::print("How each stage is checked:\n");
  fmt::print("  tape      dL/dX from tapegrad's backward, X a leaf of the float64 chain of public ops\n");
  fmt::print("  numeric   (L(X + h) − L(X − h)) / 2h for each entry of X, h = {:g}, the rest of the forward re-run from X\n", kStep);
  fmt::print("            pass: |tape − numeric| <= {:g} + {:g}·|numeric| for every entry\n", kFdAtol, kFdRtol);
  fmt::print("  library   the same gradient from tapegrad's fused multihead_attention ({}) where it is observable,\n", o.dtype);
  fmt::print("            pass: |library − tape| <= {:g} + {:g}·|tape|\n", lib_atol, lib_rtol);
  fmt::print("  exact 0   entries that masks make constant must be 0 exactly, in tape and numeric alike\n");

  // The library: the whole multihead_attention, and the attention node alone.
  const ab::LibraryRun whole = ab::run_multihead_attention(p, dtype);
  const Tensor d_merged = ab::tape_gradient(p, base, Var::merged);
  const ab::LibraryRun node = ab::run_attention_node(p, base, d_merged, dtype);
  const Gap fwd_out = gap(at(whole.values, Var::out), at(base, Var::out), lib_atol, lib_rtol),
            fwd_a = gap(at(whole.values, Var::A), at(base, Var::A), lib_atol, lib_rtol),
            fwd_node = gap(at(node.values, Var::O_h), at(base, Var::O_h), lib_atol, lib_rtol);
  const bool forward_ok = fwd_out.ok && fwd_a.ok && fwd_node.ok;
  fmt::print("\nforward: library − chain: output {:.1e}, attention weights {:.1e}, attention node's output {:.1e}  {}\n", fwd_out.max,
             fwd_a.max, fwd_node.max, verdict(forward_ok));

  fmt::print("\nBackward, stage by stage, from the loss to the weights\n");
  std::vector<StageResult> results;
  Tensor dA, dS;
  int number = 0;
  for (const StageInfo& info : kStages) {
    if (!at(base, info.var).defined()) continue;  // no bias
    StageResult r{&info, ab::tape_gradient(p, base, info.var), ab::numeric_gradient(p, base, info.var, kStep), {}, {}, 0.0, 0, true};
    r.fd = gap(r.tape, r.numeric, kFdAtol, kFdRtol);
    for (const auto* lib : {&whole, &node})
      if (auto it = lib->grads.find(info.var); it != lib->grads.end()) r.library = gap(it->second, r.tape, lib_atol, lib_rtol);
    const tg::Shape& shape = r.tape.shape();
    const auto [must_zero, zero_what] = ab::exact_zeros(p, info.var, shape);
    const auto t = r.tape.to_vector<double>(), num = r.numeric.to_vector<double>();
    for (std::size_t e = 0; e < must_zero.size(); ++e)
      if (must_zero[e]) {
        ++r.zeros;
        r.zeros_ok = r.zeros_ok && t[e] == 0.0 && num[e] == 0.0;
      }
    std::size_t arg = 0;
    for (std::size_t e = 0; e < t.size(); ++e)
      if (std::abs(t[e]) > std::abs(t[arg])) arg = e;
    r.largest = std::abs(t[arg]);

    fmt::print("\n[{:2}] {}: {}  {} = {}\n", ++number, info.stage, info.grad, info.var == Var::bias ? "bias" : info.shape, shape_str(shape));
    fmt::print("     {}\n     library: {}\n", info.formula, info.library);
    fmt::print("     largest |{}| = {:.4g} at {};  max |tape − numeric| = {:.1e}", info.grad, std::abs(t[arg]), index_str(shape, arg), r.fd.max);
    if (r.library) fmt::print(";  max |library − tape| = {:.1e}", r.library->max);
    fmt::print("\n");
    if (r.zeros > 0)
      fmt::print("     exactly 0 at {} entries ({}): {}\n", r.zeros, zero_what, r.zeros_ok ? "yes, in tape and numeric" : "NO");

    const bool any_suppressed = std::find(p.active_host.begin(), p.active_host.end(), false) != p.active_host.end();
    if (info.var == Var::b_o && !any_suppressed) fmt::print("     No query is suppressed here, so db_o is Σ of R over every query.\n");
    if (info.var == Var::b_o && any_suppressed) {
      // Step 7: the suppressed queries' rows of R do not reach b_o.
      const Tensor all_rows = tg::sum(p.R, {0, 1});
      const Tensor suppressed_rows = tg::sum(tg::where(p.active, tg::scalar(0.0, tg::float64), p.R), {0, 1});
      fmt::print("     Σ of R over every query would be [{:.4f}]; db_o is that minus [{:.4f}],\n"
                 "     the sum of R over the suppressed queries (difference from db_o: {:.1e}). Their output is 0 whatever\n"
                 "     b_o is (step 7), so L does not depend on b_o through them: dy is exactly 0 there, and central\n"
                 "     differences agree.\n",
                 fmt::join(all_rows.to_vector<double>(), ", "), fmt::join(suppressed_rows.to_vector<double>(), ", "),
                 gap(tg::sub(all_rows, suppressed_rows), r.tape, 0, 0).max);
    }
    if (info.var == Var::A) {
      dA = r.tape;
      fmt::print("     dA is not zero at masked entries (it is dO vᵀ there too): the softmax backward never reads it.\n");
    }
    if (info.var == Var::S) {
      dS = r.tape;
      // What a backward without the row term would give: the check would catch it.
      const Gap wrong = gap(tg::mul(at(base, Var::A), dA), r.numeric, kFdAtol, kFdRtol);
      fmt::print("     A wrong backward, A ⊙ dA without − rowsum(A ⊙ dA), would differ from numeric by {:.2g}: {}\n", wrong.max,
                 wrong.ok ? "NOT caught (the rows' sums are ~0 here)" : "caught");
      // Softmax ignores a constant added to a row, so each row of dS sums to 0.
      double row_sum = 0;
      const auto ds = dS.to_vector<double>();
      for (std::size_t row = 0; row < ds.size(); row += static_cast<std::size_t>(n.k)) {
        double sum = 0;
        for (std::int64_t j = 0; j < n.k; ++j) sum += ds[row + static_cast<std::size_t>(j)];
        row_sum = std::max(row_sum, std::abs(sum));
      }
      fmt::print("     Each row of dS sums to 0 (largest |row sum| {:.1e}): adding c to a whole row of S leaves A unchanged.\n", row_sum);
      fmt::print("     Per head, A (weights) and dS (its gradient):\n");
      ab::print_head_maps(p, base, dS, o.colour);
      fmt::print("\n     Batch {} head {}, lined up: A, dA and dS = A ⊙ (dA − rowsum(A ⊙ dA)). Where A is near 0, dS is near 0\n"
                 "     whatever dA is; where dA is above its A-weighted row mean, dS is positive.\n",
                 o.show_batch, o.show_head);
      ab::print_lineup(p, base, dA, dS, o.show_batch, o.show_head, o.colour);
    }
    if (info.var == Var::b_k)
      fmt::print("     db_k is 0 up to rounding: b_k adds q_i·b_k/√D to every score of row i, a constant per row, which\n"
                 "     the softmax ignores (A(S + c) = A(S)). Central differences see the same flat direction.\n");
    if (info.var == Var::q_h) {
      const Gap wrong = gap(tg::matmul(dS, at(base, Var::k_h)), r.numeric, kFdAtol, kFdRtol);
      if (n.d > 1)
        fmt::print("     A wrong backward, dS k without the 1/√D, would differ from numeric by {:.2g}: {}\n", wrong.max,
                   wrong.ok ? "NOT caught" : "caught");
    }
    fmt::print("     {}\n", verdict(r.ok()));
    results.push_back(std::move(r));
  }

  bool kv_ok = true;
  if (p.causal) {
    const double kv = ab::kv_cache_gap(p, dtype);
    kv_ok = kv <= lib_atol;
    fmt::print("\nKV cache: query t alone with causal_offset = t{}{} (a decoding step) reproduces row t of the full causal output:\n"
               "  max difference over t = {:.1e}  {}\n",
               o.offset < 0 ? " − " : " + ", std::abs(o.offset), kv, verdict(kv_ok));
  }

  fmt::print("\nSummary (tape − numeric: tolerance {:g} + {:g}|numeric|; library − tape: {:g} + {:g}|tape|)\n", kFdAtol, kFdRtol,
             lib_atol, lib_rtol);
  fmt::print("  {:<34} {:<9} {:>10} {:>14} {:>15}  {:>8}\n", "stage", "gradient", "max |g|", "tape−numeric", "library−tape", "exact 0s");
  bool ok = forward_ok && kv_ok;
  for (const auto& r : results) {
    ok = ok && r.ok();
    fmt::print("  {:<34} {:<9} {:>10.3e} {:>14.1e} {:>15} {:>9}  {}\n", r.info->stage, r.info->grad, r.largest, r.fd.max,
               r.library ? fmt::format("{:.1e}", r.library->max) : "", r.zeros > 0 ? fmt::format("{}", r.zeros) : "", verdict(r.ok()));
  }
  if (o.files) fmt::print("\nFigures:\n{}", ab::write_figures(o, p, base, dA, dS));
  fmt::print("\n{}\n", ok ? "OK: every stage agrees with central differences and with the library"
                          : "FAILED: some stage disagrees (see DISAGREES above)");
  return ok ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "attention_backprop: {}\n", e.what());
  return 2;
}
