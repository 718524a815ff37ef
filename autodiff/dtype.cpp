#include "tapegrad/autodiff/dtype.hpp"

#include <cstdint>
#include <ostream>

namespace tapegrad {

std::string_view dtype_name(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::bool_: return "bool";
    case DType::int64: return "int64";
  }
  return "unknown";
}

std::size_t itemsize(DType dtype) noexcept {
  switch (dtype) {
    case DType::float32: return sizeof(float);
    case DType::float64: return sizeof(double);
    case DType::bool_: return sizeof(bool);
    case DType::int64: return sizeof(std::int64_t);
  }
  return 0;
}

std::ostream& operator<<(std::ostream& os, DType dtype) { return os << dtype_name(dtype); }

}  // namespace tapegrad
