#pragma once
// The one matrix product every tinylm layer is built on: C (+)= op(A) . op(B) with fp32
// activations A, fp32 or bf16 weights B, fp32 accumulation and fp32 C.
//
// Every element of C is accumulated in one fp32 sum, in increasing k, starting from C's old
// value (accumulate) or from zero: the result is that of the plain loop
//     for k in 0..K: c += a(m, k) * b(k, n)
// (with fused multiply-adds on CPUs that have them), whatever M and N are and however the work is
// blocked. So splitting the rows of A (e.g. into micro-batches) never changes a row's result.

#include <cstddef>
#include <cstdint>

namespace tinylm {

/// The left operand, fp32. Element (m, k) is data[m * ld + k], or data[k * ld + m] when
/// transposed (then the stored matrix is [K, M]).
struct MatA {
  const float* data = nullptr;
  size_t ld = 0;
  bool transposed = false;
};

/// The right operand, fp32 or bf16 raw bits. Element (k, n) is data[k * ld + n], or
/// data[n * ld + k] when transposed (then the stored matrix is [N, K]: a weight W [out, in]
/// applied as x . W^T is MatB{W, in, ..., transposed = true}).
struct MatB {
  const void* data = nullptr;
  size_t ld = 0;
  bool transposed = false;
  bool bf16 = false;
};

/// C[m * ldc + n] = (accumulate ? C[m * ldc + n] : 0) + sum_k A(m, k) B(k, n) for m < M, n < N.
/// Single-threaded; reentrant across threads (its scratch is thread-local). K == 0 leaves C (or
/// zeroes it).
void gemm(size_t M, size_t N, size_t K, const MatA& a, const MatB& b, float* c, size_t ldc, bool accumulate);

/// "avx2+fma" or "portable": which build of the kernel this CPU runs.
const char* gemmKernelName();

}  // namespace tinylm
