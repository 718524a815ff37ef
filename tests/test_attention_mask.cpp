// The row-by-row attention mask agrees with the materialised product of its parts, for causal
// offsets on both sides of the diagonal and beyond the matrix, and its one check (masking_rows)
// rejects misshapen parts.
#define BOOST_TEST_MODULE attention_mask
#include <boost/test/unit_test.hpp>
#include <cmath>

#include <tapegrad/tapegrad.hpp>

#include "kernels/attention_mask.hpp"
#include "ops/attention_masking.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace {
tg::detail::RowMasks rows_of(const tg::AttentionMasking& m, const tg::Shape& scores, std::int64_t key_start = 0) {
  return tg::detail::masking_rows("attn", m, scores, tg::float64, {}, key_start);
}
}  // namespace

BOOST_AUTO_TEST_CASE(rows_match_the_materialised_mask) {
  const std::int64_t B = 2, H = 3, Q = 4, K = 5;
  const Tensor keys = tg::gt(tg::rand({B, K}, 1), tg::scalar(0.3));
  const Tensor queries = tg::gt(tg::rand({B, Q}, 2), tg::scalar(0.3));
  const Tensor pairs = tg::gt(tg::rand({B, 1, Q, K}, 3), tg::scalar(0.2));
  for (std::int64_t offset : {std::int64_t{-2}, std::int64_t{0}, std::int64_t{1}, std::int64_t{100}, std::int64_t{-100},
                              INT64_MAX, INT64_MIN}) {
    const tg::detail::RowMasks rows =
        rows_of({.mask = pairs, .key_mask = keys, .query_mask = queries, .causal = true, .causal_offset = offset}, {B, H, Q, K});
    Tensor full = tg::logical_and(tg::reshape(keys, {B, 1, 1, K}), tg::reshape(queries, {B, 1, Q, 1}));
    full = tg::logical_and(tg::logical_and(full, pairs), tg::causal_mask(Q, K, offset));
    full = tg::contiguous(tg::expand(full, {B, H, Q, K}));
    const bool* expected = full.data<bool>();
    for (std::int64_t r = 0; r < B * H * Q; ++r) {
      const tg::detail::RowMask row = rows.row(r);
      for (std::int64_t j = 0; j < K; ++j) BOOST_REQUIRE_MESSAGE(row(j) == expected[r * K + j], "offset " << offset << " row " << r << " key " << j);
    }
  }
}

// The window's rule p_i - W < j <= p_i with p_i = i + offset holds exactly for every int64 offset
// and window, however far past 2^62 (the rule computed here in 128 bits).
BOOST_AUTO_TEST_CASE(windows_and_offsets_at_the_ends_of_int64_follow_the_rule_exactly) {
  __extension__ typedef __int128 wide;
  const std::int64_t Q = 3, K = 9, far = std::int64_t{1} << 62;
  const std::int64_t offsets[] = {INT64_MIN, INT64_MIN + 1, -far - 10, -far, -5, 0, 3, far, far + 10, INT64_MAX - 1, INT64_MAX};
  const std::int64_t windows[] = {1, 2, 5, far, far + 5, far + 12, INT64_MAX - 1, INT64_MAX};
  for (const std::int64_t offset : offsets)
    for (const std::int64_t window : windows) {
      const tg::detail::RowMasks rows = rows_of({.causal = true, .causal_offset = offset, .window = window}, {Q, K});
      for (std::int64_t i = 0; i < Q; ++i) {
        const tg::detail::RowMask row = rows.row(i);
        BOOST_REQUIRE(row.begin <= row.end);
        for (std::int64_t j = 0; j < K; ++j) {
          const wide p = static_cast<wide>(i) + offset;
          const bool allowed = static_cast<wide>(j) <= p && static_cast<wide>(j) > p - window;
          BOOST_REQUIRE_MESSAGE(row(j) == allowed, "offset " << offset << " window " << window << " query " << i << " key " << j);
        }
      }
    }
}

// ALiBi reads the distances |i + offset - j| as exact doubles: an offset past 2^52 is refused, as
// is a slope that is not finite (inf * 0 at distance 0), naming the head.
BOOST_AUTO_TEST_CASE(alibi_refuses_what_it_cannot_compute_exactly) {
  const tg::Shape scores{1, 3, 2, 4};
  const std::int64_t limit = std::int64_t{1} << 52;
  for (const std::int64_t offset : {-limit, limit})
    BOOST_CHECK_NO_THROW(rows_of({.causal_offset = offset, .alibi_slopes = tg::alibi_slopes(3, tg::float64)}, scores));
  for (const std::int64_t offset : {-limit - 1, limit + 1, INT64_MAX}) {
    try {
      rows_of({.causal_offset = offset, .alibi_slopes = tg::alibi_slopes(3, tg::float64)}, scores);
      BOOST_ERROR("expected a ValueError for offset " << offset);
    } catch (const tg::ValueError& e) {
      BOOST_TEST(std::string(e.what()).find("causal_offset must lie in [-2^52, 2^52]") != std::string::npos, e.what());
    }
  }
  for (const double bad : {HUGE_VAL, -HUGE_VAL, std::nan("")}) {
    try {
      rows_of({.alibi_slopes = tg::tensor({0.5, bad, 0.25}, tg::float64)}, scores);
      BOOST_ERROR("expected a ValueError for slope " << bad);
    } catch (const tg::ValueError& e) {
      BOOST_TEST(std::string(e.what()).find("for head 1; every slope must be finite") != std::string::npos, e.what());
    }
  }
}

BOOST_AUTO_TEST_CASE(no_parts_allow_everything) {
  const tg::detail::RowMasks rows = rows_of({}, {2, 3, 4});
  BOOST_TEST(rows.empty());
  BOOST_TEST(rows.row(5).dense());
  BOOST_TEST(rows.row(5).end == 4);
}

BOOST_AUTO_TEST_CASE(misshapen_parts_are_named) {
  const Tensor keys = tg::ones({2, 6}, tg::bool_);
  try {
    rows_of({.key_mask = keys}, {2, 3, 4, 5});
    BOOST_FAIL("expected ShapeError");
  } catch (const tg::ShapeError& e) {
    BOOST_TEST(std::string(e.what()).find("'masking.key_mask' must have shape [B, K] = [2, 5]") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(rows_of({.mask = tg::ones({3, 5})}, {2, 3, 4, 5}), tg::DTypeError);
}

// A KV cache that dropped its oldest keys reads rows from key_start on: the same rows, shifted,
// at the same positions (the causal end, the window and ALiBi's distances).
BOOST_AUTO_TEST_CASE(rows_from_a_key_start_are_the_full_rows_shifted) {
  const std::int64_t B = 2, H = 2, Q = 3, K = 11, start = 4;
  const Tensor keys = tg::gt(tg::rand({B, K}, 4), tg::scalar(0.2));
  const Tensor pairs = tg::gt(tg::rand({B, H, Q, K}, 5), tg::scalar(0.2));
  const tg::AttentionMasking m{.mask = pairs, .key_mask = keys, .causal = true, .causal_offset = 7, .window = 5,
                               .alibi_slopes = tg::alibi_slopes(H, tg::float64)};
  const tg::detail::RowMasks full = rows_of(m, {B, H, Q, K}), held = rows_of(m, {B, H, Q, K}, start);
  for (std::int64_t r = 0; r < B * H * Q; ++r) {
    const tg::detail::RowMask a = full.row(r), b = held.row(r);
    for (std::int64_t j = start; j < K; ++j) BOOST_REQUIRE_MESSAGE(a(j) == b(j - start), "row " << r << " key " << j);
    BOOST_TEST(a.alibi_bias<double>(K - 1) == b.alibi_bias<double>(K - 1 - start));
  }
}
