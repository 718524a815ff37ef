// tapegrad_bench: every benchmark in one run, so that each ratio compares figures measured on the
// same machine at the same time.
//
//   ./build/bench/tapegrad_bench [--threads 1,2] [--only kernels,attention,...] [--json FILE] [--quick]
//
// Each section runs at every --threads count in turn (default: tapegrad's default count); the
// "threads" section compares 1 thread with the largest count (at least 2).
//
// --json FILE writes one document (stable keys; a new key may be added, none renamed):
//   {"format": "tapegrad_bench 1",
//    "run": {"threads": [1, 2], "quick": false, "sections": ["system", ...]},
//    "facts": {"cpu": ..., "cpu_features": ..., "onednn": ..., "threads": ..., "bfloat16_native": ...},
//    "tables": {"<table id>": {"section": "<section>", "title": "...", "notes": ["..."],
//                              "columns": [{"key": "forward_ms", "header": "fwd ms"}, ...],
//                              "rows": [{"<column key>": value, ...}, ...]}}}
// A value is a string, a number, null (no figure: printed "-") or, for a timed figure,
// {"median_ms", "min_ms", "max_ms", "runs"} (a time derived from medians, such as softmax's
// backward_ms, is a number). Keys name their unit: _ms, _gbs (GB/s),
// _gflops (GFLOP/s), _mib, _percent; _fraction and _ratio are plain ratios (a _memory ending: of
// the memory copy's bandwidth, bench::memory_copy). Table ids: references,
// matmul, overhead, kernels, softmax, attention, fused, variants, bf16, bf16_error, decode, generate,
// threads, threads_busy, train, checkpoint, distributed_chars, distributed_gpt2.
#include <algorithm>
#include <fstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace {

struct Section {
  const char* name;
  void (*run)(bench::Report&, const bench::Options&);
  const char* about;  // for the Markdown page
};

constexpr Section kSections[] = {
    {"system", bench::section_system, "The machine, and the two references the other sections are held to: a copy loop's bandwidth and oneDNN's own float32 matmul throughput."},
    {"matmul", bench::section_matmul, "tapegrad::matmul against the raw oneDNN primitive on the same shapes, a naive loop, and bfloat16 products."},
    {"overhead", bench::section_overhead, "The tape's fixed cost: a recorded op on a tiny tensor, forward and backward."},
    {"kernels", bench::section_kernels, "Elementwise ops and reductions against a copy of the same bytes on the same threads."},
    {"softmax", bench::section_softmax, "The public softmax ops against a copy of the same bytes, and against memory bandwidth."},
    {"attention", bench::section_attention, "The MultiHeadAttention layer on the weights path, toy to long shapes, against the sum of its products at oneDNN's throughput (the roofline)."},
    {"fused", bench::section_fused, "The fused path (need_weights = false) against the weights path on long sequences: time and peak memory."},
    {"variants", bench::section_variants, "Sliding windows, grouped-query heads and ALiBi against full attention: training calls and decoding."},
    {"bf16", bench::section_bf16, "bfloat16 products against float32: speed-ups, and the error against float64."},
    {"decode", bench::section_decode, "KV-cache decoding: the cost of one token as the cache grows, and generation's tokens per second."},
    {"threads", bench::section_threads, "Each operation on 1 thread against 2, alone and next to a process that keeps a core busy."},
    {"train", bench::section_train, "A training step of train_sort's model: time per step and where it goes."},
    {"gpt2", bench::section_gpt2, "One training step of a GPT-2-shaped decoder (163M parameters: GPT-2 small with an untied head; 4 x 64 tokens): against the sum of its products at oneDNN's throughput (hot: each on operands it has just used; cold: all in memory; chain: in the step's order on the step's buffers), op by op, on 1 and 2 threads, float32 and bfloat16, peak memory against llm.c's activations, against PyTorch's twin in turn (where python3-torch is installed), and bfloat16's loss against float32's over 200 steps."},
    {"distributed", bench::section_distributed, "Data-parallel training (DataParallel) of train_chars' model and the GPT-2 shape: 1 process x 2 threads against 2 processes x 1 thread under mpirun, exact against fast reduction, how much of the exchange the backward hides, and how far the parameters drift apart."},
    {"checkpoint", bench::section_checkpoint, "Saving and loading checkpoints of 1k to 100k tensors: time per tensor and resident memory."},
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tapegrad's benchmarks, one run: times, throughputs, peak memory and ratios against oneDNN and a copy loop"};
  std::vector<std::string> only;
  std::string json, markdown;
  bench::Options options;
  std::vector<long long> rss_peak;
  app.add_option("--threads", options.threads, "thread counts, comma-separated; each section runs at each (default: tapegrad's default)")
      ->delimiter(',')
      ->check(CLI::PositiveNumber);
  std::string names;
  for (const auto& s : kSections) names += std::string(names.empty() ? "" : ",") + s.name;
  app.add_option("--only", only, "comma-separated sections to run (default: all): " + names)->delimiter(',');
  app.add_option("--json", json, "also write every number to this file");
  app.add_option("--markdown", markdown, "also write every table as one Markdown page (docs/benchmarks.md)");
  app.add_flag("--quick", options.quick, "small sizes and few runs: checks that the benchmark runs");
  // The fused section's child process (resident memory of one call in a fresh process).
  app.add_option("--rss-peak", rss_peak)->expected(4)->group("");
  std::string checkpoint_rss;  // the checkpoint section's child process
  app.add_option("--checkpoint-rss", checkpoint_rss)->group("");
  CLI11_PARSE(app, argc, argv);
  if (!checkpoint_rss.empty()) return bench::checkpoint_rss_child(checkpoint_rss);
  if (!rss_peak.empty())
    return bench::fused_rss_child(rss_peak[0], rss_peak[1] != 0, rss_peak[2] != 0, static_cast<int>(rss_peak[3]));
  if (options.threads.empty()) options.threads = {tapegrad::num_threads()};
  if (options.quick) {
    options.runs = 3;
    options.seconds = 0.01;
  }
  for (const auto& w : only)
    if (std::none_of(std::begin(kSections), std::end(kSections), [&](const Section& s) { return w == s.name; })) {
      fmt::print(stderr, "--only: unknown section '{}'; sections are {}\n", w, names);
      return 2;
    }
  // A full run takes minutes: learn that the file cannot be written before, not after.
  if (!json.empty() && !std::ofstream(json)) {
    fmt::print(stderr, "--json: cannot write {}\n", json);
    return 2;
  }
  bench::Report report;
  std::vector<std::string> ran;
  for (const auto& s : kSections)
    if (only.empty() || std::find(only.begin(), only.end(), s.name) != only.end()) {
      report.begin(s.name, s.about);
      s.run(report, options);
      ran.emplace_back(s.name);
    }
  if (!json.empty())
    report.write_json(json, nlohmann::json{{"threads", options.threads}, {"quick", options.quick}, {"sections", ran}}.dump());
  if (!markdown.empty()) {
    std::string command = "./build/bench/tapegrad_bench";
    for (int i = 1; i < argc; ++i) command += std::string(" ") + argv[i];
    report.write_markdown(markdown, command);
  }
}
