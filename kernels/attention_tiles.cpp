// The fused attention path (attention_core with need_weights = false): an online softmax over
// tiles of keys, so the [..., Q, K] scores and weights are never held, only one [kTileQ, kTileK]
// tile of them per thread. The node saves q, k, v, the bias, O and, per row, the maximum m and
// log l (their sum L, the log-sum-exp, would lose log l to rounding when |m| is large).
// Derivation and equivalence with the weights path: docs/gradients.md §8.1.
//
//   forward, per query tile, over key tiles          backward, per key tile, over query tiles
//   S = s q kᵀ (+ bias), -inf where masked            S again;  P = exp((S - m) - log l), 0 if masked
//   m' = max(m, rowmax S),  c = exp(m - m')            dv += Pᵀ ⊛ dO
//   P = exp(S - m'),  l = c l + rowsum P               dP = dO vᵀ
//   acc = c acc + P ⊛ v                                dS = P (dP - Δ),  Δ_i = rowsum(dO_i O_i)
//   last tile: O = acc / l,  keep m and log l         dbias += dS,  dq += s dS ⊛ k,  dk += s dSᵀ ⊛ q
//
// ⊛ is the product in which a zero weight contributes nothing, as kernels/weighted_matmul.cpp
// (tiles::weighted_gemm, kernels/attention_products.hpp): the tile of v, dO, k or q is copied with
// its non-finite elements set to 0, multiplied, and each non-finite element is added back only
// where its weight is nonzero. A NaN in a masked key's k or v, or in an empty row's q or dO, so
// reaches no output or gradient. A row with no allowed key, or whose allowed scores are all -inf,
// is empty: O = 0, m = -inf, P = 0, no gradient. A NaN among a row's allowed scores makes its
// output and m NaN (docs/semantics.md §11).
//
// Under a bfloat16 matmul precision (float32), q, k, v and dO are rounded once per call and P
// and dS once per tile, and every tile product is bfloat16 x bfloat16 -> float32, with the rules
// above kept: the rounded copies hold an inf or NaN as 0 and the products add it back in float32
// (attention_products.hpp). The exp, the sums, m, l and the accumulators stay float32.
//
// Work is split over (batch entry, query tile) in the forward; the backward owns key tiles
// (dk, dv are written by one thread each) and, when there are few batch entries, splits a batch
// entry's key tiles into G interleaved groups whose dq go to separate buffers. G and the order
// of every sum follow from the shape, so the results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"
#include "kernels/attention_alibi.hpp"
#include "kernels/attention_operands.hpp"
#include "kernels/attention_paths.hpp"
#include "kernels/attention_products.hpp"

namespace tapegrad::detail {
namespace {

using namespace tiles;

// A [128, 128] tile of float32 scores is 64 KiB; with dP, the packed operands and the
// accumulators a thread's working set stays well inside a 1-2 MiB L2.
constexpr std::int64_t kTileQ = 128, kTileK = 128;
// The backward's work items (batch entry, key-tile group) are at least this many when there are
// enough key tiles; a broadcast bias's gradient is summed in this many chunks at most (a buffer
// of the bias's size each).
constexpr std::int64_t kMinItems = 8, kDbiasChunks = 4;

// A [..., Q, K]-broadcastable tensor (the bias, or its gradient) by batch entry, row and key.
template <class T> struct PerPair {
  const T* base = nullptr;
  std::vector<std::int64_t> offsets;
  std::int64_t si = 0, sj = 0;
  PerPair() = default;
  PerPair(const Tensor& t, const Shape& scores) : base(static_cast<const T*>(t.raw_data())) {
    const Dims8 s = broadcast_strides(t, scores);
    const std::size_t r = scores.size();
    offsets = batch_offsets(s.data(), Shape(scores.begin(), scores.end() - 2));
    si = s[r - 2];
    sj = s[r - 1];
  }
  std::int64_t at(std::int64_t bh, std::int64_t i) const { return offsets[static_cast<std::size_t>(bh)] + i * si; }
};

// Everything the two passes read, for one call.
template <class T> struct Problem {
  std::int64_t bh = 0, q = 0, k = 0, d = 0, dv = 0;
  T scale = 1;
  Matrices<T> qs, ks, vs;
  const RowMasks* masks = nullptr;
  bool has_bias = false;
  PerPair<T> bias;
  bool bf16 = false;  // the tile products round to bfloat16 (float32 only), from these copies:
  Bf16Matrices qb, kb, vb;

  Problem(const Tensor& q_, const Tensor& k_, const Tensor& v_, const Tensor& bias_, const RowMasks& m, const Shape& scores,
          bool bfloat16)
      : masks(&m), has_bias(bias_.defined()), bf16(bfloat16) {
    const Shape batch(scores.begin(), scores.end() - 2);
    bh = shape_numel(batch);
    q = scores[scores.size() - 2];
    k = scores[scores.size() - 1];
    d = q_.shape().back();
    dv = v_.shape().back();
    scale = static_cast<T>(1.0 / std::sqrt(static_cast<double>(d)));
    qs = Matrices<T>(q_, batch);
    ks = Matrices<T>(k_, batch);
    vs = Matrices<T>(v_, batch);
    if (has_bias) bias = PerPair<T>(bias_, scores);
    if (bf16) {
      qb = Bf16Matrices(q_, batch);
      kb = Bf16Matrices(k_, batch);
      vb = Bf16Matrices(v_, batch);
    }
  }
  // Batch entry bh's rows of q, k or v for the bfloat16 products (float32 only).
  RoundedRows q_rows(std::int64_t bh) const { return qb.rows(qs, bh); }
  RoundedRows k_rows(std::int64_t bh) const { return kb.rows(ks, bh); }
  RoundedRows v_rows(std::int64_t bh) const { return vb.rows(vs, bh); }
  std::int64_t query_tiles() const { return (q + kTileQ - 1) / kTileQ; }
  std::int64_t key_tiles() const { return (k + kTileK - 1) / kTileK; }
};

// Whether key tile [j0, j0 + n) holds a key that the key mask allows (always, without one).
bool tile_has_keys(const RowMask& rm, std::int64_t j0, std::int64_t n) {
  return rm.keys == nullptr || std::any_of(rm.keys + j0, rm.keys + j0 + n, [](bool b) { return b; });
}

// Scores of one tile row with the mask and bias applied: s[j] for key j0 + j, -inf where masked.
template <class T>
void mask_row(const Problem<T>& p, const RowMask& rm, std::int64_t bh, std::int64_t i, std::int64_t j0, std::int64_t n, T* s) {
  const std::int64_t live = std::clamp<std::int64_t>(rm.end - j0, 0, n);  // keys below the causal end
  const std::int64_t dead = std::clamp<std::int64_t>(rm.begin - j0, 0, live);  // keys before the window
  if (p.has_bias) {
    const T* b = p.bias.base + p.bias.at(bh, i) + j0 * p.bias.sj;
    for (std::int64_t j = 0; j < live; ++j) s[j] += b[j * p.bias.sj];  // a masked entry is overwritten below
  }
  if (rm.alibi) {
    // The distances in T when they are exact there (the usual case): a loop that vectorises.
    // s + (-(m d)) and s - m d are the same number.
    if (rm.alibi_in_float(j0 + live)) {
      const T slope = static_cast<T>(rm.slope), b = static_cast<T>(rm.position - j0);
      const T* index = index_ramp<T>(live);
      for (std::int64_t j = 0; j < live; ++j) s[j] -= slope * std::abs(b - index[j]);
    } else {
      for (std::int64_t j = 0; j < live; ++j) s[j] += rm.alibi_bias<T>(j0 + j);
    }
  }
  std::fill(s, s + dead, -kInf<T>);
  // Selected, not added: a masked score may be NaN (a poisoned key), and is dropped.
  if (rm.keys != nullptr) {
    const bool* keys = rm.keys + j0;
    for (std::int64_t j = 0; j < live; ++j) s[j] = keys[j] ? s[j] : -kInf<T>;
  }
  if (rm.pairs != nullptr) {
    const bool* pairs = rm.pairs + j0 * rm.pairs_stride;
    for (std::int64_t j = 0; j < live; ++j) s[j] = pairs[j * rm.pairs_stride] ? s[j] : -kInf<T>;
  }
  std::fill(s + live, s + n, -kInf<T>);
}

template <class T> struct ForwardScratch {
  std::vector<T> s, acc, m, l, pack;
  std::vector<std::uint16_t> sb;  // the tile of P in bfloat16
  std::vector<char> nan;
  std::vector<RowMask> rows;
};

// Query tile [i0, i0 + nq) of batch entry bh: O rows (contiguous [Q, Dv] at out) and L.
template <class T>
void forward_tile(const Problem<T>& p, std::int64_t bh, std::int64_t i0, std::int64_t nq, T* out, T* lse, ForwardScratch<T>& w) {
  const std::int64_t dv = p.dv;
  w.s.resize(static_cast<std::size_t>(kTileQ * kTileK));
  w.acc.assign(static_cast<std::size_t>(nq * dv), T(0));
  w.m.assign(static_cast<std::size_t>(nq), -kInf<T>);
  w.l.assign(static_cast<std::size_t>(nq), T(0));
  w.nan.assign(static_cast<std::size_t>(nq), 0);
  w.rows.resize(static_cast<std::size_t>(nq));
  std::int64_t begin = p.k, end = 0;  // no row of the tile may attend before begin or at or past end
  for (std::int64_t r = 0; r < nq; ++r) {
    const RowMask& rm = w.rows[static_cast<std::size_t>(r)] = p.masks->row(bh * p.q + i0 + r);
    if (rm.begin < rm.end) begin = std::min(begin, rm.begin);
    end = std::max(end, rm.end);
  }
  const T* q = p.qs[bh] + i0 * p.qs.ld;
  // Key tiles wholly before every row's window are skipped: a window of W costs O(W), not O(K).
  for (std::int64_t j0 = begin / kTileK * kTileK; j0 < end; j0 += kTileK) {
    const std::int64_t nk = std::min(kTileK, end - j0);
    if (!tile_has_keys(w.rows[0], j0, nk)) continue;
    const T* k = p.ks[bh] + j0 * p.ks.ld;
    if constexpr (std::is_same_v<T, float>)
      if (p.bf16) scores_bf16(nq, nk, p.d, p.scale, p.q_rows(bh).from(i0), p.k_rows(bh).from(j0), w.s.data(), kTileK);
    if (!p.bf16) gemm(false, true, nq, nk, p.d, p.scale, q, p.qs.ld, k, p.ks.ld, T(0), w.s.data(), kTileK);
    for (std::int64_t r = 0; r < nq; ++r) {
      T* s = w.s.data() + r * kTileK;
      mask_row(p, w.rows[static_cast<std::size_t>(r)], bh, i0 + r, j0, nk, s);
      const T mx = row_max(s, nk);
      T& m = w.m[static_cast<std::size_t>(r)];
      const T m_new = std::max(m, mx);
      if (m_new == -kInf<T>) {  // nothing with a finite score yet: this tile adds nothing, unless NaN
        std::uint32_t nan = 0;
        for (std::int64_t j = 0; j < nk; ++j) nan |= s[j] != s[j];
        if (nan) w.nan[static_cast<std::size_t>(r)] = 1;
        std::fill_n(s, nk, T(0));
        continue;
      }
      // A NaN score (or +inf, through +inf - +inf) makes sum and l NaN, hence O and L NaN.
      const T c = exp_tile(m - m_new);  // 0 on the first live tile (m = -inf)
      for (std::int64_t j = 0; j < nk; ++j) s[j] = exp_tile(s[j] - m_new);  // exp(-inf) = 0 at masked keys
      const T sum = row_sum(s, nk);
      T& l = w.l[static_cast<std::size_t>(r)];
      l = l * c + sum;
      if (c != T(1))
        for (std::int64_t n = 0; n < dv; ++n) {  // selected at c = 0: a NaN or inf value whose weight underflowed adds nothing
          T& a = w.acc[static_cast<std::size_t>(r * dv + n)];
          a = c == T(0) ? T(0) : a * c;
        }
      m = m_new;
    }
    if constexpr (std::is_same_v<T, float>)
      if (p.bf16) {
        w.sb.resize(static_cast<std::size_t>(kTileQ * kTileK));
        for (std::int64_t r = 0; r < nq; ++r) round_bf16_weights(w.s.data() + r * kTileK, w.sb.data() + r * kTileK, nk);
        weighted_gemm_bf16(false, nq, dv, nk, 1.0f, w.s.data(), w.sb.data(), kTileK, p.v_rows(bh).from(j0), w.acc.data(), dv);
        continue;
      }
    weighted_gemm<T>(false, nq, dv, nk, T(1), w.s.data(), kTileK, p.vs[bh] + j0 * p.vs.ld, p.vs.ld, w.acc.data(), dv, w.pack);
  }
  for (std::int64_t r = 0; r < nq; ++r) {
    T* o = out + (i0 + r) * dv;
    const std::size_t ri = static_cast<std::size_t>(r);
    if (w.nan[ri]) {
      std::fill_n(o, dv, std::numeric_limits<T>::quiet_NaN());
      lse[2 * (i0 + r)] = lse[2 * (i0 + r) + 1] = std::numeric_limits<T>::quiet_NaN();
    } else if (w.m[ri] == -kInf<T>) {  // empty row
      std::fill_n(o, dv, T(0));
      lse[2 * (i0 + r)] = -kInf<T>;
      lse[2 * (i0 + r) + 1] = T(0);
    } else {
      for (std::int64_t n = 0; n < dv; ++n) o[n] = w.acc[ri * static_cast<std::size_t>(dv) + static_cast<std::size_t>(n)] / w.l[ri];
      // m and log l are kept apart: with |m| large, m + log l rounds to m (float32 at m = 1e4
      // already drops log l < 5e-4), and the backward's P would no longer sum to 1.
      lse[2 * (i0 + r)] = w.m[ri];
      lse[2 * (i0 + r) + 1] = std::log(w.l[ri]);
    }
  }
}

// float32 tiles for each vector width, the tiles' own loops (mask, maximum, exp, sums, dS, the
// roundings) inlined into each version.
TAPEGRAD_CPU_CLONES_FLATTENED void forward_tile_f32(const Problem<float>& p, std::int64_t bh,
                                                                                       std::int64_t i0, std::int64_t nq, float* out,
                                                                                       float* lse, ForwardScratch<float>& w) {
  forward_tile<float>(p, bh, i0, nq, out, lse, w);
}

// Query tile t of a batch entry, in an order that pairs light and heavy tiles (under a causal
// mask tile i has i + 1 key tiles of work): contiguous chunks of items get even work.
std::int64_t zigzag(std::int64_t t, std::int64_t tiles) { return t % 2 == 0 ? t / 2 : tiles - 1 - t / 2; }

// What the backward writes: gradients as contiguous [batch..., rows, width] buffers (dq one per
// key-tile group), dbias in the bias's shape (one per chunk when chunks could collide).
template <class T> struct Gradients {
  bool dq = false, dk = false, dv = false, dbias = false;
  std::vector<T*> dq_groups;
  T *dk_p = nullptr, *dv_p = nullptr;
  std::vector<T*> dbias_chunks;
  PerPair<T> dbias_at;  // offsets into a dbias buffer
  bool dslopes = false;  // ALiBi's slopes: per chunk, sums per head (added in chunk order at the end)
  std::int64_t heads = 0;
  std::vector<double*> dslopes_chunks;
};

template <class T> struct BackwardScratch {
  std::vector<T> s, dp, dk, dv, pack;
  std::vector<std::uint16_t> sb, dpb;  // the tiles of P and dS in bfloat16
  std::vector<RowMask> rows;
  double* dslopes = nullptr;  // the chunk's sums for ALiBi's slopes
};

// dS = P (dP - Δ) in place over dP, exactly 0 where P is (see backward_tile), dbias += dS, and
// the slopes' sums += dS weighted by -|i + offset - j| (kernels/attention_alibi.hpp).
template <class T>
void scores_gradient(std::int64_t bh, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                     const T* delta, const Gradients<T>& g, T* dbias, BackwardScratch<T>& w) {
  for (std::int64_t r = 0; r < nq; ++r) {
    const T* pr = w.s.data() + r * kTileK;
    T* ds = w.dp.data() + r * kTileK;
    const T dl = delta[i0 + r];
    for (std::int64_t j = 0; j < nk; ++j) ds[j] = pr[j] == T(0) ? T(0) : pr[j] * (ds[j] - dl);
    if (g.dbias) {
      T* b = dbias + g.dbias_at.at(bh, i0 + r) + j0 * g.dbias_at.sj;
      for (std::int64_t j = 0; j < nk; ++j) b[j * g.dbias_at.sj] += ds[j];
    }
    if (g.dslopes) w.dslopes[bh % g.heads] += alibi_row_gradient(w.rows[static_cast<std::size_t>(i0 + r)], ds, j0, nk);
  }
}

// The products of backward_tile after P, on bfloat16 copies (P and dS rounded here, tile by tile;
// q, k, v and dO once per call), with the same formulas and the same care for zero weights.
void backward_products_bf16(const Problem<float>& p, std::int64_t bh, std::int64_t i0, std::int64_t nq, std::int64_t j0, std::int64_t nk,
                            const float* delta, const Matrices<float>& d_out, const Bf16Matrices& d_out_b, const Gradients<float>& g,
                            float* dq, float* dbias, BackwardScratch<float>& w) {
  const std::int64_t d = p.d, dv = p.dv;
  const RoundedRows go = d_out_b.rows(d_out, bh).from(i0);
  w.sb.resize(static_cast<std::size_t>(kTileQ * kTileK));
  w.dpb.resize(static_cast<std::size_t>(kTileQ * kTileK));
  for (std::int64_t r = 0; r < nq; ++r) round_bf16_weights(w.s.data() + r * kTileK, w.sb.data() + r * kTileK, nk);
  // dv += Pᵀ ⊛ dO
  if (g.dv) weighted_gemm_bf16(true, nk, dv, nq, 1.0f, w.s.data(), w.sb.data(), kTileK, go, w.dv.data(), dv);
  if (!(g.dq || g.dk || g.dbias || g.dslopes)) return;
  // dP = dO vᵀ (not finite where a flagged row of dO or v reaches), then dS
  scores_bf16(nq, nk, dv, 1.0f, go, p.v_rows(bh).from(j0), w.dp.data(), kTileK);
  scores_gradient(bh, i0, nq, j0, nk, delta, g, dbias, w);
  for (std::int64_t r = 0; r < nq; ++r) round_bf16_weights(w.dp.data() + r * kTileK, w.dpb.data() + r * kTileK, nk);
  // dq += s dS ⊛ k,  dk += s dSᵀ ⊛ q
  if (g.dq)
    weighted_gemm_bf16(false, nq, d, nk, p.scale, w.dp.data(), w.dpb.data(), kTileK, p.k_rows(bh).from(j0), dq + (bh * p.q + i0) * d, d);
  if (g.dk)
    weighted_gemm_bf16(true, nk, d, nq, p.scale, w.dp.data(), w.dpb.data(), kTileK, p.q_rows(bh).from(i0), w.dk.data(), d);
}

// Key tile [j0, j0 + nk) of batch entry bh, against every query tile that may attend to it.
template <class T>
void backward_tile(const Problem<T>& p, std::int64_t bh, std::int64_t j0, std::int64_t nk, const T* lse, const T* delta,
                   const Matrices<T>& d_out, const Bf16Matrices& d_out_b, const Gradients<T>& g, T* dq, T* dbias, BackwardScratch<T>& w) {
  const std::int64_t d = p.d, dv = p.dv;
  const std::vector<RowMask>& rows = w.rows;
  if (!tile_has_keys(rows[0], j0, nk)) return;
  w.s.resize(static_cast<std::size_t>(kTileQ * kTileK));
  w.dp.resize(static_cast<std::size_t>(kTileQ * kTileK));
  w.dk.assign(static_cast<std::size_t>(nk * d), T(0));
  w.dv.assign(static_cast<std::size_t>(nk * dv), T(0));
  const T* k = p.ks[bh] + j0 * p.ks.ld;
  const T* v = p.vs[bh] + j0 * p.vs.ld;
  const bool need_ds = g.dq || g.dk || g.dbias || g.dslopes;
  for (std::int64_t i0 = 0; i0 < p.q; i0 += kTileQ) {
    const std::int64_t nq = std::min(kTileQ, p.q - i0);
    bool live = false;  // some row of the tile is not empty and may reach this key tile
    for (std::int64_t r = 0; r < nq && !live; ++r)
      live = rows[static_cast<std::size_t>(i0 + r)].end > j0 && rows[static_cast<std::size_t>(i0 + r)].begin < j0 + nk &&
             lse[2 * (i0 + r)] != -kInf<T>;
    if (!live) continue;
    const T* q = p.qs[bh] + i0 * p.qs.ld;
    const T* go = d_out[bh] + i0 * d_out.ld;
    if constexpr (std::is_same_v<T, float>)
      if (p.bf16) scores_bf16(nq, nk, d, p.scale, p.q_rows(bh).from(i0), p.k_rows(bh).from(j0), w.s.data(), kTileK);
    if (!p.bf16) gemm(false, true, nq, nk, d, p.scale, q, p.qs.ld, k, p.ks.ld, T(0), w.s.data(), kTileK);
    for (std::int64_t r = 0; r < nq; ++r) {
      T* s = w.s.data() + r * kTileK;
      const T m = lse[2 * (i0 + r)], log_l = lse[2 * (i0 + r) + 1];
      const RowMask& rm = rows[static_cast<std::size_t>(i0 + r)];
      if (log_l != log_l) {  // a NaN row: NaN at its allowed keys, as the forward's weights
        for (std::int64_t j = 0; j < nk; ++j) s[j] = rm(j0 + j) ? std::numeric_limits<T>::quiet_NaN() : T(0);
        continue;
      }
      if (m == -kInf<T>) {  // empty row: P = 0
        std::fill_n(s, nk, T(0));
        continue;
      }
      mask_row(p, rm, bh, i0 + r, j0, nk, s);
      for (std::int64_t j = 0; j < nk; ++j) s[j] = exp_tile((s[j] - m) - log_l);  // masked: exp(-inf) = 0
    }
    if constexpr (std::is_same_v<T, float>)
      if (p.bf16) {
        backward_products_bf16(p, bh, i0, nq, j0, nk, delta, d_out, d_out_b, g, dq, dbias, w);
        continue;
      }
    // dv += Pᵀ ⊛ dO
    if (g.dv) weighted_gemm<T>(true, nk, dv, nq, T(1), w.s.data(), kTileK, go, d_out.ld, w.dv.data(), dv, w.pack);
    if (!need_ds) continue;
    // dP = dO vᵀ, then dS = P (dP - Δ) in place; dP is not finite at a masked key whose v is not,
    // which is why dS is selected where P = 0 rather than multiplied.
    gemm(false, true, nq, nk, dv, T(1), go, d_out.ld, v, p.vs.ld, T(0), w.dp.data(), kTileK);
    scores_gradient(bh, i0, nq, j0, nk, delta, g, dbias, w);
    // dq += s dS ⊛ k,  dk += s dSᵀ ⊛ q
    if (g.dq) weighted_gemm<T>(false, nq, d, nk, p.scale, w.dp.data(), kTileK, k, p.ks.ld, dq + (bh * p.q + i0) * d, d, w.pack);
    if (g.dk) weighted_gemm<T>(true, nk, d, nq, p.scale, w.dp.data(), kTileK, q, p.qs.ld, w.dk.data(), d, w.pack);
  }
  if (g.dk) std::copy(w.dk.begin(), w.dk.end(), g.dk_p + (bh * p.k + j0) * d);
  if (g.dv) std::copy(w.dv.begin(), w.dv.end(), g.dv_p + (bh * p.k + j0) * dv);
}

// float32 for each vector width, as forward_tile_f32.
TAPEGRAD_CPU_CLONES_FLATTENED void backward_tile_f32(
    const Problem<float>& p, std::int64_t bh, std::int64_t j0, std::int64_t nk, const float* lse, const float* delta,
    const Matrices<float>& d_out, const Bf16Matrices& d_out_b, const Gradients<float>& g, float* dq, float* dbias,
    BackwardScratch<float>& w) {
  backward_tile<float>(p, bh, j0, nk, lse, delta, d_out, d_out_b, g, dq, dbias, w);
}
template <class T>
void backward_tile_any(const Problem<T>& p, std::int64_t bh, std::int64_t j0, std::int64_t nk, const T* lse, const T* delta,
                       const Matrices<T>& d_out, const Bf16Matrices& d_out_b, const Gradients<T>& g, T* dq, T* dbias,
                       BackwardScratch<T>& w) {
  if constexpr (std::is_same_v<T, float>) backward_tile_f32(p, bh, j0, nk, lse, delta, d_out, d_out_b, g, dq, dbias, w);
  else backward_tile<T>(p, bh, j0, nk, lse, delta, d_out, d_out_b, g, dq, dbias, w);
}

// What the backward recomputes the rest from: q, k, v, O and L.
struct Saved {
  Tensor q, k, v, bias, out, lse;
  RowMasks masks;
  Shape scores;
  bool bf16 = false;  // the forward's products were bfloat16: so are the backward's
};

template <class T> AttentionGrads backward(const Saved& sv, const Tensor& grad_out, const std::vector<bool>& needs) {
  const Problem<T> p(sv.q, sv.k, sv.v, sv.bias, sv.masks, sv.scores, sv.bf16);
  const Shape batch(sv.scores.begin(), sv.scores.end() - 2);
  const Tensor go = matrix_ready(grad_out);
  const Matrices<T> d_out(go, batch);
  const Bf16Matrices d_out_b = sv.bf16 ? Bf16Matrices(go, batch) : Bf16Matrices();
  const T* out = static_cast<const T*>(sv.out.raw_data());
  const T* lse = static_cast<const T*>(sv.lse.raw_data());

  // Δ_i = rowsum(dO_i O_i), in double as the weights path's rowsum(A dA). Only read where P != 0.
  std::vector<T> delta(static_cast<std::size_t>(p.bh * p.q));
  parallel_for(p.bh * p.q, std::max<std::int64_t>(p.dv, 1), [&](std::int64_t r0, std::int64_t r1) {
    for (std::int64_t r = r0; r < r1; ++r) {
      const T* o = out + r * p.dv;
      const T* gr = d_out[r / std::max<std::int64_t>(p.q, 1)] + (r % p.q) * d_out.ld;
      double sum = 0;
      for (std::int64_t n = 0; n < p.dv; ++n) sum += static_cast<double>(o[n]) * static_cast<double>(gr[n]);
      delta[static_cast<std::size_t>(r)] = static_cast<T>(sum);
    }
  });

  Gradients<T> g;
  g.dq = needs[0];
  g.dk = needs[1];
  g.dv = needs[2];
  g.dbias = wants(needs, 3) && p.has_bias;
  g.dslopes = wants(needs, 4) && sv.masks.alibi_heads() > 0;
  g.heads = sv.masks.alibi_heads();
  const DType dtype = sv.q.dtype();
  const std::int64_t key_tiles = p.key_tiles();

  // Key-tile groups per batch entry, from the shape alone (each group sums its own dq, and the
  // groups' dq are added in order, so the bits must not depend on the threads): enough items
  // (batch entry, group) for the threads to share when there are few batch entries.
  const std::int64_t groups = std::clamp<std::int64_t>((kMinItems + p.bh - 1) / std::max<std::int64_t>(p.bh, 1), 1,
                                                       std::max<std::int64_t>(key_tiles, 1));
  const std::int64_t items = p.bh * groups;
  // A work item: its key tiles against every query, 2 (D + Dv) multiply-adds per pair
  int chunks = parallel_chunks(items, cost_of({double(kTileK), double(p.q), 2.0 * double(p.d + p.dv), double(key_tiles) / double(groups)}));

  std::vector<Tensor> dq_buffers;
  if (g.dq)
    for (std::int64_t i = 0; i < groups; ++i) {
      dq_buffers.push_back(zeros(with_matrix(batch, p.q, p.d), dtype));
      g.dq_groups.push_back(static_cast<T*>(mutable_data(dq_buffers.back())));
    }
  Tensor dk, dv;
  if (g.dk) g.dk_p = static_cast<T*>(mutable_data(dk = zeros(with_matrix(batch, p.k, p.d), dtype)));
  if (g.dv) g.dv_p = static_cast<T*>(mutable_data(dv = zeros(with_matrix(batch, p.k, p.dv), dtype)));
  // The slopes' sums go to one buffer per chunk, added in order: their chunks are fixed by the
  // shape (as a dbias summed per chunk below).
  if (g.dslopes) chunks = static_cast<int>(std::min<std::int64_t>(items, kDbiasChunks));
  std::vector<Tensor> dbias_buffers;
  if (g.dbias) {
    // Items (batch entry, group) never write the same dbias element when the bias is not broadcast
    // over a batch dim and groups own disjoint keys; otherwise each chunk sums into its own buffer.
    Tensor first = zeros(sv.bias.shape(), dtype);
    g.dbias_at = PerPair<T>(first, sv.scores);
    std::vector<std::int64_t> sorted = g.dbias_at.offsets;
    std::sort(sorted.begin(), sorted.end());
    const bool shared = std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end() && (groups == 1 || g.dbias_at.sj != 0);
    // Chunks that sum into buffers of their own are fixed by the shape too (their buffers are
    // added in order); otherwise the chunking changes no bit and follows the threads.
    if (!shared) chunks = static_cast<int>(std::min<std::int64_t>(items, kDbiasChunks));
    dbias_buffers.push_back(first);
    for (int c = 1; !shared && c < chunks; ++c) dbias_buffers.push_back(zeros(sv.bias.shape(), dtype));
    for (int c = 0; c < chunks; ++c) g.dbias_chunks.push_back(static_cast<T*>(mutable_data(dbias_buffers[shared ? 0 : static_cast<std::size_t>(c)])));
  }

  std::vector<std::vector<double>> dslopes_buffers;
  if (g.dslopes) {
    dslopes_buffers.assign(static_cast<std::size_t>(chunks), std::vector<double>(static_cast<std::size_t>(g.heads), 0.0));
    for (auto& b : dslopes_buffers) g.dslopes_chunks.push_back(b.data());
  }

  // With Q = 0 or K = 0 there is no pair: every gradient stays 0.
  if (p.q > 0 && p.k > 0) parallel_for(chunks, kParallelGrain, [&](std::int64_t c0, std::int64_t c1) {
    BackwardScratch<T> w;
    for (std::int64_t c = c0; c < c1; ++c)
      for (std::int64_t item = items * c / chunks; item < items * (c + 1) / chunks; ++item) {
        const std::int64_t bh = item / groups, group = item % groups;
        w.rows.resize(static_cast<std::size_t>(p.q));
        for (std::int64_t i = 0; i < p.q; ++i) w.rows[static_cast<std::size_t>(i)] = p.masks->row(bh * p.q + i);
        T* dq = g.dq ? g.dq_groups[static_cast<std::size_t>(group)] : nullptr;
        T* db = g.dbias ? g.dbias_chunks[static_cast<std::size_t>(c)] : nullptr;
        w.dslopes = g.dslopes ? g.dslopes_chunks[static_cast<std::size_t>(c)] : nullptr;
        for (std::int64_t t = group; t < key_tiles; t += groups)
          backward_tile_any(p, bh, t * kTileK, std::min(kTileK, p.k - t * kTileK), lse + 2 * bh * p.q, delta.data() + bh * p.q, d_out, d_out_b, g, dq,
                        db, w);
      }
  });

  AttentionGrads grads;  // dq and dk are scaled: the tiles multiply by s as they sum
  if (g.dq) {
    grads.dq = dq_buffers[0];
    for (std::size_t i = 1; i < dq_buffers.size(); ++i) grads.dq = add_same_shape(grads.dq, dq_buffers[i]);
  }
  grads.dk = dk;
  grads.dv = dv;
  if (g.dbias) {
    grads.dbias = dbias_buffers[0];
    for (std::size_t i = 1; i < dbias_buffers.size(); ++i) grads.dbias = add_same_shape(grads.dbias, dbias_buffers[i]);
  }
  if (g.dslopes) {
    std::vector<double> sums(static_cast<std::size_t>(g.heads), 0.0);
    for (const auto& b : dslopes_buffers)
      for (std::size_t h = 0; h < sums.size(); ++h) sums[h] += b[h];
    grads.dslopes = from_vector(std::span<const double>(sums), {g.heads}).to(dtype);
  }
  return grads;
}

class FlashBackward final : public AttentionBackward {
 public:
  explicit FlashBackward(Saved sv) : sv_(std::move(sv)) {}
  AttentionGrads operator()(const Tensor& d_out, const Tensor&, const std::vector<bool>& needs) const override {
    if (!d_out.defined()) return {};
    return visit_float(sv_.q.dtype(), "attention", [&]<class T>(Tag<T>) { return backward<T>(sv_, d_out, needs); });
  }

 private:
  Saved sv_;
};

}  // namespace

AttentionRun attention_tiles(const AttentionArgs& a, const Shape& scores_shape, const RowMasks& masks, bool bf16) {
  Saved sv{matrix_ready(a.q), matrix_ready(a.k), matrix_ready(a.v), a.bias, Tensor(), Tensor(), masks, scores_shape, bf16};
  const Shape batch(scores_shape.begin(), scores_shape.end() - 2);
  const std::int64_t q_len = scores_shape[scores_shape.size() - 2];
  const DType dtype = a.q.dtype();
  sv.out = new_tensor(with_matrix(batch, q_len, a.v.shape().back()), dtype, a.op);
  Shape lse_shape = batch;
  lse_shape.push_back(2 * q_len);  // per row: the maximum m, then log l
  sv.lse = new_tensor(lse_shape, dtype, a.op);
  visit_float(dtype, a.op, [&]<class T>(Tag<T>) {
    const Problem<T> p(sv.q, sv.k, sv.v, sv.bias, sv.masks, scores_shape, sv.bf16);
    T* out = static_cast<T*>(mutable_data(sv.out));
    T* lse = static_cast<T*>(mutable_data(sv.lse));
    const std::int64_t tiles = p.query_tiles();
    // A tile costs its rows (fewer than kTileQ when Q is: one when decoding) times the keys.
    parallel_for(p.bh * tiles, std::min(kTileQ, p.q) * p.k * (p.d + p.dv), [&](std::int64_t t0, std::int64_t t1) {
      ForwardScratch<T> w;
      for (std::int64_t t = t0; t < t1; ++t) {
        const std::int64_t bh = t / tiles, i0 = zigzag(t % tiles, tiles) * kTileQ;
        if constexpr (std::is_same_v<T, float>)
          forward_tile_f32(p, bh, i0, std::min(kTileQ, p.q - i0), out + bh * p.q * p.dv, lse + 2 * bh * p.q, w);
        else
          forward_tile(p, bh, i0, std::min(kTileQ, p.q - i0), out + bh * p.q * p.dv, lse + 2 * bh * p.q, w);
      }
    });
  });
  AttentionRun run{sv.out, Tensor(), masks.saved_with({a.q, a.k, a.v, sv.out}), nullptr};
  if (a.bias.defined()) run.saved.push_back(a.bias);
  sv.out = sv.out.detach();
  run.backward = std::make_shared<FlashBackward>(std::move(sv));
  return run;
}

}  // namespace tapegrad::detail
