// The processes of one training job, and the one thread that makes their MPI calls.
//
// Started by an MPI launcher (mpirun, mpiexec) in a tapegrad built with MPI, a ProcessGroup is
// MPI's world: rank() of size() processes. Started any other way it is one process, rank 0 of 1,
// and everything below works the same with nothing to exchange. Make one per process, first
// thing in main, and keep it for the run:
//
//   int main(int argc, char** argv) {
//     tg::ProcessGroup group;
//     try {
//       ...                                          // DataParallel, data_parallel.hpp
//     } catch (const std::exception& e) {
//       group.abort(e.what());                       // ends every process, naming this rank
//     }
//   }
//
// Every MPI call is made by the group's communication thread, in the order the calls were
// asked for (Open MPI does not progress a collective by itself, so a thread that waits in one
// is what lets communication overlap the backward). A collective that does not finish within
// the timeout throws a DistributedError on the rank that waits, instead of hanging. A process
// that dies ends the job: mpirun stops the others and names the rank.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "tapegrad/autodiff/error.hpp"
#include "tapegrad/autodiff/tensor.hpp"

namespace tapegrad {

// A collective failed or did not finish in time, or the processes of a job disagree (their
// models, their options). The message names the rank that saw it.
class DistributedError : public Error {
 public:
  using Error::Error;
};

struct ProcessGroupOptions {
  // How long a rank waits for one collective before it gives up with a DistributedError. It
  // bounds how far the ranks may drift apart (rank 0 validating while the others wait), so it is
  // generous; > 0.
  double timeout_seconds = 600;
};

namespace detail {
class Communicator;
class CommThread;
}  // namespace detail

class ProcessGroup {
 public:
  explicit ProcessGroup(const ProcessGroupOptions& options = {});
  // Stops the communication thread and finalises MPI. Left by an exception, or after a
  // collective failed, it finalises nothing (the other ranks may be waiting in a collective that
  // will never finish): the process should end with abort() or a non-zero exit status, which
  // makes mpirun stop the job.
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  // "one process", or the MPI library's name and version.
  const std::string& backend() const noexcept { return backend_; }
  double timeout_seconds() const noexcept { return timeout_; }

  void barrier();
  // Every rank's `tensors` (contiguous, the same shapes and dtypes on every rank) take root's
  // values, in place.
  void broadcast(const std::vector<Tensor>& tensors, int root = 0);
  // Prints "rank R of P: message" on standard error and ends every process of the job with
  // `code` (MPI_Abort), or this process when it is alone.
  [[noreturn]] void abort(std::string_view message, int code = 1) noexcept;

  // For DataParallel: the communication thread (jobs run in order) and the wait on a job that
  // turns a timeout or a failed collective into a DistributedError naming `what`.
  detail::CommThread& comm() { return *thread_; }

 private:
  std::unique_ptr<detail::Communicator> communicator_;
  std::unique_ptr<detail::CommThread> thread_;
  int rank_ = 0, size_ = 1;
  double timeout_;
  std::string backend_;
  int uncaught_at_start_;
};

}  // namespace tapegrad
