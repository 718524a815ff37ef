// Section "overhead": the tape's fixed cost per recorded op, on 8 elements (where the arithmetic
// is nothing): a chain of recorded muls, forward alone and then with one backward through all.
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {

void section_overhead(Report& report, const Options& options) {
  constexpr int kChain = 1000;
  tg::set_num_threads(options.threads.front());
  const Tensor start = tg::ones({8});
  const auto chain = [&] {
    Tensor y = tg::ones({8}).set_requires_grad();
    for (int i = 0; i < kChain; ++i) y = tg::mul(y, start);
    return y;
  };
  const double peak = peak_mib_of([&] { tg::backward({chain()}, {start}); });
  const auto t = measure({[&] { chain(); }, [&] { tg::backward({chain()}, {start}); }}, options.runs, options.seconds);
  auto& table = report.table("overhead", fmt::format("the tape's fixed cost: one recorded mul on 8 elements, a chain of {}", kChain),
                             {{"forward_us_per_op", "fwd us/op", 3, 10},
                              {"forward_backward_us_per_op", "f+b us/op", 3, 10},
                              {"forward_chain_ms", "fwd chain ms", 3, 22},
                              {"forward_backward_chain_ms", "f+b chain ms", 3, 22},
                              {"peak_mib", "peak MiB", 3, 9}});
  table.add({t[0].median / kChain * 1e6, t[1].median / kChain * 1e6, t[0], t[1], peak});
}

}  // namespace bench
