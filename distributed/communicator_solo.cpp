// One process: every collective is a copy (or nothing).
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "distributed/communicator.hpp"

namespace tapegrad::detail {

std::size_t elem_size(Elem e) {
  switch (e) {
    case Elem::f32: return 4;
    case Elem::f64: return 8;
    case Elem::i64: return 8;
    case Elem::u8: return 1;
  }
  return 1;
}

const char* launcher_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"})
    if (const char* value = std::getenv(name)) return value;
  return nullptr;
}

bool launched_by_mpi() {
  // Open MPI's mpirun, MPICH's mpiexec (PMI), PMIx launchers (srun --mpi=pmix among them).
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

namespace {

class Solo final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string backend() const override { return "one process"; }
  void barrier() override {}
  void broadcast(void*, std::int64_t, Elem, int) override {}
  void all_to_all(const void* send, const std::vector<std::int64_t>& send_counts, void* recv, const std::vector<std::int64_t>&,
                  Elem e) override {
    copy(send, recv, send_counts[0], e);
  }
  void all_gather(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) override {
    if (send != nullptr) copy(send, recv, counts[0], e);
  }
  void all_reduce_sum(void*, std::int64_t, Elem) override {}
  void reduce_scatter_sum(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) override {
    copy(send, recv, counts[0], e);
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }
  void finalize() override {}

 private:
  static void copy(const void* from, void* to, std::int64_t count, Elem e) {
    if (count > 0 && from != to) std::memmove(to, from, static_cast<std::size_t>(count) * elem_size(e));
  }
};

}  // namespace

std::unique_ptr<Communicator> make_solo_communicator() { return std::make_unique<Solo>(); }

}  // namespace tapegrad::detail
