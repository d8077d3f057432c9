// The streaming heads' band past the prefix, exact per query position (corelens/attention/kernels/band.py).
//
// A tile of R query positions i0 .. i0 + R - 1 of the g query heads that share one KV head (stacked: M = g R
// rows) needs the S sink keys and the W + R - 1 window keys i0 - W + 1 .. i0 + R - 1; row r of a head keeps
// window columns r .. r + W - 1. Per tile: two GEMMs for the scores (sinks, window; read in place), the exact
// softmax over each row's own keys (the R - 1 columns outside its window are zeroed, never exponentiated),
// two GEMMs for the values, and the normalised rows written into the output. Tiles are independent and run
// in parallel; every buffer is thread-local and small enough to stay in cache. fp32 throughout.
#if defined(__AVX2__) && defined(__FMA__) && !defined(CPU_CAPABILITY_AVX2)
#define CPU_CAPABILITY_AVX2
#endif
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

extern "C" void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                       const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                       const float* beta, float* c, const int* ldc);

namespace {

using Vec = at::vec::Vectorized<float>;

float max_of(const float* x, int64_t n, float m) {
  int64_t i = 0;
  if (n >= Vec::size()) {
    Vec acc = Vec::loadu(x);
    for (i = Vec::size(); i + Vec::size() <= n; i += Vec::size()) {
      acc = at::vec::maximum(acc, Vec::loadu(x + i));
    }
    m = std::max(m, at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, acc));
  }
  for (; i < n; ++i) {
    m = std::max(m, x[i]);
  }
  return m;
}

// x[i] = exp(x[i] - m) in place; returns the sum.
float exp_sum(float* x, int64_t n, float m) {
  const Vec vm(m);
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + Vec::size() <= n; i += Vec::size()) {
    Vec e = (Vec::loadu(x + i) - vm).exp_u20();
    e.store(x + i);
    acc = acc + e;
  }
  float s = at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, acc);
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  return s;
}

// Row-major C (m x n, leading dimension ldc) = A (m x kk) times B (kk x n), or times B^T when B is stored
// n x kk (`b_transposed`), plus beta C, through the Fortran BLAS that torch links and exports (MKL on x86;
// the CPU flash kernel's own GEMM): inside a parallel region it runs on the calling thread.
void gemm(int64_t m, int64_t n, int64_t kk, const float* a, int64_t lda, const float* b, int64_t ldb,
          bool b_transposed, float beta, float* c, int64_t ldc) {
  const char tb = b_transposed ? 'T' : 'N', ta = 'N';
  const int cm = static_cast<int>(n), cn = static_cast<int>(m), ck = static_cast<int>(kk);
  const int la = static_cast<int>(ldb), lb = static_cast<int>(lda), lc = static_cast<int>(ldc);
  const float alpha = 1.f;
  sgemm_(&tb, &ta, &cm, &cn, &ck, &alpha, b, &la, a, &lb, &beta, c, &lc);
}

}  // namespace

// q (Hq, n, d), k (n, d), v (n, dv), out (n, Ho, dv): fp32, last dimension contiguous. Query head q_heads[h]
// of the group writes out head o_heads[h]. Rows end .. n - 1 are computed; the sinks are keys start ..
// start + sink - 1 and end >= start + sink + window, so no window reaches a sink.
void band(const at::Tensor& q, const at::Tensor& q_heads, const at::Tensor& k, const at::Tensor& v, at::Tensor& out,
          const at::Tensor& o_heads, int64_t start, int64_t end, int64_t sink, int64_t window, double scale,
          int64_t rows) {
  TORCH_CHECK(q.scalar_type() == at::kFloat && k.scalar_type() == at::kFloat && v.scalar_type() == at::kFloat &&
                  out.scalar_type() == at::kFloat,
              "band: fp32 tensors expected");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(1) == 1 && v.stride(1) == 1 && out.stride(2) == 1,
              "band: the last dimension must be contiguous");
  TORCH_CHECK(end >= start + sink + window && window >= 1 && rows >= 1, "band: end must follow the prefix");
  const int64_t n = k.size(0), d = q.size(2), dv = v.size(1), g = q_heads.size(0);
  TORCH_CHECK(q.size(1) == n && v.size(0) == n && out.size(0) == n && k.size(1) == d && out.size(2) == dv &&
                  o_heads.size(0) == g,
              "band: q (Hq, n, d), k (n, d), v (n, dv), out (n, Ho, dv) and one output head per query head");
  const auto qh = q_heads.to(at::kLong).contiguous(), oh = o_heads.to(at::kLong).contiguous();
  TORCH_CHECK(g == 0 || (qh.min().item<int64_t>() >= 0 && qh.max().item<int64_t>() < q.size(0) &&
                         oh.min().item<int64_t>() >= 0 && oh.max().item<int64_t>() < out.size(1)),
              "band: head index out of range");
  const int64_t* qi = qh.data_ptr<int64_t>();
  const int64_t* oi = oh.data_ptr<int64_t>();
  const float* qp = q.data_ptr<float>();
  const float* kp = k.data_ptr<float>();
  const float* vp = v.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t q_sh = q.stride(0), q_sn = q.stride(1), k_sn = k.stride(0), v_sn = v.stride(0);
  const int64_t o_sn = out.stride(0), o_sh = out.stride(1);
  const int64_t tiles = n > end ? (n - end + rows - 1) / rows : 0;
  const float fscale = static_cast<float>(scale);

  at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
    const int64_t m_max = g * rows, w_max = window + rows - 1;
    std::vector<float> qb(m_max * d), sb(m_max * std::max<int64_t>(sink, 1)), wb(m_max * w_max), ob(m_max * dv);
    std::vector<float> inv(m_max);
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t i0 = end + t * rows, rt = std::min(rows, n - i0), m = g * rt;
      const int64_t w0 = i0 - window + 1, nw = window + rt - 1;
      for (int64_t h = 0; h < g; ++h) {  // stacked, pre-scaled queries: row h * rt + r
        for (int64_t r = 0; r < rt; ++r) {
          const float* src = qp + qi[h] * q_sh + (i0 + r) * q_sn;
          float* dst = qb.data() + (h * rt + r) * d;
          at::vec::map([fscale](Vec x) { return x * Vec(fscale); }, dst, src, d);
        }
      }
      gemm(m, nw, d, qb.data(), d, kp + w0 * k_sn, k_sn, true, 0.f, wb.data(), nw);
      if (sink > 0) {
        gemm(m, sink, d, qb.data(), d, kp + start * k_sn, k_sn, true, 0.f, sb.data(), sink);
      }
      for (int64_t row = 0; row < m; ++row) {  // row r of its head keeps window columns r .. r + W - 1
        const int64_t r = row % rt;
        float* s = sb.data() + row * sink;
        float* w = wb.data() + row * nw;
        const float mx = max_of(w + r, window, max_of(s, sink, -std::numeric_limits<float>::infinity()));
        const float total = exp_sum(s, sink, mx) + exp_sum(w + r, window, mx);
        std::fill(w, w + r, 0.f);
        std::fill(w + r + window, w + nw, 0.f);
        inv[row] = 1.f / total;
      }
      gemm(m, dv, nw, wb.data(), nw, vp + w0 * v_sn, v_sn, false, 0.f, ob.data(), dv);
      if (sink > 0) {
        gemm(m, dv, sink, sb.data(), sink, vp + start * v_sn, v_sn, false, 1.f, ob.data(), dv);
      }
      for (int64_t h = 0; h < g; ++h) {
        for (int64_t r = 0; r < rt; ++r) {
          const int64_t row = h * rt + r;
          const float f = inv[row];
          at::vec::map([f](Vec x) { return x * Vec(f); }, op + (i0 + r) * o_sn + oi[h] * o_sh, ob.data() + row * dv,
                       dv);
        }
      }
    }
  });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("band", &band, "streaming heads past the prefix: sinks + sliding window, exact per query (fp32)");
}
