// Data-parallel training (see data_parallel.hpp; the tree is distributed/sum_tree.hpp).
#include "tapegrad/distributed/data_parallel.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "autodiff/check.hpp"
#include "distributed/comm_thread.hpp"
#include "distributed/bucket.hpp"
#include "tapegrad/autodiff/tape.hpp"
#include "tapegrad/ops/inplace.hpp"
#include "tapegrad/ops/reduction.hpp"
#include "tapegrad/ops/view.hpp"

namespace tapegrad {
using detail::Communicator;
using detail::Elem;
using detail::Bucket;
using detail::elem_of;
using detail::fail;
using detail::seconds_since;
using detail::TreeNode;

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// A parameter that trains: where its gradient lies in its bucket, and which rank keeps its
// optimizer state when that is sharded.
struct Param {
  std::string name;
  Tensor tensor;
  std::size_t bucket = 0, position = 0;
  std::int64_t offset = 0;
  int owner = 0;
};

}  // namespace

struct DataParallel::Impl {
  std::vector<Param> params;
  std::vector<std::shared_ptr<Bucket>> buckets;
  std::unordered_map<const void*, std::size_t> index;  // a parameter's TensorImpl -> params index
  std::vector<std::vector<TreeNode>> covers;           // each rank's partial sums
  std::int64_t done = 0;                               // micro-batches of this step so far
  std::size_t next_launch = 0;
  bool synchronized = false;                           // since the last backward
  bool shared = true;                                  // sharded: share_parameters() since synchronize()
  bool failed = false;
};

namespace {

// The parameters' names, dtypes, shapes and whether they train, and the options as given, one
// line each: what every process must agree on.
std::string describe(const std::vector<NamedTensor>& named, const DataParallelOptions& o, int size) {
  std::string text = fmt::format("processes {}\nmicro_batches {}\nbucket_bytes {}\nreduction {}\nshard_optimizer_state {}\n", size,
                                 o.micro_batches, o.bucket_bytes, o.reduction == GradientReduction::exact ? "exact" : "fast", o.shard_optimizer_state);
  for (const NamedTensor& p : named)
    text += fmt::format("parameter {} {} [{}]{}\n", p.name, p.tensor.dtype(), fmt::join(p.tensor.shape(), ", "),
                        p.tensor.requires_grad() ? "" : " frozen");
  return text;
}

std::string first_difference(const std::string& mine, const std::string& theirs, std::string& their_line) {
  std::size_t a = 0, b = 0;
  while (a < mine.size() || b < theirs.size()) {
    const std::size_t ea = std::min(mine.find('\n', a), mine.size()), eb = std::min(theirs.find('\n', b), theirs.size());
    std::string la = mine.substr(a, ea - a), lb = theirs.substr(b, eb - b);
    if (la != lb) {
      their_line = lb.empty() ? "nothing more" : lb;
      return la.empty() ? "nothing more" : la;
    }
    a = ea + 1;
    b = eb + 1;
  }
  return {};
}

// Every process's `mine` must be rank 0's; otherwise each throws, the differing ones saying how.
void agree(ProcessGroup& group, const std::string& mine, const char* fn) {
  struct Shared {
    std::string theirs;
    std::vector<std::int64_t> flags;
  };
  const auto shared = std::make_shared<Shared>();
  shared->flags.assign(static_cast<std::size_t>(group.size()), 0);
  group.comm().run(fmt::format("{}: the check that every process has the same model and options", fn), [shared, mine](Communicator& c) {
    std::int64_t length = static_cast<std::int64_t>(mine.size());
    c.broadcast(&length, 1, Elem::i64, 0);
    shared->theirs = c.rank() == 0 ? mine : std::string(static_cast<std::size_t>(length), '\0');
    c.broadcast(shared->theirs.data(), length, Elem::u8, 0);
    std::int64_t differs = shared->theirs != mine ? 1 : 0;
    c.all_gather(&differs, shared->flags.data(), std::vector<std::int64_t>(shared->flags.size(), 1), Elem::i64);
  });
  std::vector<int> differing;
  for (int r = 0; r < group.size(); ++r)
    if (shared->flags[static_cast<std::size_t>(r)] != 0) differing.push_back(r);
  if (differing.empty()) return;
  if (shared->theirs != mine) {
    std::string their_line;
    const std::string my_line = first_difference(mine, shared->theirs, their_line);
    fail<DistributedError>("rank {} of {}: {}: this process's model or options differ from rank 0's: rank 0 has '{}', this process has '{}'",
                           group.rank(), group.size(), fn, their_line, my_line);
  }
  fail<DistributedError>("rank {} of {}: {}: the model or options of rank(s) {} differ from rank 0's (their messages say how)", group.rank(),
                         group.size(), fn, fmt::join(differing, ", "));
}

}  // namespace

DataParallel::DataParallel(ProcessGroup& group, Module& model, const DataParallelOptions& options)
    : group_(group), options_(options), impl_(std::make_shared<Impl>()) {
  const char* fn = "DataParallel";
  const int size = group.size(), rank = group.rank();
  const std::int64_t m = options.micro_batches;
  // Agreement first: then an option or a model that one process refuses, every process refuses.
  const std::vector<NamedTensor> named = model.named_parameters();
  agree(group, describe(named, options, size), fn);
  if (m < 1) fail<ValueError>("{}: options.micro_batches must be >= 1, got {}", fn, m);
  if (m % size != 0)
    fail<ValueError>("{}: options.micro_batches = {} must be a multiple of the {} processes (each takes as many)", fn, m, size);
  if (options.bucket_bytes <= 0 || options.bucket_bytes > (std::int64_t{1} << 30))
    fail<ValueError>("{}: options.bucket_bytes must be in (0, 2^30], got {}", fn, options.bucket_bytes);
  if (named.empty()) fail<ValueError>("{}: the model has no parameters", fn);
  first_ = m / size * rank;
  end_ = first_ + m / size;
  for (int r = 0; r < size; ++r) impl_->covers.push_back(detail::tree_cover(m, m / size * r, m / size * (r + 1)));

  // The parameters that train, in the order the backward completes them (about the reverse of
  // the module's), bucketed by dtype and size. Frozen ones are only given rank 0's values.
  std::int64_t total = 0;
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    const DType d = it->tensor.dtype();
    if (d != float32 && d != float64)
      fail<DTypeError>("{}: parameter '{}' is {}; data-parallel training reduces float32 and float64 gradients", fn, it->name, d);
    if (!it->tensor.requires_grad()) continue;
    Param p{it->name, it->tensor};
    const std::int64_t bytes = p.tensor.numel() * static_cast<std::int64_t>(itemsize(d));
    if (impl_->buckets.empty() || impl_->buckets.back()->dtype != d ||
        (impl_->buckets.back()->numel > 0 && (impl_->buckets.back()->numel * static_cast<std::int64_t>(itemsize(d)) + bytes > options.bucket_bytes))) {
      impl_->buckets.push_back(std::make_shared<Bucket>());
      impl_->buckets.back()->dtype = d;
      impl_->buckets.back()->sums = detail::TreeStack<Tensor>(m);
    }
    Bucket& b = *impl_->buckets.back();
    p.bucket = impl_->buckets.size() - 1;
    p.position = b.params.size();
    p.offset = b.numel;
    b.params.push_back(impl_->params.size());
    b.numel += p.tensor.numel();
    total += p.tensor.numel();
    impl_->index[p.tensor.impl()] = impl_->params.size();
    impl_->params.push_back(std::move(p));
  }
  // Owners for sharded state: consecutive parameters, about total / size elements each (a
  // parameter goes to the rank its middle element falls on).
  std::int64_t at = 0;
  for (Param& p : impl_->params) {
    const std::int64_t middle = at + p.tensor.numel() / 2;
    p.owner = static_cast<int>(std::min<std::int64_t>(size - 1, middle * size / std::max<std::int64_t>(total, 1)));
    at += p.tensor.numel();
  }
  // The exchange's shards: even cuts, or along the owners with sharded state.
  std::size_t most_nodes = 0, all_nodes = 0;
  for (const auto& cover : impl_->covers) {
    most_nodes = std::max(most_nodes, cover.size());
    all_nodes += cover.size();
  }
  for (auto& bp : impl_->buckets) {
    Bucket& b = *bp;
    b.shard.assign(static_cast<std::size_t>(size) + 1, b.numel);
    for (int j = 0; j < size; ++j) {
      if (!options.shard_optimizer_state) {
        b.shard[static_cast<std::size_t>(j)] = b.numel * j / size;
        continue;
      }
      for (std::size_t i : b.params)
        if (impl_->params[i].owner >= j) {
          b.shard[static_cast<std::size_t>(j)] = impl_->params[i].offset;
          break;
        }
    }
    b.filled.assign(b.params.size(), 0);
    // MPI counts are ints: every process must find its messages countable, or none may start.
    std::int64_t widest = 0;
    for (int j = 0; j < size; ++j) widest = std::max(widest, b.shard[static_cast<std::size_t>(j) + 1] - b.shard[static_cast<std::size_t>(j)]);
    const std::int64_t largest = std::max(b.numel * static_cast<std::int64_t>(most_nodes), widest * static_cast<std::int64_t>(all_nodes));
    if (largest > std::numeric_limits<int>::max())
      fail<ValueError>("{}: the bucket of parameter '{}' would send {} elements in one MPI message, more than MPI counts ({}); a parameter "
                       "that large needs fewer micro-batches per process",
                       fn, impl_->params[b.params.front()].name, largest, std::numeric_limits<int>::max());
  }

  // Rank 0's values to every process, frozen parameters included.
  NoGradGuard no_grad;
  std::vector<Tensor> values;
  for (const NamedTensor& p : named) {
    values.push_back(empty(p.tensor.shape(), p.tensor.dtype()));
    copy_(values.back(), p.tensor);
  }
  group.broadcast(values, 0);
  if (rank != 0)
    for (std::size_t i = 0; i < values.size(); ++i) copy_(named[i].tensor, values[i]);
}

DataParallel::~DataParallel() = default;


void DataParallel::backward(const Tensor& loss) {
  const char* fn = "DataParallel::backward";
  Impl& s = *impl_;
  if (s.failed) fail<DistributedError>("rank {} of {}: {}: an earlier step failed part-way; this DataParallel cannot go on", group_.rank(), group_.size(), fn);
  detail::check_defined(fn, "loss", loss);
  if (loss.numel() != 1) fail<ShapeError>("{}: argument 'loss' must have one element, got shape [{}]", fn, fmt::join(loss.shape(), ", "));
  if (!loss.requires_grad())
    fail<GraphError>("{}: argument 'loss' does not require grad (computed under NoGradGuard, or from no parameter that trains)", fn);
  if (s.done == end_ - first_)
    fail<ValueError>("{}: this process has run all its {} micro-batches of the step; call synchronize() before the next step's", fn, end_ - first_);
  if (!s.shared)
    fail<ValueError>("{}: with sharded optimizer state, call share_parameters() after the optimizer's step, before the next step (the other "
                     "processes' parameters are not here yet)",
                     fn);
  const std::int64_t k = first_ + s.done;
  s.synchronized = false;
  bool completed_any = false;  // a bucket joined the sums: a failure after it cannot be undone
  for (auto& bp : s.buckets) {
    Bucket& b = *bp;
    if (b.spare.empty()) {
      b.leaf = empty({b.numel}, b.dtype);
    } else {
      b.leaf = std::move(b.spare.back());
      b.spare.pop_back();
    }
    std::fill(b.filled.begin(), b.filled.end(), 0);
    b.pending = b.params.size();
  }
  // A bucket complete for this micro-batch joins the partial sums; in the last micro-batch, the
  // buckets then go to the communication thread, in bucket order.
  auto complete = [&](std::size_t bucket) {
    Bucket& b = *s.buckets[bucket];
    completed_any = true;
    b.sums.push(k, std::move(b.leaf), [](Tensor& left, const Tensor& right) { add_(left, right); });  // a + b, on every thread
    b.leaf = Tensor();
    if (k + 1 < end_) return;
    b.ready = true;
    while (s.next_launch < s.buckets.size() && s.buckets[s.next_launch]->ready) launch(s.next_launch++);
  };
  BackwardOptions options;
  options.on_gradient_ready = [&](const Tensor& leaf, const Tensor& gradient) {
    const auto it = s.index.find(leaf.impl());
    if (it == s.index.end()) return;  // a leaf that is not one of the model's parameters
    const Param& p = s.params[it->second];
    Bucket& b = *s.buckets[p.bucket];
    const Tensor g = gradient.is_contiguous() ? gradient : gradient.contiguous();
    const std::size_t item = itemsize(b.dtype);
    std::memcpy(static_cast<char*>(const_cast<void*>(b.leaf.raw_data())) + p.offset * static_cast<std::int64_t>(item), g.raw_data(),
                static_cast<std::size_t>(g.numel()) * item);
    b.filled[p.position] = 1;
    if (--b.pending == 0) complete(p.bucket);
  };
  for (Param& p : s.params) p.tensor.zero_grad();  // the sums hold the gradients, not .grad
  try {
    tapegrad::backward({loss}, {ones_like(loss)}, options);
    // Parameters this micro-batch did not reach: a zero gradient, so that every bucket completes.
    for (std::size_t bucket = 0; bucket < s.buckets.size(); ++bucket) {
      Bucket& b = *s.buckets[bucket];
      if (b.pending == 0) continue;
      for (std::size_t i = 0; i < b.params.size(); ++i) {
        if (b.filled[i] != 0) continue;
        const Param& p = s.params[b.params[i]];
        std::memset(static_cast<char*>(const_cast<void*>(b.leaf.raw_data())) + p.offset * static_cast<std::int64_t>(itemsize(b.dtype)), 0,
                    static_cast<std::size_t>(p.tensor.numel()) * itemsize(b.dtype));
      }
      b.pending = 0;
      complete(bucket);
    }
  } catch (...) {
    if (completed_any) {
      s.failed = true;
    } else {  // nothing joined the sums: the micro-batch can be run again
      for (auto& bp : s.buckets)
        if (bp->leaf.defined()) bp->spare.push_back(std::move(bp->leaf));
    }
    throw;
  }
  for (Param& p : s.params) p.tensor.zero_grad();
  ++s.done;
}

void DataParallel::launch(std::size_t bucket) {
  const std::shared_ptr<Bucket> b = impl_->buckets[bucket];
  std::vector<std::pair<TreeNode, Tensor>> nodes = b->sums.nodes();
  b->exchanged = group_.comm().submit([b, nodes = std::move(nodes), covers = impl_->covers, m = options_.micro_batches,
                                       reduction = options_.reduction, sharded = options_.shard_optimizer_state](Communicator& c) {
    detail::exchange(c, *b, nodes, covers, m, reduction, sharded);
  });
}

void DataParallel::synchronize() {
  const char* fn = "DataParallel::synchronize";
  Impl& s = *impl_;
  if (s.failed) fail<DistributedError>("rank {} of {}: {}: an earlier step failed part-way; this DataParallel cannot go on", group_.rank(), group_.size(), fn);
  if (s.done != end_ - first_)
    fail<ValueError>("{}: this process has run {} of its {} micro-batches of the step (dp.backward(loss) once per micro-batch first; "
                     "a plain backward() does not reach DataParallel)",
                     fn, s.done, end_ - first_);
  const auto started = std::chrono::steady_clock::now();
  try {
    for (std::size_t i = 0; i < s.buckets.size(); ++i)
      group_.comm().wait(s.buckets[i]->exchanged, fmt::format("{}: the exchange of bucket {} in step {} of this DataParallel", fn, i, stats_.steps));
  } catch (...) {
    s.failed = true;
    throw;
  }
  stats_.waiting_seconds += seconds_since(started);
  for (auto& bp : s.buckets) {
    Bucket& b = *bp;
    stats_.exchange_seconds += b.seconds;
    stats_.bytes_sent += b.bytes;
    for (auto& [node, value] : b.sums.nodes()) b.spare.push_back(std::move(value));
    b.sums.clear();
    b.ready = false;
  }
  const bool sharded = options_.shard_optimizer_state;
  for (Param& p : s.params) {
    if (sharded && p.owner != group_.rank()) {
      p.tensor.zero_grad();
      continue;
    }
    const Bucket& b = *s.buckets[p.bucket];
    p.tensor.set_grad(reshape(narrow(b.result, 0, p.offset, p.tensor.numel()), p.tensor.shape()));
  }
  s.done = 0;
  s.next_launch = 0;
  s.synchronized = true;
  s.shared = !sharded;
  ++stats_.steps;
}

double DataParallel::clip_grad_norm(double max_norm) {
  const char* fn = "DataParallel::clip_grad_norm";
  if (!impl_->synchronized) fail<ValueError>("{}: the step's gradients are not there yet; call synchronize() first", fn);
  if (!(max_norm > 0) || !std::isfinite(max_norm)) fail<ValueError>("{}: argument 'max_norm' must be finite and > 0, got {}", fn, max_norm);
  std::vector<Tensor> mine;  // in the module's order, as clip_grad_norm sums them
  for (auto it = impl_->params.rbegin(); it != impl_->params.rend(); ++it)
    if (!options_.shard_optimizer_state || it->owner == group_.rank()) mine.push_back(it->tensor);
  if (!options_.shard_optimizer_state) return tapegrad::clip_grad_norm(mine, max_norm);
  // clip_grad_norm's sum, over every process's parameters in the module's order.
  NoGradGuard no_grad;
  const std::size_t n = impl_->params.size();
  std::vector<double> squares(n, 0.0);
  for (std::size_t i = 0; i < n; ++i)
    if (const Param& p = impl_->params[i]; p.owner == group_.rank())
      if (const Tensor g = p.tensor.grad(); g.defined()) squares[i] = sum_of_squares(g);
  const std::vector<double> everyone = all_gather(group_, squares);
  double total_squares = 0;
  for (std::size_t i = n; i-- > 0;)  // impl_->params is the module's order reversed
    total_squares += everyone[static_cast<std::size_t>(impl_->params[i].owner) * n + i];
  const double total = std::sqrt(total_squares);
  const double factor = max_norm / (total + 1e-6);
  if (std::isfinite(total) && factor < 1)
    for (const Tensor& p : mine)
      if (const Tensor g = p.grad(); g.defined()) mul_(g, factor);
  return total;
}

std::vector<NamedTensor> DataParallel::optimizer_parameters() const {
  std::vector<NamedTensor> out;
  for (auto it = impl_->params.rbegin(); it != impl_->params.rend(); ++it)
    if (!options_.shard_optimizer_state || it->owner == group_.rank()) out.push_back({it->name, it->tensor});
  return out;
}

bool DataParallel::parameters_shared() const noexcept { return impl_->shared; }

int DataParallel::owner(const std::string& name) const {
  for (const Param& p : impl_->params)
    if (p.name == name) return p.owner;
  fail<ValueError>("DataParallel::owner: the model has no parameter '{}'", name);
}

void DataParallel::share_parameters() {
  if (!options_.shard_optimizer_state) return;
  if (!impl_->synchronized)
    fail<ValueError>("DataParallel::share_parameters: no step to share; call it after synchronize() and the optimizer's step()");
  Impl& s = *impl_;
  s.shared = true;
  const int size = group_.size(), rank = group_.rank();
  for (std::size_t bucket = 0; bucket < s.buckets.size(); ++bucket) {
    Bucket& b = *s.buckets[bucket];
    const auto item = static_cast<std::int64_t>(itemsize(b.dtype));
    std::vector<std::int64_t> lengths;
    for (int j = 0; j < size; ++j) lengths.push_back(b.shard[static_cast<std::size_t>(j) + 1] - b.shard[static_cast<std::size_t>(j)]);
    // This process's parameters in place in the bucket's layout, then everyone's gathered there.
    const Tensor flat = empty({b.numel}, b.dtype);
    char* base = static_cast<char*>(const_cast<void*>(flat.raw_data()));
    for (std::size_t i : b.params)
      if (const Param& p = s.params[i]; p.owner == rank) {
        const Tensor v = p.tensor.detach().contiguous();
        std::memcpy(base + p.offset * item, v.raw_data(), static_cast<std::size_t>(v.numel() * item));
      }
    group_.comm().run(fmt::format("DataParallel::share_parameters: bucket {} in step {} of this DataParallel", bucket, stats_.steps),
                      [flat, lengths, e = elem_of(b.dtype)](Communicator& c) { c.all_gather(nullptr, const_cast<void*>(flat.raw_data()), lengths, e); });
    NoGradGuard no_grad;
    for (std::size_t i : b.params)
      if (const Param& p = s.params[i]; p.owner != rank) copy_(p.tensor, reshape(narrow(flat, 0, p.offset, p.tensor.numel()), p.tensor.shape()));
  }
}

void key_generators(Module& model, std::uint64_t seed, std::int64_t index) {
  for (NamedGenerator& g : model.named_generators()) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name
    for (const char ch : g.name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ULL;
    g.generator.get() = Generator(mix(mix(mix(seed) ^ h) ^ static_cast<std::uint64_t>(index)));  // chained: no two keys cancel
  }
}

std::vector<double> all_gather(ProcessGroup& group, const std::vector<double>& values) {
  struct Shared {
    std::vector<std::int64_t> counts;
    std::vector<double> out;
    std::int64_t differs = -1;  // a rank whose count is not this one's
  };
  const auto shared = std::make_shared<Shared>();
  shared->counts.assign(static_cast<std::size_t>(group.size()), 0);
  group.comm().run("all_gather", [shared, values](Communicator& c) {
    const auto size = static_cast<std::size_t>(c.size());
    const auto n = static_cast<std::int64_t>(values.size());
    c.all_gather(&n, shared->counts.data(), std::vector<std::int64_t>(size, 1), Elem::i64);
    for (std::size_t r = 0; r < size; ++r)
      if (shared->counts[r] != shared->counts[0]) shared->differs = static_cast<std::int64_t>(r);
    if (shared->differs >= 0) return;  // every rank sees the same counts, so every rank stops here
    shared->out.resize(values.size() * size);
    c.all_gather(values.data(), shared->out.data(), shared->counts, Elem::f64);
  });
  if (shared->differs >= 0)
    fail<ValueError>("rank {} of {}: all_gather: argument 'values' must have as many values on every process; rank 0 gives {}, rank {} "
                     "gives {}",
                     group.rank(), group.size(), shared->counts[0], shared->differs, shared->counts[static_cast<std::size_t>(shared->differs)]);
  return shared->out;
}

}  // namespace tapegrad
