// The safetensors header, read with nlohmann-json's SAX interface: each event updates the specs
// being built, so nothing of the size of the header is kept beyond its text. (nlohmann's
// callback parser, used before, scans an object's members for a discarded one each time one of
// them ends: quadratic in the number of tensors, 525 s for 100,000 of them.)
#include "train/safetensors.hpp"

#include <algorithm>
#include <array>
#include <optional>
#include <unordered_set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "autodiff/check.hpp"

namespace tapegrad::detail {
namespace {

// A valid header nests three deep: {name: {"shape": [dim]}}. Anything deeper stops the parse,
// before a hostile file can make a deep structure.
constexpr std::size_t kMaxDepth = 3;

struct DTypeCode {
  std::string_view code;
  DType dtype;
};
constexpr std::array<DTypeCode, 4> kCodes{{{"F32", float32}, {"F64", float64}, {"BOOL", bool_}, {"I64", int64}}};

using Json = nlohmann::json;

// A value as a message shows it: its JSON type, and its text when it is a scalar.
struct Seen {
  std::string type, text;  // text empty for an object or an array
  std::string describe() const { return text.empty() ? type : fmt::format("{} '{}'", type, printable(text)); }
};

// What one tensor's entry said, gathered until it ends and is checked.
struct Entry {
  std::string name;
  std::optional<Seen> not_object;  // the entry itself is not an object
  std::optional<std::string> unexpected;  // the first key other than the three
  std::optional<std::string> dtype;
  std::string dtype_bad, shape_bad, offsets_bad;  // a value of the wrong type, described (else empty)
  std::vector<std::int64_t> dims;
  std::optional<std::string> bad_dim;  // the first element that is not an index
  std::vector<std::string> offset_texts;
  std::vector<std::optional<std::uint64_t>> offsets;
};

enum class Role { top, entry, metadata, shape, offsets, ignored };

struct Frame {
  Role role;
  bool object;
  std::string key;  // the last key read in this object
  std::unordered_set<std::string> keys;
};

class HeaderSax final : public nlohmann::json_sax<Json> {
 public:
  HeaderSax(std::uint64_t data_size, SafetensorsHeader& out) : data_size_(data_size), out_(out) {}

  bool null() override { return scalar({"null", "null"}); }
  bool boolean(bool v) override { return scalar({"boolean", v ? "true" : "false"}); }
  bool number_integer(number_integer_t v) override { return scalar({"number", std::to_string(v)}); }  // negative
  bool number_unsigned(number_unsigned_t v) override { return scalar({"number", std::to_string(v)}, v); }
  bool number_float(number_float_t, const string_t& text) override { return scalar({"number", text}); }
  bool string(string_t& s) override { return scalar({"string", Json(s).dump()}, std::nullopt, &s); }
  bool binary(binary_t&) override { return scalar({"binary", "..."}); }  // not in JSON text
  bool start_object(std::size_t) override { return open(true); }
  bool start_array(std::size_t) override { return open(false); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override;
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_ = e.what();
    return false;
  }

  // The parse's outcome: "" or the problem (a syntax error, then one that stopped the parse,
  // then the first problem in the header's order).
  std::string problem() const {
    if (!syntax_.empty()) return fmt::format("the header is not valid JSON: {}", printable(syntax_));
    if (!stop_.empty()) return stop_;
    return first_;
  }

 private:
  template <class... Args> void problem_once(fmt::format_string<Args...> f, Args&&... args) {
    if (first_.empty()) first_ = fmt::format(f, std::forward<Args>(args)...);
  }
  std::string shown() const { return printable(entry_.name); }

  Role value(const Seen& seen, std::optional<std::uint64_t> index = std::nullopt, const std::string* text = nullptr);
  bool scalar(const Seen& seen, std::optional<std::uint64_t> index = std::nullopt, const std::string* text = nullptr) {
    value(seen, index, text);
    return true;
  }
  bool open(bool object);
  bool close();
  void finish_entry(const std::unordered_set<std::string>& keys = {});

  std::uint64_t data_size_;
  SafetensorsHeader& out_;
  std::vector<Frame> frames_;
  Entry entry_;
  std::string syntax_, stop_, first_;
};

bool HeaderSax::key(string_t& k) {
  Frame& f = frames_.back();
  if (!f.keys.insert(k).second) {
    const std::string entry = frames_.front().object ? printable(frames_.front().key) : std::string();
    stop_ = frames_.size() == 1 ? fmt::format("the header names tensor '{}' twice", printable(k))
                                : fmt::format("key '{}' appears twice in the entry '{}'", printable(k), entry);
    return false;
  }
  f.key = k;
  if (f.role == Role::entry && k != "dtype" && k != "shape" && k != "data_offsets" && !entry_.unexpected)
    entry_.unexpected = k;
  return true;
}

// A scalar, or (from open) the start of an object or array, as the value of its parent's slot;
// returns the role of the frame an object or array opens.
Role HeaderSax::value(const Seen& seen, std::optional<std::uint64_t> index, const std::string* text) {
  const bool object = seen.type == "object", array = seen.type == "array";
  if (frames_.empty()) {
    if (object) return Role::top;
    problem_once("the header must be a JSON object, found {}", seen.describe());
    return Role::ignored;
  }
  const Frame& f = frames_.back();
  switch (f.role) {
    case Role::top:
      if (f.key == "__metadata__") {
        if (object) return Role::metadata;
        problem_once("'__metadata__' must be an object of strings, found {}", seen.describe());
        return Role::ignored;
      }
      entry_ = Entry{};
      entry_.name = f.key;
      if (object) return Role::entry;
      entry_.not_object = seen;
      finish_entry();
      break;
    case Role::entry:
      if (f.key == "dtype") {
        if (text != nullptr) entry_.dtype = *text;
        else entry_.dtype_bad = seen.describe();
      } else if (f.key == "shape") {
        if (array) return Role::shape;
        entry_.shape_bad = seen.describe();
      } else if (f.key == "data_offsets") {
        if (array) return Role::offsets;
        entry_.offsets_bad = seen.text.empty() ? seen.type : seen.text;
      }
      break;
    case Role::metadata:
      if (text != nullptr) out_.metadata.emplace(f.key, *text);
      else problem_once("'__metadata__' values must be strings; key '{}' holds {}", printable(f.key), seen.describe());
      break;
    case Role::shape:
      if (index && *index <= static_cast<std::uint64_t>(INT64_MAX)) entry_.dims.push_back(static_cast<std::int64_t>(*index));
      else if (!entry_.bad_dim) entry_.bad_dim = seen.text.empty() ? seen.type : seen.text;
      break;
    case Role::offsets:
      entry_.offset_texts.push_back(seen.text.empty() ? seen.type : seen.text);
      entry_.offsets.push_back(index && *index <= static_cast<std::uint64_t>(INT64_MAX) ? index : std::nullopt);
      break;
    case Role::ignored: break;
  }
  return Role::ignored;
}

bool HeaderSax::open(bool object) {
  if (frames_.size() >= kMaxDepth) {
    stop_ = fmt::format("the header nests {}s deeper than the format's {} levels", object ? "object" : "array", kMaxDepth);
    return false;
  }
  frames_.push_back({value({object ? "object" : "array", ""}), object, {}, {}});
  return true;
}

bool HeaderSax::close() {
  if (frames_.back().role == Role::entry) finish_entry(frames_.back().keys);
  frames_.pop_back();
  return true;
}

// The checks of one entry (`keys`: those of its object), in the order they are documented; the
// first problem is kept.
void HeaderSax::finish_entry(const std::unordered_set<std::string>& keys) {
  const Entry& e = entry_;
  if (!first_.empty()) return;
  if (e.name.empty()) return problem_once("a tensor has an empty name, which tapegrad cannot save or use as a parameter");
  if (e.not_object)
    return problem_once("tensor '{}': its entry must be an object with dtype, shape and data_offsets, found {}", shown(),
                        e.not_object->describe());
  if (e.unexpected)
    return problem_once("tensor '{}': unexpected key '{}' (an entry holds dtype, shape and data_offsets)", shown(), printable(*e.unexpected));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!keys.contains(key)) return problem_once("tensor '{}': its entry has no '{}'", shown(), key);
  if (!e.dtype) return problem_once("tensor '{}': dtype must be a string, found {}", shown(), e.dtype_bad);
  const auto code = std::find_if(kCodes.begin(), kCodes.end(), [&](const DTypeCode& c) { return c.code == *e.dtype; });
  if (code == kCodes.end())
    return problem_once("tensor '{}' has dtype '{}', which tapegrad does not hold (it reads F32, F64, BOOL and I64); convert "
                        "it before saving",
                        shown(), printable(*e.dtype));
  if (!e.shape_bad.empty()) return problem_once("tensor '{}': shape must be an array, found {}", shown(), e.shape_bad);
  if (e.bad_dim) return problem_once("tensor '{}': shape must hold non-negative integers, found '{}'", shown(), printable(*e.bad_dim));
  if (!e.offsets_bad.empty() || e.offsets.size() != 2)
    return problem_once(
        "tensor '{}': data_offsets must be an array [begin, end], found '{}'", shown(),
        printable(e.offsets_bad.empty() ? fmt::format("[{}]", fmt::join(e.offset_texts, ",")) : e.offsets_bad));
  for (std::size_t i = 0; i < 2; ++i)
    if (!e.offsets[i])
      return problem_once("tensor '{}': data_offsets must hold non-negative integers, found '{}'", shown(), printable(e.offset_texts[i]));
  TensorSpec s{e.name, code->dtype, e.dims, *e.offsets[0], *e.offsets[1]};
  if (s.begin > s.end) return problem_once("tensor '{}': data_offsets [{}, {}] end before they begin", shown(), s.begin, s.end);
  if (s.end > data_size_)
    return problem_once("tensor '{}': data_offsets [{}, {}] run past the end of the data, which has {} bytes after the header "
                        "(truncated?)",
                        shown(), s.begin, s.end, data_size_);
  // The tensor factories' own check, so that making the tensor cannot refuse a shape accepted
  // here: [0, 2^50] holds no bytes but is refused too.
  std::int64_t numel = 0;
  try {
    numel = check_shape("read_safetensors_header", "shape", s.shape, s.dtype);
  } catch (const ShapeError&) {
    return problem_once("tensor '{}': shape {} has more elements than can be addressed (its sizes, with 0 counted as "
                        "1, times the item size exceed 2^48 bytes)",
                        shown(), shape_str(s.shape));
  }
  const std::int64_t bytes = numel * static_cast<std::int64_t>(itemsize(s.dtype));
  if (static_cast<std::uint64_t>(bytes) != s.end - s.begin)
    return problem_once("tensor '{}': shape {} of {} needs {} bytes, but data_offsets [{}, {}] hold {}", shown(), shape_str(s.shape),
                        *e.dtype, bytes, s.begin, s.end, s.end - s.begin);
  out_.tensors.push_back(std::move(s));
}

// The data must be covered exactly once: no gaps (the format forbids bytes that belong to no
// tensor, which would let a file be two formats at once) and no overlaps. Fills `order` with the
// tensors' indices by (begin, end): a zero-size tensor that starts where another does comes first,
// so the ends never decrease along it.
std::string check_coverage(const std::vector<TensorSpec>& specs, std::uint64_t data_size, std::vector<std::size_t>& order) {
  order.resize(specs.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return std::pair(specs[a].begin, specs[a].end) < std::pair(specs[b].begin, specs[b].end);
  });
  std::uint64_t covered = 0;
  const TensorSpec* previous = nullptr;
  for (const std::size_t i : order) {
    const TensorSpec* s = &specs[i];
    if (s->begin < covered)
      return fmt::format("tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", printable(s->name), s->begin, s->end,
                         printable(previous->name), previous->begin, previous->end);
    if (s->begin > covered)
      return fmt::format("data bytes [{}, {}), before tensor '{}', belong to no tensor", covered, s->begin, printable(s->name));
    covered = s->end;
    previous = s;
  }
  if (covered != data_size)
    return fmt::format("data bytes [{}, {}){} belong to no tensor", covered, data_size,
                       previous ? fmt::format(", after tensor '{}',", printable(previous->name)) : std::string());
  return {};
}

}  // namespace

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len = 0;
    std::uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return false;
    if (s.size() - i < len) return false;
    for (std::size_t k = 1; k < len; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

std::string printable(std::string_view s) {
  constexpr std::size_t kMax = 160;
  const bool utf8 = valid_utf8(s);
  std::string out;
  for (std::size_t i = 0; i < s.size() && out.size() < kMax; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7F || (c >= 0x80 && !utf8)) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (out.size() >= kMax) {
    // Do not end in the middle of a UTF-8 sequence.
    while (!out.empty() && (static_cast<unsigned char>(out.back()) & 0xC0) == 0x80) out.pop_back();
    if (!out.empty() && static_cast<unsigned char>(out.back()) >= 0xC0) out.pop_back();
    out += "...";
  }
  return out;
}

std::string_view safetensors_code(DType d) {
  for (const auto& c : kCodes)
    if (c.dtype == d) return c.code;
  return "?";
}

std::string read_safetensors_header(std::string_view text, std::uint64_t data_size, SafetensorsHeader& out) {
  out = SafetensorsHeader{};
  HeaderSax sax(data_size, out);
  Json::sax_parse(text.begin(), text.end(), &sax);
  if (std::string problem = sax.problem(); !problem.empty()) return problem;
  return check_coverage(out.tensors, data_size, out.file_order);
}

}  // namespace tapegrad::detail
