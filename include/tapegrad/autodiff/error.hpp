// The exceptions tapegrad throws. Every one derives from std::invalid_argument, and its message
// names the function, the argument, what was expected and what was given.
#pragma once

#include <stdexcept>
#include <string>

namespace tapegrad {

// Base of every tapegrad error.
class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// A shape, rank or dimension index does not fit (including shapes that do not broadcast).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// A dtype is not accepted, or float32 and float64 were mixed in one op.
class DTypeError : public Error {
 public:
  using Error::Error;
};

// A scalar argument is out of range (negative step, zero heads, bad tolerance...).
class ValueError : public Error {
 public:
  using Error::Error;
};

// The tape was misused: backward through a tensor that needs no gradient, a gradient of the
// wrong shape, a tensor whose graph was cleared.
class GraphError : public Error {
 public:
  using Error::Error;
};

}  // namespace tapegrad
