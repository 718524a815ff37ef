// SubwordTokenizer when tapegrad was built without SentencePiece: the class exists so that
// programs build either way, and every way to get one says what is missing.
#include "tapegrad/train/tokenizer.hpp"

#include <exception>

#include "autodiff/check.hpp"

namespace tapegrad {
namespace {
[[noreturn]] void unavailable(const char* fn) {
  detail::fail<Error>("{}: tapegrad was built without SentencePiece (Debian: libsentencepiece-dev; see docs/building.md)", fn);
}
}  // namespace

struct SubwordTokenizer::Impl {};

SubwordTokenizer::SubwordTokenizer(std::shared_ptr<const Impl> impl) : impl_(std::move(impl)) {}
bool SubwordTokenizer::available() noexcept { return false; }
SubwordTokenizer SubwordTokenizer::train(std::string_view, const SubwordOptions&) { unavailable("SubwordTokenizer::train"); }
SubwordTokenizer SubwordTokenizer::load(const std::filesystem::path&) { unavailable("SubwordTokenizer::load"); }
// No object exists to call these on.
void SubwordTokenizer::save(const std::filesystem::path&) const { unavailable("SubwordTokenizer::save"); }
const std::string& SubwordTokenizer::model_bytes() const noexcept { std::terminate(); }
std::int64_t SubwordTokenizer::size() const { unavailable("SubwordTokenizer::size"); }
std::vector<std::int64_t> SubwordTokenizer::encode(std::string_view) const { unavailable("SubwordTokenizer::encode"); }
std::string SubwordTokenizer::decode(std::span<const std::int64_t>) const { unavailable("SubwordTokenizer::decode"); }

}  // namespace tapegrad
