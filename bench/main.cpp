// tapegrad_bench: every benchmark in one run, so that each ratio compares figures measured on the
// same machine at the same time.
//
//   ./build/bench/tapegrad_bench [--threads N] [--only system,matmul,...] [--json FILE] [--quick]
#include <algorithm>
#include <functional>
#include <sstream>

#include <CLI/CLI.hpp>
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace {

struct Section {
  const char* name;
  std::function<void(bench::Report&, const bench::Options&)> run;
};

const std::vector<Section>& sections() {
  static const std::vector<Section> all = {
      {"system", bench::section_system},
      {"matmul", bench::section_matmul},
      {"overhead", bench::section_overhead},
  };
  return all;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tapegrad's benchmarks, one run: times, throughputs and ratios against oneDNN and a copy loop"};
  int threads = 0;
  std::string only, json;
  bench::Options options;
  app.add_option("--threads", threads, "threads for oneDNN and tapegrad's loops (default: tapegrad's default)")->check(CLI::PositiveNumber);
  app.add_option("--only", only, "comma-separated sections to run (default: all)");
  app.add_option("--json", json, "also write every number to this file");
  app.add_flag("--quick", options.quick, "fewer shapes and runs: checks that the benchmark runs");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) tapegrad::set_num_threads(threads);
  std::vector<std::string> wanted;
  std::stringstream list(only);
  for (std::string s; std::getline(list, s, ',');) wanted.push_back(s);
  for (const auto& w : wanted)
    if (std::none_of(sections().begin(), sections().end(), [&](const Section& s) { return w == s.name; })) {
      std::string names;
      for (const auto& s : sections()) names += std::string(names.empty() ? "" : ", ") + s.name;
      fmt::print(stderr, "--only: unknown section '{}'; sections are {}\n", w, names);
      return 2;
    }
  bench::Report report;
  for (const auto& s : sections())
    if (wanted.empty() || std::find(wanted.begin(), wanted.end(), s.name) != wanted.end()) s.run(report, options);
  if (!json.empty()) report.write_json(json);
}
