// The row-by-row attention mask agrees with the materialised product of its parts, for causal
// offsets on both sides of the diagonal and beyond the matrix, and rejects misshapen parts.
#define BOOST_TEST_MODULE attention_mask
#include <boost/test/unit_test.hpp>

#include <tapegrad/tapegrad.hpp>

#include "kernels/attention_mask.hpp"

namespace tg = tapegrad;
using tg::Tensor;

BOOST_AUTO_TEST_CASE(rows_match_the_materialised_mask) {
  const std::int64_t B = 2, H = 3, Q = 4, K = 5;
  const Tensor keys = tg::gt(tg::rand({B, K}, 1), tg::scalar(0.3));
  const Tensor queries = tg::gt(tg::rand({B, Q}, 2), tg::scalar(0.3));
  const Tensor pairs = tg::gt(tg::rand({B, 1, Q, K}, 3), tg::scalar(0.2));
  for (std::int64_t offset : {std::int64_t{-2}, std::int64_t{0}, std::int64_t{1}, std::int64_t{100}, std::int64_t{-100},
                              INT64_MAX, INT64_MIN}) {
    const tg::detail::RowMasks rows(
        "test", {.allowed = pairs, .key_mask = keys, .query_mask = queries, .causal = true, .causal_offset = offset}, {B, H, Q, K});
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

BOOST_AUTO_TEST_CASE(no_parts_allow_everything) {
  const tg::detail::RowMasks rows("test", {}, {2, 3, 4});
  BOOST_TEST(rows.empty());
  BOOST_TEST(rows.row(5).dense());
  BOOST_TEST(rows.row(5).end == 4);
}

BOOST_AUTO_TEST_CASE(misshapen_parts_are_named) {
  const Tensor keys = tg::ones({2, 6}, tg::bool_);
  try {
    tg::detail::RowMasks("attn", {.key_mask = keys}, {2, 3, 4, 5});
    BOOST_FAIL("expected ShapeError");
  } catch (const tg::ShapeError& e) {
    BOOST_TEST(std::string(e.what()).find("'key_mask' must have shape [B, K] = [2, 5]") != std::string::npos, e.what());
  }
  BOOST_CHECK_THROW(tg::detail::RowMasks("attn", {.allowed = tg::ones({3, 5})}, {2, 3, 4, 5}), tg::DTypeError);
}
