// Section "softmax": the public softmax ops on a float32 [rows, 1024] tensor against a copy of
// the same floats on the same threads, alternating, and against the machine's memory bandwidth
// (a copy loop well past the last-level cache, memory_copy(), timed for each size and thread
// count just before its rows, alternating with that size's copy: in the rows' own rounds it
// would evict the 1 MiB tensors from the cache between calls). A forward moves 2 N floats
// (read x, write y), a backward 3 N (read y and dy, write dx), forward + backward 5 N; the copy
// moves 2 N. The backward alone is (forward + backward) - forward, as before this was a section.
// "fwd %" and "bwd %" compare with the copy of the same size (at 1 MiB a copy within the cache,
// a stricter bar); "mem %" with the memory bandwidth, which the performance target is stated in.
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {

void section_softmax(Report& report, const Options& options) {
  auto& table = report.table("softmax", "softmax ops, float32 [rows, 1024]: ms median (min-max), GB/s, % of a copy's bandwidth and of memory's",
                             {{"threads", "th", 0, 2},
                              {"op", "op", 0, 21},
                              {"size_mib", "MiB", 1, 5},
                              {"copy_ms", "copy ms", 3, 22},
                              {"copy_gbs", "copy GB/s", 1, 9},
                              {"forward_ms", "fwd ms", 3, 22},
                              {"forward_gbs", "GB/s", 1, 6},
                              {"forward_percent", "fwd %", 1, 6},
                              {"forward_percent_memory", "mem %", 1, 6},
                              {"forward_backward_ms", "f+b ms", 3, 22},
                              {"backward_ms", "bwd ms", 3, 7},
                              {"backward_percent", "bwd %", 1, 6},
                              {"backward_percent_memory", "mem %", 1, 6},
                              {"memory_gbs", "mem GB/s", 1, 8},
                              {"peak_mib", "peak MiB", 1, 8}});
  struct Op {
    const char* name;
    Tensor (*fn)(const Tensor&, const Tensor&);
    bool masked;
  };
  const Op ops[] = {{"masked_softmax", tg::masked_softmax, false}, {"masked_softmax (mask)", tg::masked_softmax, true},
                    {"log_softmax", tg::log_softmax, false}};
  const std::vector<std::int64_t> row_counts = options.quick ? std::vector<std::int64_t>{64} : std::vector<std::int64_t>{256, 4096};
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (std::int64_t rows : row_counts) {
      CopyLoop& memory = memory_copy(options);
      double memory_gbs = 0;
      {
        CopyLoop copy(rows * 1024);
        memory_gbs = per_second(memory.bytes(), measure({[&] { copy(); }, [&] { memory(); }}, options.runs, options.seconds)[1]);
      }
      for (const Op& op : ops) {
        const std::int64_t k = 1024, n = rows * k;
        const Tensor x = tg::randn({rows, k}, 3).set_requires_grad();
        const Tensor mask = op.masked ? tg::gt(tg::randn({rows, k}, 4), tg::scalar(-1.0)) : Tensor();
        const Tensor g = tg::randn({rows, k}, 5);
        CopyLoop copy(n);
        const auto forward = [&] {
          tg::NoGradGuard no_grad;
          op.fn(x, mask);
        };
        const auto both = [&] {
          tg::backward({op.fn(x, mask)}, {g});
          tg::clear_tape();
          Tensor(x).zero_grad();
        };
        const double peak = peak_mib_of(both);
        const auto t = measure({[&] { copy(); }, forward, both}, options.runs, options.seconds);
        const double bwd = t[2].median - t[1].median, bytes = 4.0 * static_cast<double>(n);
        table.add({static_cast<std::int64_t>(threads), std::string(op.name), bytes / (1 << 20), t[0], per_second(copy.bytes(), t[0]),
                   t[1], per_second(2 * bytes, t[1]), 100 * t[0].median / t[1].median, 100 * per_second(2 * bytes, t[1]) / memory_gbs,
                   t[2], bwd * 1e3, 100 * 1.5 * t[0].median / bwd, 100 * 3 * bytes / bwd * 1e-9 / memory_gbs, memory_gbs, peak});
      }
    }
  }
  table.note("forward moves 2N floats, backward 3N, the copy 2N; bwd = (f+b) - fwd; % = the copy's time for the same bytes / the op's; "
             "mem % = the op's GB/s / the memory copy's (mem GB/s: a copy well past the last-level cache, timed before the size's rows)");
}

}  // namespace bench
