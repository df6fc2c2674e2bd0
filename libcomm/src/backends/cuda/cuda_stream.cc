// CUDA streams and events behind libcomm's Stream/Event (contract: libcomm/stream.h, libcomm/cuda.h).
//
// CUDA orders the device work itself; this file adds what CUDA lacks:
//  - host functions that return a Status (cudaLaunchHostFunc): the first failure is sticky on the
//    stream and later host functions on it are skipped;
//  - event records that carry their stream's error when a host function before them failed, and
//    waits that hand such an error on to the waiting stream;
//  - deadlines: CUDA's own synchronize calls block without one, so waits poll cudaStreamQuery /
//    cudaEventQuery, spinning briefly and then sleeping.
//
// Every item (host function, record, wait) gets a number on its stream, taken under the stream's
// enqueue lock together with the CUDA call, so numbers follow CUDA's order. A failure remembers the
// number of the item that failed; a record at position p carries the error iff that number is < p.
//
// Each record owns its own cudaEvent_t (a CudaRecord), shared by the event (as its last record) and
// by any wait that captured it: "wait for the last record as of the call" holds when the event is
// re-recorded before the wait has run. A record nobody else holds is re-used in place.

#include <cuda_runtime_api.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <thread>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cudart_library.h"
#include "backends/cuda/device_path.h"
#include "core/cpu_relax.h"
#include "core/log.h"
#include "libcomm/cuda.h"

namespace libcomm {
namespace {

constexpr uint64_t kNever = std::numeric_limits<uint64_t>::max();
constexpr Milliseconds kDestroyDrainTimeout{5000};

long long msSince(Clock::time_point t) { return std::chrono::duration_cast<Milliseconds>(Clock::now() - t).count(); }

// Polls `probe` (a CUDA query) until it returns something other than cudaErrorNotReady or the
// deadline passes (then cudaErrorNotReady). A short spin catches work about to finish; then sleeps
// that grow to 1 ms leave the core to the threads doing the work (2 cores: PERF-NOTES).
template <typename Probe>
cudaError_t pollUntil(Probe probe, Deadline deadline) {
  const auto spinEnd = Clock::now() + std::chrono::microseconds(20);
  for (unsigned i = 0;; ++i) {
    const cudaError_t r = probe();
    if (r != cudaErrorNotReady) return r;
    if ((i & 15) == 15 && Clock::now() >= spinEnd) break;
    cpuRelax();
  }
  auto sleep = std::chrono::microseconds(10);
  for (;;) {
    const cudaError_t r = probe();
    if (r != cudaErrorNotReady) return r;
    if (deadline.expired()) return cudaErrorNotReady;
    std::this_thread::sleep_for(sleep);  // overshoots the deadline by at most 1 ms
    sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
  }
}

// What a CUDA stream shares with its callbacks and with the records taken on it; outlives the
// stream while any of them remains.
struct StreamState {
  StreamState(std::string n, int d) : name(std::move(n)), device(d) {}

  const std::string name;
  const int device;
  std::atomic<uint64_t> items{0};          // items enqueued so far (written under the enqueue lock)
  std::atomic<uint64_t> hostEnqueued{0};   // host callbacks enqueued (functions and wait checks)
  std::atomic<uint64_t> hostFinished{0};   // host callbacks run or skipped (CUDA runs them in order)
  std::atomic<uint64_t> failedAt{kNever};  // item number of the first failure

  void fail(uint64_t seq, const Status& s) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_.isOk()) return;
    error_ = s;
    failedAt.store(seq, std::memory_order_release);
    LIBCOMM_LOG(kWarn, "stream") << s.toString() << " (later host functions on the stream are skipped)";
  }
  bool failedBefore(uint64_t seq) const { return failedAt.load(std::memory_order_acquire) < seq; }
  // The sticky error if the failure came before item `seq`, else OK.
  Status errorBefore(uint64_t seq) const {
    if (!failedBefore(seq)) return Status::ok();
    std::lock_guard<std::mutex> lock(mu_);
    return error_;
  }
  Status sticky() const { return errorBefore(kNever); }

  void beginHost(uint64_t seq, const std::string& label) {
    std::lock_guard<std::mutex> lock(mu_);
    runningSeq_ = seq;
    runningLabel_ = label;
    runningSince_ = Clock::now();
  }
  void endHost() {
    std::lock_guard<std::mutex> lock(mu_);
    runningSeq_ = 0;
  }
  // "CUDA stream 'x' (device 0): host function #12 'label' running for 40 ms; 3 of 5 host callbacks done".
  std::string position() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string s = detail::strCat("CUDA stream '", name, "' (device ", device, "): ");
    if (runningSeq_)
      s += detail::strCat("host function #", runningSeq_, " '", runningLabel_, "' running for ", msSince(runningSince_),
                          " ms; ");
    s += detail::strCat(hostFinished.load(), " of ", hostEnqueued.load(), " host callbacks done, ", items.load(),
                        " items enqueued");
    return s;
  }

 private:
  mutable std::mutex mu_;
  Status error_;
  uint64_t runningSeq_ = 0;
  std::string runningLabel_;
  Clock::time_point runningSince_;
};

// One record of an event on a stream: its own cudaEvent_t.
struct CudaRecord {
  cudaEvent_t event = nullptr;
  int device = 0;
  std::shared_ptr<const StreamState> stream;
  uint64_t position = 0;    // the record's item number on that stream
  uint64_t hostBefore = 0;  // host callbacks enqueued on that stream before the record

  ~CudaRecord() {
    if (event) (void)cuda::cudart().cudaEventDestroy(event);
  }
  // The error this record carries: its stream's, when it failed before the record.
  Status carried() const { return stream ? stream->errorBefore(position) : Status::ok(); }
  // True when no host callback before the record is still to run: it can no longer fail.
  bool settled() const { return !stream || stream->hostFinished.load(std::memory_order_acquire) >= hostBefore; }
  std::string describe() const {
    return detail::strCat("event record at item #", position, " of CUDA stream '", stream ? stream->name : "?", "'");
  }
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int device, cudaEvent_t spare) : device_(device), spare_(spare) {}
  ~CudaEvent() override {
    if (spare_) (void)cuda::cudart().cudaEventDestroy(spare_);
  }

  StreamKind kind() const override { return StreamKind::kCuda; }
  int device() const { return device_; }

  Status query() const override {
    auto rec = last();
    if (!rec) return Status::ok();
    const cudaError_t r = cuda::cudart().cudaEventQuery(rec->event);
    if (r == cudaErrorNotReady) return makeError(StatusCode::kInProgress, rec->describe(), " has not completed");
    if (r != cudaSuccess) return LIBCOMM_CUDA_STATUS(r).withContext(rec->describe());
    return rec->carried();
  }

  Status synchronize(Deadline deadline) const override {
    auto rec = last();
    if (!rec) return Status::ok();
    const cudaError_t r = pollUntil([&] { return cuda::cudart().cudaEventQuery(rec->event); }, deadline);
    if (r == cudaErrorNotReady)
      return makeError(StatusCode::kTimeout, rec->describe(), " did not complete by the deadline (",
                       rec->stream->position(), ")");
    if (r != cudaSuccess) return LIBCOMM_CUDA_STATUS(r).withContext(rec->describe());
    return rec->carried();
  }

  std::shared_ptr<CudaRecord> last() const {
    std::lock_guard<std::mutex> lock(mu_);
    return last_;
  }

  // Records this event on `stream` as item `seq` (the caller holds the stream's enqueue lock).
  Status recordOn(cudaStream_t stream, const std::shared_ptr<StreamState>& state, uint64_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    cudaEvent_t ev = nullptr;
    if (spare_) {
      std::swap(ev, spare_);
    } else if (last_ && last_.use_count() == 1) {
      std::swap(ev, last_->event);  // nobody waits on the old record: re-use its CUDA event
      last_.reset();
    } else {  // the caller made the device current
      LIBCOMM_RETURN_IF_ERROR(
          LIBCOMM_CUDA_STATUS(cuda::cudart().cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)));
    }
    auto rec = std::make_shared<CudaRecord>();
    rec->event = ev;
    rec->device = device_;
    rec->stream = state;
    rec->position = seq;
    rec->hostBefore = state->hostEnqueued.load(std::memory_order_relaxed);
    const Status s = LIBCOMM_CUDA_STATUS(cuda::cudart().cudaEventRecord(ev, stream));
    if (!s.isOk()) {
      std::swap(rec->event, spare_);  // keep the CUDA event for the next try
      return s;
    }
    last_ = std::move(rec);
    return Status::ok();
  }

 private:
  const int device_;
  mutable std::mutex mu_;
  cudaEvent_t spare_ = nullptr;       // created with the event, so that creation reports a bad device
  std::shared_ptr<CudaRecord> last_;  // null: never recorded, which counts as complete
};

// A host callback: a user's host function, or the check that hands a waited-on record's error on.
struct HostCall {
  std::shared_ptr<StreamState> state;
  uint64_t seq = 0;
  std::string label;
  std::function<Status()> fn;  // a user's host function, or
  // the record whose error a wait hands on: its stream and position only, not the CudaRecord, whose
  // destructor calls CUDA, which a host callback must not.
  std::shared_ptr<const StreamState> waitStream;
  uint64_t waitPosition = 0;
};

void CUDART_CB runHostCall(void* arg) {
  std::unique_ptr<HostCall> call(static_cast<HostCall*>(arg));
  StreamState& st = *call->state;
  auto context = [&] {
    return detail::strCat("CUDA stream '", st.name, "' item #", call->seq, " '", call->label, "'");
  };
  if (st.failedBefore(call->seq)) {
    LIBCOMM_LOG(kDebug, "stream") << context() << " skipped: the stream has failed";
  } else if (call->waitStream) {
    Status carried = call->waitStream->errorBefore(call->waitPosition);
    if (!carried.isOk()) st.fail(call->seq, carried.withContext(context()));
  } else {
    st.beginHost(call->seq, call->label);
    Status s;
    try {
      s = call->fn();
    } catch (...) {
      // Host functions are user code; an exception must not unwind into CUDA's thread.
      s = makeError(StatusCode::kInternalError, "host function threw an exception");
    }
    st.endHost();
    if (!s.isOk()) st.fail(call->seq, s.withContext(context()));
  }
  // Release what the item captured before counting it done: a closure's destructor may be user code
  // that the stream's synchronize() must cover.
  call->fn = nullptr;
  st.hostFinished.fetch_add(1, std::memory_order_acq_rel);
}

class CudaStream final : public Stream {
 public:
  CudaStream(std::shared_ptr<StreamState> state, cudaStream_t stream) : state_(std::move(state)), stream_(stream) {}

  ~CudaStream() override {
    const Status drained = synchronize(Deadline::after(kDestroyDrainTimeout));
    if (!drained.isOk() && drained.code() == StatusCode::kTimeout)
      LIBCOMM_LOG(kWarn, "stream") << "destroyed with work pending: " << drained.message()
                                   << "; CUDA releases the stream once that work has run";
    cuda::DeviceGuard guard(state_->device);
    (void)cuda::cudart().cudaStreamDestroy(stream_);  // returns at once; CUDA frees it after the pending work
  }

  StreamKind kind() const override { return StreamKind::kCuda; }
  const std::string& name() const override { return state_->name; }
  cudaStream_t native() const { return stream_; }
  int device() const { return state_->device; }

  Status record(Event& event) override {
    auto* ev = dynamic_cast<CudaEvent*>(&event);
    if (!ev)
      return makeError(StatusCode::kInvalidArgument, "CUDA stream '", name(),
                       "': record of a host event (host events are recorded on host streams; use createCudaEvent)");
    if (ev->device() != state_->device)
      return makeError(StatusCode::kInvalidArgument, "CUDA stream '", name(), "' (device ", state_->device,
                       "): record of an event made for device ", ev->device());
    std::lock_guard<std::mutex> lock(enqueueMu_);
    cuda::DeviceGuard guard(state_->device);
    LIBCOMM_RETURN_IF_ERROR(guard.status());
    const uint64_t seq = state_->items.load(std::memory_order_relaxed) + 1;
    LIBCOMM_RETURN_IF_ERROR(ev->recordOn(stream_, state_, seq));
    state_->items.store(seq, std::memory_order_release);
    return Status::ok();
  }

  Status wait(const Event& event) override {
    const auto* ev = dynamic_cast<const CudaEvent*>(&event);
    if (!ev)
      return makeError(StatusCode::kInvalidArgument, "CUDA stream '", name(),
                       "': wait on a host event is not supported (synchronize it on the host first, with a deadline, "
                       "or record a CUDA event)");
    auto rec = ev->last();
    if (!rec) return Status::ok();  // never recorded: complete
    std::lock_guard<std::mutex> lock(enqueueMu_);
    cuda::DeviceGuard guard(state_->device);
    LIBCOMM_RETURN_IF_ERROR(guard.status());
    LIBCOMM_RETURN_IF_ERROR(
        LIBCOMM_CUDA_STATUS(cuda::cudart().cudaStreamWaitEvent(stream_, rec->event, 0))
            .withContext(detail::strCat("CUDA stream '", name(), "' waiting on ", rec->describe())));
    const uint64_t seq = state_->items.load(std::memory_order_relaxed) + 1;
    state_->items.store(seq, std::memory_order_release);
    // The device-side wait orders the work; the record's stream may still fail before the record,
    // and then work after this wait must not run either. A check callback hands that error on, but
    // only where a failure is still possible: callbacks cost tens of microseconds each.
    if (rec->stream == state_ || (rec->settled() && rec->carried().isOk())) return Status::ok();
    auto call = std::make_unique<HostCall>();
    call->waitStream = rec->stream;
    call->waitPosition = rec->position;
    call->label = "wait for " + rec->describe();
    return launch(std::move(call), seq);
  }

  Status enqueueHost(std::function<Status()> fn, std::string label) override {
    if (!fn)
      return makeError(StatusCode::kInvalidArgument, "CUDA stream '", name(), "': empty host function '", label, "'");
    auto call = std::make_unique<HostCall>();
    call->fn = std::move(fn);
    call->label = std::move(label);
    std::lock_guard<std::mutex> lock(enqueueMu_);
    cuda::DeviceGuard guard(state_->device);
    LIBCOMM_RETURN_IF_ERROR(guard.status());
    const uint64_t seq = state_->items.load(std::memory_order_relaxed) + 1;
    LIBCOMM_RETURN_IF_ERROR(launch(std::move(call), seq));
    state_->items.store(seq, std::memory_order_release);
    return Status::ok();
  }

  Status synchronize(Deadline deadline) override {
    const cudaError_t r = pollUntil([&] { return cuda::cudart().cudaStreamQuery(stream_); }, deadline);
    if (r == cudaErrorNotReady)
      return makeError(StatusCode::kTimeout, "CUDA stream '", name(), "': work did not finish by the deadline; ",
                       state_->position());
    if (r != cudaSuccess) return failWith(r);
    return state_->sticky();
  }

  Status query() const override {
    Status sticky = state_->sticky();
    if (!sticky.isOk()) return sticky;
    const cudaError_t r = cuda::cudart().cudaStreamQuery(stream_);
    if (r == cudaSuccess) return Status::ok();
    if (r == cudaErrorNotReady) return makeError(StatusCode::kInProgress, state_->position());
    return failWith(r);
  }

  Status asyncError() const override {
    Status sticky = state_->sticky();
    if (!sticky.isOk()) return sticky;
    const cudaError_t r = cuda::cudart().cudaStreamQuery(stream_);
    return r == cudaSuccess || r == cudaErrorNotReady ? Status::ok() : failWith(r);
  }

 private:
  // Launches a host callback as item `seq` (the caller holds enqueueMu_ and publishes `seq` when
  // this returns OK; a wait's check is launched after its seq is published).
  Status launch(std::unique_ptr<HostCall> call, uint64_t seq) {
    call->state = state_;
    call->seq = seq;
    state_->hostEnqueued.fetch_add(1, std::memory_order_relaxed);
    const std::string label = call->label;
    const cudaError_t r = cuda::cudart().cudaLaunchHostFunc(stream_, runHostCall, call.get());
    if (r != cudaSuccess) {
      state_->hostEnqueued.fetch_sub(1, std::memory_order_relaxed);
      return LIBCOMM_CUDA_STATUS(r).withContext(
          detail::strCat("CUDA stream '", name(), "': enqueueing host function '", label, "'"));
    }
    (void)call.release();  // runHostCall owns it now
    return Status::ok();
  }

  // A CUDA error seen by a query is the stream's from then on (CUDA's own errors of this kind are
  // sticky for the whole context).
  Status failWith(cudaError_t r) const {
    Status s = LIBCOMM_CUDA_STATUS(r).withContext(detail::strCat("CUDA stream '", name(), "'"));
    state_->fail(state_->items.load(std::memory_order_acquire), s);
    return state_->sticky();
  }

  std::shared_ptr<StreamState> state_;
  cudaStream_t stream_;
  std::mutex enqueueMu_;
};

}  // namespace

Result<std::unique_ptr<Stream>> createCudaStream(std::string name, int device) {
  const std::string what = "CUDA stream '" + name + "'";
  LIBCOMM_RETURN_IF_ERROR(cuda::checkDevice(device, what));
  cuda::noteCudaInUse();
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status().withContext(what));
  cudaStream_t stream = nullptr;
  LIBCOMM_RETURN_IF_ERROR(
      LIBCOMM_CUDA_STATUS(cuda::cudart().cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking)).withContext(what));
  return std::unique_ptr<Stream>(
      std::make_unique<CudaStream>(std::make_shared<StreamState>(std::move(name), device), stream));
}

Result<std::unique_ptr<Event>> createCudaEvent(int device) {
  LIBCOMM_RETURN_IF_ERROR(cuda::checkDevice(device, "CUDA event"));
  cuda::noteCudaInUse();
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status().withContext("CUDA event"));
  cudaEvent_t ev = nullptr;
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cuda::cudart().cudaEventCreateWithFlags(&ev, cudaEventDisableTiming))
                              .withContext("CUDA event"));
  return std::unique_ptr<Event>(std::make_unique<CudaEvent>(device, ev));
}

void* nativeCudaStream(const Stream& stream) {
  const auto* cuda = dynamic_cast<const CudaStream*>(&stream);
  return cuda ? static_cast<void*>(cuda->native()) : nullptr;
}

int cuda::streamDevice(const Stream& stream) {
  const auto* cuda = dynamic_cast<const CudaStream*>(&stream);
  return cuda ? cuda->device() : -1;
}

}  // namespace libcomm
