// Matrix products on f32 activations: packed weights (prepared at load) by
// the blocked GEMM of the chosen path, weights in their stored layout (not
// prepared: tests, tools) by one dot per (weight row, activation row).
#include <omp.h>

#include <algorithm>
#include <vector>

#include "backend/cpu/ops.h"
#include "backend/cpu/packed.h"
#include "backend/cpu/simd.h"

namespace wick::cpu {

namespace {

// The activations of one product in the form m's path takes, in buffers of
// the calling thread (reused from call to call).
ActRows activations(const PackedMatrix& m, const float* x, int64_t n_rows, bool parallel) {
  thread_local std::vector<int8_t> q;
  thread_local std::vector<ActBlock> blk;
  thread_local std::vector<uint32_t> h;
  const auto& k = simd();
  ActRows a;
  a.path = m.path;
  a.n_rows = n_rows;
  switch (m.path) {
    case GemmPath::F32:
      a.x = x;
      a.ldx = m.n_in;
      break;
    case GemmPath::I8:
    case GemmPath::I8X3: {
      const int n_levels = m.path == GemmPath::I8X3 ? 3 : 1;
      a.ldq = n_levels * m.k_pad;
      a.ldb = n_levels * m.k_pad / 32;
      if (q.size() < size_t(n_rows * a.ldq)) q.resize(size_t(n_rows * a.ldq));
      if (blk.size() < size_t(n_rows * a.ldb)) blk.resize(size_t(n_rows * a.ldb));
      // (the workers below see these buffers through a, not by their thread_local names)
      int8_t* qp = q.data();
      ActBlock* bp = blk.data();
      a.q = qp;
      a.blk = bp;
      // one row per iteration: a row's values never depend on the others
#pragma omp parallel for schedule(static) num_threads(n_threads()) if (parallel && n_rows >= 8)
      for (int64_t r = 0; r < n_rows; ++r)
        k.quantize_rows(x + r * m.n_in, m.n_in, 1, m.n_in, n_levels, qp + r * a.ldq, a.ldq,
                        bp + r * a.ldb, a.ldb);
      break;
    }
    case GemmPath::BF16: {
      a.ldh = m.k_pad / 2;
      if (h.size() < size_t(n_rows * a.ldh)) h.resize(size_t(n_rows * a.ldh));
      a.h = h.data();
      k.bf16_rows(x, m.n_in, n_rows, m.n_in, h.data(), a.ldh);
      break;
    }
  }
  return a;
}

}  // namespace

void matmul_packed(const PackedMatrix& m, const float* x, int64_t n_rows, float* y) {
  const auto& k = simd();
  const bool parallel = m.n_out * m.n_in * n_rows > 32768;
  const ActRows a = activations(m, x, n_rows, parallel);
  // Contiguous runs of panels per thread: a panel's outputs are computed the
  // same way whoever computes them.
  const int n_t = parallel ? int(std::min<int64_t>(n_threads(), m.n_panels)) : 1;
  if (n_t == 1) return k.gemm(m, a, 0, m.n_panels, y);
#pragma omp parallel num_threads(n_t)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    k.gemm(m, a, m.n_panels * t / nt, m.n_panels * (t + 1) / nt, y);
  }
}

void matmul_shared_input(std::span<const Weight* const> ws, const float* x, int64_t n_rows,
                         float* const* ys) {
  // One activation pass serves them all where they take the same form (path and row length).
  const PackedMatrix* first = packed_of(*ws[0]);
  bool shared = first != nullptr;
  int64_t n_panels = 0, work = 0;
  for (const Weight* w : ws) {
    const PackedMatrix* m = packed_of(*w);
    shared =
        shared && m && m->path == first->path && m->n_in == first->n_in && m->k_pad == first->k_pad;
    if (!shared) break;
    n_panels += m->n_panels;
    work += m->n_out * m->n_in * n_rows;
  }
  if (!shared) {
    for (size_t i = 0; i < ws.size(); ++i) matmul(*ws[i], x, n_rows, ys[i]);
    return;
  }
  const auto& k = simd();
  const bool parallel = work > 32768;
  const ActRows a = activations(*first, x, n_rows, parallel);
  // The matrices' panels end to end, in contiguous runs per thread (one region, not one each).
  auto run = [&](int64_t p0, int64_t p1) {
    int64_t off = 0;
    for (size_t i = 0; i < ws.size() && off < p1; ++i) {
      const PackedMatrix& m = *packed_of(*ws[i]);
      const int64_t lo = std::max(p0, off), hi = std::min(p1, off + m.n_panels);
      if (lo < hi) k.gemm(m, a, lo - off, hi - off, ys[i]);
      off += m.n_panels;
    }
  };
  const int n_t = parallel ? int(std::min<int64_t>(n_threads(), n_panels)) : 1;
  if (n_t == 1) return run(0, n_panels);
#pragma omp parallel num_threads(n_t)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    run(n_panels * t / nt, n_panels * (t + 1) / nt);
  }
}

void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) {
  if (const PackedMatrix* m = packed_of(w)) return matmul_packed(*m, x, n_rows, y);
  const auto& k = simd();
  const int64_t n_in = w.n_in, n_out = w.n_out;
  const bool direct = w.dtype == DType::F32;
  // Rows of w are split across threads; each weight row is dequantized once
  // and reused for every activation row.
#pragma omp parallel for schedule(static) \
    num_threads(n_threads()) if (n_out * n_in * n_rows > 32768)
  for (int64_t o = 0; o < n_out; ++o) {
    if (n_rows < 4) {  // decode: no pass through a buffer (same bits either way)
      float* buf = direct ? nullptr : thread_buf(size_t(n_in));
      for (int64_t r = 0; r < n_rows; ++r)
        y[r * n_out + o] = k.dot_row(w.dtype, w.row(o), x + r * n_in, n_in, buf);
      continue;
    }
    const float* wr;
    if (direct) {
      wr = reinterpret_cast<const float*>(w.row(o));
    } else {
      float* buf = thread_buf(size_t(n_in));
      k.dequant_row(w.dtype, w.row(o), buf, n_in);
      wr = buf;
    }
    for (int64_t r = 0; r < n_rows; ++r) y[r * n_out + o] = k.dot(x + r * n_in, wr, n_in);
  }
}

}  // namespace wick::cpu
