// The one header a user includes.
#pragma once

#include "tapegrad/autodiff/dtype.hpp"
#include "tapegrad/autodiff/error.hpp"
#include "tapegrad/autodiff/gradcheck.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/autodiff/tensor.hpp"
#include "tapegrad/ops/cast.hpp"
#include "tapegrad/ops/compare.hpp"
#include "tapegrad/ops/elementwise.hpp"
#include "tapegrad/ops/join.hpp"
#include "tapegrad/ops/matmul.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"
#include "tapegrad/ops/where.hpp"
