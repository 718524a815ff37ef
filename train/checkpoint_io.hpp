// Internal: checkpoint.cpp's reader, writer and load's check, with `fn` naming the public
// function in errors, for the other checkpoints of train/ (training_state.cpp).
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tapegrad/train/checkpoint.hpp"

namespace tapegrad::detail {

// save_safetensors and load_safetensors.
void write_safetensors(const char* fn, const std::filesystem::path& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata);
SafetensorsFile read_safetensors(const char* fn, const std::filesystem::path& path);
// What keeps `tensors` from being copied into the module's `params` (load's check), one line
// each: missing and unexpected names, dtypes, shapes, parameters that cannot be written.
std::vector<std::string> fit_problems(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& tensors);
// Copies each of `tensors` into the parameter of its name, in place: after fit_problems found none.
void copy_fitted(const std::vector<NamedTensor>& params, const std::vector<NamedTensor>& tensors);

}  // namespace tapegrad::detail
