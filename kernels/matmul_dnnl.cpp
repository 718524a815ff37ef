// Every oneDNN call in tapegrad lives in this file (oneDNN 2.6 API: matmul::desc, then
// primitive_desc, then primitive).
//
// Recipe: 1. describe a, b and c by dims and strides (a transposed view is just other strides,
// no copy); 2. build the primitive once per layout and keep it in a per-thread LRU cache; 3. wrap
// the three buffers in dnnl::memory and execute. oneDNN always runs on one OpenMP thread here: a
// product that its size repays on more threads is cut into pieces (a batch dim, panels of columns
// or bands of rows: split_plan), which tapegrad's own workers run (runtime/;
// docs/performance-notes.md says why).
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <exception>
#include <list>
#include <mutex>
#include <memory>
#include <numeric>
#include <string>
#include <unordered_map>

#include <oneapi/dnnl/dnnl.hpp>

#include "autodiff/loops.hpp"
#include "autodiff/tape_observer.hpp"
#include "kernels/matmul_dnnl.hpp"
#include "kernels/matmul_rows.hpp"
#include "kernels/rounded_copy.hpp"
#include "runtime/cpu.hpp"
#include "runtime/parallel.hpp"

// OpenMP's per-thread setting, which oneDNN reads (declared here rather than through <omp.h>,
// as in runtime/parallel.cpp).
extern "C" {
void omp_set_num_threads(int n);
int omp_get_max_threads(void);
// Row-major bfloat16 gemm with float32 accumulation and output (the dnnl_sgemm of bfloat16).
// oneDNN 2.6 exports it but its dnnl.h does not declare it yet (later versions do, with this
// signature; dnnl_bfloat16_t there is a struct of one uint16_t).
dnnl_status_t dnnl_gemm_bf16bf16f32(char transa, char transb, dnnl_dim_t m, dnnl_dim_t n, dnnl_dim_t k, float alpha,
                                    const std::uint16_t* a, dnnl_dim_t lda, const std::uint16_t* b, dnnl_dim_t ldb, float beta,
                                    float* c, dnnl_dim_t ldc);
}

namespace tapegrad::detail {
namespace {

using dnnl::memory;

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& cpu_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// Each thread a product uses must have this many multiply-adds (a few microseconds of work on
// one core), so a second thread starts from 2^21: handing a piece to an awake worker costs a few
// microseconds, a fair part of what a smaller split would save (docs/performance-notes.md).
constexpr double kMacsPerThread = 1 << 20;

// A product's rows are cut into bands of at least this many rows (split_plan says why).
constexpr std::int64_t kMinBandRows = 16;

// Products of one row per matrix up to this many multiply-adds run as plain loops (matmul_rows):
// the loops' arithmetic is cheaper than creating a primitive for a new layout, which decoding
// meets at every step.
constexpr double kRowMacs = 1 << 20;
// Any product up to this many multiply-adds runs as plain loops too: a call into oneDNN (argument
// map, cache lookups, dispatch) costs a microsecond or two, more than the loops take for these
// (a toy attention layer's 8 x 16 x 16 projections are 2,048).
constexpr double kLoopMacs = 1 << 12;

thread_local std::int64_t t_created = 0;

// Sets the calling thread's OpenMP thread count for one product (always 1 here) and puts it back
// after: oneDNN reads it when it creates a primitive (to partition the work and size its
// scratchpad) and when it executes one.
class OmpThreads {
 public:
  explicit OmpThreads(int n) : saved_(omp_get_max_threads()) {
    if (n != saved_) omp_set_num_threads(n);
  }
  ~OmpThreads() {
    if (omp_get_max_threads() != saved_) omp_set_num_threads(saved_);
  }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int saved_;
};

// An operand as oneDNN will see it. Held inline (no allocation per product): a memory::desc is
// only made from it when a primitive is created.
struct Layout {
  Dims8 dims, strides;
};

memory::desc desc_of(const Layout& l, memory::data_type type) {
  return {memory::dims(l.dims.begin(), l.dims.end()), type, memory::dims(l.strides.begin(), l.strides.end())};
}

// Batch dims that were broadcast by stride 0 become size 1 (oneDNN broadcasts size-1 batch dims
// itself); size-1 dims get the stride a dense layout would give them, so oneDNN recognises
// plain and transposed layouts. Returns false when neither of the two matrix dims has unit
// stride (gemm kernels need a row- or column-major matrix) or when oneDNN would refuse the
// strides: such an operand is copied.
bool describe(const Tensor& x, Layout& out) {
  const std::size_t r = x.shape().size();
  out.dims.assign(x.shape().begin(), x.shape().end());
  out.strides.assign(x.strides().begin(), x.strides().end());
  const std::int64_t rows = out.dims[r - 2], cols = out.dims[r - 1];
  if (cols == 1) out.strides[r - 1] = rows == 1 ? 1 : out.strides[r - 2] == 1 ? rows : 1;
  if (rows == 1) out.strides[r - 2] = out.strides[r - 1] == 1 ? cols : 1;
  const bool row_major = out.strides[r - 1] == 1 && out.strides[r - 2] >= cols;
  const bool col_major = out.strides[r - 2] == 1 && out.strides[r - 1] >= rows;
  if (!row_major && !col_major) return false;
  std::int64_t span = std::max(out.strides[r - 2] * rows, out.strides[r - 1] * cols);
  for (std::size_t d = r - 2; d-- > 0;) {
    if (out.strides[d] == 0) out.dims[d] = 1;
    if (out.dims[d] == 1) out.strides[d] = span;
    span = std::max(span, out.strides[d] * out.dims[d]);
  }
  // oneDNN also refuses strides that interleave: taken in increasing order, each must reach past
  // the dims below it. A batch sliced from a taller one does not ([4, 4, 2, 1] with strides
  // [16, 4, 3, 1]: each matrix spans 6 elements, batches start every 4); memory::desc threw.
  std::array<std::size_t, DNNL_MAX_NDIMS> order;  // run() folds higher ranks first
  std::iota(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(r), std::size_t{0});
  std::sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(r), [&](std::size_t x, std::size_t y) {
    return std::pair{out.strides[x], out.dims[x]} < std::pair{out.strides[y], out.dims[y]};
  });
  std::int64_t reach = 1;
  for (std::size_t i = 0; i < r; ++i) {
    const std::size_t d = order[i];
    if (out.dims[d] == 1) continue;
    if (out.strides[d] < reach) return false;
    reach = out.strides[d] * out.dims[d];
  }
  return true;
}

// A primitive with its three memory objects: per call only their data handles change.
struct Entry {
  dnnl::matmul primitive;
  memory a, b, c;
};

struct KeyHash {
  std::size_t operator()(const std::vector<std::int64_t>& key) const noexcept {
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a over the words
    for (auto v : key) h = (h ^ static_cast<std::uint64_t>(v)) * 1099511628211ull;
    return static_cast<std::size_t>(h);
  }
};

using Key = std::vector<std::int64_t>;

// Keeps the `capacity` most recently used entries: decoding's one-off layouts push out each
// other, not the hot layouts of a training step (the previous cache dropped everything at once).
template <class Value> class LruCache {
 public:
  explicit LruCache(std::size_t capacity) : capacity_(capacity) {}
  // The entry for key, now the most recently used; nullptr when absent.
  Value* find(const Key& key) {
    const auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    items_.splice(items_.begin(), items_, it->second);
    return &it->second->second;
  }
  Value& insert(Key key, Value value) {
    if (index_.size() >= capacity_) {
      index_.erase(items_.back().first);
      items_.pop_back();
    }
    items_.emplace_front(std::move(key), std::move(value));
    index_.emplace(items_.front().first, items_.begin());
    return items_.front().second;
  }

 private:
  std::size_t capacity_;
  std::list<std::pair<Key, Value>> items_;  // most recently used first
  std::unordered_map<Key, typename std::list<std::pair<Key, Value>>::iterator, KeyHash> index_;
};

void append(std::vector<std::int64_t>& key, const Layout& l) {
  key.insert(key.end(), l.dims.begin(), l.dims.end());
  key.insert(key.end(), l.strides.begin(), l.strides.end());
}

template <class Out> inline Out rounded_as(float f) {
  const std::uint16_t bits = to_bf16<false>(f);
  if constexpr (std::is_same_v<Out, std::uint16_t>) return bits;
  else return std::bit_cast<float>(std::uint32_t{bits} << 16);
}

// The contiguous conversion loops, for each vector width.
TAPEGRAD_CPU_CLONES void round_run(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = rounded_as<std::uint16_t>(src[i]);
}
TAPEGRAD_CPU_CLONES void round_run(const float* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = rounded_as<float>(src[i]);
}

// Scratch for the rounded operands, kept per thread and grown as needed: allocating (and
// page-faulting) fresh buffers on every call cost as much as the conversion itself.
template <class Out> Out* scratch(int which, std::int64_t n) {
  thread_local std::unique_ptr<Out[]> buffers[2];
  thread_local std::int64_t sizes[2] = {0, 0};
  if (sizes[which] < n) {
    buffers[which] = std::make_unique_for_overwrite<Out[]>(static_cast<std::size_t>(n));
    sizes[which] = n;
  }
  return buffers[which].get();
}

// Whether the layout's elements fill one dense block (some order of its dims, size-1 dims aside).
bool dense_block(const Layout& l) {
  return dense_in_some_order({l.dims.data(), l.dims.size()}, {l.strides.data(), l.strides.size()});
}

// x (float32, any strides) rounded to bfloat16 into `out`, laid out as `l` says on return: a
// dense operand (any order of its dims) keeps its layout, any other becomes contiguous (l's
// strides are rewritten; a stride-0 batch dim was already turned into size 1 there). Out is raw
// bfloat16 bits (uint16_t) or float32 holding the rounded values (for the emulated path).
template <class Out> void round_into(const Tensor& x, Layout& l, Out* out) {
  Shape shape(l.dims.begin(), l.dims.end());
  Tensor region = make_view(x, shape, x.strides(), x.offset(), "matmul");
  const std::int64_t numel = shape_numel(shape);
  const float* src = static_cast<const float*>(region.raw_data());
  if (dense_block(l)) {
    // Contiguous, or a transposed (or otherwise permuted) dense operand such as the activations
    // in a weight gradient xᵀ g: rounded in memory order, by vectorised runs on all threads
    // (the strided loop would go element by element).
    parallel_for(numel, 2, [&](std::int64_t begin, std::int64_t end) { round_run(src + begin, out + begin, end - begin); });
    return;
  }
  const Shape dense = contiguous_strides(shape);
  StridedLoop<2> loop(shape.data(), shape.size(), {dense.data(), region.strides().data()});
  loop.for_each_run([&](const auto& off, std::int64_t n, const auto& inner) {
    for (std::int64_t i = 0; i < n; ++i) out[off[0] + i * inner[0]] = rounded_as<Out>(src[off[1] + i * inner[1]]);
  });
  l.strides.assign(dense.begin(), dense.end());
}

// x's bfloat16 values as float32, in a new tensor of x's layout where that is dense: the
// operands of the emulated path (a weight read transposed stays transposed, no copy in order).
Tensor rounded_float32(const Tensor& x, Layout& l) {
  const Shape shape(l.dims.begin(), l.dims.end());
  Tensor out = empty({shape_numel(shape)});
  round_into(x, l, static_cast<float*>(mutable_data(out)));
  return make_view(out, shape, Shape(l.strides.begin(), l.strides.end()), 0, "matmul");
}

// A bfloat16 operand: a weight's kept copy (rounded_copy.hpp) where oneDNN can read it as it
// is, else x rounded into this thread's scratch. The same bits either way.
void* bf16_operand(const Tensor& x, Layout& l, int which) {
  if (dense_block(l))
    if (const std::uint16_t* kept = rounded_copy(x)) return const_cast<std::uint16_t*>(kept + x.offset());
  std::uint16_t* out = scratch<std::uint16_t>(which, shape_numel(Shape(l.dims.begin(), l.dims.end())));
  round_into(x, l, out);
  return out;
}

// The cached primitive for this layout, or nullptr when oneDNN has no bfloat16 kernel for it.
// Made for, and run on, one OpenMP thread.
Entry* primitive_for(const Layout& a, const Layout& b, const Layout& c, bool bf16) {
  thread_local LruCache<Entry> cache(kDnnlCacheCapacity);
  thread_local Key key;  // reused: a lookup allocates nothing
  key.assign({bf16 ? 1 : 0});
  append(key, a);
  append(key, b);
  append(key, c);
  if (Entry* hit = cache.find(key)) return hit->primitive ? hit : nullptr;
  ++t_created;
  const OmpThreads omp(1);  // oneDNN fixes a primitive's thread count when it makes it (the bf16 probe calls this too)
  const auto in_type = bf16 ? memory::data_type::bf16 : memory::data_type::f32;
  Entry e;
  const memory::desc da = desc_of(a, in_type), db = desc_of(b, in_type), dc = desc_of(c, memory::data_type::f32);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(da, db, dc), cpu_engine(), /*allow_empty=*/bf16);
  if (pd) {
    e.primitive = dnnl::matmul(pd);
    e.a = memory(da, cpu_engine(), DNNL_MEMORY_NONE);
    e.b = memory(db, cpu_engine(), DNNL_MEMORY_NONE);
    e.c = memory(dc, cpu_engine(), DNNL_MEMORY_NONE);
  }
  Entry& stored = cache.insert(key, std::move(e));
  return stored.primitive ? &stored : nullptr;
}

// Whether oneDNN picks a real gemm kernel for this layout, rather than its slow reference
// loop (which it uses for layouts its kernels do not take).
bool has_fast_kernel(const Layout& a, const Layout& b, const Layout& c) {
  const auto f32 = memory::data_type::f32;
  const memory::desc da = desc_of(a, f32), db = desc_of(b, f32), dc = desc_of(c, f32);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(da, db, dc), cpu_engine());
  return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
}

// Whether a band of rows, or a piece of a batch, gets the bits it has in the whole product, so
// that bands and batch pieces can follow the thread count: with oneDNN's AVX-512 kernels (checked
// by split_products_give_one_threads_bits). Its AVX2 kernels block K by M, and bands changed
// elements of [1002, 129] x [129, 257] products and of the tiles' raw gemm calls
// ([1024, 600] x [600, 384]); pieces of a batch against a broadcast column-major b changed too.
// There products without a batch or panels stay on one thread, and batches are cut into pieces
// fixed by the shape.
bool bands_keep_bits() {
  static const bool avx512 = [] {
    const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
    return (isa & dnnl_cpu_isa_avx512_core) == dnnl_cpu_isa_avx512_core;
  }();
  return avx512;
}

// Runs one raw gemm call (`kind` tells sgemm from the bfloat16 one) on the threads ThreadChoice
// picks for its shape, and reports its time. call(i0, i1, j0, j1) computes rows [i0, i1) and
// columns [j0, j1) of c on one thread; with more threads, each runs a band of at least
// kMinBandRows rows (see split_plan for why rows).
template <class Call>
dnnl_status_t on_chosen_threads(int kind, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
                                std::int64_t lda, std::int64_t ldb, std::int64_t ldc, Call call) {
  const OmpThreads omp(1);
  const auto by_size = dnnl_threads_for(static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  const int wanted = bands_keep_bits() ? static_cast<int>(std::min<std::int64_t>(by_size, m / kMinBandRows)) : 1;
  if (wanted <= 1) return call(0, m, 0, n);  // no choice to make: no clock, no lock (tiles are called thousands of times)
  std::uint64_t key = mix_key(kKeySeed, static_cast<std::uint64_t>(kind));
  for (const std::int64_t v : {std::int64_t{trans_a}, std::int64_t{trans_b}, m, n, k, lda, ldb, ldc})
    key = mix_key(key, static_cast<std::uint64_t>(v));
  const double start = now_seconds();
  int threads = choose_threads(key, wanted, start);
  dnnl_status_t status = dnnl_success;
  if (threads == 1) {
    status = call(0, m, 0, n);
  } else {
    struct Bands {
      Call* call;
      std::int64_t m, n;
      int count;
      std::atomic<int> failed{dnnl_success};
    } bands{&call, m, n, threads};
    const bool pooled = pool_run(threads, threads, [](void* p, int i) noexcept {
      auto& b = *static_cast<Bands*>(p);
      const dnnl_status_t s = (*b.call)(b.m * i / b.count, b.m * (i + 1) / b.count, 0, b.n);
      if (s != dnnl_success) b.failed.store(s, std::memory_order_relaxed);
    }, &bands);
    status = static_cast<dnnl_status_t>(bands.failed.load(std::memory_order_relaxed));
    if (!pooled) threads = 1;
  }
  record_threads(key, threads, start);
  return status;
}

// The kind of work a product is, for ThreadChoice: its layouts and input type.
std::uint64_t work_key(const Layout& a, const Layout& b, const Layout& c, bool bf16) {
  std::uint64_t key = mix_key(kKeySeed, bf16 ? 2 : 1);
  for (const Layout* l : {&a, &b, &c}) {
    for (const dnnl::memory::dim d : l->dims) key = mix_key(key, static_cast<std::uint64_t>(d));
    for (const dnnl::memory::dim s : l->strides) key = mix_key(key, static_cast<std::uint64_t>(s));
  }
  return key;
}

// How a product is cut: along `dim` into `pieces`, run on up to `threads` threads.
//  - The largest batch dim, or bands of at least kMinBandRows rows (only where bands_keep_bits):
//    one piece per thread. oneDNN's one-thread AVX-512 kernels give each row of a band the bits
//    it has in the whole product, so any cut gives the one-thread bits.
//  - Pieces whose count is fixed by the shape (`fixed`), whatever the threads, because a piece's
//    elements may get other bits than the whole product's (137,617 of 153,900 elements of a
//    [300, 777] x [777, 513] product differed in panels): one thread runs the same pieces in turn.
//    More pieces than threads let a thread on a busy core take fewer of them.
//    - Panels of columns (dim = the last), when c has at least as many columns as rows and no
//      batch (column_panels). Rows would make every thread read (and oneDNN pack) all of b, the
//      larger operand there; panels read each of b's columns once.
//    - Bands of rows of a column-major a (fixed_bands): oneDNN's kernels for such an a block K
//      by M (past K = 256), so its bands do not keep the whole product's bits.
struct Split {
  std::size_t dim = 0;
  int pieces = 1, threads = 1;
  bool fixed = false;
};

// Up to 8 pieces (a power of two) of at least `least` rows or columns out of `extent` and about
// 2^20 multiply-adds each; 1 when there would be fewer than 2.
int fixed_pieces(std::int64_t extent, std::int64_t least, double macs) {
  const double most =
      std::min({8.0, std::floor(static_cast<double>(extent) / static_cast<double>(least)), std::floor(macs / kMacsPerThread)});
  return most < 2 ? 1 : static_cast<int>(std::bit_floor(static_cast<unsigned>(most)));
}

// The panels a product of c's shape [m, n] (no batch) and k is cut into, on every thread count:
// only while a fits in a core's cache (1 MiB of float32), since every panel reads all of a. Past
// that, panels lost to the whole product on one thread (the head's dx = g wᵀ,
// [256, 50257] x [50257, 768]). A column-major b gets at most 2: its panels cost more each,
// where a row-major b's 8 cost nothing (docs/performance-notes.md, Products). bfloat16 panels
// are at least 192 columns wide: a panel writes a strided piece of c, which oneDNN runs on its
// gemm rather than its faster bfloat16 brgemm, and 96-wide ones lost to it.
int column_panels(std::int64_t m, std::int64_t n, std::int64_t k, bool b_column_major, bool bf16) {
  if (n < m || static_cast<double>(m) * static_cast<double>(k) * sizeof(float) > (1 << 20)) return 1;
  const int panels = fixed_pieces(n, bf16 ? 192 : 64, static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
  return b_column_major ? std::min(panels, 2) : panels;
}

// The bands of rows a product of a column-major a is cut into, on every thread count (when it
// gets no panels). Before, such an a was copied row-major so that its bands could follow the
// threads, and the copy cost the GPT-2 step's second feed-forward dW = xᵀ g more than the
// bands do (docs/performance-notes.md, Products). Bands of 32 rows or more: the copy let such a
// product follow the threads from 32 rows.
int fixed_bands(std::int64_t m, std::int64_t n, std::int64_t k) {
  return fixed_pieces(m, 2 * kMinBandRows, static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k));
}

// `a_column_major` and `b_column_major`: a and b are stored column by column.
Split split_plan(const Shape& shape, std::int64_t k, int wanted, bool a_column_major, bool b_column_major, bool bf16) {
  const std::size_t r = shape.size();
  Split best;
  if (!bands_keep_bits()) {  // batch pieces fixed by the shape: AVX2's batched calls change bits when cut
    const double macs = static_cast<double>(shape_numel(shape)) * static_cast<double>(k);
    for (std::size_t d = 0; d + 2 < r; ++d)
      if (const int p = fixed_pieces(shape[d], 1, macs); p > best.pieces) best = {d, p, std::min(wanted, p), true};
  } else {
    for (std::size_t d = 0; d + 2 < r; ++d)
      if (const auto p = static_cast<int>(std::min<std::int64_t>(wanted, shape[d])); p > best.pieces) best = {d, p, p};
  }
  if (best.pieces > 1) return best;
  for (std::size_t d = 0; d + 2 < r; ++d)
    if (shape[d] > 1) return best;  // a batched product too small to cut by its batch stays whole
  const std::int64_t m = shape[r - 2], n = shape[r - 1];
  if (const int panels = column_panels(m, n, k, b_column_major, bf16); panels > 1) return {r - 1, panels, std::min(wanted, panels), true};
  if (a_column_major) {
    const int bands = fixed_bands(m, n, k);
    return bands > 1 ? Split{r - 2, bands, std::min(wanted, bands), true} : best;
  }
  if (!bands_keep_bits()) return best;
  if (const auto p = static_cast<int>(std::min<std::int64_t>(wanted, shape[r - 2] / kMinBandRows)); p > best.pieces) best = {r - 2, p, p};
  return best;
}

// One product on the calling thread: the primitive for these layouts (cached), run on these
// buffers (bfloat16 bits for a and b under bf16, which the caller has checked oneDNN can do).
void execute(const Layout& la, const Layout& lb, const Layout& lc, void* pa, void* pb, void* pc, bool bf16) {
  const OmpThreads omp(1);
  Entry* found = primitive_for(la, lb, lc, bf16);
  // run() checked the whole product's layout; a piece's (wider strides) is checked here.
  if (found == nullptr)
    fail<ValueError>("matmul: oneDNN has no bfloat16 kernel for a piece of a product of shapes {} and {}", shape_str(Shape(la.dims.begin(), la.dims.end())),
                     shape_str(Shape(lb.dims.begin(), lb.dims.end())));
  Entry& e = *found;
  e.a.set_data_handle(pa);
  e.b.set_data_handle(pb);
  e.c.set_data_handle(pc);
  // Through the C API: the C++ execute() builds an unordered_map of the three arguments per call.
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, e.a.get()}, {DNNL_ARG_WEIGHTS, e.b.get()}, {DNNL_ARG_DST, e.c.get()}};
  const dnnl_status_t status = dnnl_primitive_execute(e.primitive.get(), cpu_stream().get(), 3, args);
  if (status != dnnl_success)
    fail<ValueError>("matmul: oneDNN failed to run a product of shapes {} and {}, status {}", shape_str(Shape(la.dims.begin(), la.dims.end())),
                     shape_str(Shape(lb.dims.begin(), lb.dims.end())), static_cast<int>(status));
  cpu_stream().wait();
}

// Entries [lo, hi) of an operand's dim d, which the result has `full` of: the layout of that part
// and where it starts (elements from the operand's start), or the whole operand when it is
// broadcast along d. A batch dim left with one entry gets the stride describe() gives such dims.
Layout part_of(const Layout& l, std::size_t d, std::int64_t full, std::int64_t lo, std::int64_t hi, std::int64_t& offset) {
  Layout p = l;
  offset = 0;
  if (l.dims[d] != full) return p;
  p.dims[d] = hi - lo;
  offset = lo * l.strides[d];
  const std::size_t r = p.dims.size();
  std::int64_t span = std::max(p.strides[r - 2] * p.dims[r - 2], p.strides[r - 1] * p.dims[r - 1]);
  for (std::size_t k = r - 2; k-- > 0;) {
    if (p.dims[k] == 1) p.strides[k] = span;
    span = std::max(span, p.strides[k] * p.dims[k]);
  }
  return p;
}

// Where piece i of `pieces` along a dim of `full` entries starts (i = pieces: its end), on a
// multiple of `align`: panels and bands fixed by the shape start on one AVX-512 vector of float32
// (16), batch pieces and bands that follow the threads anywhere.
std::int64_t piece_start(std::int64_t full, int pieces, int i, std::int64_t align) {
  if (i >= pieces) return full;
  return (full / pieces * i + full % pieces * i / pieces) / align * align;
}

// c = a b in split.pieces pieces along split.dim on up to split.threads of tapegrad's workers
// (a band of a's and c's rows for M; a panel of b's and c's columns for N; a's, b's and c's
// entries for a batch dim), on the operands as the caller prepared them (bfloat16 copies rounded
// once, whole). More pieces than threads go to whichever thread is free first. False when the
// pieces ran in order on the calling thread instead.
bool execute_split(const Layout& la, const Layout& lb, const Layout& lc, void* pa, void* pb, void* pc, bool bf16, Split split) {
  struct Pieces {
    const Layout &la, &lb, &lc;
    std::byte *pa, *pb, *pc;
    std::size_t in_size;
    bool bf16;
    Split split;
    std::exception_ptr error;
    std::mutex error_mutex;
  } pieces{la, lb, lc, static_cast<std::byte*>(pa), static_cast<std::byte*>(pb), static_cast<std::byte*>(pc),
           bf16 ? sizeof(std::uint16_t) : sizeof(float), bf16, split, nullptr, {}};
  const bool pooled = pool_run(split.threads, split.pieces, [](void* p, int i) noexcept {
    auto& s = *static_cast<Pieces*>(p);
    const std::size_t d = s.split.dim, r = s.lc.dims.size();
    const bool rows = d == r - 2, columns = d == r - 1;
    const std::int64_t full = s.lc.dims[d];
    const std::int64_t align = s.split.fixed && (rows || columns) ? 16 : 1;
    const std::int64_t lo = piece_start(full, s.split.pieces, i, align), hi = piece_start(full, s.split.pieces, i + 1, align);
    try {
      std::int64_t oa = 0, ob = 0, oc = 0;
      const Layout a = columns ? s.la : part_of(s.la, d, full, lo, hi, oa), c = part_of(s.lc, d, full, lo, hi, oc);
      const Layout b = rows ? s.lb : part_of(s.lb, d, full, lo, hi, ob);
      const auto at = [&](std::byte* base, std::int64_t offset, std::size_t size) { return base + offset * static_cast<std::int64_t>(size); };
      execute(a, b, c, at(s.pa, oa, s.in_size), at(s.pb, ob, s.in_size), at(s.pc, oc, sizeof(float)), s.bf16);
    } catch (...) {
      std::lock_guard lock(s.error_mutex);
      if (!s.error) s.error = std::current_exception();
    }
  }, &pieces);
  if (pieces.error) std::rethrow_exception(pieces.error);
  return pooled;
}

// Whether a float32 product is small enough for plain loops (matmul_rows.cpp) rather than oneDNN.
bool on_rows(const Tensor& a, const Tensor& c) {
  const std::size_t rank = c.shape().size();
  const double macs = static_cast<double>(c.numel()) * static_cast<double>(a.shape()[rank - 1]);
  return macs <= kLoopMacs || (c.shape()[rank - 2] == 1 && macs <= kRowMacs);
}

// Whether an operand is stored column by column (split_plan cuts such an a otherwise).
bool column_major(const Layout& l) {
  const std::size_t r = l.dims.size();
  return l.dims[r - 1] > 1 && l.strides[r - 2] == 1 && l.strides[r - 1] != 1;
}

void run(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16);

// A bfloat16 product without a bfloat16 dot product: products of bfloat16 values are exact in
// float32, so the float32 product of the rounded operands computes the same thing, and is
// what a float32 product of those operands gives, bit for bit. (On AVX-512 without BF16,
// oneDNN's own bfloat16 gemm is slower than that, and its batch pieces change bits:
// docs/performance-notes.md.)
void emulated(const Tensor& a, Layout& la, const Tensor& b, Layout& lb, const Tensor& c) {
  const Tensor ra = rounded_float32(a, la), rb = rounded_float32(b, lb);
  if (on_rows(ra, c)) matmul_rows(ra, rb, c);
  else run(ra, rb, c, false);
}

void run(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16) {
  const std::size_t r = c.shape().size();
  const std::int64_t k = a.shape()[r - 1];
  Layout la, lb, lc;
  if (!describe(a, la)) return run(copy_of(a), b, c, bf16);
  if (!describe(b, lb)) return run(a, copy_of(b), c, bf16);
  describe(c, lc);
  static const bool native = dnnl_bf16_native();  // oneDNN settles its ISA once per process
  if (bf16 && !native) return emulated(a, la, b, lb, c);
  // Inside a parallel body this is 1 thread (fixed pieces still run, in order).
  Split split = split_plan(c.shape(), k, dnnl_threads_for(static_cast<double>(c.numel()) * static_cast<double>(k)), column_major(la),
                           column_major(lb), bf16);
  const int wanted = split.threads;
  const std::uint64_t work = wanted > 1 ? work_key(la, lb, lc, bf16) : 0;
  const double start = wanted > 1 ? now_seconds() : 0.0;
  void* pa = mutable_data(a);  // oneDNN takes non-const handles; it only reads a and b
  void* pb = mutable_data(b);
  if (bf16) {
    // Rounded once, whole (on every thread), whatever the pieces: a piece rounding its own band
    // of a transposed operand went element by element, and each rounded all of the other operand.
    pa = bf16_operand(a, la, 0);
    pb = bf16_operand(b, lb, 1);
    if (!primitive_for(la, lb, lc, true)) {  // not seen on a CPU with AVX512-BF16 or AMX
      describe(a, la);  // bf16_operand may have rewritten the layouts for its copies
      describe(b, lb);
      return emulated(a, la, b, lb, c);
    }
  } else {
    // Decided once per layout: strided layouts oneDNN only runs on its reference loop are
    // cheaper to copy first.
    thread_local LruCache<bool> fast(kDnnlCacheCapacity);
    thread_local Key key;
    key.clear();
    append(key, la);
    append(key, lb);
    // Contiguous operands run as they are, whatever was decided for the layout: an expanded
    // operand (stride-0 batch) is described like a contiguous one of batch size 1, and copying
    // contiguous operands would change nothing (it recursed until the stack overflowed).
    const bool contiguous = a.is_contiguous() && b.is_contiguous();
    bool* decided = fast.find(key);
    if (!decided) decided = &fast.insert(key, contiguous || has_fast_kernel(la, lb, lc));
    if (!*decided && !contiguous) return run(a.is_contiguous() ? a : copy_of(a), b.is_contiguous() ? b : copy_of(b), c, false);
  }
  // Chosen only now: a layout that returned above (run again on copies) would leave a trial
  // that ThreadChoice started for it without a result.
  if (wanted > 1) {
    split.threads = choose_threads(work, wanted, start);
    if (!split.fixed) split.pieces = split.threads;  // bands and batches: a piece per thread
  }
  bool pooled = false;
  if (split.pieces > 1) pooled = execute_split(la, lb, lc, pa, pb, mutable_data(c), bf16, split);
  else execute(la, lb, lc, pa, pb, mutable_data(c), bf16);
  if (wanted > 1) record_threads(work, pooled ? split.threads : 1, start);
}

}  // namespace

bool dense_in_some_order(std::span<const std::int64_t> sizes, std::span<const std::int64_t> strides) {
  std::vector<std::pair<std::int64_t, std::int64_t>> dims;  // (stride, size) of the dims that matter
  for (std::size_t d = 0; d < sizes.size(); ++d)
    if (sizes[d] != 1) dims.emplace_back(strides[d], sizes[d]);
  std::sort(dims.begin(), dims.end());
  std::int64_t next = 1;
  for (auto [stride, size] : dims) {
    if (stride != next) return false;
    next *= size;
  }
  return true;
}

std::int64_t dnnl_primitives_created() noexcept { return t_created; }

int dnnl_threads_for(double macs) noexcept {
  if (in_parallel_body()) return 1;  // a product inside a parallel_for body stays on its thread
  const double wanted = std::max(1.0, std::floor(macs / kMacsPerThread));
  return static_cast<int>(std::min<double>(max_threads(), wanted));
}

void matmul_dnnl(const Tensor& a, const Tensor& b, const Tensor& c, bool bf16) {
  const ObservedProduct observed;
  const std::size_t rank = c.shape().size();
  if (!bf16 && on_rows(a, c)) return matmul_rows(a, b, c);
  if (rank <= DNNL_MAX_NDIMS) return run(a, b, c, bf16);
  // Past oneDNN's rank limit: fold the batch dims into one.
  const std::int64_t m = c.shape()[rank - 2], n = c.shape()[rank - 1], k = a.shape()[rank - 1];
  Shape batch(c.shape().begin(), c.shape().end() - 2);
  const std::int64_t count = shape_numel(batch);
  // A contiguous tensor as [count, rows, cols] (a view).
  auto as_batch = [&](const Tensor& x, std::int64_t rows, std::int64_t cols) {
    return make_view(x, {count, rows, cols}, contiguous_strides({count, rows, cols}), 0, "matmul");
  };
  auto fold = [&](const Tensor& x, std::int64_t rows, std::int64_t cols) {
    Shape full = batch;
    full.push_back(rows);
    full.push_back(cols);
    // c fits, but an operand broadcast to c's batch dims may not (K much larger than N or M).
    check_shape("matmul", "an operand broadcast to the result's batch dims (rank past oneDNN's limit), shape", full,
                x.dtype());
    const Dims8 s = broadcast_strides(x, full);
    return as_batch(copy_of(make_view(x, full, Shape(s.begin(), s.end()), x.offset(), "matmul")), rows, cols);
  };
  run(fold(a, m, k), fold(b, k, n), as_batch(c, m, n), bf16);
}

void gemm_f32(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
              std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const ObservedProduct observed;
  // dnnl_sgemm skips primitive creation and takes a beta, so tiles accumulate in place.
  const dnnl_status_t status = on_chosen_threads(3, trans_a, trans_b, m, n, k, lda, ldb, ldc, [&](std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1) {
    return dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', i1 - i0, j1 - j0, k, alpha, trans_a ? a + i0 : a + i0 * lda, lda,
                      trans_b ? b + j0 * ldb : b + j0, ldb, beta, c + i0 * ldc + j0, ldc);
  });
  if (status != dnnl_success)
    fail<ValueError>("gemm_f32: oneDNN refused a [{}, {}] x [{}, {}] tile product (lda {}, ldb {}, ldc {}), status {}", m, k, k, n,
                     lda, ldb, ldc, static_cast<int>(status));
}

namespace {

// bfloat16 bits back to float32 (exact).
inline float widen(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

TAPEGRAD_CPU_CLONES std::uint32_t round_operand_row(const float* src, std::uint16_t* dst, std::int64_t n) {
  std::uint32_t bad = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const std::uint32_t u = std::bit_cast<std::uint32_t>(src[i]);
    const std::uint32_t non_finite = (u & 0x7f800000u) == 0x7f800000u;
    bad |= non_finite;
    dst[i] = non_finite ? std::uint16_t{0} : to_bf16<true>(src[i]);
  }
  return bad;
}
TAPEGRAD_CPU_CLONES void round_weights_run(const float* src, std::uint16_t* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = to_bf16<true>(src[i]);
}
TAPEGRAD_CPU_CLONES void widen_run(const std::uint16_t* src, float* dst, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) dst[i] = widen(src[i]);
}

// The [rows, cols] block at src (row stride ld) widened into dense float32 scratch.
const float* widened(const std::uint16_t* src, std::int64_t rows, std::int64_t cols, std::int64_t ld, int which) {
  float* out = scratch<float>(which, rows * cols);
  for (std::int64_t r = 0; r < rows; ++r) widen_run(src + r * ld, out + r * cols, cols);
  return out;
}

}  // namespace

bool round_bf16_operand(const float* src, std::int64_t ld, std::int64_t rows, std::int64_t cols, std::uint16_t* dst,
                        unsigned char* bad_rows) noexcept {
  std::uint32_t any = 0;
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::uint32_t bad = round_operand_row(src + r * ld, dst + r * cols, cols);
    if (bad_rows != nullptr) bad_rows[r] = static_cast<unsigned char>(bad);
    any |= bad;
  }
  return any != 0;
}

void round_bf16(const float* src, std::uint16_t* dst, std::int64_t n) noexcept { round_run(src, dst, n); }
void round_bf16_weights(const float* src, std::uint16_t* dst, std::int64_t n) noexcept { round_weights_run(src, dst, n); }

void gemm_bf16(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const std::uint16_t* a,
               std::int64_t lda, const std::uint16_t* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  const ObservedProduct observed;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    if (beta == 0)
      for (std::int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.0f);
    return;
  }
  static const bool native = dnnl_bf16_native();  // oneDNN settles its ISA once per process
  if (!native) {
    // No bfloat16 dot product on this CPU: bfloat16 products are exact in float32, so the float32
    // gemm on the widened blocks computes the same sums (slower than float32 itself: two extra passes).
    const std::int64_t ar = trans_a ? k : m, ac = trans_a ? m : k, br = trans_b ? n : k, bc = trans_b ? k : n;
    return gemm_f32(trans_a, trans_b, m, n, k, alpha, widened(a, ar, ac, lda, 0), ac, widened(b, br, bc, ldb, 1), bc, beta, c, ldc);
  }
  const dnnl_status_t status = on_chosen_threads(4, trans_a, trans_b, m, n, k, lda, ldb, ldc, [&](std::int64_t i0, std::int64_t i1, std::int64_t j0, std::int64_t j1) {
    return dnnl_gemm_bf16bf16f32(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', i1 - i0, j1 - j0, k, alpha, trans_a ? a + i0 : a + i0 * lda,
                                 lda, trans_b ? b + j0 * ldb : b + j0, ldb, beta, c + i0 * ldc + j0, ldc);
  });
  if (status != dnnl_success)
    fail<ValueError>("gemm_bf16: oneDNN refused a [{}, {}] x [{}, {}] tile product (lda {}, ldb {}, ldc {}), status {}", m, k, k, n,
                     lda, ldb, ldc, static_cast<int>(status));
}

bool dnnl_bf16_native() noexcept {
  const auto isa = static_cast<unsigned>(dnnl_get_effective_cpu_isa());
  return (isa & dnnl_cpu_isa_avx512_core_bf16) == dnnl_cpu_isa_avx512_core_bf16;
}

}  // namespace tapegrad::detail
