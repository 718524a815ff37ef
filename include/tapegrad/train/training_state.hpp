// One file that resumes a training run exactly where it stopped: the model's parameters and its
// random streams (each Dropout's), the optimizer's state, step count and learning rate, the
// loop's step, the loop's own generators (the data's) and the caller's metadata. It is one
// safetensors file saved atomically (checkpoint.hpp: a temporary, fsync, rename), so a run
// stopped at any moment leaves the old state or the new one, never parts of both.
//
//   tg::Generator data(seed);
//   tg::TrainingState state{.model = model, .optimizer = opt, .generators = {{"data", data}}};
//   if (resume) tg::load_training_state(path, state);   // state.step: where the loop continues
//   for (; state.step < total; ++state.step) { ... opt.set_learning_rate(schedule(state.step)); ... }
//   tg::save_training_state(path, state);
//
// The file's tensors: "model.<parameter>" and "model.<generator>" (Module::named_generators),
// "optimizer.<slot>.<parameter>" (Optimizer::state), "generator.<name>" for each of
// `generators` (a generator as Generator::get_state gives it); its metadata: the caller's, and
// "tapegrad.step", "tapegrad.optimizer_steps" and "tapegrad.learning_rate" (the shortest text
// that reads back as the same double).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tapegrad/layers/module.hpp"
#include "tapegrad/train/optimizer.hpp"

namespace tapegrad {

struct TrainingState {
  Module& model;
  Optimizer& optimizer;
  // The loop's own random streams (the data's), under unique non-empty names; the model's own
  // (Module::named_generators) are saved without being listed here.
  std::vector<NamedGenerator> generators = {};
  // Steps the loop has done: where it continues, and the position of a schedule or of data
  // keyed by step. >= 0.
  std::int64_t step = 0;
  // The caller's (the model's shape, a vocabulary); no key may start with "tapegrad.".
  std::map<std::string, std::string> metadata = {};
};

// Writes everything `state` names to `path`, atomically.
void save_training_state(const std::filesystem::path& path, const TrainingState& state);

// Restores `state` from `path`: parameters, optimizer state and generators in place (the same
// tensors and Generator objects), the optimizer's step count and learning rate, and state.step
// and state.metadata. The file must hold what save_training_state writes for a state like this
// one (the same parameters, optimizer kind and generator names); otherwise a ValueError lists
// every difference and nothing is changed. A file without the training state's metadata is a
// FormatError, as is a malformed safetensors file.
void load_training_state(const std::filesystem::path& path, TrainingState& state);

// The model alone from a file save_training_state wrote, for inference or evaluation: its
// parameters in place, nothing else read (no optimizer to build, the random streams left as they
// are). Returns the caller's metadata. A ValueError lists every parameter that does not fit, and
// nothing is changed; a file without the training state's metadata is a FormatError.
std::map<std::string, std::string> load_training_state_model(const std::filesystem::path& path, Module& model);

}  // namespace tapegrad
