// Internal to runtime/: tapegrad's own worker threads, behind parallel_for and the split
// products (parallel.hpp declares what the rest of the library calls). Why not OpenMP's team,
// and how the workers take tasks: docs/performance-notes.md, "Threads".
#pragma once

#include <cstdint>

namespace tapegrad::detail {

// Microseconds an idle worker keeps checking for a new task before it sleeps on a futex: long
// enough that loops of a few hundred microseconds keep their second thread, short enough not to
// take the core from another process (docs/performance-notes.md has the trade as measured).
inline constexpr double kSpinMicros = 250.0;

// Whether the calling thread is running a pool task (nested parallel work then stays on it).
bool in_pool_task() noexcept;

// Workers started so far (tests).
int pool_workers() noexcept;

}  // namespace tapegrad::detail
