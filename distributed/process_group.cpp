// A job's processes (see process_group.hpp).
#include "tapegrad/distributed/process_group.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include <fmt/format.h>

#include "autodiff/check.hpp"
#include "distributed/comm_thread.hpp"

namespace tapegrad {
using detail::fail;

ProcessGroup::ProcessGroup(const ProcessGroupOptions& options) : timeout_(options.timeout_seconds), uncaught_at_start_(std::uncaught_exceptions()) {
  if (!(timeout_ > 0) || !std::isfinite(timeout_))
    fail<ValueError>("ProcessGroup: options.timeout_seconds must be finite and > 0, got {}", timeout_);
  communicator_ = detail::make_communicator();
  rank_ = communicator_->rank();
  size_ = communicator_->size();
  backend_ = communicator_->backend();
  thread_ = std::make_unique<detail::CommThread>(*communicator_, timeout_);
}

ProcessGroup::~ProcessGroup() {
  const bool failing = std::uncaught_exceptions() > uncaught_at_start_ || thread_->broken() || !thread_->drained();
  if (failing) {
    // Another rank may wait forever in a collective this one will not join: finalising would
    // wait with it. The thread and what it uses stay alive for the rest of the process.
    thread_->abandon();
    (void)thread_.release();
    (void)communicator_.release();
    return;
  }
  thread_.reset();
  communicator_->finalize();
}

void ProcessGroup::barrier() {
  thread_->run("ProcessGroup::barrier", [](detail::Communicator& c) { c.barrier(); });
}

void ProcessGroup::broadcast(const std::vector<Tensor>& tensors, int root) {
  if (root < 0 || root >= size_) fail<ValueError>("ProcessGroup::broadcast: argument 'root' must be in [0, {}), got {}", size_, root);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::check_defined("ProcessGroup::broadcast", fmt::format("tensors[{}]", i).c_str(), tensors[i]);
    if (!tensors[i].is_contiguous())
      fail<ValueError>("ProcessGroup::broadcast: tensors[{}] must be contiguous (its values are sent in place)", i);
  }
  thread_->run("ProcessGroup::broadcast", [&](detail::Communicator& c) {
    for (const Tensor& t : tensors)
      c.broadcast(const_cast<void*>(t.raw_data()), t.numel() * static_cast<std::int64_t>(itemsize(t.dtype())), detail::Elem::u8, root);
  });
}

void ProcessGroup::abort(std::string_view message, int code) noexcept {
  // DistributedErrors name the rank already.
  const std::string prefix = fmt::format("rank {} of {}: ", rank_, size_);
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  std::fprintf(stderr, "%s%.*s\n", prefix.c_str(), static_cast<int>(message.size()), message.data());
  std::fflush(stderr);
  communicator_->abort(code);
  std::_Exit(code);  // not reached: abort() does not return
}

}  // namespace tapegrad
