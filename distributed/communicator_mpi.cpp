// MPI's world (MPI-3.1 C calls only, so Open MPI and MPICH both serve). Errors are returned, not
// fatal (MPI_ERRORS_RETURN), and become DistributedErrors naming the call and the rank.
#include <mpi.h>

#include <climits>

#include "autodiff/check.hpp"
#include "distributed/communicator.hpp"
#include "tapegrad/distributed/process_group.hpp"

namespace tapegrad::detail {
namespace {

MPI_Datatype type_of(Elem e) {
  switch (e) {
    case Elem::f32: return MPI_FLOAT;
    case Elem::f64: return MPI_DOUBLE;
    case Elem::i64: return MPI_INT64_T;
    case Elem::u8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

class Mpi final : public Communicator {
 public:
  Mpi() {
    int initialised = 0;
    MPI_Initialized(&initialised);
    if (initialised) fail<DistributedError>("ProcessGroup: MPI was initialised already; make one ProcessGroup per process, before any other MPI use");
    // Every collective comes from the communication thread; abort() may come from another
    // thread while that one waits in a collective, which only MULTIPLE allows.
    int provided = 0;
    if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
      fail<DistributedError>("ProcessGroup: MPI_Init_thread failed");
    if (provided < MPI_THREAD_MULTIPLE)
      fail<DistributedError>("ProcessGroup: the MPI library gives thread level {}; tapegrad needs MPI_THREAD_MULTIPLE ({}), as Open MPI and "
                             "MPICH give",
                             provided, static_cast<int>(MPI_THREAD_MULTIPLE));
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &size_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend() const override {
    char version[MPI_MAX_LIBRARY_VERSION_STRING];
    int length = 0;
    MPI_Get_library_version(version, &length);
    std::string text(version, static_cast<std::size_t>(length));
    if (const auto cut = text.find_first_of(",\n"); cut != std::string::npos) text.resize(cut);
    return text;
  }
  void barrier() override { check("MPI_Barrier", MPI_Barrier(MPI_COMM_WORLD)); }
  void broadcast(void* data, std::int64_t count, Elem e, int root) override {
    check("MPI_Bcast", MPI_Bcast(data, as_int(count), type_of(e), root, MPI_COMM_WORLD));
  }
  void all_to_all(const void* send, const std::vector<std::int64_t>& send_counts, void* recv, const std::vector<std::int64_t>& recv_counts,
                  Elem e) override {
    const auto [sc, sd] = counts_and_displacements(send_counts);
    const auto [rc, rd] = counts_and_displacements(recv_counts);
    check("MPI_Alltoallv", MPI_Alltoallv(send, sc.data(), sd.data(), type_of(e), recv, rc.data(), rd.data(), type_of(e), MPI_COMM_WORLD));
  }
  void all_gather(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) override {
    const auto [c, d] = counts_and_displacements(counts);
    check("MPI_Allgatherv", MPI_Allgatherv(send == nullptr ? MPI_IN_PLACE : send, c[static_cast<std::size_t>(rank_)], type_of(e), recv, c.data(),
                                           d.data(), type_of(e), MPI_COMM_WORLD));
  }
  void all_reduce_sum(void* data, std::int64_t count, Elem e) override {
    check("MPI_Allreduce", MPI_Allreduce(MPI_IN_PLACE, data, as_int(count), type_of(e), MPI_SUM, MPI_COMM_WORLD));
  }
  void reduce_scatter_sum(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) override {
    const auto [c, d] = counts_and_displacements(counts);
    check("MPI_Reduce_scatter", MPI_Reduce_scatter(send, recv, c.data(), type_of(e), MPI_SUM, MPI_COMM_WORLD));
  }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);  // MPI_Abort does not return; in case an implementation does
  }
  void finalize() override { MPI_Finalize(); }

 private:
  static int as_int(std::int64_t count) {
    if (count < 0 || count > INT_MAX) fail<DistributedError>("ProcessGroup: {} elements in one message; MPI counts stop at {}", count, INT_MAX);
    return static_cast<int>(count);
  }
  static std::pair<std::vector<int>, std::vector<int>> counts_and_displacements(const std::vector<std::int64_t>& counts) {
    std::vector<int> c, d;
    std::int64_t at = 0;
    for (const std::int64_t n : counts) {
      c.push_back(as_int(n));
      d.push_back(as_int(at));
      at += n;
    }
    return {c, d};
  }
  void check(const char* call, int code) const {
    if (code == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    fail<DistributedError>("rank {} of {}: {} failed: {}", rank_, size_, call, std::string(text, static_cast<std::size_t>(length)));
  }
  int rank_ = 0, size_ = 1;
};

}  // namespace

std::unique_ptr<Communicator> make_communicator() {
  if (!launched_by_mpi()) return make_solo_communicator();
  return std::make_unique<Mpi>();
}

}  // namespace tapegrad::detail
