// Internal: a vector of trivially copyable values that lives inline up to N elements. Loop
// plans and broadcast strides are built on every op call; keeping them off the heap is most of
// what makes a recorded op on a small tensor cheap.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <type_traits>

namespace tapegrad::detail {

template <class T, std::size_t N> class SmallVec {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVec() = default;
  SmallVec(std::size_t n, T value) {
    while (capacity_ < n) grow();
    std::fill(data_, data_ + n, value);
    size_ = n;
  }
  SmallVec(const SmallVec& other) { assign(other.begin(), other.end()); }
  SmallVec& operator=(const SmallVec& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }

  template <class It> void assign(It first, It last) {
    size_ = 0;
    for (; first != last; ++first) push_back(static_cast<T>(*first));
  }
  void push_back(T v) {
    if (size_ == capacity_) grow();
    data_[size_++] = v;
  }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }
  T& back() { return data_[size_ - 1]; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void grow() {
    auto bigger = std::make_unique<T[]>(capacity_ * 2);
    std::copy(data_, data_ + size_, bigger.get());
    heap_ = std::move(bigger);
    data_ = heap_.get();
    capacity_ *= 2;
  }

  T inline_[N];
  std::unique_ptr<T[]> heap_;
  T* data_ = inline_;
  std::size_t size_ = 0;
  std::size_t capacity_ = N;
};

// Strides or sizes of one operand: inline for up to 8 dims.
using Dims8 = SmallVec<std::int64_t, 8>;

}  // namespace tapegrad::detail
