// Section "kernels": elementwise ops and reductions against a copy of the same byte count on
// the same threads (CopyLoop), all three (forward, forward + backward, copy) alternating, and
// against the machine's memory bandwidth (the same copy loop well past the last-level cache,
// memory_copy()), timed for each shape and thread count just before its rows, alternating with
// the copy of the shape's size. (In the rows' own rounds it would evict the cache between the
// calls of an op whose tensors fit in it.)
//
// Bytes moved (B = bytes of one float32 [N, C] tensor, R = 4 N bytes (a result reduced over
// dim -1), C = 4 C bytes (the bias row, or a result reduced over dim 0), M = N C bytes (a bool
// mask)): forward = inputs read + output written; backward = upstream gradient read + tensors
// the backward keeps read + input gradients written (kernels() lists each op's sums). Work a
// kernel repeats (reading the upstream gradient twice, say) is not counted: the figure is what
// an ideal kernel would have to move, so a lower GB/s means avoidable traffic or compute.
// "frac" = GB/s over the copy's GB/s (medians); "best" = the same from the minima (on a busy
// machine the steadier estimate of what the code itself costs); "mem" = GB/s over the memory
// copy's GB/s (medians), the fraction the performance targets are stated in (at 1-4 MiB the
// same-size copy runs from the cache, two to three times faster: "frac" is then the stricter).
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

struct Kernel {
  std::string name;
  std::function<Tensor(const Tensor&)> op;  // of the leaf x (other operands captured)
  std::vector<Tensor> others;               // leaves that also get gradients
  double fwd_bytes, bwd_bytes;
};

std::vector<Kernel> kernels(std::int64_t n, std::int64_t c, tg::Generator& gen) {
  const double B = 4.0 * n * c, R = 4.0 * n, C = 4.0 * c, M = 1.0 * n * c;
  const Tensor y = tg::randn({n, c}, gen).set_requires_grad();
  const Tensor bias = tg::randn({c}, gen).set_requires_grad();
  const Tensor cond = tg::gt(tg::randn({n, c}, gen), tg::zeros({}));
  std::vector<Kernel> k;
  k.push_back({"add", [y](const Tensor& x) { return tg::add(x, y); }, {y}, 3 * B, 3 * B});
  k.push_back({"add bias [N,C]+[C]", [bias](const Tensor& x) { return tg::add(x, bias); }, {bias}, 2 * B + C, 2 * B + C});
  k.push_back({"mul", [y](const Tensor& x) { return tg::mul(x, y); }, {y}, 3 * B, 5 * B});
  k.push_back({"relu", [](const Tensor& x) { return tg::relu(x); }, {}, 2 * B, 3 * B});
  k.push_back({"gelu", [](const Tensor& x) { return tg::gelu(x); }, {}, 2 * B, 3 * B});
  k.push_back({"exp", [](const Tensor& x) { return tg::exp(x); }, {}, 2 * B, 3 * B});
  k.push_back({"tanh", [](const Tensor& x) { return tg::tanh(x); }, {}, 2 * B, 3 * B});
  k.push_back({"where", [cond, y](const Tensor& x) { return tg::where(cond, x, y); }, {y}, 3 * B + M, 3 * B + M});
  k.push_back({"sum dim -1", [](const Tensor& x) { return tg::sum(x, {-1}); }, {}, B + R, R + B});
  k.push_back({"mean dim -1", [](const Tensor& x) { return tg::mean(x, {-1}); }, {}, B + R, R + B});
  k.push_back({"max dim -1", [](const Tensor& x) { return tg::max(x, {-1}); }, {}, B + R, R + B + R + B});
  k.push_back({"sum dim 0", [](const Tensor& x) { return tg::sum(x, {0}); }, {}, B + C, C + B});
  k.push_back({"mean dim 0", [](const Tensor& x) { return tg::mean(x, {0}); }, {}, B + C, C + B});
  k.push_back({"max dim 0", [](const Tensor& x) { return tg::max(x, {0}); }, {}, B + C, C + B + C + B});
  return k;
}

}  // namespace

void section_kernels(Report& report, const Options& options) {
  auto& table = report.table("kernels", "elementwise ops and reductions, float32: ms median (min-max), GB/s, fraction of a copy's GB/s and of memory's",
                             {{"threads", "th", 0, 2},
                              {"shape", "shape", 0, 12},
                              {"kernel", "kernel", 0, 18},
                              {"forward_ms", "fwd ms", 4, 26},
                              {"forward_gbs", "GB/s", 1, 6},
                              {"forward_fraction", "frac", 2, 5},
                              {"forward_fraction_best", "best", 2, 5},
                              {"forward_fraction_memory", "mem", 2, 5},
                              {"forward_backward_ms", "f+b ms", 4, 26},
                              {"forward_backward_gbs", "GB/s", 1, 6},
                              {"forward_backward_fraction", "frac", 2, 5},
                              {"forward_backward_fraction_best", "best", 2, 5},
                              {"forward_backward_fraction_memory", "mem", 2, 5},
                              {"copy_gbs", "copy GB/s", 1, 9},
                              {"memory_gbs", "mem GB/s", 1, 8},
                              {"peak_mib", "peak MiB", 1, 8}});
  // [4096, 4096]: 64 MiB per tensor, past the last-level cache, so the copy measures main
  // memory; [1024, 1024]: 4 MiB, inside a large L3, so the copy runs at cache speed (a higher bar
  // for compute-heavy kernels); [544, 256] ([32 * 17, 256]) is a small model's activations.
  const std::vector<std::pair<std::int64_t, std::int64_t>> shapes =
      options.quick ? std::vector<std::pair<std::int64_t, std::int64_t>>{{64, 256}}
                    : std::vector<std::pair<std::int64_t, std::int64_t>>{{4096, 4096}, {1024, 1024}, {32 * 17, 256}};
  for (int threads : options.threads) {
    tg::set_num_threads(threads);
    for (const auto& [n, c] : shapes) {
      tg::Generator gen(7);
      Tensor x = tg::randn({n, c}, gen).set_requires_grad();
      CopyLoop copy(n * c);
      CopyLoop& memory = memory_copy(options);
      const double memory_gbs =
          per_second(memory.bytes(), measure({[&] { copy(); }, [&] { memory(); }}, options.runs, options.seconds)[1]);
      for (Kernel& k : kernels(n, c, gen)) {
        const Tensor g = tg::full(k.op(x).shape(), 0.5);
        tg::clear_tape();
        const auto fwd = [&] {
          tg::NoGradGuard no_grad;
          k.op(x);
        };
        const auto fwd_bwd = [&] {
          tg::backward({k.op(x)}, {g});
          x.zero_grad();
          for (Tensor& o : k.others) o.zero_grad();
          tg::clear_tape();
        };
        const double peak = peak_mib_of(fwd_bwd);
        const auto t = measure({fwd, fwd_bwd, [&] { copy(); }}, options.runs, options.seconds);
        const double both = k.fwd_bytes + k.bwd_bytes, copy_gbs = per_second(copy.bytes(), t[2]);
        table.add({static_cast<std::int64_t>(threads), fmt::format("[{}, {}]", n, c), k.name, t[0], per_second(k.fwd_bytes, t[0]),
                   per_second(k.fwd_bytes, t[0]) / copy_gbs, t[2].min / t[0].min * k.fwd_bytes / copy.bytes(),
                   per_second(k.fwd_bytes, t[0]) / memory_gbs, t[1], per_second(both, t[1]), per_second(both, t[1]) / copy_gbs,
                   t[2].min / t[1].min * both / copy.bytes(), per_second(both, t[1]) / memory_gbs, copy_gbs, memory_gbs, peak});
      }
    }
  }
  table.note("bytes as an ideal kernel moves them (bench/kernels.cpp); frac = GB/s / the copy's GB/s (medians), best = the same from the minima; "
             "mem = GB/s / the memory copy's GB/s (mem GB/s: a copy well past the last-level cache, timed before the shape's rows)");
}

}  // namespace bench
