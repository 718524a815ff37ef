// A data-parallel run's training state: one file, written by rank 0, read by every rank, whatever
// the number of processes that wrote it (see data_parallel.hpp).
#include <deque>
#include <map>
#include <set>

#include <fmt/format.h>

#include "autodiff/check.hpp"
#include "distributed/comm_thread.hpp"
#include "tapegrad/distributed/data_parallel.hpp"
#include "tapegrad/ops/inplace.hpp"

namespace tapegrad {
using detail::fail;

namespace {

// The whole model's optimizer state in one place, for the file: slots of the real optimizer's
// kind, over every parameter. It never steps.
class GatheredState final : public Optimizer {
 public:
  GatheredState(std::vector<NamedTensor> params, double lr, const std::vector<std::pair<std::string, bool>>& slots)
      : Optimizer("DataParallel's gathered optimizer state", std::move(params), lr) {
    for (const auto& [slot, counter] : slots) add_slot(names_.emplace_back(slot).c_str(), counter);
  }
  void step() override { fail<ValueError>("DataParallel's gathered optimizer state is for checkpoints; it does not step"); }

 private:
  std::deque<std::string> names_;  // add_slot keeps the pointer
};

// The optimizer's slots ("exp_avg", "step", ...; counter: a per-parameter int64 count).
// The parameters an optimizer can hold: those that train (DataParallel gives frozen ones no state).
std::vector<NamedTensor> trained_parameters(Module& model) {
  std::vector<NamedTensor> out;
  for (NamedTensor& p : model.named_parameters())
    if (p.tensor.requires_grad()) out.push_back(std::move(p));
  return out;
}

std::vector<std::pair<std::string, bool>> optimizer_slots(DataParallel& dp, Module& model, const Optimizer& opt, const char* fn) {
  // Every rank's optimizer must update exactly its own parameters, or the slots would not line up.
  std::vector<std::string> expected, given;
  for (const NamedTensor& p : dp.optimizer_parameters()) expected.push_back(p.name);
  for (const NamedTensor& p : opt.parameters()) given.push_back(p.name);
  const std::vector<double> verdicts = all_gather(dp.group(), {expected == given ? 0.0 : 1.0});
  for (std::size_t r = 0; r < verdicts.size(); ++r)
    if (verdicts[r] != 0)
      fail<ValueError>("rank {} of {}: {}: argument 'state.optimizer' must update the parameters of dp.optimizer_parameters(), in that order; "
                       "rank {}'s does not",
                       dp.group().rank(), dp.group().size(), fn, r);
  // The slots as the optimizer of a rank that updates a parameter has them (the owner of the
  // first one), given to every rank.
  const std::vector<NamedTensor> trained = trained_parameters(model);
  if (trained.empty()) return {};
  const int root = dp.owner(trained.front().name);
  auto text = std::make_shared<std::string>();
  if (dp.group().rank() == root) {
    const std::string suffix = "." + opt.parameters().front().name;
    for (const NamedTensor& t : opt.state())
      if (t.name.size() > suffix.size() && t.name.ends_with(suffix))
        *text += fmt::format("{}{}\n", t.tensor.dtype() == int64 ? '#' : '=', t.name.substr(0, t.name.size() - suffix.size()));
  }
  dp.group().comm().run(fmt::format("{}: the optimizer's slots", fn), [text, root](detail::Communicator& c) {
    std::int64_t length = static_cast<std::int64_t>(text->size());
    c.broadcast(&length, 1, detail::Elem::i64, root);
    text->resize(static_cast<std::size_t>(length));
    c.broadcast(text->data(), length, detail::Elem::u8, root);
  });
  std::vector<std::pair<std::string, bool>> slots;
  for (std::size_t at = 0; at < text->size();) {
    const std::size_t end = text->find('\n', at);
    slots.emplace_back(text->substr(at + 1, end - at - 1), (*text)[at] == '#');
    at = end + 1;
  }
  return slots;
}

}  // namespace

void save_training_state(const std::filesystem::path& path, const TrainingState& state, DataParallel& dp) {
  ProcessGroup& group = dp.group();
  if (!dp.parameters_shared())
    fail<ValueError>("save_training_state: with sharded optimizer state, call dp.share_parameters() after the optimizer's step, before "
                     "saving (rank 0 does not have the other processes' parameters yet)");
  if (!dp.sharded()) {
    if (group.rank() == 0) save_training_state(path, state);
    group.barrier();
    return;
  }
  // Each parameter's slots are broadcast by the rank that updates it, one tensor at a time, and
  // rank 0 keeps them.
  const auto slots = optimizer_slots(dp, state.model, state.optimizer, "save_training_state");
  const std::vector<NamedTensor> params = trained_parameters(state.model);
  std::map<std::string, Tensor> mine, received;
  for (const NamedTensor& t : state.optimizer.state()) mine.emplace(t.name, t.tensor);
  for (const NamedTensor& p : params) {
    const int owner = dp.owner(p.name);
    for (const auto& [slot, counter] : slots) {
      const std::string name = slot + "." + p.name;
      Tensor buffer = owner == group.rank() ? mine.at(name).contiguous() : (counter ? zeros({}, int64) : zeros(p.tensor.shape(), p.tensor.dtype()));
      if (owner != 0) group.broadcast({buffer}, owner);
      if (group.rank() == 0) received.emplace(name, buffer);
    }
  }
  if (group.rank() == 0) {
    GatheredState gathered(params, state.optimizer.learning_rate(), slots);
    std::vector<NamedTensor> ordered;
    for (const NamedTensor& t : gathered.state()) ordered.push_back({t.name, received.at(t.name)});
    gathered.load_state(ordered, state.optimizer.steps());
    save_training_state(path, TrainingState{state.model, gathered, state.generators, state.step, state.metadata});
  }
  group.barrier();
}

void load_training_state(const std::filesystem::path& path, TrainingState& state, DataParallel& dp) {
  if (!dp.sharded()) {
    load_training_state(path, state);
    return;
  }
  // The whole state into a gathered optimizer, checked as load_training_state checks it; then
  // this rank's parameters' slots into its own.
  const auto slots = optimizer_slots(dp, state.model, state.optimizer, "load_training_state");
  GatheredState gathered(trained_parameters(state.model), state.optimizer.learning_rate(), slots);
  TrainingState whole{state.model, gathered, state.generators, state.step, state.metadata};
  load_training_state(path, whole);
  std::set<std::string> wanted;
  for (const auto& [slot, counter] : slots)
    for (const NamedTensor& p : state.optimizer.parameters()) wanted.insert(slot + "." + p.name);
  std::vector<NamedTensor> own;
  for (const NamedTensor& t : gathered.state())
    if (wanted.contains(t.name)) own.push_back(t);
  state.optimizer.load_state(own, gathered.steps());
  state.optimizer.set_learning_rate(gathered.learning_rate());
  state.step = whole.step;
  state.metadata = whole.metadata;
}

}  // namespace tapegrad
