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

// One product on a packed weight.
struct PackedJob {
  const PackedMatrix* m;
  const float* x;
  int64_t n_rows;
  float* y;
};

// The activations of a call's distinct inputs, end to end in one buffer per form, in buffers of
// the calling thread (reused from call to call; the workers see them through the ActRows).
struct ActBuffers {
  std::vector<int8_t> q;
  std::vector<ActBlock> blk;
  std::vector<uint32_t> h;
  std::vector<const float*> src;  // the f32 row each activation row is made from
  std::vector<ActRows> of_job;
  std::vector<int64_t> row0;  // each job's first activation row
};

// Room for n_rows activation rows of m's form (rows not yet filled).
ActRows act_layout(const PackedMatrix& m, int64_t n_rows, ActBuffers& b) {
  ActRows a;
  a.path = m.path;
  a.n_rows = n_rows;
  a.ldx = m.n_in;
  switch (m.path) {
    case GemmPath::F32:
      break;
    case GemmPath::I8:
    case GemmPath::I8X3: {
      const int n_levels = m.path == GemmPath::I8X3 ? 3 : 1;
      a.ldq = n_levels * m.k_pad;
      a.ldb = n_levels * m.k_pad / 32;
      if (b.q.size() < size_t(n_rows * a.ldq)) b.q.resize(size_t(n_rows * a.ldq));
      if (b.blk.size() < size_t(n_rows * a.ldb)) b.blk.resize(size_t(n_rows * a.ldb));
      a.q = b.q.data();
      a.blk = b.blk.data();
      break;
    }
    case GemmPath::BF16:
      a.ldh = m.k_pad / 2;
      if (b.h.size() < size_t(n_rows * a.ldh)) b.h.resize(size_t(n_rows * a.ldh));
      a.h = b.h.data();
      break;
  }
  return a;
}

// Rows [row0, row0 + n_rows) of the buffer, made from x (F32: x itself).
ActRows act_rows(const ActRows& all, int64_t row0, int64_t n_rows, const float* x) {
  ActRows a = all;
  a.n_rows = n_rows;
  a.x = x;
  if (a.q) a.q += row0 * a.ldq;
  if (a.blk) a.blk += row0 * a.ldb;
  if (a.h) a.h += row0 * a.ldh;
  return a;
}

// Row r of the buffer from the f32 row x (a row's values never depend on the others).
void act_fill(const SimdKernels& k, const PackedMatrix& m, const ActRows& all, int64_t r,
              const float* x) {
  switch (m.path) {
    case GemmPath::F32:
      break;
    case GemmPath::I8:
    case GemmPath::I8X3:
      k.quantize_rows(x, m.n_in, 1, m.n_in, m.path == GemmPath::I8X3 ? 3 : 1,
                      const_cast<int8_t*>(all.q) + r * all.ldq, all.ldq,
                      const_cast<ActBlock*>(all.blk) + r * all.ldb, all.ldb);
      break;
    case GemmPath::BF16:
      k.bf16_rows(x, m.n_in, 1, m.n_in, const_cast<uint32_t*>(all.h) + r * all.ldh, all.ldh);
      break;
  }
}

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// Products whose weights share one packed form (path, n_in, k_pad), in one parallel region:
// the distinct inputs are converted once (a job reading the same rows as the job before it
// shares its activations), then the jobs' panels, end to end, are split into contiguous runs of
// equal work (a panel's cost taken as its job's rows + 1: the weights streamed, then each row).
// A panel's outputs are computed the same way whoever computes them, so every job has the bits
// of its own matmul.
void run_packed(std::span<const PackedJob> jobs) {
  const auto& k = simd();
  const PackedMatrix& form = *jobs[0].m;
  thread_local ActBuffers buffers;
  ActBuffers& b = buffers;  // the caller's, also inside the region
  b.src.clear();
  b.of_job.resize(jobs.size());
  b.row0.resize(jobs.size());
  std::vector<int64_t>& row0 = b.row0;
  int64_t work = 0, n_panels = 0, cost = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const PackedJob& j = jobs[i];
    const bool shares = i > 0 && j.x == jobs[i - 1].x && j.n_rows == jobs[i - 1].n_rows;
    row0[i] = shares ? row0[i - 1] : int64_t(b.src.size());
    if (!shares)
      for (int64_t r = 0; r < j.n_rows; ++r) b.src.push_back(j.x + r * form.n_in);
    work += j.m->n_out * j.m->n_in * j.n_rows;
    n_panels += j.m->n_panels;
    cost += j.m->n_panels * (j.n_rows + 1);
  }
  const int64_t n_act = int64_t(b.src.size());
  const ActRows all = act_layout(form, n_act, b);
  for (size_t i = 0; i < jobs.size(); ++i)
    b.of_job[i] = act_rows(all, row0[i], jobs[i].n_rows, jobs[i].x);
  // The panels whose cost starts in [c0, c1).
  auto run = [&](int64_t c0, int64_t c1) {
    int64_t at = 0;
    for (size_t i = 0; i < jobs.size() && at < c1; ++i) {
      const PackedJob& j = jobs[i];
      const int64_t per = j.n_rows + 1;
      const int64_t p0 = std::min(j.m->n_panels, ceil_div(std::max<int64_t>(c0 - at, 0), per));
      const int64_t p1 = std::min(j.m->n_panels, ceil_div(std::max<int64_t>(c1 - at, 0), per));
      if (p0 < p1) k.gemm(*j.m, b.of_job[i], p0, p1, j.y);
      at += j.m->n_panels * per;
    }
  };
  const bool parallel = work > 32768;
  const int n_t = parallel ? int(std::min<int64_t>(n_threads(), n_panels)) : 1;
  // Few rows: converted before the region (no barrier inside it for a few microseconds' work).
  const bool fill_inside = n_t > 1 && n_act >= 8;
  if (!fill_inside)
    for (int64_t r = 0; r < n_act; ++r) act_fill(k, form, all, r, b.src[size_t(r)]);
  if (n_t == 1) return run(0, cost);
#pragma omp parallel num_threads(n_t)
  {
    if (fill_inside) {
#pragma omp for schedule(static)
      for (int64_t r = 0; r < n_act; ++r) act_fill(k, form, all, r, b.src[size_t(r)]);
    }
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    run(cost * t / nt, cost * (t + 1) / nt);
  }
}

}  // namespace

void matmul_packed(const PackedMatrix& m, const float* x, int64_t n_rows, float* y) {
  const PackedJob job{&m, x, n_rows, y};
  run_packed(std::span<const PackedJob>(&job, 1));
}

void matmul_many(std::span<const MatmulJob> jobs) {
  if (jobs.empty()) return;
  thread_local std::vector<PackedJob> packed;
  packed.clear();
  const PackedMatrix* form = packed_of(*jobs[0].w);
  for (const MatmulJob& j : jobs) {
    const PackedMatrix* m = packed_of(*j.w);
    if (!m || !form || m->path != form->path || m->n_in != form->n_in || m->k_pad != form->k_pad)
      break;
    packed.push_back({m, j.x, j.n_rows, j.y});
  }
  if (packed.size() == jobs.size()) return run_packed(packed);
  for (const MatmulJob& j : jobs) matmul(*j.w, j.x, j.n_rows, j.y);
}

void matmul_shared_input(std::span<const Weight* const> ws, const float* x, int64_t n_rows,
                         float* const* ys) {
  thread_local std::vector<MatmulJob> jobs;
  jobs.clear();
  for (size_t i = 0; i < ws.size(); ++i) jobs.push_back({ws[i], x, n_rows, ys[i]});
  matmul_many(jobs);
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
