// libFuzzer target for the tape: bytes become a small program of built-in ops, user ops made
// with record_op (whose backward records under EnableGradGuard, runs a nested backward or
// gradcheck, calls clear_tape(), throws, or returns gradients of the wrong count, shape or
// dtype), two-output user ops that receive undefined upstream gradients, nested grad-mode
// guards, dropped and detached graphs; then one or two backward passes.
//
// Each program runs twice on the same bytes. The second run ("disturbed") also writes in place
// (add_, copy_, fill_, mul_, data<T>()) into tensors of the recorded graph between the forward
// and backward, and records some steps on another thread. Its backward must then either fail
// with a GraphError that names the op whose saved tensor changed, or give bit for bit the
// gradients of the first run: an op that read a modified tensor without noticing would differ.
//
// Checked besides: the outcome of every step is the same in both runs; a backward that throws
// leaves every leaf gradient as it was; ops record exactly when grad mode is on and an input
// requires grad; a backward runs with grad mode off and sees `needs_grad` as recorded; an
// output that nothing read gets an undefined upstream gradient; leaf gradients are contiguous
// and carry no graph; once every tensor of a run is dropped, no node is left (the graph belongs
// to the tensors), before clear_tape() is called.
#include <exception>
#include <memory>
#include <thread>

#include "fuzz_support.hpp"

namespace {
using namespace fuzz;

// What a user op's backward does besides computing its gradient.
enum class Behaviour {
  plain,
  enable_grad,         // computes its gradient with grad mode on (ops recorded during the pass)
  nested_backward,     // runs backward on a graph of its own and checks that gradient
  nested_through,      // runs backward from its own first input, through the graph being walked
  gradcheck,           // gradchecks a small function
  clear_tape_caught,   // clear_tape() must throw a GraphError, which it catches
  clear_tape_thrown,   // ... which it lets through
  throws,              // throws a ValueError
  wrong_count,         // one gradient for two inputs
  wrong_shape,
  wrong_dtype,
  none,                // undefined gradients: nothing flows back
  last = none
};

// The behaviours whose gradients are right (gradcheck of the op must pass).
bool correct(Behaviour b) { return b <= Behaviour::clear_tape_caught && b != Behaviour::nested_through; }

struct Slot {
  Tensor t;
  std::shared_ptr<bool> read = std::make_shared<bool>(false);  // by a later op or as a backward root
};

struct World {
  bool disturbed;
  std::vector<Slot> pool;
  std::vector<Tensor> leaves;
  bool bumped = false;          // an in-place write changed the version of some storage
  bool nested_through = false;  // a backward ran a nested pass through its own graph
  std::vector<std::string> trace;  // the outcome of every step, compared between the runs
};

void check_backward_entry(const std::vector<bool>& needs, const std::vector<bool>& expected) {
  require(!tg::is_grad_enabled(), "a backward runs with grad mode on");
  require(needs == expected, "needs_grad {} differs from the inputs' requires_grad at recording {}", needs, expected);
}

// What `how` does before the gradient is computed.
void side_effect(Behaviour how, World& w, const Tensor& first_input) {
  switch (how) {
    case Behaviour::nested_backward: {
      tg::EnableGradGuard on;
      Tensor z = tg::tensor({0.5, -1.25, 2.0}, tg::float64).set_requires_grad();
      tg::backward(tg::sum(z * z * 3.0));
      require(same_values(values(z.grad()), {3.0, -7.5, 12.0}), "nested backward gave {}", values(z.grad()));
      break;
    }
    case Behaviour::nested_through:
      if (first_input.requires_grad()) {
        w.nested_through = true;
        tg::backward({first_input}, {tg::ones_like(first_input)});
      }
      break;
    case Behaviour::gradcheck: {
      const Tensor x = tg::tensor({0.3, -0.7}, tg::float64).set_requires_grad();
      const auto r = tg::gradcheck([](const std::vector<Tensor>& in) { return std::vector<Tensor>{tg::tanh(in[0]) * in[0]}; }, {x});
      require(r.ok, "gradcheck inside a backward failed: {}", r.report());
      require(!tg::is_grad_enabled(), "gradcheck left grad mode on inside a backward");
      break;
    }
    case Behaviour::clear_tape_caught:
      expect_error<tg::GraphError>("clear_tape inside a backward", [] { tg::clear_tape(); });
      break;
    case Behaviour::clear_tape_thrown: tg::clear_tape(); fail("clear_tape() inside a backward returned");
    case Behaviour::throws: throw tg::ValueError("user_op: deliberately failing backward");
    default: break;
  }
}

// The gradient list a bad behaviour returns instead of `good`, or `good`.
std::vector<Tensor> result(Behaviour how, std::vector<Tensor> good, const Tensor& like) {
  switch (how) {
    case Behaviour::wrong_count: good.pop_back(); return good;
    case Behaviour::wrong_shape: good[0] = tg::zeros({like.numel() + 1}, like.dtype()); return good;
    case Behaviour::wrong_dtype: good[0] = tg::zeros(like.shape(), like.dtype() == tg::float64 ? tg::float32 : tg::float64); return good;
    case Behaviour::none: return std::vector<Tensor>(good.size());
    default: return good;
  }
}

// Within gradcheck's default tolerances: central differences of products of values near 100
// already lose 1e-6 to cancellation.
bool moderate(const Tensor& t) {
  for (double v : values(t))
    if (!(std::abs(v) <= 4.0)) return false;
  return true;
}

std::vector<bool> requiring(const std::vector<Tensor>& xs) {
  std::vector<bool> r;
  for (const auto& x : xs) r.push_back(x.requires_grad());
  return r;
}

// y = a * b, recorded by hand. `saved_all` records with the default saved list (every input and
// output) instead of {a, b}.
Tensor user_mul(World& w, const Tensor& a, const Tensor& b, Behaviour how, bool saved_all) {
  Tensor y;
  {
    tg::NoGradGuard off;
    y = tg::mul(a, b);
  }
  std::vector<Tensor> outs{y};
  const std::vector<Tensor> inputs{a, b};
  const bool records = tg::should_record(inputs);
  auto backward = [&w, a, b, how, expected = requiring(inputs)](std::span<const Tensor> g, const std::vector<bool>& needs) {
    check_backward_entry(needs, expected);
    require(g.size() == 1 && g[0].defined(), "a one-output op got {} upstream gradients", g.size());
    side_effect(how, w, a);
    tg::GradModeGuard mode(how == Behaviour::enable_grad);
    return result(how, {needs[0] ? g[0] * b : Tensor(), needs[1] ? g[0] * a : Tensor()}, a);
  };
  const bool recorded = saved_all ? tg::record_op("user_mul", inputs, outs, backward)
                                  : tg::record_op("user_mul", inputs, outs, backward, inputs);
  require(recorded == records && outs[0].requires_grad() == records, "record_op recorded {} where should_record said {}", recorded, records);
  return outs[0];
}

// Two outputs, y0 = 2a and y1 = a + b. Each backward checks that an output nothing read got no
// gradient.
std::pair<Slot, Slot> user_pair(World& w, const Tensor& a, const Tensor& b, Behaviour how) {
  std::vector<Tensor> outs(2);
  {
    tg::NoGradGuard off;
    outs = {a * 2.0, a + b};
  }
  Slot s0{outs[0]}, s1{outs[1]};
  const std::vector<Tensor> inputs{a, b};
  auto backward = [&w, a, how, r0 = s0.read, r1 = s1.read, expected = requiring(inputs)](std::span<const Tensor> g,
                                                                                         const std::vector<bool>& needs) {
    check_backward_entry(needs, expected);
    require(g.size() == 2 && (g[0].defined() || g[1].defined()), "a two-output op ran with no upstream gradient");
    require((*r0 || !g[0].defined()) && (*r1 || !g[1].defined()), "an output nothing read got an upstream gradient");
    side_effect(how, w, a);
    tg::GradModeGuard mode(how == Behaviour::enable_grad);
    Tensor da = g[0].defined() ? g[0] * 2.0 : Tensor();
    if (g[1].defined()) da = da.defined() ? da + g[1] : g[1];
    return result(how, {needs[0] ? da : Tensor(), needs[1] ? g[1] : Tensor()}, a);
  };
  tg::record_op("user_pair", inputs, outs, backward);
  s0.t = outs[0];
  s1.t = outs[1];
  return {s0, s1};
}

// Runs f under nested guards (true: EnableGradGuard, false: NoGradGuard, outermost first).
template <class F> void nested(const std::vector<bool>& guards, std::size_t i, F& f) {
  if (i == guards.size()) return f();
  tg::GradModeGuard g(guards[i]);
  nested(guards, i + 1, f);
}

struct Program {
  Input& in;
  World& w;
  Shape shape;
  tg::DType dtype;

  Slot& slot() { return w.pool[in.in<std::size_t>(0, w.pool.size() - 1)]; }
  Tensor use(Slot& s) {
    *s.read = true;
    return s.t;
  }

  // One built-in op on a and b. `fresh`: the result is always a new tensor (so it requires grad
  // exactly when the op recorded).
  Tensor builtin(int op, const Tensor& a, const Tensor& b, bool& fresh) {
    const auto rank = static_cast<std::int64_t>(shape.size());
    fresh = op <= 9;
    switch (op) {
      case 0: return a + b;
      case 1: return a - b;
      case 2: return a * b;
      case 3: return a / (b * b + 1.0);
      case 4: return tg::tanh(a);
      case 5: return tg::exp(a);  // saves its output
      case 6: return tg::pow(a, 3.0);
      case 7: return tg::relu(a);
      case 8: return tg::gelu(a);
      case 9: return tg::clone(a);
      case 10: return tg::reshape(tg::flatten(a), shape);
      case 11: return tg::expand(tg::sum(a, {}, /*keepdim=*/true), shape);
      case 12: return rank ? a - tg::max(a, {-1}, true) : a;
      case 13: return rank ? tg::slice(a, 0, 0, shape[0]) : a;
      case 14: return rank == 2 ? tg::transpose(a, 0, 1) : a;
      case 15: return rank == 2 ? tg::matmul(a, b) : a * b;
      case 16: return rank ? tg::narrow(tg::concat({a, b}, 0), 0, shape[0], shape[0]) : b;
      case 17: return tg::select(tg::stack({a, b}, 0), 0, 1);
      case 18: return rank ? tg::masked_softmax(a) : a;
      default: return tg::mean(a) + a;
    }
  }

  // One forward step; returns its outcome for the trace.
  void step() {
    const int pick = in.in(0, 13), kind = pick >= 10 ? pick - 7 : pick;  // ops (3-6) twice as often
    if (kind == 0) {  // drop a graph without running backward
      slot().t = Tensor();
      return;
    }
    if (kind == 1) {
      Slot& s = slot();
      if (s.t.defined()) s.t = s.t.detach();
      return;
    }
    if (kind == 2) {
      Slot& s = slot();
      const bool live = s.t.defined() && !s.t.is_leaf();
      if (live) expect_error<tg::GraphError>("set_requires_grad on a recorded output", [&] { s.t.set_requires_grad(); });
      else if (s.t.defined()) s.t.set_requires_grad(in.flag());
      return;
    }
    std::vector<bool> guards(in.in(0, 3));
    for (std::size_t i = 0; i < guards.size(); ++i) guards[i] = in.flag();
    Slot &sa = slot(), &sb = slot();
    const int op = in.in(0, 19);
    const auto how = static_cast<Behaviour>(in.in(0, static_cast<int>(Behaviour::last)));
    const bool saved_all = in.flag(), on_thread = in.flag() && in.flag() && w.disturbed;
    if (!sa.t.defined() || !sb.t.defined()) return;
    const Tensor a = use(sa), b = use(sb);
    if (narrating())
      narrate("step {} op {} behaviour {} guards {} thread {}\na = {}\nb = {}", kind, op, static_cast<int>(how), guards, on_thread,
              tg::to_string(a), tg::to_string(b));
    std::vector<Slot> made;
    auto body = [&] {
      const bool mode = tg::is_grad_enabled();
      auto inner = [&] {
        const bool on = guards.empty() ? mode : guards.back();
        require(tg::is_grad_enabled() == on, "grad mode {} under guards {}", tg::is_grad_enabled(), guards);
        // Ops 0-3 read a and b, 4-9 only a.
        const bool expect = on && (a.requires_grad() || (op <= 3 && b.requires_grad()));
        if (kind <= 5) {
          bool fresh = false;
          Tensor y = builtin(op, a, b, fresh);
          require(!fresh || y.requires_grad() == expect, "op {} gave requires_grad {}, expected {}", op, y.requires_grad(), expect);
          made.push_back({y});
        } else if (kind <= 7) {
          made.push_back({user_mul(w, a, b, how, saved_all)});
        } else if (kind == 8) {
          auto [y0, y1] = user_pair(w, a, b, how);
          made = {y0, y1};
        } else if (correct(how) && a.dtype() == tg::float64 && moderate(a) && moderate(b)) {  // the user op gradchecks
          const auto r = tg::gradcheck(
              [&](const std::vector<Tensor>& x) { return std::vector<Tensor>{user_mul(w, x[0], x[1], how, saved_all)}; },
              {a.detach().set_requires_grad(), b.detach()});
          require(r.ok, "gradcheck of user_mul ({}) failed: {}", static_cast<int>(how), r.report());
        }
      };
      nested(guards, 0, inner);
      require(tg::is_grad_enabled() == mode, "guards did not restore grad mode");
    };
    if (on_thread) {
      std::exception_ptr error;
      std::thread([&] {
        try {
          body();
        } catch (...) {
          error = std::current_exception();
        }
      }).join();
      if (error) std::rethrow_exception(error);
    } else {
      body();
    }
    for (auto& s : made) w.pool.push_back(s);
  }

  // In the disturbed run: an in-place update of some tensor of the graph. Consumes the same
  // bytes in both runs.
  void disturb() {
    const int kind = in.in(0, 6);
    Slot& s = slot();
    const Tensor& leaf = w.leaves[in.in<std::size_t>(0, w.leaves.size() - 1)];
    if (!w.disturbed) return;
    const Tensor& t = kind >= 4 ? s.t : leaf;
    narrate("in-place write {} into a {}", kind, t.defined() ? (t.is_leaf() ? "leaf" : "recorded output") : "dropped slot");
    if (!t.defined()) return;
    const std::uint64_t before = t.version();
    auto bumped = [&] {
      require(t.version() > before, "in-place write {} did not change the version", kind);
      w.bumped = true;
    };
    switch (kind) {
      case 0: tg::add_(t, tg::ones_like(t)); return bumped();
      case 1: tg::copy_(t, tg::zeros_like(t)); return bumped();
      case 2: {
        tg::NoGradGuard off;  // a view of the leaf that is not recorded: it shares the storage
        tg::fill_(t.dim() ? tg::slice(t, 0, 0, 1) : t, 7.0);
        return bumped();
      }
      case 3: tg::mul_(t, 1.0); return bumped();  // the same values, a new version all the same
      case 4:
        if (t.numel() == 0) return;
        if (t.dtype() == tg::float64) t.data<double>()[0] += 1.0;
        else t.data<float>()[0] += 1.0f;
        return bumped();
      case 5:
        if (t.dtype() == tg::float64) (void)t.data<const double>();
        else (void)t.data<const float>();
        require(t.version() == before, "data<const T>() changed the version");
        return;
      default:
        if (!t.is_leaf()) {
          expect_error<tg::GraphError>("add_ into a recorded output", [&] { tg::add_(t, tg::ones_like(t)); });
          require(t.version() == before, "a refused add_ changed the version");
          return;
        }
        tg::add_(t, t, -0.5);  // src overlaps dst exactly
        return bumped();
    }
  }

  struct Leaf {
    bool defined;
    std::vector<double> grad;
  };
  std::vector<Leaf> grads() const {
    std::vector<Leaf> r;
    for (const auto& l : w.leaves) {
      const Tensor g = l.grad();
      if (g.defined()) {
        require(g.is_contiguous(), "a leaf gradient is not contiguous");
        require(!g.requires_grad(), "a leaf gradient carries a graph (requires_grad), so it keeps nodes alive");
      }
      r.push_back({g.defined(), values(g)});
    }
    return r;
  }
  static std::string describe(const std::vector<Leaf>& gs) {
    std::string s;
    for (const auto& g : gs) s += g.defined ? fmt::format("{} ", g.grad) : std::string("undefined ");
    return s;
  }

  // Backward from some pool tensors; the outcome and the leaf gradients go to the trace.
  void backward() {
    std::vector<Tensor> roots, upstream;
    const int count = in.in(1, 3);
    for (int i = 0; i < count; ++i) {
      Slot* p = &slot();
      if (!p->t.defined() && in.in(0, 7) != 0)  // usually a tensor that is still there
        for (auto& other : w.pool)
          if (other.t.defined()) p = &other;
      Slot& s = *p;
      roots.push_back(use(s));
      const int g = in.in(0, 9);
      if (!s.t.defined() || g == 0) upstream.emplace_back();
      else upstream.push_back(g == 1 ? tg::zeros({s.t.numel() + 1}, s.t.dtype()) : in.tensor(s.t.shape(), s.t.dtype()));
    }
    const bool scalar_form = in.flag(), twice = in.flag();
    for (int pass = 0; pass < (twice ? 2 : 1); ++pass) {
      const auto before = grads();
      try {
        if (scalar_form) tg::backward(roots[0]);
        else tg::backward(roots, upstream);
        w.trace.push_back("backward: ok");
        narrate("backward ok ({} run)", w.disturbed ? "disturbed" : "clean");
      } catch (const tg::Error& e) {
        if (!w.nested_through) require(describe(grads()) == describe(before), "a failed backward changed leaf gradients");
        const std::string msg = e.what();
        narrate("backward failed ({} run): {}", w.disturbed ? "disturbed" : "clean", msg);
        if (w.disturbed && w.bumped && msg.find("modified in place") != std::string::npos) {
          require(msg.find("backward of ") == 0, "the in-place error does not name the op: {}", msg);
          w.trace.push_back("backward: in-place");  // accepted instead of the clean run's outcome
          return;
        }
        w.trace.push_back(fmt::format("backward: {} {}", typeid(e).name(), msg));
      }
      w.trace.push_back(describe(grads()));
    }
  }

  void run() {
    shape = Shape(in.in(0, 2), 0);
    const std::int64_t n = in.in(1, 3);
    for (auto& d : shape) d = n;  // rank 2 is square: transpose and matmul keep the shape
    dtype = in.in(0, 3) == 0 ? tg::float32 : tg::float64;
    const int leaves = in.in(1, 4);
    for (int i = 0; i < leaves; ++i) {
      Tensor t = in.tensor(shape, dtype);
      if (in.in(0, 3) != 0) t.set_requires_grad();
      w.leaves.push_back(t);
      w.pool.push_back({t});
    }
    const int steps = in.in(0, 12);
    for (int i = 0; i < steps; ++i) {
      try {
        step();
        w.trace.push_back("step: ok");
      } catch (const tg::Error& e) {
        w.trace.push_back(fmt::format("step: {} {}", typeid(e).name(), e.what()));
      }
    }
    const int disturbances = in.in(0, 3);
    for (int i = 0; i < disturbances; ++i) {
      try {
        disturb();
      } catch (const tg::Error&) {  // e.g. add_ into an expanded view: refused, documented
      }
    }
    backward();
  }
};

std::vector<std::string> run_world(const std::uint8_t* data, std::size_t size, bool disturbed) {
  FuzzedDataProvider fdp(data, size);
  Input in{fdp};
  World w{disturbed};
  Program{in, w, {}, tg::float64}.run();
  std::vector<std::string> trace = std::move(w.trace);
  w = World{disturbed};
  // Every tensor of the run is gone: so is every node it recorded on this thread.
  require(tg::tape_size() == 0, "{} nodes outlive every tensor of the run (a reference cycle)", tg::tape_size());
  return trace;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  return run_one(data, size, [&](Input&) {
    const auto clean = run_world(data, size, false);
    tg::clear_tape();
    const auto disturbed = run_world(data, size, true);
    require(clean.size() >= disturbed.size(), "the disturbed run did more steps");
    for (std::size_t i = 0; i < disturbed.size(); ++i) {
      if (disturbed[i] == "backward: in-place") break;
      require(clean[i] == disturbed[i], "entry {} of the runs differs:\nclean:     {}\ndisturbed: {}", i, clean[i], disturbed[i]);
    }
  });
}
