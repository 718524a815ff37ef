// The collectives data-parallel training needs, over MPI or within one process. Every call is
// blocking and made from the process group's communication thread alone. Counts are elements.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tapegrad::detail {

enum class Elem { f32, f64, i64, u8 };
std::size_t elem_size(Elem e);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string backend() const = 0;
  virtual void barrier() = 0;
  virtual void broadcast(void* data, std::int64_t count, Elem e, int root) = 0;
  // Rank r sends send_counts[j] elements to rank j (packed in rank order) and receives
  // recv_counts[j] from rank j (packed in rank order).
  virtual void all_to_all(const void* send, const std::vector<std::int64_t>& send_counts, void* recv,
                          const std::vector<std::int64_t>& recv_counts, Elem e) = 0;
  // Every rank receives every rank's `counts[j]` elements, packed in rank order. `send` null:
  // in place, this rank's part already where it goes in `recv`.
  virtual void all_gather(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) = 0;
  // The sum over the ranks, in place, in whatever order the MPI library chooses.
  virtual void all_reduce_sum(void* data, std::int64_t count, Elem e) = 0;
  // The sum over the ranks of `send` (sum of counts elements); rank j keeps its counts[j] of it.
  virtual void reduce_scatter_sum(const void* send, void* recv, const std::vector<std::int64_t>& counts, Elem e) = 0;
  // Ends every process of the job (MPI_Abort), or this one.
  [[noreturn]] virtual void abort(int code) = 0;
  // Called once the communication thread has stopped, when every rank is done (MPI_Finalize).
  virtual void finalize() = 0;
};

// MPI's world when the process was started by an MPI launcher (mpirun sets OMPI_COMM_WORLD_SIZE,
// MPICH's mpiexec PMI_SIZE, PMIx launchers PMIX_RANK) and the library was built with MPI;
// otherwise one process.
std::unique_ptr<Communicator> make_communicator();
std::unique_ptr<Communicator> make_solo_communicator();
// Whether the environment says an MPI launcher started this process, and the process count it
// says it started, if any.
bool launched_by_mpi();
const char* launcher_size();

}  // namespace tapegrad::detail
