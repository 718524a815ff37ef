// Built without MPI: a process group is one process, and refuses to pretend otherwise under a launcher.
#include <string>

#include "autodiff/check.hpp"
#include "distributed/communicator.hpp"
#include "tapegrad/distributed/process_group.hpp"

namespace tapegrad::detail {

std::unique_ptr<Communicator> make_communicator() {
  const char* size = launcher_size();
  if (size != nullptr && std::string(size) != "1")
    fail<DistributedError>("ProcessGroup: an MPI launcher started {} processes, but this tapegrad was built without MPI, so each would "
                           "train alone; install libopenmpi-dev and openmpi-bin and rebuild",
                           size);
  return make_solo_communicator();
}

}  // namespace tapegrad::detail
