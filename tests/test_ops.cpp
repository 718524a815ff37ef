// The data-driven op suite: every entry of the op table, on every sample, in every layout
// (contiguous, transposed, strided, expanded), is checked against its reference in float64,
// against float64 in float32, for dtype preservation and untouched inputs, by float64
// gradcheck and gradgradcheck, and on its error inputs.
#define BOOST_TEST_MODULE ops
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>

#include "op_table.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace bdata = boost::unit_test::data;
using namespace tg_test;
using tg::Shape;
using tg::Tensor;

namespace {

enum class Layout { contiguous, transposed, strided, expanded };
const char* layout_name(Layout l) {
  switch (l) {
    case Layout::contiguous: return "contiguous";
    case Layout::transposed: return "transposed";
    case Layout::strided: return "strided";
    case Layout::expanded: return "expanded";
  }
  return "?";
}

// The leaves a test owns, and how each becomes the op's input (expanded or as is).
struct Inputs {
  std::vector<Tensor> leaves;
  std::vector<Shape> shapes;  // the op's input shapes
  bool expand = false;

  std::vector<Tensor> apply(const std::vector<Tensor>& leaves_now) const {
    std::vector<Tensor> out;
    for (std::size_t i = 0; i < leaves_now.size(); ++i)
      out.push_back(expand ? tg::expand(leaves_now[i], shapes[i]) : leaves_now[i]);
    return out;
  }
  std::vector<Ref> refs() const {
    std::vector<Ref> out;
    for (std::size_t i = 0; i < leaves.size(); ++i) {
      const Ref leaf = Ref::of(leaves[i]);
      Ref r{shapes[i], {}};
      for (std::int64_t k = 0; k < r.numel(); ++k) r.v.push_back(leaf.at_broadcast(r.unravel(k)));
      out.push_back(r);
    }
    return out;
  }
};

Shape expanded_leaf_shape(Shape s) {
  for (auto& d : s)
    if (d > 1) {
      d = 1;
      break;
    }
  return s;
}

// Same values, different memory layout.
Tensor arrange(const Tensor& base, Layout layout) {
  if (layout == Layout::transposed && base.dim() >= 2) {
    Tensor t = relaid(base, ArgLayout::transposed).detach();
    BOOST_REQUIRE(!t.is_contiguous() || base.numel() <= 1 || base.shape()[0] == 1 || base.shape().back() == 1);
    return t;
  }
  if (layout == Layout::strided && base.dim() >= 1) return relaid(base, ArgLayout::strided).detach();
  return base;
}

Inputs make_inputs(const OpInfo& info, const std::vector<Shape>& shapes, Layout layout, tg::DType dtype, std::uint64_t seed) {
  Inputs in;
  in.shapes = shapes;
  in.expand = layout == Layout::expanded;
  tg::Generator gen(seed);
  for (const auto& s : shapes) {
    const Shape leaf_shape = in.expand ? expanded_leaf_shape(s) : s;
    Tensor base = info.positive ? tg::rand(leaf_shape, gen, tg::float64, 0.5, 2.0) : tg::randn(leaf_shape, gen, tg::float64);
    in.leaves.push_back(arrange(tg::to(base, dtype), layout));
  }
  return in;
}

bool layout_applies(const std::vector<Shape>& shapes, Layout layout) {
  if (layout != Layout::expanded) return true;
  for (const auto& s : shapes)
    if (expanded_leaf_shape(s) != s) return true;
  return false;
}

std::string shapes_str(const std::vector<Shape>& shapes) {
  std::string out;
  for (const auto& s : shapes) out += fmt::format("[{}]", fmt::join(s, ", "));
  return out;
}

// Runs check(shapes, layout, seed) on every sample of the entry in every layout that applies.
template <class Check> void for_each_sample_and_layout(const std::string& name, const OpInfo& info, Check check) {
  std::uint64_t seed = 1;
  for (const auto& shapes : info.samples)
    for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded}) {
      if (!layout_applies(shapes, layout)) continue;
      // Masks and ids the entry makes take the layout too.
      const ArgLayout args(layout == Layout::transposed ? ArgLayout::transposed
                           : layout == Layout::strided  ? ArgLayout::strided
                                                        : ArgLayout::as_made);
      BOOST_TEST_CONTEXT(name << " on " << shapes_str(shapes) << ", " << layout_name(layout)) { check(shapes, layout, ++seed); }
      tg::clear_tape();
    }
}


bool no_elements(const std::vector<Tensor>& leaves) {
  return std::all_of(leaves.begin(), leaves.end(), [](const Tensor& t) { return t.numel() == 0; });
}

// A sample with no element to perturb: gradcheck refuses it (it would compare nothing), but the
// backward still runs on the empty tensors and gives each input a gradient of its own shape.
void check_empty_backward(const std::vector<Tensor>& outputs, const std::vector<Tensor>& leaves) {
  std::vector<Tensor> recorded, upstream;
  for (const Tensor& o : outputs)
    if (o.requires_grad()) {
      recorded.push_back(o);
      upstream.push_back(tg::ones_like(o));
    }
  if (recorded.empty()) return;
  const std::vector<Tensor> grads = tg::grad(recorded, leaves, upstream, {.allow_unused = true});
  for (std::size_t i = 0; i < grads.size(); ++i)
    if (grads[i].defined()) BOOST_CHECK_MESSAGE(grads[i].shape() == leaves[i].shape(), "the gradient of empty input " << i);
}

void check_against_reference(const std::string& name) {
  const OpInfo& info = find_op(name);
  for_each_sample_and_layout(name, info, [&](const std::vector<Shape>& shapes, Layout layout, std::uint64_t seed) {
    // float64 against the independent reference; dtype kept; inputs untouched.
    const Inputs in64 = make_inputs(info, shapes, layout, tg::float64, seed);
    std::vector<std::vector<double>> before;
    for (const auto& t : in64.leaves) before.push_back(t.to_vector<double>());
    const auto out64 = info.op(in64.apply(in64.leaves));
    const auto expected = info.reference(in64.refs());
    BOOST_REQUIRE_EQUAL(out64.size(), expected.size());
    for (std::size_t o = 0; o < out64.size(); ++o) {
      BOOST_CHECK_MESSAGE(out64[o].shape() == expected[o].shape,
                          "output " << o << " shape " << fmt::format("{}", out64[o].shape()) << " expected "
                                    << fmt::format("{}", expected[o].shape));
      BOOST_CHECK(out64[o].dtype() == tg::float64);
      check_close(out64[o].to_vector<double>(), expected[o].v, 1e-12, 1e-12, fmt::format("{} output {}", name, o));
    }
    for (std::size_t i = 0; i < before.size(); ++i)
      BOOST_CHECK_MESSAGE(in64.leaves[i].to_vector<double>() == before[i], "input " << i << " was modified");

    // float32 agrees with float64 and stays float32.
    const Inputs in32 = make_inputs(info, shapes, layout, tg::float32, seed);
    const auto out32 = info.op(in32.apply(in32.leaves));
    for (std::size_t o = 0; o < out32.size(); ++o) {
      BOOST_CHECK(out32[o].dtype() == tg::float32);
      check_close(out32[o].to_vector<double>(), out64[o].to_vector<double>(), info.f32_tol, info.f32_tol,
                  fmt::format("{} float32 output {}", name, o));
    }

    // float64 gradients against central differences.
    if (info.differentiable) {
      std::vector<Tensor> leaves = in64.leaves;
      for (auto& l : leaves) l = l.detach().set_requires_grad();
      const auto f = [&](const std::vector<Tensor>& xs) { return info.op(in64.apply(xs)); };
      if (no_elements(leaves)) {
        check_empty_backward(f(leaves), leaves);
        BOOST_CHECK_THROW(tg::gradcheck(f, leaves, info.grad), tg::ValueError);  // nothing to check
      } else {
        const auto result = tg::gradcheck(f, leaves, info.grad);
        BOOST_CHECK_MESSAGE(result.ok, result.report());
      }
    }
  });
}

// Second order: float64 gradgradcheck (the gradients of the op's gradients, with respect to
// the inputs and to random upstream gradients) on every sample and layout.
void check_second_order(const std::string& name) {
  const OpInfo& info = find_op(name);
  if (!info.differentiable) return;
  for_each_sample_and_layout(name, info, [&](const std::vector<Shape>& shapes, Layout layout, std::uint64_t seed) {
    const Inputs in64 = make_inputs(info, shapes, layout, tg::float64, seed);
    std::vector<Tensor> leaves = in64.leaves;
    for (auto& l : leaves) l = l.detach().set_requires_grad();
    const auto f = [&](const std::vector<Tensor>& xs) { return info.op(in64.apply(xs)); };
    if (no_elements(leaves)) {
      BOOST_CHECK_THROW(tg::gradgradcheck(f, leaves, {}, info.grad), tg::ValueError);  // nothing to check
      return;
    }
    const auto result = tg::gradgradcheck(f, leaves, {}, info.grad);
    BOOST_CHECK_MESSAGE(result.ok, result.report());
  });
}

void check_error_inputs(const std::string& name) {
  const OpInfo& info = find_op(name);
  for (const auto& e : info.errors) {
    BOOST_TEST_CONTEXT(name << ": " << e.description) {
      switch (e.raises) {
        case Raises::shape: check_throws<tg::ShapeError>(e.call, e.fragments); break;
        case Raises::dtype: check_throws<tg::DTypeError>(e.call, e.fragments); break;
        case Raises::value: check_throws<tg::ValueError>(e.call, e.fragments); break;
        case Raises::graph: check_throws<tg::GraphError>(e.call, e.fragments); break;
        case Raises::error: check_throws<tg::Error>(e.call, e.fragments); break;
      }
    }
  }
}

// Whether the message starts with "name:" (or "name::member:") for one of the entry's names.
bool names_one_of(const std::string& msg, const std::vector<std::string>& names) {
  return std::any_of(names.begin(), names.end(), [&](const std::string& n) { return msg.rfind(n + ":", 0) == 0; });
}

// Each input of the first sample in turn replaced by an undefined Tensor: the function must
// name itself and the argument, not fail inside Tensor (or crash).
void check_undefined_inputs(const std::string& name) {
  const OpInfo& info = find_op(name);
  if (!info.undefined_inputs_unreachable.empty()) {
    BOOST_TEST_MESSAGE(name << ": undefined arguments are in its error inputs (" << info.undefined_inputs_unreachable << ")");
    return;
  }
  const Inputs in = make_inputs(info, info.samples.front(), Layout::contiguous, tg::float64, 1);
  for (std::size_t i = 0; i < in.leaves.size(); ++i) {
    BOOST_TEST_CONTEXT(name << " with input " << i << " undefined") {
      std::vector<Tensor> args = in.leaves;
      args[i] = Tensor();
      try {
        info.op(args);
        BOOST_ERROR("no error");
      } catch (const tg::Error& e) {
        const std::string msg = e.what();
        BOOST_CHECK_MESSAGE(msg.find("undefined") != std::string::npos && msg.find("argument '") != std::string::npos &&
                                names_one_of(msg, info.covers),
                            "message '" << msg << "' should name one of " << fmt::format("{}", info.covers)
                                        << " and the undefined argument");
      }
    }
  }
}

}  // namespace

BOOST_AUTO_TEST_SUITE(op_table_suite)

BOOST_DATA_TEST_CASE(matches_reference_in_every_layout, bdata::make(op_names()), name) { check_against_reference(name); }

BOOST_DATA_TEST_CASE(second_order_gradients_in_every_layout, bdata::make(op_names()), name) { check_second_order(name); }

BOOST_DATA_TEST_CASE(rejects_bad_inputs_with_clear_errors, bdata::make(op_names()), name) { check_error_inputs(name); }

BOOST_DATA_TEST_CASE(undefined_inputs_name_the_function_and_argument, bdata::make(op_names()), name) {
  check_undefined_inputs(name);
}

// Every op and layer the public headers (ops/ and layers/) declare must be named by some entry,
// or be one of the few declarations that are not differentiable ops (the in-place updates, the
// precision setting, Module) or layers built on the table's ops, each named in the suite that
// tests it; so nothing escapes.
BOOST_AUTO_TEST_CASE(every_public_op_has_an_entry) {
  std::set<std::string> covered;
  for (const auto& info : op_table()) covered.insert(info.covers.begin(), info.covers.end());
  const std::map<std::string, std::string> elsewhere{
      {"add_", "test_inplace"},         {"mul_", "test_inplace"},          {"addcmul_", "test_inplace"},
      {"addcdiv_", "test_inplace"},     {"lerp_", "test_inplace"},         {"fill_", "test_inplace"},
      {"zero_", "test_inplace"},        {"copy_", "test_inplace"},         {"adam_update_", "test_optim"},
      {"sum_of_squares", "test_optim"}, {"set_matmul_precision", "test_matmul"}, {"MatmulPrecisionGuard", "test_matmul"},
      {"Module", "test_module"},        {"ModuleVisitor", "test_module"},  {"Linear", "test_layers"},
      {"Embedding", "test_layers"},     {"LayerNorm", "test_layers"},      {"Dropout", "test_layers"},
      {"FeedForward", "test_layers"},   {"LearnedPositions", "test_layers"}, {"SinusoidalPositions", "test_layers"},
      {"TransformerBlock", "test_layers"}, {"Decoder", "test_layers"}, {"RMSNorm", "test_layers"}, {"Norm", "test_layers"}, {"check_window", "test_attention_variants"},
      {"check_kv_heads", "test_attention_variants"},
      {"generate", "test_sampling"},    {"generate_tokens", "test_sampling"}};
  for (const auto& [name, suite] : elsewhere) {
    std::ifstream in(std::string(TAPEGRAD_TESTS) + "/" + suite + ".cpp");
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    BOOST_CHECK_MESSAGE(text.find(name) != std::string::npos, name << " is said to be tested in " << suite << ", which never names it");
    covered.insert(name);
  }
  // A declaration is a line "[inline ]Tensor name(" (or bool, void, double, ...) or "class Name"
  // at namespace scope.
  auto declared_name = [](std::string line) -> std::string {
    if (line.rfind("inline ", 0) == 0) line.erase(0, 7);
    for (const std::string type : {"Tensor ", "bool ", "void ", "double ", "Shape ", "AttentionResult ", "class "}) {
      if (line.rfind(type, 0) != 0) continue;
      const auto open = line.find_first_of("( ;{", type.size());
      const std::string name = line.substr(type.size(), open - type.size());
      const bool identifier = open != std::string::npos && !name.empty() &&
                              name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") == std::string::npos;
      return identifier ? name : "";
    }
    return "";
  };
  std::size_t found = 0;
  std::set<std::string> declared;
  std::vector<std::filesystem::directory_entry> headers;
  for (const char* dir : {TAPEGRAD_INCLUDE "/ops", TAPEGRAD_INCLUDE "/layers"})
    for (const auto& file : std::filesystem::directory_iterator(dir)) headers.push_back(file);
  for (const auto& file : headers) {
    std::ifstream in(file.path());
    for (std::string line; std::getline(in, line);) {
      const std::string name = declared_name(line);
      if (name.empty()) continue;
      ++found;
      declared.insert(name);
      BOOST_CHECK_MESSAGE(covered.count(name) == 1,
                          name << " (" << file.path().filename().string() << ") has no entry in the op table and is not listed as tested elsewhere");
    }
  }
  BOOST_TEST(found >= 90u);
  // The training ops must be among the declarations this parser recognises: one declared in a
  // form it misses would escape the check above silently.
  for (const char* name : {"clone", "index_select", "embedding", "gather", "argmax", "log_softmax", "cross_entropy",
                           "mse_loss", "layer_norm", "dropout"})
    BOOST_CHECK_MESSAGE(declared.count(name) == 1, name << " is not declared where the coverage test looks");
}

// Counts for the record, and a floor so that the table cannot silently shrink.
BOOST_AUTO_TEST_CASE(table_statistics) {
  std::size_t samples = 0, runs = 0, errors = 0;
  for (const auto& info : op_table()) {
    samples += info.samples.size();
    for (const auto& shapes : info.samples)
      for (Layout layout : {Layout::contiguous, Layout::transposed, Layout::strided, Layout::expanded})
        runs += layout_applies(shapes, layout) ? 1 : 0;
    errors += info.errors.size();
  }
  BOOST_TEST_MESSAGE("op table: " << op_table().size() << " entries, " << samples << " samples, " << runs
                                  << " sample-layout runs, " << errors << " error inputs");
  BOOST_TEST(op_table().size() >= 80u);
  BOOST_TEST(errors >= 200u);
}

BOOST_AUTO_TEST_SUITE_END()
