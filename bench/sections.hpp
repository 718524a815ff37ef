// The sections of tapegrad_bench. Each measures its part, prints its tables and adds them to the
// report; every ratio it prints is against a reference measured in the same run.
#pragma once

#include "report.hpp"

namespace bench {

struct Options {
  bool quick = false;  // fewer shapes and runs: a smoke test of the benchmark itself
};

// Facts about the machine and the two references: a plain copy loop's bandwidth and oneDNN's
// float32 matmul throughput.
void section_system(Report& report, const Options& options);

// tapegrad::matmul against the raw oneDNN primitive, a naive loop and bfloat16.
void section_matmul(Report& report, const Options& options);
// The tape's fixed cost per recorded op.
void section_overhead(Report& report, const Options& options);

// The copy loop's bandwidth in GB/s (bytes read + bytes written per second) on `bytes` of data.
double copy_bandwidth(std::int64_t bytes);

}  // namespace bench
