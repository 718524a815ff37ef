// The version check of what a backward reads, and its test seam (saved_versions.hpp).
#include "autodiff/saved_versions.hpp"

#include <utility>

#include "autodiff/check.hpp"

namespace tapegrad::detail {
namespace {

thread_local const OmitSavedForTesting* omit_saved = nullptr;

std::string saved_name(const SavedVersion& s) {
  switch (s.kind) {
    case SavedVersion::Kind::input: return fmt::format("input {}", s.index);
    case SavedVersion::Kind::output: return fmt::format("output {}", s.index);
    case SavedVersion::Kind::view_of_input: return fmt::format("a view of input {}", s.index);
    case SavedVersion::Kind::view_of_output: return fmt::format("a view of output {}", s.index);
    case SavedVersion::Kind::other: break;
  }
  return "a saved tensor";
}

}  // namespace

SavedVersion::Kind describe(const Tensor& t, std::span<const Tensor> inputs, std::span<const Tensor> outputs,
                            std::uint32_t& index) {
  using Kind = SavedVersion::Kind;
  for (bool same : {true, false})
    for (auto [list, kind] : {std::pair{inputs, same ? Kind::input : Kind::view_of_input},
                              std::pair{outputs, same ? Kind::output : Kind::view_of_output}})
      for (std::size_t k = 0; k < list.size(); ++k)
        if (list[k].defined() && (same ? list[k].impl() == t.impl() : list[k].shares_storage_with(t))) {
          index = static_cast<std::uint32_t>(k);
          return kind;
        }
  return Kind::other;
}

void check_saved_versions(const char* name, const std::vector<SavedVersion>& saved) {
  for (const SavedVersion& s : saved) {
    const auto storage = s.storage.lock();
    if (!storage) continue;  // the backward does not hold it, so it cannot read it
    if (omit_saved != nullptr && omit_saved->storage == storage.get()) continue;
    const std::uint64_t now = storage->version.load(std::memory_order_relaxed);
    if (now != s.version)
      fail<GraphError>(
          "backward of {}: {} was modified in place after {} was recorded (version {}, now {}), so its "
          "gradient would be wrong; run backward before updating it, or update a clone()",
          name, saved_name(s), name, s.version, now);
  }
}

OmitSavedForTesting::OmitSavedForTesting(const Tensor& storage_of)
    : storage(storage_of.impl()->storage.get()), previous_(omit_saved) {
  omit_saved = this;
}
OmitSavedForTesting::~OmitSavedForTesting() { omit_saved = previous_; }

}  // namespace tapegrad::detail
