#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#include <tapegrad/tapegrad.hpp>

#include "bench_support.hpp"
#include "sections.hpp"

namespace bench {
namespace {

// The CPU's name and the features that choose tapegrad's and oneDNN's kernels.
std::pair<std::string, std::string> cpu() {
  std::ifstream f("/proc/cpuinfo");
  std::string line, model = "unknown", features;
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0 && model == "unknown") model = line.substr(line.find(':') + 2);
    if (line.rfind("flags", 0) == 0 && features.empty()) {
      std::istringstream words(line.substr(line.find(':') + 1));
      for (std::string w; words >> w;)
        if (w == "avx2" || w == "fma" || w == "avx512f" || w == "avx512_bf16" || w == "avx512_vnni" || w.rfind("amx", 0) == 0)
          features += (features.empty() ? "" : " ") + w;
    }
  }
  return {model, features};
}

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return fmt::format("isa {}", static_cast<int>(isa));
  }
}

}  // namespace

double copy_bandwidth(std::int64_t bytes) {
  const auto n = static_cast<std::size_t>(bytes) / sizeof(float);
  std::vector<float> src(n, 1.0f), dst(n);
  const Stats s = measure([&] {
    std::memcpy(dst.data(), src.data(), n * sizeof(float));
    asm volatile("" : : "r"(dst.data()) : "memory");  // the copy must happen
  });
  return 2.0 * static_cast<double>(n * sizeof(float)) / s.median * 1e-9;
}

void section_system(Report& report, const Options&) {
  const auto [model, features] = cpu();
  report.fact("cpu", model);
  report.fact("cpu features", features);
  const dnnl_version_t* v = dnnl_version();
  report.fact("oneDNN", fmt::format("{}.{}.{}, isa {}", v->major, v->minor, v->patch, isa_name(dnnl::get_effective_cpu_isa())));
  report.fact("threads", static_cast<std::int64_t>(tapegrad::num_threads()));
  report.fact("bfloat16 matmul native", tapegrad::bfloat16_native() ? "yes" : "no (emulated)");
  for (std::int64_t mib : {1, 4, 64})
    report.fact(fmt::format("copy loop, {} MiB", mib), copy_bandwidth(mib << 20), "GB/s");
  double peak = 0;
  for (std::int64_t n : {512, 1024}) {
    RawDnnl raw(1, n, n, n);
    peak = std::max(peak, 2.0 * n * n * n / measure([&] { raw.run(); }).median * 1e-9);
  }
  report.fact("oneDNN float32 matmul, best of 512^3 and 1024^3", peak, "GFLOP/s");
}

}  // namespace bench
