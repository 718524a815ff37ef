// Data-parallel training (see data_parallel.hpp; the tree is distributed/sum_tree.hpp).
#include "tapegrad/distributed/data_parallel.hpp"

#include <chrono>
#include <cmath>
#include <cstring>
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
using detail::TreeNode;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finaliser
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

struct Param {
  std::string name;
  Tensor tensor;
  std::size_t bucket = 0, position = 0;
  std::int64_t offset = 0;
  int owner = 0;
};

struct DataParallel::Impl {
  std::vector<Param> params;
  std::vector<std::shared_ptr<Bucket>> buckets;
  std::unordered_map<const void*, std::size_t> index;  // a parameter's TensorImpl -> params index
  std::vector<std::vector<TreeNode>> covers;           // each rank's partial sums
  std::int64_t done = 0;                               // micro-batches of this step so far
  std::size_t next_launch = 0;
  bool failed = false;
};

namespace {

// The parameters' names, dtypes and shapes and the options, one line each: what every process
// must agree on.
std::string describe(const std::vector<Param>& params, const DataParallelOptions& o, int size) {
  std::string text = fmt::format("processes {}\nmicro_batches {}\nbucket_bytes {}\nreduction {}\nshard_optimizer_state {}\n", size,
                                 o.micro_batches, o.bucket_bytes, o.reduction == GradientReduction::exact ? "exact" : "fast", o.shard_optimizer_state);
  for (auto p = params.rbegin(); p != params.rend(); ++p)  // in the module's order
    text += fmt::format("parameter {} {} [{}]\n", p->name, p->tensor.dtype(), fmt::join(p->tensor.shape(), ", "));
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

}  // namespace

DataParallel::DataParallel(ProcessGroup& group, Module& model, const DataParallelOptions& options)
    : group_(group), options_(options), impl_(std::make_shared<Impl>()) {
  const char* fn = "DataParallel";
  const int size = group.size(), rank = group.rank();
  const std::int64_t m = options.micro_batches;
  if (m < 1) fail<ValueError>("{}: options.micro_batches must be >= 1, got {}", fn, m);
  if (m % size != 0)
    fail<ValueError>("{}: options.micro_batches = {} must be a multiple of the {} processes (each takes as many)", fn, m, size);
  if (options.bucket_bytes <= 0 || options.bucket_bytes > (std::int64_t{1} << 30))
    fail<ValueError>("{}: options.bucket_bytes must be in (0, 2^30], got {}", fn, options.bucket_bytes);
  first_ = m / size * rank;
  end_ = first_ + m / size;
  for (int r = 0; r < size; ++r) impl_->covers.push_back(detail::tree_cover(m, m / size * r, m / size * (r + 1)));

  // The parameters in the order the backward completes them (about the reverse of the
  // module's), bucketed by dtype and size.
  auto named = model.named_parameters();
  if (named.empty()) fail<ValueError>("{}: the model has no parameters", fn);
  std::int64_t total = 0;
  for (auto it = named.rbegin(); it != named.rend(); ++it) {
    const DType d = it->tensor.dtype();
    if (d != float32 && d != float64)
      fail<DTypeError>("{}: parameter '{}' is {}; data-parallel training reduces float32 and float64 gradients", fn, it->name, d);
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
  // Owners for sharded state: consecutive parameters, about total / size elements each.
  std::int64_t at = 0;
  for (Param& p : impl_->params) {
    p.owner = static_cast<int>(std::min<std::int64_t>(size - 1, at * size / std::max<std::int64_t>(total, 1)));
    at += p.tensor.numel();
  }
  // The exchange's shards: even cuts, or along the owners with sharded state.
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
  }

  // Every process must describe the same model and options; then rank 0's values go to all.
  const std::string mine = describe(impl_->params, options, size);
  std::string theirs;
  std::vector<std::int64_t> flags(static_cast<std::size_t>(size), 0);
  group.comm().run("DataParallel: the check that every process has the same model and options", [&](Communicator& c) {
    std::int64_t length = static_cast<std::int64_t>(mine.size());
    c.broadcast(&length, 1, Elem::i64, 0);
    theirs.resize(static_cast<std::size_t>(length));
    if (rank == 0) theirs = mine;
    c.broadcast(theirs.data(), length, Elem::u8, 0);
    std::int64_t differs = theirs != mine ? 1 : 0;
    c.all_gather(&differs, flags.data(), std::vector<std::int64_t>(static_cast<std::size_t>(size), 1), Elem::i64);
  });
  std::vector<int> differing;
  for (int r = 0; r < size; ++r)
    if (flags[static_cast<std::size_t>(r)] != 0) differing.push_back(r);
  if (!differing.empty()) {
    if (theirs != mine) {
      std::string their_line;
      const std::string my_line = first_difference(mine, theirs, their_line);
      fail<DistributedError>("rank {} of {}: {}: this process's model or options differ from rank 0's: rank 0 has '{}', this process has '{}'",
                             rank, size, fn, their_line, my_line);
    }
    fail<DistributedError>("rank {} of {}: {}: the model or options of rank(s) {} differ from rank 0's (their messages say how)", rank, size,
                           fn, fmt::join(differing, ", "));
  }
  NoGradGuard no_grad;
  std::vector<Tensor> values;
  for (const Param& p : impl_->params) {
    values.push_back(empty(p.tensor.shape(), p.tensor.dtype()));
    copy_(values.back(), p.tensor);
  }
  group.broadcast(values, 0);
  if (rank != 0)
    for (std::size_t i = 0; i < values.size(); ++i) copy_(impl_->params[i].tensor, values[i]);
}

DataParallel::~DataParallel() = default;


void DataParallel::backward(const Tensor& loss) {
  const char* fn = "DataParallel::backward";
  Impl& s = *impl_;
  if (s.failed) fail<DistributedError>("rank {} of {}: {}: an earlier step failed part-way; this DataParallel cannot go on", group_.rank(), group_.size(), fn);
  detail::check_defined(fn, "loss", loss);
  if (loss.numel() != 1) fail<ShapeError>("{}: argument 'loss' must have one element, got shape [{}]", fn, fmt::join(loss.shape(), ", "));
  if (s.done == end_ - first_)
    fail<ValueError>("{}: this process has run all its {} micro-batches of the step; call synchronize() before the next step's", fn, end_ - first_);
  const std::int64_t k = first_ + s.done;
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
    b.sums.push(k, std::move(b.leaf), detail::add_into);
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
    if (b.filled[p.position] != 0) return;
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
    s.failed = true;
    throw;
  }
  for (Param& p : s.params) p.tensor.zero_grad();
  ++s.done;
}

void DataParallel::launch(std::size_t bucket) {
  const std::shared_ptr<Bucket> b = impl_->buckets[bucket];
  std::vector<std::pair<TreeNode, Tensor>> nodes = b->sums.nodes();
  b->launched = true;
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
    fail<ValueError>("{}: this process has run {} of its {} micro-batches of the step (backward once per micro-batch first)", fn, s.done,
                     end_ - first_);
  const auto started = std::chrono::steady_clock::now();
  try {
    for (std::size_t i = 0; i < s.buckets.size(); ++i)
      group_.comm().wait(s.buckets[i]->exchanged, fmt::format("{}: the exchange of bucket {} of step {}", fn, i, stats_.steps));
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
    b.ready = b.launched = false;
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
  ++stats_.steps;
}

double DataParallel::clip_grad_norm(double max_norm) {
  std::vector<Tensor> mine;  // in the module's order, as clip_grad_norm sums them
  for (auto it = impl_->params.rbegin(); it != impl_->params.rend(); ++it)
    if (!options_.shard_optimizer_state || it->owner == group_.rank()) mine.push_back(it->tensor);
  if (!options_.shard_optimizer_state) return tapegrad::clip_grad_norm(mine, max_norm);
  // clip_grad_norm's sum, over every process's parameters in the module's order.
  if (!(max_norm > 0) || !std::isfinite(max_norm))
    fail<ValueError>("DataParallel::clip_grad_norm: argument 'max_norm' must be finite and > 0, got {}", max_norm);
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

int DataParallel::owner(const std::string& name) const {
  for (const Param& p : impl_->params)
    if (p.name == name) return p.owner;
  fail<ValueError>("DataParallel::owner: the model has no parameter '{}'", name);
}

void DataParallel::share_parameters() {
  if (!options_.shard_optimizer_state) return;
  Impl& s = *impl_;
  const int size = group_.size(), rank = group_.rank();
  for (std::size_t bucket = 0; bucket < s.buckets.size(); ++bucket) {
    Bucket& b = *s.buckets[bucket];
    const std::size_t item = itemsize(b.dtype);
    Tensor flat = empty({b.numel}, b.dtype);
    char* base = static_cast<char*>(const_cast<void*>(flat.raw_data()));
    for (std::size_t i : b.params)
      if (const Param& p = s.params[i]; p.owner == rank) {
        const Tensor v = p.tensor.detach().contiguous();
        std::memcpy(base + p.offset * static_cast<std::int64_t>(item), v.raw_data(), static_cast<std::size_t>(v.numel()) * item);
      }
    std::vector<std::int64_t> lengths;
    for (int j = 0; j < size; ++j) lengths.push_back(b.shard[static_cast<std::size_t>(j) + 1] - b.shard[static_cast<std::size_t>(j)]);
    const std::int64_t own = b.shard[static_cast<std::size_t>(rank)];
    Tensor mine = empty({std::max<std::int64_t>(lengths[static_cast<std::size_t>(rank)], 1)}, b.dtype);
    std::memcpy(const_cast<void*>(mine.raw_data()), base + own * static_cast<std::int64_t>(item),
                static_cast<std::size_t>(lengths[static_cast<std::size_t>(rank)]) * item);
    group_.comm().run(fmt::format("DataParallel::share_parameters: bucket {} of step {}", bucket, stats_.steps),
                      [&](Communicator& c) { c.all_gather(mine.raw_data(), base, lengths, elem_of(b.dtype)); });
    NoGradGuard no_grad;
    for (std::size_t i : b.params)
      if (const Param& p = s.params[i]; p.owner != rank) copy_(p.tensor, reshape(narrow(flat, 0, p.offset, p.tensor.numel()), p.tensor.shape()));
  }
}

void key_generators(Module& model, std::uint64_t seed, std::int64_t index) {
  for (NamedGenerator& g : model.named_generators()) {
    std::uint64_t h = 0xcbf29ce484222325ULL;  // FNV-1a of the name
    for (const char ch : g.name) h = (h ^ static_cast<unsigned char>(ch)) * 0x100000001b3ULL;
    g.generator.get() = Generator(mix(mix(seed) ^ mix(h) ^ mix(static_cast<std::uint64_t>(index) + 0x632be59bd9b4e019ULL)));
  }
}

std::vector<double> all_gather(ProcessGroup& group, const std::vector<double>& values) {
  const auto size = static_cast<std::size_t>(group.size());
  std::vector<std::int64_t> counts(size);
  std::vector<double> out;
  group.comm().run("all_gather", [&](Communicator& c) {
    const std::int64_t n = static_cast<std::int64_t>(values.size());
    c.all_gather(&n, counts.data(), std::vector<std::int64_t>(size, 1), Elem::i64);
    for (std::size_t r = 0; r < size; ++r)
      if (counts[r] != n)
        fail<DistributedError>("rank {} of {}: all_gather: this process gives {} values, rank {} gives {}; every process must give as many",
                               c.rank(), c.size(), n, r, counts[r]);
    out.resize(values.size() * size);
    c.all_gather(values.data(), out.data(), counts, Elem::f64);
  });
  return out;
}

}  // namespace tapegrad
