#include "op_profile.hpp"

#include "runtime/parallel.hpp"

namespace bench {

using tapegrad::detail::now_seconds;

OpProfile::OpProfile() : last_(now_seconds()) {}

void OpProfile::recorded(const char* op) {
  const double now = now_seconds();
  Times& t = times_[op];
  t.forward += now - last_;
  t.forward_products += products_;
  ++t.calls;
  last_ = now;
  products_ = 0;
}

void OpProfile::backward_began(const char*) { backward_started_.push_back(now_seconds()); }

void OpProfile::backward_ended(const char* op) {
  const double seconds = now_seconds() - backward_started_.back();
  backward_started_.pop_back();
  Times& t = times_[op];
  t.backward += seconds;
  t.backward_products += products_;
  products_ = 0;
}

void OpProfile::product_began() {
  if (product_depth_++ == 0) product_started_ = now_seconds();
}

void OpProfile::product_ended() {
  if (--product_depth_ == 0) products_ += now_seconds() - product_started_;
}

}  // namespace bench
