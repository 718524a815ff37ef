// Section "checkpoint": saving and loading safetensors files of many small tensors (a model of
// 1k, 10k and 100k parameters of 4 floats each, named like a real model's, "blocks.<i>.w"):
// save(module), load_safetensors(path) and load(module, path), ms median (min-max), and the time
// per tensor, which stays flat when the cost is linear in the file. The resident memory of one
// load is measured in a fresh process (this program re-run with the hidden --checkpoint-rss):
// its peak above what the process held before, less the file's size (what the loaded tensors
// hold at least), per tensor.
#include <malloc.h>

#include <filesystem>
#include <fstream>

#include <tapegrad/tapegrad.hpp>

#include "sections.hpp"

namespace tg = tapegrad;
using tg::Tensor;

namespace bench {
namespace {

class ManyParameters : public tg::Module {
 public:
  explicit ManyParameters(std::int64_t n) {
    for (std::int64_t i = 0; i < n; ++i) {
      names_.push_back(fmt::format("w{}", i));
      params_.push_back(tg::full({4}, static_cast<double>(i)).set_requires_grad());
    }
  }
  void visit(tg::ModuleVisitor& v) override {
    for (std::size_t i = 0; i < params_.size(); ++i) v.parameter(names_[i], params_[i]);
  }

 private:
  std::vector<std::string> names_;
  std::vector<Tensor> params_;
};

// Groups of 10 parameters under "blocks.<i>", as a real model's names nest.
class Model : public tg::Module {
 public:
  explicit Model(std::int64_t n) {
    for (std::int64_t i = 0; i < n / 10; ++i) blocks.emplace_back(10);
  }
  void visit(tg::ModuleVisitor& v) override { v.modules("blocks", blocks); }
  std::vector<ManyParameters> blocks;
};

// Peak resident bytes of one load_safetensors(path) in a fresh process, above what it held before.
double load_peak_bytes(const std::filesystem::path& path) { return run_self(fmt::format("--checkpoint-rss '{}'", path.string())); }

}  // namespace

int checkpoint_rss_child(const std::string& path) {
  mallopt(M_MMAP_THRESHOLD, 64 << 10);  // big blocks from mmap: freed, they leave the resident set
  std::ofstream("/proc/self/clear_refs") << "5";
  const std::int64_t before = status_kb("VmRSS:");
  const tg::SafetensorsFile file = tg::load_safetensors(path);
  const std::int64_t peak = status_kb("VmHWM:");
  fmt::print("{}\n", before < 0 || peak < 0 ? -1.0 : 1024.0 * static_cast<double>(peak - before));
  return file.tensors.empty() ? 1 : 0;
}

void section_checkpoint(Report& report, const Options& options) {
  auto& table = report.table("checkpoint",
                             "safetensors checkpoints of many small tensors (4 floats each): ms median (min-max), us per tensor, "
                             "resident peak of a load above the file's size",
                             {{"tensors", "tensors", 0, 7},
                              {"file_mib", "file MiB", 2, 8},
                              {"save_ms", "save ms", 2, 24},
                              {"load_safetensors_ms", "load_safetensors ms", 2, 24},
                              {"load_module_ms", "load(module) ms", 2, 24},
                              {"load_us_per_tensor", "us/tensor", 3, 9},
                              {"load_extra_bytes_per_tensor", "B/tensor", 0, 8}});
  const std::vector<std::int64_t> counts =
      options.quick ? std::vector<std::int64_t>{100, 1000} : std::vector<std::int64_t>{1000, 10000, 100000};
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tapegrad-bench-{}", ::getpid());
  std::filesystem::create_directories(dir);
  for (std::int64_t n : counts) {
    Model model(n);
    const auto path = dir / fmt::format("model-{}.safetensors", n);
    const int runs = n >= 100000 ? 3 : options.runs;
    const auto t = measure({[&] { tg::save(model, path); }, [&] { tg::load_safetensors(path); }, [&] { tg::load(model, path); }}, runs,
                           options.seconds);
    const double bytes = static_cast<double>(std::filesystem::file_size(path)), peak = load_peak_bytes(path);
    table.add({n, bytes / (1 << 20), t[0], t[1], t[2], t[1].median * 1e6 / static_cast<double>(n),
               peak < 0 ? Cell{} : Cell{(peak - bytes) / static_cast<double>(n)}});
  }
  std::filesystem::remove_all(dir);
  table.note("us/tensor: load_safetensors' median over the tensor count (flat when loading is linear in the file); B/tensor: the "
             "resident peak of one load_safetensors in a fresh process, above what it held before, less the file's size, per tensor");
}

}  // namespace bench
