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
  const char* fn = "ProcessGroup::broadcast";
  if (root < 0 || root >= size_) fail<ValueError>("{}: argument 'root' must be in [0, {}), got {}", fn, size_, root);
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    detail::check_defined(fn, fmt::format("tensors[{}]", i).c_str(), tensors[i]);
    if (!tensors[i].is_contiguous()) fail<ValueError>("{}: tensors[{}] must be contiguous (its values are sent in place)", fn, i);
  }
  // Root's sizes first: a rank whose tensors differ is found before any value moves.
  std::vector<std::int64_t> bytes;
  for (const Tensor& t : tensors) bytes.push_back(t.numel() * static_cast<std::int64_t>(itemsize(t.dtype())));
  const auto verdicts = std::make_shared<std::vector<std::int64_t>>(static_cast<std::size_t>(size_), 0);
  thread_->run(fn, [tensors, bytes, root, verdicts](detail::Communicator& c) {
    std::int64_t count = static_cast<std::int64_t>(bytes.size());
    c.broadcast(&count, 1, detail::Elem::i64, root);
    std::vector<std::int64_t> roots(static_cast<std::size_t>(count));
    if (c.rank() == root) roots = bytes;
    c.broadcast(roots.data(), count, detail::Elem::i64, root);
    const std::int64_t differs = roots != bytes ? 1 : 0;
    c.all_gather(&differs, verdicts->data(), std::vector<std::int64_t>(verdicts->size(), 1), detail::Elem::i64);
    for (const std::int64_t v : *verdicts)
      if (v != 0) return;  // every rank sees the verdicts: none sends
    for (const Tensor& t : tensors) c.broadcast(const_cast<void*>(t.raw_data()), t.numel() * static_cast<std::int64_t>(itemsize(t.dtype())), detail::Elem::u8, root);
  });
  for (int r = 0; r < size_; ++r)
    if ((*verdicts)[static_cast<std::size_t>(r)] != 0)
      fail<DistributedError>("rank {} of {}: {}: argument 'tensors' must have the same sizes on every process; rank {}'s differ from rank {}'s", rank_,
                       size_, fn, r, root);
}

void ProcessGroup::abort(std::string_view message, int code) noexcept {
  // DistributedErrors name the rank already.
  const std::string prefix = fmt::format("rank {} of {}: ", rank_, size_);
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  std::fprintf(stderr, "%s%.*s\n", prefix.c_str(), static_cast<int>(message.size()), message.data());
  std::fflush(nullptr);
  communicator_->abort(code);
  std::_Exit(code);  // not reached: abort() does not return
}

}  // namespace tapegrad
