// Safetensors checkpoints: bit-exact round trips, Module save/load, refusal of every corrupt file
// (no crash, no over-read: this suite also runs under AddressSanitizer), atomic saving, and the
// two halves of the interoperability check with tests/data/read_safetensors.py.
#define BOOST_TEST_MODULE checkpoint
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>

#include "files.hpp"
#include "support.hpp"

namespace tg = tapegrad;
namespace fs = std::filesystem;
using namespace tg_test;
using tg::Tensor;

namespace {

// One file rewritten in place (pwrite + ftruncate). The corruption loops write thousands of
// variants, and on ext4 truncating a file to zero and rewriting it costs a flush at each close.
struct ScratchFile {
  explicit ScratchFile(fs::path p) : path(std::move(p)), fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600)) {
    BOOST_REQUIRE(fd >= 0);
  }
  ~ScratchFile() { ::close(fd); }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  void set(std::string_view bytes) const {
    BOOST_REQUIRE(::pwrite(fd, bytes.data(), bytes.size(), 0) == static_cast<ssize_t>(bytes.size()));
    BOOST_REQUIRE(::ftruncate(fd, static_cast<off_t>(bytes.size())) == 0);
  }
  fs::path path;
  int fd;
};

// The bytes of a tensor's values in row-major order.
std::string value_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  const auto* p = static_cast<const char*>(c.raw_data());
  return std::string(p, p + static_cast<std::size_t>(c.numel()) * tg::itemsize(c.dtype()));
}

void check_bit_equal(const Tensor& got, const Tensor& expected, const std::string& what) {
  BOOST_REQUIRE_MESSAGE(got.defined(), what << ": missing");
  BOOST_CHECK_MESSAGE(got.dtype() == expected.dtype(), what << ": dtype " << got.dtype() << " vs " << expected.dtype());
  BOOST_CHECK_MESSAGE(got.shape() == expected.shape(), what << ": shape " << fmt::format("{}", fmt::join(got.shape(), ","))
                                                           << " vs " << fmt::format("{}", fmt::join(expected.shape(), ",")));
  BOOST_CHECK_MESSAGE(value_bytes(got) == value_bytes(expected), what << ": values differ bitwise");
}

std::vector<std::string> names_of(const tg::SafetensorsFile& f) {
  std::vector<std::string> out;
  for (const auto& t : f.tensors) out.push_back(t.name);
  return out;
}

// A file made by hand: the 8-byte length, the header, the data.
std::string make_file(std::string_view header, std::string_view data = {}) {
  std::string out(8, '\0');
  const std::uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out += header;
  out += data;
  return out;
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string out(v.size() * 4, '\0');
  std::memcpy(out.data(), std::data(v), out.size());
  return out;
}

Tensor f32(std::vector<float> v, const tg::Shape& shape) { return tg::from_vector(std::span<const float>(v), shape); }
Tensor f64(std::vector<double> v, const tg::Shape& shape) { return tg::from_vector(std::span<const double>(v), shape); }
Tensor i64(std::vector<std::int64_t> v, const tg::Shape& shape) {
  return tg::from_vector(std::span<const std::int64_t>(v), shape);
}

// Values chosen to catch any conversion on the way: NaN payloads, signed zero, infinities,
// subnormals, extremes.
std::vector<tg::NamedTensor> every_dtype() {
  constexpr float fmax = std::numeric_limits<float>::max();
  constexpr double dmax = std::numeric_limits<double>::max();
  return {
      {"f32", f32({0.5f, -0.0f, std::bit_cast<float>(0x7fc01234u), std::numeric_limits<float>::infinity(),
                   -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::denorm_min(), fmax, -fmax},
                  {2, 4})},
      {"f64", f64({1.0 / 3.0, -0.0, std::bit_cast<double>(0xfff0000000000abcull), std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::denorm_min(), dmax},
                  {3, 1, 2})},
      {"mask", tg::from_bools({true, false, false, true, true}, {5})},
      {"ids", i64({std::numeric_limits<std::int64_t>::min(), -1, 0, 1, std::numeric_limits<std::int64_t>::max()}, {5, 1})},
  };
}

// Raises RLIMIT_FSIZE's soft limit back and restores SIGXFSZ when the test is done with them.
struct FileSizeLimit {
  explicit FileSizeLimit(rlim_t bytes) {
    getrlimit(RLIMIT_FSIZE, &saved);
    previous_handler = std::signal(SIGXFSZ, SIG_IGN);  // write() then fails with EFBIG instead
    rlimit lowered = saved;
    lowered.rlim_cur = bytes;
    setrlimit(RLIMIT_FSIZE, &lowered);
  }
  ~FileSizeLimit() {
    setrlimit(RLIMIT_FSIZE, &saved);
    std::signal(SIGXFSZ, previous_handler);
  }
  rlimit saved{};
  void (*previous_handler)(int) = nullptr;
};

// A tiny model: two parameters and a child.
struct Child : tg::Module {
  explicit Child(std::uint64_t seed) : scale(tg::randn({4}, seed, tg::float64).set_requires_grad()) {}
  void visit(tg::ModuleVisitor& v) override { v.parameter("scale", scale); }
  Tensor scale;
};

struct Tiny : tg::Module {
  explicit Tiny(std::uint64_t seed)
      : w(tg::randn({2, 3}, seed).set_requires_grad()), b(tg::randn({3}, seed + 1).set_requires_grad()), child(seed + 2) {}
  void visit(tg::ModuleVisitor& v) override {
    v.parameter("w", w);
    v.parameter("b", b);
    v.module("child", child);
  }
  Tensor w, b;
  Child child;
};

// Same names, but `w` transposed, `b` missing, child.scale float32 and one extra parameter.
struct Different : tg::Module {
  Different()
      : w(tg::zeros({3, 2}).set_requires_grad()), extra(tg::zeros({7}).set_requires_grad()),
        scale(tg::zeros({4}).set_requires_grad()) {}
  struct C : tg::Module {
    explicit C(Tensor& s) : s_(s) {}
    void visit(tg::ModuleVisitor& v) override { v.parameter("scale", s_); }
    Tensor& s_;
  };
  void visit(tg::ModuleVisitor& v) override {
    v.parameter("w", w);
    v.parameter("extra", extra);
    C c(scale);
    v.module("child", c);
  }
  Tensor w, extra, scale;
};

}  // namespace

BOOST_AUTO_TEST_SUITE(round_trip)

BOOST_AUTO_TEST_CASE(every_dtype_is_bit_exact_and_keeps_its_order) {
  const TempDir dir;
  const auto tensors = every_dtype();
  tg::save_safetensors(dir / "a.safetensors", tensors);
  const auto file = tg::load_safetensors(dir / "a.safetensors");
  BOOST_TEST(names_of(file) == (std::vector<std::string>{"f32", "f64", "mask", "ids"}), boost::test_tools::per_element());
  for (const auto& t : tensors) check_bit_equal(file.find(t.name), t.tensor, t.name);
  BOOST_TEST(file.metadata.empty());
  BOOST_TEST(!file.find("nope").defined());
  // The header is padded to 8 bytes so the data is aligned in the file.
  std::uint64_t n = 0;
  std::memcpy(&n, read_bytes(dir / "a.safetensors").data(), 8);
  BOOST_TEST(n % 8 == 0);
}

BOOST_AUTO_TEST_CASE(loaded_tensors_are_fresh_contiguous_leaves) {
  const TempDir dir;
  const Tensor w = tg::randn({3, 4}, 1).set_requires_grad();
  tg::save_safetensors(dir / "w.safetensors", {{"w", w}});
  const Tensor got = tg::load_safetensors(dir / "w.safetensors").find("w");
  BOOST_TEST(got.is_contiguous());
  BOOST_TEST(!got.requires_grad());
  BOOST_TEST(!got.shares_storage_with(w));
  check_bit_equal(got, w, "w");
}

BOOST_AUTO_TEST_CASE(views_of_any_layout_are_written_in_row_major_order) {
  const TempDir dir;
  const Tensor base = tg::arange(0.0, 24.0, 1.0, tg::float64).reshape({2, 3, 4});
  const std::vector<tg::NamedTensor> views{
      {"transposed", base.transpose(0, 2)},
      {"permuted", base.permute({1, 2, 0})},
      {"strided", tg::slice(base, 2, 1, 4, 2)},
      {"selected", tg::select(base, 1, 2)},
      {"expanded", tg::expand(tg::tensor({{1}, {2}}, tg::float32), {2, 5})},
      {"offset_int", tg::slice(tg::arange(10), 0, 3, 9, 3)},
      {"bool_transposed", tg::mask({{true, false, true}, {false, false, true}}).transpose(0, 1)},
  };
  for (const auto& v : views) BOOST_TEST_REQUIRE(!v.tensor.is_contiguous(), v.name << " should be a strided view");
  tg::save_safetensors(dir / "v.safetensors", views);
  const auto file = tg::load_safetensors(dir / "v.safetensors");
  for (const auto& v : views) check_bit_equal(file.find(v.name), v.tensor, v.name);
  // Spot-check one value by its row-major position: transposed[3, 1, 0] = base[0, 1, 3] = 7.
  BOOST_TEST(file.find("transposed").to_vector<double>()[3 * 6 + 1 * 2 + 0] == 7.0);
  BOOST_TEST(file.find("offset_int").to_vector<std::int64_t>() == (std::vector<std::int64_t>{3, 6}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(zero_size_and_rank_zero_tensors) {
  const TempDir dir;
  const std::vector<tg::NamedTensor> tensors{
      {"empty_f32", tg::zeros({0})},
      {"scalar_f64", tg::scalar(-2.5, tg::float64)},
      {"empty_i64", tg::zeros({3, 0, 2}, tg::int64)},
      {"scalar_bool", tg::from_bools({true}, {})},
      {"middle", tg::ones({2, 2})},
      {"empty_bool", tg::from_bools({}, {0, 4})},
      {"empty_f64_view", tg::slice(tg::ones({4, 3}, tg::float64), 0, 2, 2).transpose(0, 1)},
  };
  tg::save_safetensors(dir / "z.safetensors", tensors);
  const auto file = tg::load_safetensors(dir / "z.safetensors");
  BOOST_TEST(file.tensors.size() == tensors.size());
  for (const auto& t : tensors) check_bit_equal(file.find(t.name), t.tensor, t.name);
  BOOST_TEST(file.find("scalar_f64").item() == -2.5);

  tg::save_safetensors(dir / "none.safetensors", {});
  BOOST_TEST(tg::load_safetensors(dir / "none.safetensors").tensors.empty());
}

// The writer puts wider dtypes first, so a zero-size float64 tensor listed after a float32 one
// starts at the same byte; the reader must still size its buffer for the float32 tensor (it
// once read past its buffer here, or stale bytes from an earlier piece).
BOOST_AUTO_TEST_CASE(zero_size_tensor_at_another_tensors_offset) {
  const TempDir dir;
  const std::vector<std::vector<tg::NamedTensor>> cases{
      {{"a", tg::full({1}, 3.5)}, {"z", tg::zeros({0}, tg::float64)}},
      {{"m", tg::from_bools({true}, {1})}, {"z", tg::zeros({0})}},
      {{"d", tg::full({1}, 7.25, tg::float64)},
       {"big", tg::ones({131072}, tg::float64)},
       {"a", tg::full({1}, -1.5)},
       {"z", tg::zeros({0}, tg::float64)}},
  };
  for (const auto& tensors : cases) {
    tg::save_safetensors(dir / "z.safetensors", tensors);
    const auto file = tg::load_safetensors(dir / "z.safetensors");
    BOOST_TEST(file.tensors.size() == tensors.size());
    for (const auto& t : tensors) check_bit_equal(file.find(t.name), t.tensor, t.name);
  }
}

// The reader groups small tensors into reads of up to 1 MiB and reads larger ones straight
// into their storage: tensors just under, at and over that size, runs of small ones that end
// exactly at it or just past it, all land bit for bit, and a bad byte deep in a large BOOL
// tensor (read the direct way) is still refused.
BOOST_AUTO_TEST_CASE(tensors_around_the_reads_piece_size) {
  const TempDir dir;
  constexpr std::int64_t kMiBFloats = (1 << 20) / 4;
  const std::vector<tg::NamedTensor> tensors{
      {"small_a", tg::randn({3}, 1)},
      {"just_under", tg::randn({kMiBFloats - 1}, 2)},
      {"small_b", tg::randn({1}, 3)},
      {"exactly", tg::randn({kMiBFloats}, 4)},
      {"half_1", tg::randn({kMiBFloats / 2}, 5)},
      {"half_2", tg::randn({kMiBFloats / 2}, 6)},
      {"over", tg::randn({kMiBFloats + 1}, 7)},
      {"tail", tg::randn({kMiBFloats / 2 + 1}, 8)},
      {"tail_2", tg::randn({kMiBFloats / 2}, 9)},
      {"wide", tg::randn({kMiBFloats / 2 + 3}, 10, tg::float64)},
      {"ids", tg::arange(0.0, 300000.0, 1.0, tg::int64)},
      {"mask", tg::gt(tg::randn({1 << 21}, 11), tg::scalar(0.0))},
  };
  tg::save_safetensors(dir / "p.safetensors", tensors);
  const auto file = tg::load_safetensors(dir / "p.safetensors");
  BOOST_TEST(names_of(file).size() == tensors.size());
  for (const auto& t : tensors) check_bit_equal(file.find(t.name), t.tensor, t.name);

  // The mask is the last 2 MiB of the file; make its 1,500,000th byte a 2.
  std::string bytes = read_bytes(dir / "p.safetensors");
  bytes[bytes.size() - (std::size_t{1} << 21) + 1500000] = 2;
  write_bytes(dir / "bad.safetensors", bytes);
  check_throws<tg::FormatError>([&] { tg::load_safetensors(dir / "bad.safetensors"); },
                                {"tensor 'mask' (BOOL) holds byte 2 at element 1500000"});
}

BOOST_AUTO_TEST_CASE(metadata_and_names_survive_json_escaping) {
  const TempDir dir;
  const std::map<std::string, std::string> metadata{
      {"format", "pt"}, {"empty", ""}, {"quote\"back\\slash", "line\nbreak\ttab \x01 ctl"}, {"ünï", "日本語 ß €"}};
  const std::vector<tg::NamedTensor> tensors{{"layer.0.w", tg::ones({1})},
                                             {"名前/ß \"q\" \\", tg::zeros({2})},
                                             {std::string("nul\0inside", 10), tg::ones({1}, tg::int64)}};
  tg::save_safetensors(dir / "m.safetensors", tensors, metadata);
  const auto file = tg::load_safetensors(dir / "m.safetensors");
  BOOST_CHECK(file.metadata == metadata);
  BOOST_TEST(names_of(file) == (std::vector<std::string>{tensors[0].name, tensors[1].name, tensors[2].name}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(saving_records_nothing_and_overwrites) {
  const TempDir dir;
  const Tensor w = tg::randn({3, 2}, 5).set_requires_grad();
  const std::size_t before = tg::tape_size();
  tg::save_safetensors(dir / "w.safetensors", {{"w", w.transpose(0, 1)}});  // the copy runs under no-grad
  BOOST_TEST(tg::tape_size() == before);
  tg::save_safetensors(dir / "w.safetensors", {{"other", tg::ones({1})}});
  BOOST_TEST(names_of(tg::load_safetensors(dir / "w.safetensors")) == std::vector<std::string>{"other"},
             boost::test_tools::per_element());
  BOOST_CHECK(dir.entries() == std::set<std::string>{"w.safetensors"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(save_arguments)

BOOST_AUTO_TEST_CASE(bad_names_and_arguments_are_refused_before_any_file_exists) {
  const TempDir dir;
  const fs::path p = dir / "x.safetensors";
  const Tensor t = tg::ones({2});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"a", t}, {"", t}}); },
                               {"save_safetensors", "tensors[1]", "empty name"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"a", t}, {"b", t}, {"a", t}}); },
                               {"save_safetensors", "tensors[0] and tensors[2]", "'a'", "unique"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"__metadata__", t}}); },
                               {"save_safetensors", "tensors[0]", "'__metadata__'", "reserves"});
  for (const char* bad : {"\xff", "ok\xc3", "\xc0\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\x80x"})
    check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{bad, t}}); },
                                 {"save_safetensors", "tensors[0]", "not valid UTF-8", "\\x"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"u", Tensor()}}); },
                               {"save_safetensors", "tensor 'u'", "undefined"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"a", t}}, {{"k\xfe", "v"}}); },
                               {"save_safetensors", "metadata key", "UTF-8"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(p, {{"a", t}}, {{"k", "v\xfe"}}); },
                               {"save_safetensors", "metadata value of key 'k'", "UTF-8"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors("", {{"a", t}}); }, {"save_safetensors", "'path'", "empty"});
  // The path is checked before the tensors and the header are.
  check_throws<tg::ValueError>([&] { tg::save_safetensors("", {{"", t}}); }, {"save_safetensors", "'path'", "empty"});
  check_throws<tg::ValueError>([&] { tg::save_safetensors(dir.path.string() + "/", {{"a", t}}); },
                               {"save_safetensors", "'path'", "directory separator"});
  BOOST_TEST(dir.entries().empty());
}

BOOST_AUTO_TEST_CASE(a_header_over_the_format_limit_is_refused) {
  const TempDir dir;
  // Readers (this one and the reference one) refuse headers over 100,000,000 bytes.
  check_throws<tg::ValueError>(
      [&] { tg::save_safetensors(dir / "x.safetensors", {{std::string(100'000'000, 'n'), tg::ones({1})}}); },
      {"save_safetensors", "the header for 1 tensors would take at least 1000000", "limit of 100000000"});
  BOOST_TEST(dir.entries().empty());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(module)

BOOST_AUTO_TEST_CASE(round_trip_writes_into_the_same_parameters) {
  const TempDir dir;
  Tiny a(1), b(100);
  BOOST_TEST_REQUIRE(value_bytes(a.w) != value_bytes(b.w));
  tg::save(a, dir / "tiny.safetensors", {{"step", "7"}});
  const auto names = names_of(tg::load_safetensors(dir / "tiny.safetensors"));
  BOOST_TEST(names == (std::vector<std::string>{"w", "b", "child.scale"}), boost::test_tools::per_element());

  const Tensor held = b.w;  // a handle taken before loading sees the loaded values
  const auto* storage_before = b.child.scale.impl();
  const std::uint64_t version_before = b.w.version();
  const auto metadata = tg::load(b, dir / "tiny.safetensors");
  BOOST_CHECK(metadata == (std::map<std::string, std::string>{{"step", "7"}}));
  check_bit_equal(b.w, a.w, "w");
  check_bit_equal(b.b, a.b, "b");
  check_bit_equal(b.child.scale, a.child.scale, "child.scale");
  check_bit_equal(held, a.w, "held handle");
  BOOST_TEST(b.child.scale.impl() == storage_before);
  BOOST_TEST(b.w.version() > version_before);
  BOOST_TEST(b.w.requires_grad());
  BOOST_TEST(b.w.is_leaf());
}

BOOST_AUTO_TEST_CASE(a_mismatch_lists_every_problem_and_changes_nothing) {
  const TempDir dir;
  Tiny source(1);
  tg::save(source, dir / "tiny.safetensors");
  Different target;
  const std::string w_before = value_bytes(target.w), scale_before = value_bytes(target.scale);
  const std::uint64_t v_w = target.w.version(), v_extra = target.extra.version(), v_scale = target.scale.version();
  check_throws<tg::ValueError>([&] { tg::load(target, dir / "tiny.safetensors"); },
                               {"load: '", "tiny.safetensors", "4 problems", "no parameter was changed",
                                "'w': shape [3, 2] in the module, [2, 3] in the file",
                                "missing 'extra': the module has float32 [7]",
                                "'child.scale': dtype float32 in the module, float64 (F64) in the file",
                                "unexpected 'b': the file has float32 [3]"});
  BOOST_TEST(value_bytes(target.w) == w_before);
  BOOST_TEST(value_bytes(target.scale) == scale_before);
  BOOST_TEST(target.w.version() == v_w);
  BOOST_TEST(target.extra.version() == v_extra);
  BOOST_TEST(target.scale.version() == v_scale);
}

BOOST_AUTO_TEST_CASE(each_single_problem_names_its_tensor) {
  const TempDir dir;
  Tiny model(3);
  const fs::path p = dir / "f.safetensors";
  const auto params = model.named_parameters();
  auto save_with = [&](const std::string& replace, const Tensor& with, bool drop = false, bool add = false) {
    std::vector<tg::NamedTensor> out;
    for (const auto& [name, t] : params)
      if (name != replace) out.push_back({name, t});
      else if (!drop) out.push_back({name, with});
    if (add) out.push_back({"surplus", tg::zeros({1})});
    tg::save_safetensors(p, out);
  };
  save_with("b", tg::zeros({4}));
  check_throws<tg::ValueError>([&] { tg::load(model, p); }, {"1 problem;", "'b': shape [3] in the module, [4] in the file"});
  save_with("w", tg::zeros({2, 3}, tg::float64));
  check_throws<tg::ValueError>([&] { tg::load(model, p); },
                               {"1 problem;", "'w': dtype float32 in the module, float64 (F64) in the file"});
  save_with("child.scale", {}, /*drop=*/true);
  check_throws<tg::ValueError>([&] { tg::load(model, p); },
                               {"1 problem;", "missing 'child.scale': the module has float64 [4]"});
  save_with("", {}, false, /*add=*/true);
  check_throws<tg::ValueError>([&] { tg::load(model, p); },
                               {"1 problem;", "unexpected 'surplus': the file has float32 [1]"});
}

BOOST_AUTO_TEST_CASE(module_errors_name_save_and_load) {
  const TempDir dir;
  Tiny model(1);
  check_throws<tg::IOError>([&] { tg::save(model, dir / "missing" / "m.safetensors"); }, {"save:", "missing/m.safetensors"});
  check_throws<tg::IOError>([&] { tg::load(model, dir / "nothing.safetensors"); },
                            {"load:", "nothing.safetensors", "No such file"});
  write_bytes(dir / "bad.safetensors", "12345");
  check_throws<tg::FormatError>([&] { tg::load(model, dir / "bad.safetensors"); }, {"load:", "bad.safetensors", "5 bytes"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(corrupt_input)

// A small valid file with a zero-size tensor in the middle and metadata.
std::string small_file(const TempDir& dir) {
  tg::save_safetensors(dir / "small.safetensors",
                       {{"a", tg::tensor({{1, 2}, {3, 4}})},
                        {"e", tg::zeros({0}, tg::int64)},
                        {"m", tg::mask({true, false, true})},
                        {"d", tg::tensor({5, 6}, tg::float64)}},
                       {{"k", "v"}});
  return read_bytes(dir / "small.safetensors");
}

BOOST_AUTO_TEST_CASE(every_truncation_is_a_format_error) {
  const TempDir dir;
  const std::string full = small_file(dir);
  std::uint64_t n = 0;
  std::memcpy(&n, full.data(), 8);
  const ScratchFile scratch(dir / "cut.safetensors");
  const fs::path& p = scratch.path;
  for (std::size_t len = 0; len < full.size(); ++len) {
    scratch.set(std::string_view(full).substr(0, len));
    std::vector<std::string> fragments{"load_safetensors", "cut.safetensors", "not a valid safetensors file"};
    if (len < 8) fragments.push_back("shorter than the 8-byte header length");
    else if (len < 8 + n) fragments.push_back("only " + std::to_string(len - 8) + " bytes follow it");
    else fragments.push_back("run past the end of the data");  // names the tensor cut short
    check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, fragments);
  }
  scratch.set(full);
  BOOST_TEST(tg::load_safetensors(p).tensors.size() == 4u);
  scratch.set(full + "x");
  check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, {"data bytes [", "after tensor 'm'", "belong to no tensor"});
}

BOOST_AUTO_TEST_CASE(every_corrupted_header_byte_is_an_error_or_a_valid_file) {
  const TempDir dir;
  const std::string full = small_file(dir);
  std::uint64_t n = 0;
  std::memcpy(&n, full.data(), 8);
  const ScratchFile scratch(dir / "bad.safetensors");
  const fs::path& p = scratch.path;
  int errors = 0, loads = 0;
  for (std::size_t i = 0; i < 8 + n; ++i) {
    for (const char c : std::string_view("\x00\xff\x80\"{}[],:09- a\\F", 17)) {
      std::string bad = full;
      if (bad[i] == c) continue;
      bad[i] = c;
      scratch.set(bad);
      try {
        const auto file = tg::load_safetensors(p);
        ++loads;  // e.g. a changed letter in a name, or a digit swapped for another that still fits
        for (const auto& t : file.tensors) BOOST_TEST(t.tensor.numel() <= 4);
      } catch (const tg::FormatError& e) {
        ++errors;
        BOOST_TEST(std::string(e.what()).find("bad.safetensors") != std::string::npos);
      }
    }
  }
  BOOST_TEST_MESSAGE(errors << " corruptions refused, " << loads << " still valid");
  BOOST_TEST(errors > 10 * loads);
}

struct Case {
  std::string what;
  std::string file;
  std::vector<std::string> fragments;
};

BOOST_AUTO_TEST_CASE(each_malformed_header_gives_a_clear_error) {
  const TempDir dir;
  const std::string f8 = f32_bytes({1, 2});
  const std::string big = fmt::format("{}", std::uint64_t{1} << 63);
  const std::vector<Case> cases{
      {"not json", make_file("{\"a\":", ""), {"not valid JSON"}},
      {"empty header", make_file("", ""), {"not valid JSON"}},
      {"trailing garbage", make_file("{} x", ""), {"not valid JSON"}},
      {"nul in header", make_file(std::string("{}\0 ", 4), ""), {"NUL byte at header offset 2"}},
      {"nul in a string", make_file(std::string("{\"a\0\":{}}", 9), ""), {"NUL byte at header offset 3"}},
      {"not an object", make_file("[1, 2]", ""), {"must be a JSON object", "array"}},
      {"bad utf-8 in a string",
       make_file("{\"a\xff\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", f8),
       {"not valid JSON", "\\xff"}},
      {"entry not an object", make_file("{\"a\":[1]}", ""), {"tensor 'a'", "must be an object", "array"}},
      {"missing key", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}", f8), {"tensor 'a'", "no 'data_offsets'"}},
      {"extra key", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}}", f8),
       {"tensor 'a'", "unexpected key 'x'"}},
      {"unsupported dtype", make_file("{\"a\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a' has dtype 'F16'", "F32, F64, BOOL and I64"}},
      {"unknown dtype", make_file("{\"w\":{\"dtype\":\"Q7\",\"shape\":[4],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'w' has dtype 'Q7'"}},
      {"dtype not a string", make_file("{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "dtype must be a string", "number"}},
      {"shape not an array", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "shape must be an array"}},
      {"negative dim", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "non-negative integers", "'-2'"}},
      {"fractional dim", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "non-negative integers"}},
      {"dim beyond int64", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[" + big + "],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "non-negative integers", big}},
      {"dim beyond uint64",
       make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999999],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "non-negative integers"}},
      {"string dim", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "non-negative integers"}},
      {"nested shape", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[[2]],\"data_offsets\":[0,8]}}", f8),
       {"nests arrays deeper"}},
      {"deep nesting", make_file(std::string(5000, '[') + std::string(5000, ']'), ""), {"nests arrays deeper"}},
      {"overflowing shape",
       make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "more elements than can be addressed"}},
      {"zero-size shape too large to make", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[0,1125899906842624],\"data_offsets\":[0,0]}}", ""),
       {"tensor 'a'", "more elements than can be addressed", "0 counted as 1"}},
      {"byte-order mark", make_file("\xEF\xBB\xBF{}", ""), {"byte-order mark"}},
      {"overflowing bytes", make_file("{\"a\":{\"dtype\":\"F64\",\"shape\":[2305843009213693952],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "more elements than can be addressed"}},
      {"shape does not match bytes", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a'", "shape [3] of F32 needs 12 bytes", "hold 8"}},
      {"offsets not a pair", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4,8]}}", f8),
       {"tensor 'a'", "data_offsets must be an array [begin, end]"}},
      {"offsets reversed", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", f8),
       {"tensor 'a'", "end before they begin"}},
      {"offsets past the end", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", f8),
       {"tensor 'a'", "run past the end of the data, which has 8 bytes"}},
      {"huge offsets", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" + big + "," + big + "]}}", f8),
       {"tensor 'a'", "non-negative integers"}},
      {"overlap",
       make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                 "\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 f8),
       {"tensor 'b' (bytes [4, 8)) overlaps tensor 'a' (bytes [0, 8))"}},
      {"gap",
       make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", f8),
       {"data bytes [0, 4), before tensor 'a', belong to no tensor"}},
      {"bytes after the last tensor", make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", f8),
       {"data bytes [4, 8), after tensor 'a', belong to no tensor"}},
      {"data but no tensors", make_file("{}", f8), {"data bytes [0, 8) belong to no tensor"}},
      {"duplicate name",
       make_file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                 "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                 f8),
       {"names tensor 'a' twice"}},
      {"duplicate key in an entry",
       make_file("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F64\",\"shape\":[2],\"data_offsets\":[0,8]}}", f8),
       {"key 'dtype' appears twice in the entry 'a'"}},
      {"empty name", make_file("{\"\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", f8), {"empty name"}},
      {"metadata not an object", make_file("{\"__metadata__\":[\"x\"]}", ""), {"'__metadata__' must be an object"}},
      {"metadata value not a string", make_file("{\"__metadata__\":{\"step\":3}}", ""),
       {"'__metadata__' values must be strings", "key 'step'", "number"}},
      {"bool byte out of range", make_file("{\"m\":{\"dtype\":\"BOOL\",\"shape\":[3],\"data_offsets\":[0,3]}}", std::string("\x01\x00\x02", 3)),
       {"tensor 'm' (BOOL) holds byte 2 at element 2"}},
      {"control bytes are escaped in messages",
       make_file("{\"a\\u001b[31m\":{\"dtype\":\"F16\",\"shape\":[4],\"data_offsets\":[0,8]}}", f8),
       {"tensor 'a\\x1b[31m'"}},
  };
  const fs::path p = dir / "case.safetensors";
  for (const auto& c : cases) {
    BOOST_TEST_CONTEXT(c.what) {
      write_bytes(p, c.file);
      auto fragments = c.fragments;
      fragments.push_back("load_safetensors: '" + p.string() + "' is not a valid safetensors file");
      check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, fragments);
    }
  }
}

BOOST_AUTO_TEST_CASE(length_field_errors) {
  const TempDir dir;
  const fs::path p = dir / "len.safetensors";
  std::string file = make_file("{}");
  const std::uint64_t huge = 100'000'001, past = 3;
  std::memcpy(file.data(), &huge, 8);
  write_bytes(p, file);
  check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, {"says 100000001 bytes", "limit of 100000000"});
  file = make_file("{}");
  std::memcpy(file.data(), &past, 8);
  write_bytes(p, file);
  check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, {"says 3 bytes, but only 2 bytes follow it"});
  for (int byte = 0; byte < 8; ++byte) {
    std::string bad = make_file("{}");
    bad[byte] = '\xff';
    write_bytes(p, bad);
    check_throws<tg::FormatError>([&] { tg::load_safetensors(p); }, {"the header length field says"});
  }
}

BOOST_AUTO_TEST_CASE(whitespace_around_the_header_is_accepted) {
  const TempDir dir;
  const fs::path p = dir / "ws.safetensors";
  write_bytes(p, make_file(" \t\n{\"a\" : {\"shape\": [2], \"data_offsets\": [0, 8], \"dtype\": \"F32\"}}\r\n   ",
                           f32_bytes({1.5f, -2.0f})));
  const auto file = tg::load_safetensors(p);
  BOOST_TEST(file.find("a").to_vector<float>() == (std::vector<float>{1.5f, -2.0f}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(what_is_not_a_file_is_an_io_error) {
  const TempDir dir;
  check_throws<tg::IOError>([&] { tg::load_safetensors(dir / "absent.safetensors"); },
                            {"load_safetensors: cannot open '", "absent.safetensors", "No such file or directory"});
  check_throws<tg::IOError>([&] { tg::load_safetensors(dir.path); }, {"load_safetensors", "is not a regular file"});
  const fs::path fifo = dir / "fifo";
  BOOST_REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  check_throws<tg::IOError>([&] { tg::load_safetensors(fifo); }, {"is not a regular file"});
  check_throws<tg::ValueError>([&] { tg::load_safetensors(""); }, {"load_safetensors", "'path'", "empty path"});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(atomic_save)

BOOST_AUTO_TEST_CASE(a_missing_directory_creates_nothing) {
  const TempDir dir;
  check_throws<tg::IOError>([&] { tg::save_safetensors(dir / "no" / "x.safetensors", {{"a", tg::ones({2})}}); },
                            {"save_safetensors", "cannot create a temporary file next to '", "no/x.safetensors",
                             "No such file or directory"});
  BOOST_TEST(dir.entries().empty());
}

BOOST_AUTO_TEST_CASE(a_full_disk_leaves_the_old_file_and_no_temporary) {
  const TempDir dir;
  const fs::path p = dir / "model.safetensors";
  tg::save_safetensors(p, {{"old", tg::ones({3})}});
  const std::string old = read_bytes(p);
  const Tensor big = tg::randn({64, 1024}, 3);  // 256 KiB: fails in the middle of the data
  for (rlim_t limit : {rlim_t{0}, rlim_t{6}, rlim_t{100}, rlim_t{4096}, rlim_t{200000}}) {
    BOOST_TEST_CONTEXT("file size limit " << limit) {
      {
        const FileSizeLimit guard(limit);
        check_throws<tg::IOError>([&] { tg::save_safetensors(p, {{"new", big}, {"tail", tg::ones({5})}}); },
                                  {"save_safetensors: could not save '", "model.safetensors",
                                   "writing the temporary", "File too large", "the temporary was removed"});
        check_throws<tg::IOError>([&] { tg::save_safetensors(dir / "fresh.safetensors", {{"new", big}}); },
                                  {"fresh.safetensors", "File too large"});
      }
      BOOST_TEST(read_bytes(p) == old);
      BOOST_CHECK(dir.entries() == std::set<std::string>{"model.safetensors"});
    }
  }
  tg::save_safetensors(p, {{"new", big}});  // the limit is gone again
  check_bit_equal(tg::load_safetensors(p).find("new"), big, "new");
}

BOOST_AUTO_TEST_CASE(a_failed_rename_removes_the_temporary) {
  const TempDir dir;
  const fs::path target = dir / "occupied";
  fs::create_directories(target / "inside");
  check_throws<tg::IOError>([&] { tg::save_safetensors(target, {{"a", tg::ones({2})}}); },
                            {"save_safetensors: could not save '", "occupied", "renaming the temporary"});
  BOOST_CHECK(dir.entries() == std::set<std::string>{"occupied"});
  BOOST_TEST(fs::is_directory(target / "inside"));
}

BOOST_AUTO_TEST_CASE(a_file_saved_over_keeps_its_permissions) {
  const TempDir dir;
  const fs::path p = dir / "private.safetensors";
  tg::save_safetensors(p, {{"a", tg::ones({2})}});
  fs::permissions(p, fs::perms::owner_read | fs::perms::owner_write);
  tg::save_safetensors(p, {{"b", tg::ones({3})}});
  BOOST_TEST(static_cast<int>(fs::status(p).permissions() & fs::perms::mask) == 0600);
  BOOST_TEST(tg::load_safetensors(p).tensors.front().name == "b");
}

BOOST_AUTO_TEST_CASE(a_long_file_name_still_gets_a_temporary) {
  const TempDir dir;
  const std::string name = std::string(240, 'n') + ".safetensors";  // 252 bytes, NAME_MAX is 255
  tg::save_safetensors(dir / name, {{"a", tg::ones({2})}});
  BOOST_CHECK(dir.entries() == std::set<std::string>{name});
}

BOOST_AUTO_TEST_SUITE_END()

// Run by ctest against tests/data/read_safetensors.py (tests/checkpoint.cmake); disabled in the
// plain run of this executable because each needs a path after "--".
BOOST_AUTO_TEST_SUITE(interop, *boost::unit_test::disabled())

fs::path interop_path() {
  const auto& suite = boost::unit_test::framework::master_test_suite();
  BOOST_TEST_REQUIRE(suite.argc == 2, "usage: test_checkpoint --run_test=interop/... -- FILE");
  return suite.argv[1];
}

// The values read_safetensors.py expects; keep the two in step.
BOOST_AUTO_TEST_CASE(write_for_python) {
  const Tensor base = tg::tensor({{0, 1, 2}, {3, 4, 5}});
  tg::save_safetensors(
      interop_path(),
      {
          {"f32", f32({0.5f, -1.25f, 0x1.8p127f, -0.0f, std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::denorm_min()},
                      {2, 3})},
          {"f64", f64({1.0 / 3.0, -1e308, std::bit_cast<double>(0x7ff8000000000001ull)}, {3})},
          {"mask", tg::mask({{true, false}, {false, true}})},
          {"ids", i64({std::numeric_limits<std::int64_t>::min(), -1, 0, std::numeric_limits<std::int64_t>::max()}, {4})},
          {"transposed", base.transpose(0, 1)},
          {"empty", tg::zeros({2, 0}, tg::float64)},
          {"scalar", tg::scalar(42, tg::int64)},
          {"unicode/名前.ß", tg::tensor({7})},
      },
      {{"format", "pt"}, {"step", "1000"}, {"note", "ünïcode \"quoted\"\n"}});
}

BOOST_AUTO_TEST_CASE(read_from_python) {
  const auto file = tg::load_safetensors(interop_path());
  BOOST_TEST(names_of(file) == (std::vector<std::string>{"py.f32", "py.f64", "py.bool", "py.i64", "py.empty", "py.scalar"}),
             boost::test_tools::per_element());
  check_bit_equal(file.find("py.f32"), f32({1.5f, -2.0f, 0.25f, 1024.0f}, {2, 2}), "py.f32");
  check_bit_equal(file.find("py.f64"), f64({0.1, -0.0, 1e300}, {3}), "py.f64");
  check_bit_equal(file.find("py.bool"), tg::from_bools({true, false, true}, {3}), "py.bool");
  check_bit_equal(file.find("py.i64"), i64({-5, std::int64_t{1} << 40}, {2, 1}), "py.i64");
  check_bit_equal(file.find("py.empty"), tg::zeros({0}, tg::int64), "py.empty");
  check_bit_equal(file.find("py.scalar"), tg::scalar(2.5, tg::float64), "py.scalar");
  BOOST_CHECK(file.metadata == (std::map<std::string, std::string>{{"written_by", "read_safetensors.py"}, {"ünï", "ß"}}));
}

BOOST_AUTO_TEST_SUITE_END()
