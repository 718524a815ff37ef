// bfloat16 compute against float32 on the attention issue's large and long shapes: the
// MultiHeadAttention layer (causal), forward + backward, with MatmulPrecisionGuard(bfloat16)
// and without, alternating (median of 8 after a warm-up), on both attention paths; then the
// large shape's output against float64 (relative 2-norm error and largest difference).
//
//   ./build/bench/bench_bf16 [threads]
#include <tapegrad/tapegrad.hpp>
#include <chrono>
#include <algorithm>
#include <cmath>
namespace tg = tapegrad;
// Median ms of f32 and bf16 forward+backward, alternating.
std::pair<double,double> run(tg::MultiHeadAttention& layer, const tg::Tensor& x, bool weights) {
  std::vector<double> ts[2];
  for (int r=0;r<9;++r) for (int bf16=0;bf16<2;++bf16){
    tg::MatmulPrecisionGuard g(bf16? tg::MatmulPrecision::bfloat16: tg::MatmulPrecision::exact);
    auto t0=std::chrono::steady_clock::now();
    auto res = layer.forward(x, {.causal=true, .need_weights=weights});
    tg::backward({res.output},{tg::ones_like(res.output)});
    if (r>0) ts[bf16].push_back(std::chrono::duration<double,std::milli>(std::chrono::steady_clock::now()-t0).count());
  }
  for (auto& t: ts) std::sort(t.begin(),t.end());
  return {ts[0][4], ts[1][4]};
}
int main(int argc,char**argv){
  tg::set_num_threads(argc>1?std::atoi(argv[1]):1);
  struct C{const char*n; long b,q,e,h;};
  for (C c: {C{"large",4,512,512,8}, C{"long",1,2048,256,4}}) {
    tg::MultiHeadAttention layer({.query_dim=c.e,.heads=c.h,.seed=1});
    auto x = tg::randn({c.b,c.q,c.e},2);
    for (bool w : {true,false}) {
      auto [f,b]=run(layer,x,w);
      fmt::print("{:<6} {} threads={}  float32 {:7.1f} ms  bfloat16 {:7.1f} ms  speed-up {:.2f}\n", c.n, w?"weights path":"fused path  ", tg::num_threads(), f,b,f/b);
    }
  }
  // accuracy: bf16 vs float64 output of large
  tg::MultiHeadAttention l64({.query_dim=512,.heads=8,.dtype=tg::float64,.seed=1});
  tg::MultiHeadAttention l32({.query_dim=512,.heads=8,.seed=1});
  auto x64 = tg::randn({4,512,512},2,tg::float64);
  auto o64 = l64.forward(x64, {.causal=true}).output;
  for (bool bf16 : {false,true}) {
    tg::MatmulPrecisionGuard g(bf16? tg::MatmulPrecision::bfloat16: tg::MatmulPrecision::exact);
    auto o = l32.forward(x64.to(tg::float32), {.causal=true, .need_weights=true}).output.to(tg::float64);
    auto a=o.to_vector<double>(), b=o64.to_vector<double>();
    double num=0,den=0,mx=0; for(size_t i=0;i<a.size();++i){double d=a[i]-b[i]; num+=d*d; den+=b[i]*b[i]; mx=std::max(mx,std::abs(d));}
    fmt::print("large output vs float64 ({}): relative 2-norm error {:.2e}, max abs {:.2e}\n", bf16?"bfloat16":"float32", std::sqrt(num/den), mx);
  }
}
