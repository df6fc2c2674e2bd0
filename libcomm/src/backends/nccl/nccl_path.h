#pragma once
// The NCCL backend as the communicator sees it (no NCCL headers, so core code compiles in every
// build): device collectives delegated to NCCL on the caller's CUDA stream. Null without NCCL.
//
// Mapping: fp32 -> ncclFloat32, bf16 -> ncclBfloat16; sum -> ncclSum, avg -> ncclAvg, premulSum ->
// an operator from ncclRedOpCreatePreMulSum (scale as a host scalar of the reduction's type),
// destroyed once the call is enqueued. NCCL reduces in one type, so the mixed cases go through
// libcomm's reduce kernel on the same stream:
//  - reduce_scatter bf16 -> fp32: the input is converted to an fp32 scratch (exact), then NCCL
//    reduces fp32 -- fp32 accumulation as the contract says, at twice the bytes on the wire;
//  - accumulate into an fp32 output (reduce_scatter, all_reduce): NCCL writes a scratch that the
//    kernel adds to the output;
//  - bf16 -> bf16 (reduce_scatter, all_reduce): fp32 as above, then one rounding to bf16, unless
//    the delegate was made for a bf16 wire (createDelegate).
// Scratch comes from the stream-ordered allocator (cudaMallocAsync/cudaFreeAsync on the stream):
// a later call on the stream reuses a freed block, but the device's default pool keeps freed
// memory only until the next synchronization (its release threshold is 0 unless the process raises
// cudaMemPoolAttrReleaseThreshold, which libcomm leaves to it: the pool is the process's), so
// after a synchronize the next call allocates from the driver again.

#include <memory>
#include <string>

#include "core/collective.h"
#include "libcomm/bootstrap.h"
#include "libcomm/status.h"

namespace libcomm::nccl {

class Delegate {
 public:
  virtual ~Delegate() = default;
  /// Creates the NCCL communicator on the first call (collective: every rank calls it at the same
  /// collective; the unique id travels through `boot`); later calls check that `device` is the
  /// device it was made for. Bounded by `deadline`.
  virtual Status ensureComm(Bootstrap& boot, int rank, int size, int device, Deadline deadline) = 0;
  /// Enqueues `args` on `stream` (a cudaStream_t of `device`); waits for NCCL's non-blocking enqueue
  /// at most until `deadline`. `what` names the call in errors.
  virtual Status run(const CollArgs& args, void* stream, int device, Deadline deadline, const std::string& what) = 0;
  /// The error NCCL reports for the communicator after calls were enqueued (ncclCommGetAsyncError:
  /// a peer lost, a network failure), OK when none or no communicator was made. Non-blocking; any
  /// thread (OK while another thread's call holds the communicator: that call looks itself). NCCL's
  /// kernels keep waiting after such an error until the communicator is aborted.
  virtual Status pollAsyncError() = 0;
  /// Finalizes and destroys the communicator, if one was made (bounded).
  virtual Status destroy(Deadline deadline) = 0;
  /// Aborts the communicator (ncclCommAbort: NCCL kernels still waiting for a peer end, so that
  /// freeing device memory or synchronizing the device afterwards cannot hang on them); later
  /// calls fail. Any thread; does not wait for a call in progress on another thread (that call
  /// aborts the communicator as it returns).
  virtual void abort() = 0;
};

/// Null in builds without NCCL. `bf16Wire`: a reduction of bf16 input to bf16 output goes to NCCL
/// in bf16 (LIBCOMM_RS_PARTIALS=bf16: half the bytes, every ring step rounding the partial sum to
/// bf16); otherwise in fp32, rounded to bf16 once at the end.
std::unique_ptr<Delegate> createDelegate(bool bf16Wire = false);
bool builtWithNccl();

}  // namespace libcomm::nccl
