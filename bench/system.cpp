#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include <oneapi/dnnl/dnnl.hpp>
#include <tapegrad/tapegrad.hpp>

#include <fmt/ranges.h>

#include "raw_dnnl.hpp"
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

std::int64_t status_kb(const char* field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(field, 0) == 0) return std::stoll(line.substr(std::string(field).size() + 1));
  return -1;
}

double run_self(const std::string& args) {
  std::error_code error;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return -1;
  FILE* pipe = popen(fmt::format("'{}' {}", self.string(), args).c_str(), "r");
  double value = -1;
  if (pipe == nullptr || std::fscanf(pipe, "%lf", &value) != 1) value = -1;
  if (pipe != nullptr) pclose(pipe);
  return value;
}

void section_system(Report& report, const Options& options) {
  const auto [model, features] = cpu();
  report.fact("cpu", "cpu", model);
  report.fact("cpu_features", "cpu features", features);
  const dnnl_version_t* v = dnnl_version();
  report.fact("onednn", "oneDNN", fmt::format("{}.{}.{}, isa {}", v->major, v->minor, v->patch, isa_name(dnnl::get_effective_cpu_isa())));
  report.fact("threads", "thread counts", fmt::format("{}", fmt::join(options.threads, ",")));
  report.fact("bfloat16_native", "bfloat16 matmul native", tapegrad::bfloat16_native() ? "yes" : "no (emulated)");
  // The references other sections measure per row, here once per thread count for the reader.
  auto& table = report.table("references", "references: a copy loop on tapegrad's threads (GB/s = bytes read + written / s) and oneDNN's float32 matmul",
                             {{"threads", "threads", 0, 7}, {"copy_1mib_gbs", "copy 1 MiB GB/s", 1, 15}, {"copy_4mib_gbs", "copy 4 MiB GB/s", 1, 15},
                              {"copy_64mib_gbs", "copy 64 MiB GB/s", 1, 16}, {"onednn_gflops", "oneDNN GFLOP/s", 1, 14}});
  for (int t : options.threads) {
    tapegrad::set_num_threads(t);
    std::vector<Cell> row{static_cast<std::int64_t>(t)};
    for (std::int64_t mib : {1, 4, 64}) {
      CopyLoop copy(options.quick ? (mib << 20) / 64 : (mib << 20) / 4);
      row.push_back(per_second(copy.bytes(), measure([&] { copy(); }, options.runs, options.seconds)));
    }
    double peak = 0;
    for (std::int64_t n : options.quick ? std::vector<std::int64_t>{128} : std::vector<std::int64_t>{512, 1024}) {
      RawDnnl raw(1, n, n, n);
      peak = std::max(peak, per_second(2.0 * n * n * n, measure([&] { raw.run(); }, options.runs, options.seconds)));
    }
    after_references();
    row.push_back(peak);
    table.add(std::move(row));
  }
  table.note("oneDNN: best of 512^3 and 1024^3 (--quick: 128^3; copies 1/16 of the sizes)");
}

}  // namespace bench
