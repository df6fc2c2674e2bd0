// The public conversion entry points (libcomm/convert.h) over the dispatched kernels.

#include "libcomm/convert.h"

#include "reduce/reduce.h"

namespace libcomm {

void bf16ToFloat(const uint16_t* in, float* out, size_t n) { reduce::bf16ToFloat(in, out, n); }
void floatToBf16(const float* in, uint16_t* out, size_t n) { reduce::floatToBf16(in, out, n); }

}  // namespace libcomm
