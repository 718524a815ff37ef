// Section "distributed": data-parallel training (tapegrad::DataParallel) on this machine's cores,
// as 1 process x 2 threads against 2 processes x 1 thread, for train_chars' model and the
// GPT-2 shape. Each run is another program, tapegrad_dp_worker (bench/dp_worker.cpp, built
// beside tapegrad_bench), alone or under mpirun, which trains warm-up steps then timed ones and
// writes its figures as JSON and its final parameters. The runs go in turn, in rounds (three for
// train_chars' model, two for the GPT-2 shape, whose round takes about a minute and a half), so
// that the machine's slow phases fall on every run alike. Per run: the step's time (median, min-max
// over the timed steps of every round); the exchange's time per step (the communication thread's time on the
// buckets), what synchronize() still waited for, and so the fraction the backward hid; the
// gradient bytes each process sent per step; and the largest difference of the final parameters
// from the one-process DataParallel run (exact: the same bits on any process count that divides
// M; fast: MPI_Allreduce's order). The plain row is one batch of the whole step through
// tg::backward: what splitting the step into micro-batches costs.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>
#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
namespace fs = std::filesystem;

namespace bench {
namespace {

struct Run {
  const char* label;
  int processes, threads;
  const char* flags;  // the worker's: --plain, --fast, --shard
};

// The first is the reference of the ratios and the differences.
constexpr Run kRuns[] = {
    {"DataParallel exact", 1, 2, ""},
    {"one batch, tg::backward", 1, 2, "--plain"},
    {"DataParallel exact", 2, 1, ""},
    {"DataParallel fast", 2, 1, "--fast"},
    {"exact, sharded state", 2, 1, "--shard"},
};

// A run's figures over the rounds: every timed step, and per step the means over the processes.
struct Outcome {
  std::vector<double> steps;                               // seconds
  double exchange = 0, waiting = 0, share = 0, bytes = 0;  // summed over the rounds
  int rounds = 0, micro_batches = 0, rows = 0;
  bool failed = false;
  std::string backend;
  double per_round(double total) const { return total / rounds; }
};

// One more round of a run: the worker's figures join `o`; false (and a note) when it failed.
bool launch(Table& table, const std::string& command, const fs::path& json, Outcome& o) {
  fs::remove(json);
  if (std::system(command.c_str()) != 0 || !fs::exists(json)) {
    table.note(fmt::format("failed: {}", command));
    return false;
  }
  std::ifstream in(json);
  const nlohmann::json doc = nlohmann::json::parse(in);
  const auto seconds = doc.at("step_seconds").get<std::vector<double>>();
  o.steps.insert(o.steps.end(), seconds.begin(), seconds.end());
  const double steps = static_cast<double>(seconds.size()), processes = doc.at("processes").get<double>();
  const auto mean = [&](const char* key) {
    double total = 0;
    for (const double v : doc.at(key).get<std::vector<double>>()) total += v;
    return total / processes / steps;
  };
  o.exchange += mean("exchange_seconds"), o.waiting += mean("waiting_seconds"), o.share += mean("share_seconds"), o.bytes += mean("bytes_sent");
  o.micro_batches = doc.at("micro_batches").get<int>(), o.rows = doc.at("rows").get<int>();
  o.backend = doc.at("backend").get<std::string>();
  ++o.rounds;
  return true;
}

// The largest |a - b| over two parameter files of the same model.
double max_difference(const fs::path& a, const fs::path& b) {
  const tg::SafetensorsFile fa = tg::load_safetensors(a), fb = tg::load_safetensors(b);
  double worst = 0;
  for (std::size_t i = 0; i < std::min(fa.tensors.size(), fb.tensors.size()); ++i) {
    const auto va = fa.tensors[i].tensor.to_vector<double>(), vb = fb.tensors[i].tensor.to_vector<double>();
    for (std::size_t e = 0; e < std::min(va.size(), vb.size()); ++e) worst = std::max(worst, std::abs(va[e] - vb[e]));
  }
  return worst;
}

void model_table(Report& report, const Options& options, const fs::path& worker, const fs::path& dir, const char* model,
                 const std::string& title, int warmup, int steps, int rounds) {
  auto& table = report.table(fmt::format("distributed_{}", model), title,
                             {{"processes", "P", 0, 2},
                              {"threads", "T", 0, 2},
                              {"run", "run", 0, 23},
                              {"step_ms", "step ms", 1, 24},
                              {"vs_one_process_ratio", "1x2 DP / this", 2, 13},
                              {"exchange_ms", "exchange ms", 2, 11},
                              {"waited_ms", "waited ms", 2, 9},
                              {"hidden_fraction", "hidden", 2, 6},
                              {"share_ms", "share ms", 2, 8},
                              {"sent_mib", "sent MiB", 2, 8},
                              {"max_difference", "max |param diff|", -2, 16}});
#ifndef TAPEGRAD_MPI_LAUNCH
  table.note("tapegrad was built without MPI, or MPI has no launcher here: the 2-process rows are left out");
#endif
  // In turn, round after round.
  Outcome outcomes[std::size(kRuns)];
  const auto params_of = [&](const Run& r) { return dir / fmt::format("{}_{}_{}.safetensors", model, r.processes, r.flags + (*r.flags ? 2 : 0)); };
  for (int round = 0; round < rounds; ++round)
    for (std::size_t i = 0; i < std::size(kRuns); ++i) {
      const Run& r = kRuns[i];
#ifdef TAPEGRAD_MPI_LAUNCH
      const std::string launcher = r.processes > 1 ? fmt::format("{} {} ", TAPEGRAD_MPI_LAUNCH, r.processes) : "";
#else
      const std::string launcher;
      if (r.processes > 1) continue;  // said in the table's note
#endif
      if (outcomes[i].failed) continue;
      const fs::path json = dir / "run.json";
      const std::string command = fmt::format(
          "OMP_NUM_THREADS={} {}'{}' --model {}{} {} --processes {} --threads {} --warmup {} --steps {} --json '{}' --params '{}' > /dev/null",
          r.threads, launcher, worker.string(), model, options.quick ? " --quick" : "", r.flags, r.processes, r.threads, warmup, steps,
          json.string(), params_of(r).string());
      outcomes[i].failed = !launch(table, command, json, outcomes[i]);
    }
  const Outcome& reference = outcomes[0];  // 1 x 2 DataParallel exact
  const bool have_reference = reference.rounds > 0;
  const double reference_median = have_reference ? stats_of(reference.steps).median : 0;
  for (std::size_t i = 0; i < std::size(kRuns); ++i) {
    const Run& r = kRuns[i];
    const Outcome& o = outcomes[i];
    if (o.rounds == 0) continue;
    const bool many = r.processes > 1, plain = std::string(r.flags) == "--plain";
    const double exchange = o.per_round(o.exchange), waiting = o.per_round(o.waiting);
    const double difference = many && have_reference ? max_difference(params_of(kRuns[0]), params_of(r)) : -1;  // -1: none
    const Stats step = stats_of(o.steps);
    const Cell none;
    table.add({static_cast<std::int64_t>(r.processes), static_cast<std::int64_t>(r.threads), r.label, step,
               have_reference ? Cell(reference_median / step.median) : none, plain ? none : Cell(exchange * 1e3), plain ? none : Cell(waiting * 1e3),
               plain || exchange <= 0 ? none : Cell(1 - waiting / exchange), std::string(r.flags) == "--shard" ? Cell(o.per_round(o.share) * 1e3) : none,
               plain ? none : Cell(o.per_round(o.bytes) / (1 << 20)), difference >= 0 ? Cell(difference) : none});
    if (i == 0)
      table.note(fmt::format("a step: {} micro-batches of {} ({} in all); each run {} untimed steps then {} timed, {} round(s) in turn; "
                             "max |param diff| after those {} steps, against the 1 x 2 DataParallel run",
                             o.micro_batches, o.rows, o.micro_batches * o.rows, warmup, steps, rounds, warmup + steps));
    if (i == 2) table.note(fmt::format("{} processes on {}, launched by mpirun", r.processes, o.backend));
    if (difference == 0.0 && r.processes == 2 && std::string(r.flags) == "--fast")
      table.note(fmt::format("fast on 2 processes, {} micro-batches: each process's partial sum is a subtree of exact's tree and MPI's sum of "
                             "the two is one addition, the tree's root: the same bits as exact here",
                             o.micro_batches));
  }
}

}  // namespace

void section_distributed(Report& report, const Options& options) {
  std::error_code error;
  const fs::path worker = fs::read_symlink("/proc/self/exe", error).parent_path() / "tapegrad_dp_worker";
  report.fact("distributed_cores", "cores for the distributed runs", static_cast<std::int64_t>(::sysconf(_SC_NPROCESSORS_ONLN)));
  if (error || !fs::exists(worker)) {
    auto& table = report.table("distributed_chars", "data-parallel training: not run", {{"run", "run", 0, 3}});
    table.note(fmt::format("tapegrad_dp_worker is not beside tapegrad_bench ({})", worker.string()));
    return;
  }
  const fs::path dir = fs::temp_directory_path() / fmt::format("tapegrad_bench_dp_{}", ::getpid());
  fs::create_directories(dir);
  const int quick_steps = 2, quick_warmup = 1;
  const std::string columns =
      "ms per step (median, min-max over the timed steps); exchange: the communication thread's time on the buckets, waited: what "
      "synchronize() waited for (it also covers handing the buckets over and waking the threads, so it can exceed the exchange, "
      "as on one process, which has nothing to send), hidden = 1 - waited / exchange; sent: gradient bytes each process sent per step; means over the processes";
  model_table(report, options, worker, dir, "chars",
              "train_chars' model (vocabulary of the GPL's bytes, T 64, width 64, 4 heads, 2 blocks, dropout 0.2), 32 windows a step: " + columns,
              options.quick ? quick_warmup : 5, options.quick ? quick_steps : 20, options.quick ? 1 : 3);
  model_table(report, options, worker, dir, "gpt2",
              std::string(options.quick ? "the small GPT-2 stand-in (--quick)" : "the GPT-2 shape (12 x 768, vocab 50257, T 64)") +
                  ", B sequences a step as B micro-batches of one: " + columns,
              options.quick ? quick_warmup : 3, options.quick ? quick_steps : 5, options.quick ? 1 : 2);
  fs::remove_all(dir, error);
}

}  // namespace bench
