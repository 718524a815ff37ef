// A training run's whole state in one safetensors file (see training_state.hpp).
#include "tapegrad/train/training_state.hpp"

#include <charconv>
#include <cmath>
#include <set>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "autodiff/check.hpp"
#include "train/safetensors.hpp"

namespace tapegrad {
namespace {
using detail::fail;

// The file's parts, by name prefix, and the metadata keys the state keeps for itself.
constexpr std::string_view kModel = "model.", kOptimizer = "optimizer.", kGenerator = "generator.", kReserved = "tapegrad.";
const std::string kStep = "tapegrad.step", kOptimizerSteps = "tapegrad.optimizer_steps", kLearningRate = "tapegrad.learning_rate";

// The value of a metadata key the state wrote, read whole as T (a FormatError otherwise).
template <class T>
T read_number(const char* fn, const std::filesystem::path& path, const std::map<std::string, std::string>& metadata, const std::string& key) {
  const auto it = metadata.find(key);
  if (it == metadata.end())
    fail<FormatError>("{}: '{}' has no metadata '{}'; it is not a file save_training_state wrote", fn, path.string(), key);
  T value{};
  const std::string& text = it->second;
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size() || !(value >= 0) || !std::isfinite(static_cast<double>(value)))
    fail<FormatError>("{}: '{}': metadata '{}' must be a finite number >= 0, got '{}'", fn, path.string(), key, text);
  return value;
}

// The caller's metadata: the file's, without the keys the state keeps for itself.
std::map<std::string, std::string> callers_metadata(std::map<std::string, std::string>& metadata) {
  std::map<std::string, std::string> out;
  for (auto& [key, value] : metadata)
    if (!key.starts_with(kReserved)) out.emplace(key, std::move(value));
  return out;
}

[[noreturn]] void refuse(const char* fn, const std::filesystem::path& path, const char* what, const std::vector<std::string>& problems) {
  fail<ValueError>("{}: '{}' does not fit {} ({} problem{}; nothing was changed):\n  {}", fn, path.string(), what, problems.size(),
                   problems.size() == 1 ? "" : "s", fmt::join(problems, "\n  "));
}

// Each generator of the state under its name in the file: the model's, then the loop's.
std::vector<NamedGenerator> all_generators(const char* fn, const TrainingState& state) {
  std::vector<NamedGenerator> out;
  for (NamedGenerator& g : state.model.named_generators()) out.push_back({std::string(kModel) + g.name, g.generator});
  for (std::size_t i = 0; i < state.generators.size(); ++i) {
    if (state.generators[i].name.empty()) fail<ValueError>("{}: state.generators[{}] has an empty name; each needs one", fn, i);
    out.push_back({std::string(kGenerator) + state.generators[i].name, state.generators[i].generator});
  }
  std::set<std::string_view> names;
  for (const NamedGenerator& g : out)
    if (!names.insert(g.name).second) fail<ValueError>("{}: two generators of the state are named '{}'; names must be unique", fn, g.name);
  return out;
}

}  // namespace

void save_training_state(const std::filesystem::path& path, const TrainingState& state) {
  const char* fn = "save_training_state";
  if (state.step < 0) fail<ValueError>("{}: state.step must be >= 0, got {}", fn, state.step);
  std::map<std::string, std::string> metadata = state.metadata;
  for (const auto& [key, value] : metadata)
    if (key.starts_with(kReserved))
      fail<ValueError>("{}: state.metadata key '{}' starts with '{}', which the training state keeps for its own keys", fn, key, kReserved);
  metadata[kStep] = std::to_string(state.step);
  metadata[kOptimizerSteps] = std::to_string(state.optimizer.steps());
  metadata[kLearningRate] = fmt::format("{}", state.optimizer.learning_rate());
  std::vector<NamedTensor> tensors;
  for (const NamedTensor& p : state.model.named_parameters()) tensors.push_back({std::string(kModel) + p.name, p.tensor});
  for (const NamedTensor& t : state.optimizer.state()) tensors.push_back({std::string(kOptimizer) + t.name, t.tensor});
  for (const NamedGenerator& g : all_generators(fn, state)) tensors.push_back({g.name, g.generator.get().get_state()});
  detail::write_safetensors(fn, path, tensors, metadata);
}

void load_training_state(const std::filesystem::path& path, TrainingState& state) {
  const char* fn = "load_training_state";
  SafetensorsFile file = detail::read_safetensors(fn, path);
  const auto step = read_number<std::int64_t>(fn, path, file.metadata, kStep);
  const auto optimizer_steps = read_number<std::int64_t>(fn, path, file.metadata, kOptimizerSteps);
  const auto learning_rate = read_number<double>(fn, path, file.metadata, kLearningRate);

  // Everything is checked before anything is written, so a file that does not fit changes nothing.
  std::vector<std::string> problems;
  std::vector<NamedTensor> parameters, optimizer;
  std::map<std::string, Tensor> generator_states;
  for (NamedTensor& t : file.tensors) {
    if (t.name.starts_with(kOptimizer)) optimizer.push_back({t.name.substr(kOptimizer.size()), t.tensor});
    else if (t.name.starts_with(kModel) || t.name.starts_with(kGenerator)) generator_states.emplace(t.name, t.tensor);
    else problems.push_back(fmt::format("unexpected '{}': a training state's tensors are model.*, optimizer.* and generator.*", t.name));
  }
  std::vector<std::pair<Generator*, Generator>> restored;
  for (const NamedGenerator& g : all_generators(fn, state)) {
    const auto it = generator_states.find(g.name);
    if (it == generator_states.end()) {
      problems.push_back(fmt::format("missing '{}': the state has a generator of that name, the file has no tensor of that name", g.name));
      continue;
    }
    restored.emplace_back(&g.generator.get(), Generator(0));
    try {
      restored.back().second.set_state(it->second);
    } catch (const Error& e) {
      problems.push_back(fmt::format("'{}': {}", g.name, e.what()));
    }
    generator_states.erase(it);
  }
  // What is left under model.* are the parameters; anything else left was unexpected.
  for (auto& [name, t] : generator_states) {
    if (name.starts_with(kModel)) parameters.push_back({name.substr(kModel.size()), t});
    else problems.push_back(fmt::format("unexpected '{}': the state has no generator of that name", name));
  }
  const std::vector<NamedTensor> params = state.model.named_parameters();
  for (const std::string& p : detail::fit_problems(params, parameters)) problems.push_back("model: " + p);
  if (!problems.empty()) refuse(fn, path, "the training state", problems);
  try {
    state.optimizer.load_state(optimizer, optimizer_steps);  // checks everything before it copies
  } catch (const Error& e) {
    fail<ValueError>("{}: '{}' does not fit the optimizer (nothing was changed): {}", fn, path.string(), e.what());
  }
  state.optimizer.set_learning_rate(learning_rate);
  detail::copy_fitted(params, parameters);
  for (auto& [g, r] : restored) *g = r;
  state.step = step;
  state.metadata = callers_metadata(file.metadata);
}

std::map<std::string, std::string> load_training_state_model(const std::filesystem::path& path, Module& model) {
  const char* fn = "load_training_state_model";
  SafetensorsFile file = detail::read_safetensors(fn, path);
  read_number<std::int64_t>(fn, path, file.metadata, kStep);  // a file save_training_state wrote
  std::set<std::string> streams;  // the model's random streams: training state, not the model's function
  for (const NamedGenerator& g : model.named_generators()) streams.insert(std::string(kModel) + g.name);
  std::vector<NamedTensor> parameters;
  for (NamedTensor& t : file.tensors)
    if (t.name.starts_with(kModel) && !streams.contains(t.name)) parameters.push_back({t.name.substr(kModel.size()), t.tensor});
  const std::vector<NamedTensor> params = model.named_parameters();
  const std::vector<std::string> problems = detail::fit_problems(params, parameters);
  if (!problems.empty()) refuse(fn, path, "the model", problems);
  detail::copy_fitted(params, parameters);
  return callers_metadata(file.metadata);
}

}  // namespace tapegrad
