// dp_check: trains a small decoder with DataParallel, as one process or under mpirun, and writes
// its final parameters (rank 0), so that runs on different process counts can be compared bit for
// bit. It can also make one rank fail (die, throw, stall, or build another model) to show how the
// job ends.
//
//   mpirun -np 2 dp_check --out np2.safetensors [--micro-batches 12] [--fast] [--shard] [--float64]
//   mpirun -np 2 dp_check --die-rank 1 --at-step 2        # also --throw-rank, --stall-rank, --mismatch-rank
//   mpirun -np 2 dp_check --other-micro-batches-rank 1    # options that differ, one of them refused locally
//   mpirun -np 2 dp_check --size-mismatch-rank 1          # a broadcast and an all_gather of other sizes on rank 1
//   mpirun -np 2 dp_check --stall-rank 1 --timeout 3 --catch-timeout
//   mpirun -np 2 dp_check --checkpoint c.safetensors --die-rank 1 --at-step 3; dp_check --checkpoint c.safetensors --resume
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>

#include <tapegrad/distributed/data_parallel.hpp>
#include <tapegrad/tapegrad.hpp>

namespace tg = tapegrad;

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> o;
  for (int i = 1; i < argc; ++i) {
    const std::string key = argv[i];
    if (key.rfind("--", 0) != 0) throw std::invalid_argument("dp_check: unexpected argument '" + key + "'");
    const bool flag = key == "--fast" || key == "--shard" || key == "--float64" || key == "--catch-timeout" || key == "--resume";
    if (!flag && i + 1 == argc) throw std::invalid_argument("dp_check: " + key + " needs a value");
    o[key.substr(2)] = flag ? "1" : argv[++i];
  }
  return o;
}

std::int64_t number(const std::map<std::string, std::string>& o, const std::string& key, std::int64_t fallback) {
  const auto it = o.find(key);
  return it == o.end() ? fallback : std::stoll(it->second);
}

// --size-mismatch-rank R: that rank gives a broadcast and an all_gather other sizes; both must be
// refused on every rank (none waits for a message that never comes), and the group goes on.
int check_size_mismatch(tg::ProcessGroup& group, int odd) {
  const bool mine = group.rank() == odd;
  auto refused = [&](const char* what, auto&& call) {
    try {
      call();
    } catch (const tg::Error& e) {
      if (group.rank() == 0) std::printf("%s refused: %s\n", what, e.what());
      return true;
    }
    return false;
  };
  const bool both = refused("broadcast", [&] { group.broadcast({tg::zeros({mine ? 4 : 3})}); }) &&
                    refused("all_gather", [&] { tg::all_gather(group, std::vector<double>(mine ? 2 : 1, 0.0)); });
  group.barrier();  // still usable
  return both ? 0 : 1;
}

int run(tg::ProcessGroup& group, const std::map<std::string, std::string>& o) {
  if (o.count("size-mismatch-rank") > 0) return check_size_mismatch(group, static_cast<int>(number(o, "size-mismatch-rank", 1)));
  const std::int64_t m = number(o, "micro-batches", 12), steps = number(o, "steps", 5), rows = 2, length = 8, vocab = 13;
  const int at_step = static_cast<int>(number(o, "at-step", 2));
  const bool mismatch = number(o, "mismatch-rank", -1) == group.rank();
  tg::Decoder model({.vocab = vocab, .max_len = length, .dim = 16, .heads = 2, .layers = mismatch ? 3 : 2, .dropout = 0.1,
                     .dtype = o.count("float64") ? tg::float64 : tg::float32, .seed = 7});
  const bool other_options = number(o, "other-micro-batches-rank", -1) == group.rank();
  tg::DataParallel dp(group, model,
                      {.micro_batches = other_options ? 3 : m, .bucket_bytes = number(o, "bucket-bytes", 4096),
                       .reduction = o.count("fast") ? tg::GradientReduction::fast : tg::GradientReduction::exact, .shard_optimizer_state = o.count("shard") > 0});
  tg::AdamW opt(dp.optimizer_parameters(), {.lr = 1e-2, .weight_decay = 0.01});
  // Every process draws the whole step's windows from one stream and takes its micro-batches.
  tg::Generator text_gen(11), data(5);
  std::vector<std::int64_t> text(400);
  for (auto& t : text) t = static_cast<std::int64_t>(text_gen.next_u64() % vocab);
  // --checkpoint: the training state after every step, which --resume continues from.
  tg::TrainingState state{.model = model, .optimizer = opt, .generators = {{"data", data}}};
  if (o.count("resume") > 0) {
    tg::load_training_state(o.at("checkpoint"), state, dp);
    if (group.rank() == 0) std::printf("resumed at step %lld\n", static_cast<long long>(state.step));
  }
  for (auto step = static_cast<int>(state.step); step < steps; ++step) {
    const auto [x, y] = tg::random_windows(text, m * rows, length, data);
    for (std::int64_t k = dp.first_micro_batch(); k < dp.end_micro_batch(); ++k) {
      if (step == at_step) {
        if (number(o, "die-rank", -1) == group.rank()) std::raise(SIGKILL);
        if (number(o, "throw-rank", -1) == group.rank()) throw std::runtime_error("dp_check: the failure asked for with --throw-rank");
        if (number(o, "stall-rank", -1) == group.rank()) std::this_thread::sleep_for(std::chrono::seconds(120));
      }
      tg::key_generators(model, 3, step * m + k);
      dp.backward(tg::cross_entropy(model.forward(tg::narrow(x, 0, k * rows, rows)), tg::narrow(y, 0, k * rows, rows)));
    }
    if (o.count("catch-timeout") > 0) {
      // A caller may catch the timeout; the group then refuses every further collective.
      try {
        dp.synchronize();
      } catch (const tg::DistributedError& e) {
        std::fprintf(stderr, "caught: %s\n", e.what());
        group.barrier();
      }
    } else {
      dp.synchronize();
    }
    dp.clip_grad_norm(0.5);
    opt.step();
    dp.share_parameters();
    if (o.count("checkpoint") > 0) {
      state.step = step + 1;
      tg::save_training_state(o.at("checkpoint"), state, dp);
    }
  }
  if (group.rank() == 0 && o.count("out")) tg::save_safetensors(o.at("out"), model.named_parameters());
  const auto& s = dp.stats();
  std::printf("rank %d of %d (%s): %lld steps, exchange %.3f s, waited %.3f s, %lld bytes sent\n", group.rank(), group.size(),
              group.backend().c_str(), static_cast<long long>(s.steps), s.exchange_seconds, s.waiting_seconds,
              static_cast<long long>(s.bytes_sent));
  return 0;
}

// --compare A B --tolerance T: the largest difference between two parameter files (0: bitwise).
int compare(const std::string& a, const std::string& b, double tolerance) {
  const tg::SafetensorsFile fa = tg::load_safetensors(a), fb = tg::load_safetensors(b);
  if (fa.tensors.size() != fb.tensors.size()) throw std::runtime_error("dp_check: the files hold different parameters");
  double worst = 0;
  std::size_t differing = 0;
  for (std::size_t i = 0; i < fa.tensors.size(); ++i) {
    const auto va = fa.tensors[i].tensor.to_vector<double>(), vb = fb.tensors[i].tensor.to_vector<double>();
    if (fa.tensors[i].name != fb.tensors[i].name || va.size() != vb.size()) throw std::runtime_error("dp_check: the files hold different parameters");
    for (std::size_t e = 0; e < va.size(); ++e) {
      worst = std::max(worst, std::abs(va[e] - vb[e]));
      differing += std::memcmp(&va[e], &vb[e], sizeof(double)) != 0;
    }
  }
  std::printf("%s against %s: %zu values differ, the largest difference %.3g (tolerance %g)\n", b.c_str(), a.c_str(), differing, worst, tolerance);
  return (tolerance == 0 ? differing == 0 : worst <= tolerance) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::map<std::string, std::string> o;
  try {
    if (argc >= 4 && std::string(argv[1]) == "--compare")
      return compare(argv[2], argv[3], argc >= 6 ? std::stod(argv[5]) : 0.0);
    o = parse(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
  tg::ProcessGroup group({.timeout_seconds = static_cast<double>(number(o, "timeout", 120))});
  try {
    return run(group, o);
  } catch (const std::exception& e) {
    group.abort(e.what());
  }
}
