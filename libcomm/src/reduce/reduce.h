#pragma once
// Element conversion and the fused n-way reduction every reduce-style collective is built on.
// The accumulation is fp32 (except the opt-in fp64 partial sums at the end). A vectorised (AVX-512) implementation is chosen at run time
// when the CPU has it; a portable one otherwise (on x86-64 itself built for SSE2 and for AVX2, the
// loader picking one). All give bit-identical results, except which payload a NaN result carries
// when several NaNs meet (IEEE leaves that open; the result is a NaN either way).
//
// Every function here is reentrant: calls on disjoint outputs may run concurrently. Pointers must
// be aligned to their element size (any further misalignment is fine).

#include <cstddef>
#include <cstdint>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include "libcomm/convert.h"
#include "libcomm/types.h"

namespace libcomm::reduce {

/// For its lifetime, the calling thread computes with IEEE denormals: its flush-to-zero and
/// denormals-are-zero modes (MXCSR; torch.set_flush_denormal sets both) are cleared, and restored
/// after. Every reduction below takes one, so that a rank whose thread set them forms the same sums
/// as the others (an all_reduce's results are identical on every rank) and tiny values are not
/// lost. Reading the mode costs a few cycles; writing it happens only when it was set.
class IeeeArithmetic {
 public:
  IeeeArithmetic() {
#if defined(__x86_64__) || defined(__i386__)
    saved_ = _mm_getcsr();
    if (saved_ & kFlushModes) _mm_setcsr(saved_ & ~kFlushModes);
#endif
  }
  ~IeeeArithmetic() {
#if defined(__x86_64__) || defined(__i386__)
    if (saved_ & kFlushModes) _mm_setcsr(saved_);
#endif
  }
  IeeeArithmetic(const IeeeArithmetic&) = delete;
  IeeeArithmetic& operator=(const IeeeArithmetic&) = delete;

 private:
  static constexpr unsigned kFlushModes = 0x8040;  // FTZ (bit 15) and DAZ (bit 6)
  unsigned saved_ = 0;
};

/// bf16 (raw bits) -> fp32; exact.
void bf16ToFloat(const uint16_t* in, float* out, size_t n);
/// fp32 -> bf16 (raw bits), round to nearest even; NaN stays NaN (quiet), +-Inf stays Inf,
/// overflow past bf16's max rounds to Inf as IEEE rounding does.
void floatToBf16(const float* in, uint16_t* out, size_t n);

/// Scalar reference conversions (the public ones); every implementation matches them bit for bit.
inline float bf16ToFloatScalar(uint16_t b) { return libcomm::bf16ToFloat(b); }
inline uint16_t floatToBf16Scalar(float f) { return libcomm::floatToBf16(f); }

/// out[i] = (accumulate ? out[i] : 0) + scale * sum_k inputs[k][i], for i in [0, count).
/// Sums are formed in fp32 in input order k = 0..numInputs-1, then scaled once (scale == 1 skips
/// the multiply), then added to out when accumulating, then converted to outType. No fused
/// multiply-add: each step rounds on its own.
/// inType/outType: fp32 or bf16 (bf16 output from fp32 input is allowed here; the API refuses it).
/// accumulate is meant for outType fp32 (the API's rule); with a bf16 output the kernels read the
/// old bf16 values and work the same way. `out` may alias one input exactly (in place); no other
/// overlap. numInputs >= 1; count == 0 touches no memory.
/// Each input is read once and the output written once, in one pass. Outputs of at least
/// detail::ntStoreThresholdBytes() (LIBCOMM_NT_STORE_BYTES) are written with streaming stores, followed by a store
/// fence before returning, so a flag stored after the call is not seen before the data.
struct ReduceArgs {
  const void* const* inputs = nullptr;
  int numInputs = 0;
  DataType inType = DataType::kFloat32;
  void* out = nullptr;
  DataType outType = DataType::kFloat32;
  size_t count = 0;
  float scale = 1.0f;
  bool accumulate = false;
};
void reduce(const ReduceArgs& args);

/// fp64 partial sums (CommConfig::reducePartials = fp64; algos/ring). Portable loops: memory
/// bound, and used only on that opt-in path.
/// out[i] = in[i], or out[i] += in[i] when `add`, with `in` of type t widened to fp64. Widening is
/// exact, and so is each addition while the sum fits in fp64's 53 significant bits: for N terms,
/// bf16 values whose magnitudes span less than about 2^(45 - log2 N), fp32 values less than
/// 2^(29 - log2 N).
void widenToDouble(const void* in, DataType t, double* out, size_t n, bool add);
/// out[i] = sum over k of inputs[k][i], inputs of type t widened to fp64, added in order k = 0..
/// numInputs - 1 (exact within the range above). numInputs >= 1.
void sumToDouble(const void* const* inputs, int numInputs, DataType t, double* out, size_t n);
/// out[i] += in[i] (fp64 host sums into fp64 partials).
void addDoubles(const double* in, double* out, size_t n);
/// out[i] = scale * in[i] (+ out[i] when accumulating), in outType: formed in fp64 (the product and
/// the sum each round at fp64's precision), then rounded to outType, to nearest even. With scale 1
/// and no accumulation that is the one rounding: an exact sum in `in` becomes its correctly
/// rounded value.
void roundFromDouble(const double* in, void* out, DataType outType, size_t n, float scale, bool accumulate);
/// `v` rounded to bf16 (raw bits) once, to nearest even, as floatToBf16 does for fp32.
uint16_t doubleToBf16Scalar(double v);

/// "avx512" or "portable": the implementation reduce()/conversions use on this CPU.
const char* kernelName();
/// Forces the portable implementation (tests compare the two). Not thread-safe against running
/// reductions.
void forcePortable(bool on);

}  // namespace libcomm::reduce
