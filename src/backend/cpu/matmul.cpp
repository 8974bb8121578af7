// Matrix products on stored weight types (f32 activations).
#include <omp.h>

#include "backend/cpu/ops.h"
#include "backend/cpu/simd.h"

namespace wick::cpu {

void matmul(const Weight& w, const float* x, int64_t n_rows, float* y) {
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
