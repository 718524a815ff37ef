// Internal: safetensors files: the JSON header, read and checked in one pass
// (safetensors_header.cpp), and the whole file's reader and writer and load's check
// (checkpoint.cpp), with `fn` naming the public function in errors, for every checkpoint of
// train/ (checkpoint.cpp, training_state.cpp).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/train/checkpoint.hpp"

namespace tapegrad::detail {

// A name or a piece of a file as it can appear in a message: control bytes (and every byte of a
// string that is not UTF-8) escaped as \xNN, long strings cut, so a hostile file cannot put
// terminal escapes or megabytes into an exception message.
std::string printable(std::string_view s);
// Strict UTF-8 (RFC 3629): no overlong forms, no surrogates, nothing above U+10FFFF.
bool valid_utf8(std::string_view s);

// The format's codes for the dtypes tapegrad holds ("F32", "F64", "BOOL", "I64").
std::string_view safetensors_code(DType d);

struct TensorSpec {
  std::string name;
  DType dtype = float32;
  Shape shape;
  std::uint64_t begin = 0, end = 0;  // byte offsets into the data section
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<TensorSpec> tensors;     // in the header's order
  std::vector<std::size_t> file_order;  // indices into `tensors` in the order their bytes lie
};

// Reads `text` (the header's bytes, no NUL) for a data section of `data_size` bytes into `out`,
// with every check of the format: JSON (nesting at most 3 deep, no key twice in one object), an
// object of entries {dtype, shape, data_offsets} and an optional "__metadata__" object of
// strings, offsets inside the data, bytes that match the shape, the data covered exactly once.
// Returns "" or the first problem, in the header's order, as the end of a sentence.
//
// Linear in the header's length, and it keeps no document: beyond `text` it holds the specs, the
// names once more (to find a repeated one) and the metadata.
std::string read_safetensors_header(std::string_view text, std::uint64_t data_size, SafetensorsHeader& out);

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
