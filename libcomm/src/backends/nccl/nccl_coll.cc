// Device collectives delegated to NCCL (contract and type mapping: nccl_path.h).

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#include "backends/nccl/nccl_comm.h"
#include "backends/nccl/nccl_error.h"
#include "backends/nccl/nccl_path.h"
#include "libcomm/convert.h"

namespace libcomm::nccl {
namespace {

ncclDataType_t ncclType(DataType t) { return t == DataType::kFloat32 ? ncclFloat32 : ncclBfloat16; }

class DelegateImpl final : public Delegate {
 public:
  explicit DelegateImpl(bool bf16Wire) : bf16Wire_(bf16Wire) {}
  ~DelegateImpl() override = default;  // Comm's destructor aborts a communicator not destroyed

  Status ensureComm(Bootstrap& boot, int rank, int size, int device, Deadline deadline) override {
    const Holder hold(*this);
    if (aborted_.load()) return makeError(StatusCode::kRemoteError, "rank ", rank, ": the NCCL communicator was aborted");
    if (comm_) {
      if (comm_->device() != device)
        return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": NCCL collective on a stream of device ", device,
                         ", but this rank's NCCL communicator was made for device ", comm_->device(),
                         "; a communicator uses one device per rank");
      return Status::ok();
    }
    LIBCOMM_ASSIGN_OR_RETURN(ncclUniqueId id, shareUniqueId(boot, deadline));
    LIBCOMM_ASSIGN_OR_RETURN(comm_, initComm(id, rank, size, device, deadline, &aborted_));
    return Status::ok();
  }

  Status pollAsyncError() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return Status::ok();
    return asyncErrorLocked();
  }

  Status destroy(Deadline deadline) override {
    const Holder hold(*this);
    if (!comm_) return Status::ok();
    Status s = comm_->destroy(deadline, &aborted_);
    comm_.reset();
    return s;
  }

  void abort() override {
    aborted_.store(true);
    // Either the lock is free (abort here), or a call holds it (busy_: it aborts as it returns,
    // having seen aborted_ after its unlock). A failed try_lock with no holder (one just taking or
    // leaving the lock, or a spurious failure) tries again.
    for (;;) {
      if (mu_.try_lock()) {
        comm_.reset();  // ~Comm calls ncclCommAbort
        mu_.unlock();
        return;
      }
      if (busy_.load()) return;
      std::this_thread::yield();
    }
  }

  Status run(const CollArgs& a, void* stream, int device, Deadline deadline, const std::string& what) override {
    const Holder hold(*this);
    if (aborted_.load()) return makeError(StatusCode::kRemoteError, what, ": the NCCL communicator was aborted");
    if (!comm_) return makeError(StatusCode::kInternalError, what, ": no NCCL communicator");
    // Nothing to move (every rank has the same count): no scratch of 0 bytes from cudaMallocAsync,
    // no NCCL call with null buffers.
    if (a.count == 0) return Status::ok();
    cuda::DeviceGuard guard(device);
    LIBCOMM_RETURN_IF_ERROR(guard.status().withContext(what));
    s_ = static_cast<cudaStream_t>(stream);
    deadline_ = deadline;
    // A collective enqueued earlier may have failed since (its kernels then wait for ever): no new
    // one behind it.
    Status st = asyncErrorLocked();
    if (st.isOk()) st = dispatch(a, device);
    return st.isOk() ? st
                     : st.withContext(detail::strCat(what, " (NCCL, rank ", comm_->rank(), " of ", comm_->size(), ")"));
  }

 private:
  // With mu_ held (or from the call that holds it).
  Status asyncErrorLocked() {
    if (!comm_) return Status::ok();
    ncclResult_t state = ncclSuccess;
    const ncclResult_t r = LIBCOMM_NCCL_FN(CommGetAsyncError)(comm_->get(), &state);
    if (r != ncclSuccess) return statusFromNccl(r, "ncclCommGetAsyncError", __FILE__, __LINE__);
    if (state == ncclSuccess || state == ncclInProgress) return Status::ok();
    return statusFromNccl(state, "an NCCL collective enqueued earlier", __FILE__, __LINE__);
  }

  // NCCL's non-blocking communicators may answer ncclInProgress while a call is being enqueued:
  // polls until it is, or the deadline passes. Given up while NCCL may still be enqueueing, the
  // call may yet read the buffers and operator it was given: unsettled_ says not to free them, and
  // the communicator is aborted as the call returns (Holder), which ends it.
  Status check(ncclResult_t r, const char* call) {
    if (r == ncclInProgress) {
      for (;;) {
        ncclResult_t state = ncclSuccess;
        r = LIBCOMM_NCCL_FN(CommGetAsyncError)(comm_->get(), &state);
        if (r != ncclSuccess) break;
        r = state;
        if (state != ncclInProgress) break;
        const bool late = deadline_.expired();
        if (late || aborted_.load()) {
          unsettled_ = true;
          aborted_.store(true);
          return late ? makeError(StatusCode::kTimeout, call,
                                  ": NCCL did not finish enqueueing by the deadline; "
                                  "communicator aborted")
                      : makeError(StatusCode::kRemoteError, call, ": the NCCL communicator was aborted");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    return statusFromNccl(r, call, __FILE__, __LINE__);
  }

  Result<void*> scratch(size_t bytes) {
    void* p = nullptr;
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cuda::cudart().cudaMallocAsync(&p, bytes, s_)));
    return p;
  }
  void release(void* p) {
    if (p && !unsettled_) (void)cuda::cudart().cudaFreeAsync(p, s_);  // (unsettled: left to leak, see check)
  }

  Status kernel(const void* in, void* out, size_t count, DataType inType, bool accumulate, int device) {
    cuda::ReduceLaunch l;
    l.inputs[0] = in;
    l.numInputs = 1;
    l.out = out;
    l.count = count;
    l.inType = inType;
    l.outType = DataType::kFloat32;
    l.accumulate = accumulate;
    return cuda::launchReduce(l, s_, device);
  }

  // The operator for `a` in `type`; a premulSum operator is created here and destroyed by the caller.
  Result<ncclRedOp_t> op(const CollArgs& a, ncclDataType_t type) {
    if (a.reduce.op == ReduceOp::kSum) return ncclSum;
    if (a.reduce.op == ReduceOp::kAvg) return ncclAvg;
    ncclRedOp_t made;
    float f = a.reduce.scale;
    uint16_t b = floatToBf16(f);
    void* scalar = type == ncclFloat32 ? static_cast<void*>(&f) : static_cast<void*>(&b);
    LIBCOMM_RETURN_IF_ERROR(check(LIBCOMM_NCCL_FN(RedOpCreatePreMulSum)(&made, scalar, type, ncclScalarHostImmediate, comm_->get()),
                                  "ncclRedOpCreatePreMulSum"));
    return made;
  }
  void dropOp(const CollArgs& a, ncclRedOp_t op) {
    if (a.reduce.op == ReduceOp::kPremulSum && !unsettled_) (void)LIBCOMM_NCCL_FN(RedOpDestroy)(op, comm_->get());
  }

  Status dispatch(const CollArgs& a, int device) {
    ncclComm_t c = comm_->get();
    switch (a.kind) {
      case CollKind::kAllGather:
        return check(LIBCOMM_NCCL_FN(AllGather)(a.send, a.recv, a.count, ncclType(a.inType), c, s_), "ncclAllGather");
      case CollKind::kBroadcast:
        return check(LIBCOMM_NCCL_FN(Broadcast)(a.send, a.recv, a.count, ncclType(a.inType), a.root, c, s_), "ncclBroadcast");
      case CollKind::kAllReduce:
      case CollKind::kReduceScatter:
        return reduce(a, device);
      case CollKind::kBarrier:
        break;
    }
    return makeError(StatusCode::kInternalError, "no NCCL mapping for ", collName(a.kind));
  }

  Status reduce(const CollArgs& a, int device) {
    const bool rs = a.kind == CollKind::kReduceScatter;
    const int size = comm_->size();
    // bf16 input travels as fp32: NCCL reduces in its wire type, and a bf16 wire would round every
    // partial sum to bf16 between ring steps. A bf16 output is rounded once, at the end -- unless
    // the communicator asked for bf16 partials (bf16Wire_), for bf16 output only.
    const bool bf16Out = a.outType == DataType::kBFloat16;
    const bool convert = a.inType == DataType::kBFloat16 && !(bf16Out && bf16Wire_);
    const DataType wire = convert ? DataType::kFloat32 : a.inType;
    const void* in = a.send;
    void* converted = nullptr;
    void* target = a.recv;
    Status st;
    if (convert) {
      const size_t n = rs ? a.count * size : a.count;
      auto p = scratch(n * 4);
      if (!p.isOk()) return p.status();
      converted = *p;
      st = kernel(a.send, converted, n, DataType::kBFloat16, false, device);
      in = converted;
    }
    if (st.isOk() && (a.reduce.accumulate || (bf16Out && convert))) {  // NCCL's output is not the result
      auto p = scratch(a.count * 4);
      st = p.status();
      if (st.isOk()) target = *p;
    }
    if (st.isOk()) {
      auto o = op(a, ncclType(wire));
      st = o.status();
      if (st.isOk()) {
        st = rs ? check(LIBCOMM_NCCL_FN(ReduceScatter)(in, target, a.count, ncclType(wire), *o, comm_->get(), s_),
                        "ncclReduceScatter")
                : check(LIBCOMM_NCCL_FN(AllReduce)(in, target, a.count, ncclType(wire), *o, comm_->get(), s_), "ncclAllReduce");
        dropOp(a, *o);
      }
    }
    if (st.isOk() && target != a.recv)
      st = bf16Out ? cuda::launchToBf16(static_cast<const float*>(target), a.recv, a.count, s_, device)
                   : kernel(target, a.recv, a.count, DataType::kFloat32, true, device);
    if (target != a.recv) release(target);
    release(converted);
    return st;
  }

  // The calls above hold mu_ while they use comm_ (busy_ says so). abort() may come from any thread
  // at any time: it aborts at once when mu_ is free, else the holder does on its way out: it
  // unlocks, then looks at aborted_ (set before abort() tried the lock), and aborts under the lock
  // taken again. Their waits (NCCL's enqueue, the set-up and the finalize polls) end early once
  // aborted_ is set, so the abort is not held off until their deadlines.
  struct Holder {
    explicit Holder(DelegateImpl& d) : d(d) {
      d.mu_.lock();
      d.busy_.store(true);
    }
    ~Holder() {
      d.busy_.store(false);
      d.mu_.unlock();
      if (d.aborted_.load()) {
        std::lock_guard<std::mutex> lock(d.mu_);
        d.comm_.reset();
      }
    }
    DelegateImpl& d;
  };
  const bool bf16Wire_;
  std::mutex mu_;
  std::atomic<bool> busy_{false};
  std::atomic<bool> aborted_{false};
  std::unique_ptr<Comm> comm_;
  cudaStream_t s_ = nullptr;
  Deadline deadline_ = Deadline::after(Milliseconds(0));
  bool unsettled_ = false;  // a call was given up while NCCL may still enqueue it (check)
};

}  // namespace

std::unique_ptr<Delegate> createDelegate(bool bf16Wire) { return std::make_unique<DelegateImpl>(bf16Wire); }
bool builtWithNccl() { return true; }

}  // namespace libcomm::nccl
