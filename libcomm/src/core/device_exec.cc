// Collectives on device memory (CUDA streams): which memory a call uses, registration of device
// buffers, and the execution: on one host the descriptor handshake on the shared-memory channel
// (the mismatch check and the agreement on the path come with it), then the own path (CUDA IPC;
// its cross-process ordering protocol is in backends/cuda/device_path.h) or NCCL; across hosts
// NCCL directly. The host part runs on the calling thread: a device collective returns once its
// device work is enqueued on the caller's stream, after every peer has called it too.

#include <array>

#include "backends/cuda/device_path.h"
#include "backends/nccl/nccl_path.h"
#include "core/comm_impl.h"
#include "core/log.h"
#include "core/selector.h"

namespace libcomm {
namespace {

const char* kindText(const cuda::PointerInfo& info) {
  return info.kind == cuda::PointerInfo::Kind::kManaged ? "CUDA managed memory" : "CUDA device memory";
}

}  // namespace

Result<bool> Communicator::Impl::checkMemory(const CollArgs& args, const Stream& stream) const {
  auto bad = [&](auto&&... parts) {
    return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": ", collName(args.kind), " (next seq ",
                     nextSeq_.load() + 1, ") on stream '", stream.name(), "': ", parts...);
  };
  const bool sends = args.count > 0 && args.hasInput(rank_) && args.send != nullptr;
  const bool recvs = args.count > 0 && args.recv != nullptr;
  if (stream.kind() == StreamKind::kHost) {
    // A buffer that starts in registered memory but runs past its allocation would be read or
    // written past the end of a mapping (validateColl checked that these products fit).
    const std::array<shm::LocalMemory::Span, 2> spans{{{sends ? args.send : nullptr, args.inputBytes(size_)},
                                                       {recvs ? args.recv : nullptr, args.outputBytes(size_)}}};
    const std::array<size_t, 2> left = local_->bytesLeftIfOverrun(spans, &overrunMemo_);
    for (size_t i = 0; i < spans.size(); ++i)
      if (left[i] != SIZE_MAX)
        return bad(i == 0 ? "send" : "recv", " buffer ", spans[i].ptr, " needs ", spans[i].bytes,
                   " bytes but lies in a registered allocation with ", left[i], " bytes left from there (allocRegistered)");
    if (!cuda::cudaInUse()) return false;  // no CUDA in this process yet: no device pointer to find
    for (auto [p, name] : {std::pair<const void*, const char*>{sends ? args.send : nullptr, "send"},
                           {recvs ? args.recv : nullptr, "recv"}}) {
      const cuda::PointerInfo info = cuda::queryPointer(p);
      if (info.isDevice())
        return bad(name, " buffer ", p, " is ", kindText(info), " (device ", info.device,
                   ") but the stream is a host stream; device buffers need a CUDA stream (libcomm/cuda.h)");
    }
    return false;
  }
  const int device = cuda::streamDevice(stream);
  // Refused here, before a sequence number is taken (a refusal inside the collective fails the
  // communicator): the device table has no barrier across hosts.
  if (cross_ && args.kind == CollKind::kBarrier)
    return bad("no barrier on CUDA streams across hosts yet; synchronize the stream and call barrier on a host stream");
  for (auto [p, name] : {std::pair<const void*, const char*>{sends ? args.send : nullptr, "send"},
                         {recvs ? args.recv : nullptr, "recv"}}) {
    if (!p) continue;
    const cuda::PointerInfo info = cuda::queryPointer(p);
    if (!info.isDevice())
      return bad(name, " buffer ", p, " is host memory but the stream is a CUDA stream (device ", device,
                 "); host buffers need a host stream (createHostStream)");
    if (info.kind == cuda::PointerInfo::Kind::kDevice && info.device != device)
      return bad(name, " buffer ", p, " is on device ", info.device, " but the stream is on device ", device);
  }
  return true;
}

Status Communicator::Impl::registerDevice(void* ptr, size_t bytes, bool* handled) {
  *handled = false;
  // Memory from allocRegistered is host memory: no need to ask CUDA.
  if (local_->contains(ptr, bytes > 0 ? bytes : 1) || !cuda::queryPointer(ptr, true).isDevice()) return Status::ok();
  *handled = true;
  if (!own_) {
    // Across hosts device memory goes through NCCL, which needs no registration: accepted, so that
    // a trainer written for one host (libshard's device pool) runs across hosts unchanged.
    if (bytes == 0) return makeError(StatusCode::kInvalidArgument, "rank ", rank_, ": registering an empty range");
    LIBCOMM_LOG(kDebug, "mem") << "rank " << rank_ << ": device memory " << ptr << " (" << bytes
                                << " B) registered on a communicator across hosts: nothing to do, NCCL moves it";
    return Status::ok();
  }
  return own_->registerRange(ptr, bytes);
}

Status Communicator::Impl::deregisterDevice(void* ptr, bool* handled) {
  if (own_) {
    *handled = own_->isRegistered(ptr, 1);
    return *handled ? own_->deregisterRange(ptr) : Status::ok();
  }
  // Across hosts registering device memory did nothing (above), and neither does this.
  *handled = !local_->contains(ptr, 1) && cuda::queryPointer(ptr, true).isDevice();
  return Status::ok();
}

bool Communicator::Impl::isRegisteredDevice(const void* ptr, size_t bytes) const {
  return own_ && own_->isRegistered(ptr, bytes);
}

Status Communicator::Impl::runNccl(const CollArgs& args, const DeviceTarget& device, const OpDeadline& deadline,
                                   const std::string& what) {
  // The first NCCL collective makes the NCCL communicator (every rank reaches it at the same seq:
  // the choice is the same on every rank). Its set-up gets the init deadline, not the op deadline.
  LIBCOMM_RETURN_IF_ERROR(
      nccl_->ensureComm(*bootstrap_, rank_, size_, device.device, Deadline::after(config_.initTimeout))
          .withContext(what));
  return nccl_->run(args, device.stream, device.device, deadline.get(), what);
}

Status Communicator::Impl::runDevice(const CollArgs& args, uint32_t seq, const WaitContext& wait,
                                     const DeviceTarget& device) {
  const std::string what = wait.op.str();
  const bool ncclBuilt = nccl_ != nullptr;
  const char* why = "";
  if (cross_) {
    const DeviceQuery across{args.kind, false, false, ncclBuilt, size_};
    LIBCOMM_ASSIGN_OR_RETURN(Algo algo, selectDevicePath(across, config_, &why));
    flight_->chose(seq, algo);
    LIBCOMM_LOG_REQUESTED(config_.collTrace, "coll") << what << ": " << algoName(algo) << " (" << why << ")";
    return runNccl(args, device, wait.deadline, what);
  }

  const size_t inputBytes = args.inputBytes(size_);
  shm::OpDescriptor d = describeOp(args, seq);
  d.algo = kDeviceMarker;
  d.place.bytes = args.hasInput(rank_) ? inputBytes : 0;
  uint32_t registration = 0;
  uint64_t offset = 0;
  d.inputRegistered = d.place.bytes == 0 || (own_ && own_->locate(args.send, d.place.bytes, &registration, &offset));
  if (d.place.bytes && d.inputRegistered) {
    d.place.segment = registration;
    d.place.offset = offset;
  }
  // Step 1 of the own path's protocol, before this rank's arrival is posted -- wherever the own
  // path may be chosen (it is only when every rank's view allows it, so this rank's must).
  const char* ignored = "";
  const DeviceQuery mine{args.kind, true, d.inputRegistered != 0, ncclBuilt, size_};
  auto local = selectDevicePath(mine, config_, &ignored);
  if (own_ && local.isOk() && *local == Algo::kCudaIpc)
    LIBCOMM_RETURN_IF_ERROR(own_->markReady(device.stream, device.device).withContext(what));
  LIBCOMM_ASSIGN_OR_RETURN(const bool registered, exchangeDescriptors(args, seq, d, wait));
  const std::vector<shm::OpDescriptor>& all = posted_;
  const DeviceQuery everyone{args.kind, true, registered, ncclBuilt, size_};
  LIBCOMM_ASSIGN_OR_RETURN(Algo algo, selectDevicePath(everyone, config_, &why));
  flight_->chose(seq, algo);
  LIBCOMM_LOG_REQUESTED(config_.collTrace, "coll")
      << what << ": " << algoName(algo) << " on device " << device.device << " (" << why << ")";
  if (algo == Algo::kNccl) return runNccl(args, device, wait.deadline, what);

  std::vector<cuda::PeerInput> inputs(size_);
  for (int p = 0; p < size_; ++p) inputs[p] = {all[p].place.segment, all[p].place.offset, all[p].place.bytes};
  if (Status ran = own_->run(args, inputs, device.stream, device.device, what); !ran.isOk()) {
    // Copies enqueued before the failure may still read peers' memory through IPC mappings: "done"
    // must follow them too, or a later close of those mappings (deregistration, destruction) would
    // not wait for them.
    (void)own_->markDone(device.stream);
    return ran;
  }
  LIBCOMM_RETURN_IF_ERROR(own_->markDone(device.stream).withContext(what));
  channel_->publish(shm::Counter::kDone, seq);
  LIBCOMM_RETURN_IF_ERROR(channel_->waitAll(shm::Counter::kDone, seq, wait, "device completion"));
  LIBCOMM_RETURN_IF_ERROR(own_->waitPeersDone(device.stream, what));
  lastOwnSeq_ = seq;
  channel_->publish(shm::Counter::kDeviceWaited, seq);
  return Status::ok();
}

void Communicator::Impl::waitPeersPastOwnEvents() {
  if (!lastOwnSeq_ || inForkedChild()) return;
  // A local peer's last own-path collective ends with host calls that name this rank's "done"
  // event (waitPeersDone); a peer thread of this process holds the event's raw handle. The event
  // is destroyed with the own path, after every peer said it is past them, or failed, or ended
  // (briefly bounded: a peer that is neither is stuck elsewhere, and its error will say so).
  struct Label {
    static std::string str(const void*) { return "the end of the communicator (its CUDA events)"; }
  };
  const WaitContext wait{OpDeadline(std::min<Milliseconds>(config_.opTimeout, Milliseconds(5000))),
                         OpLabel{nullptr, &Label::str}, blockingWait_};
  const Status st = channel_->waitAll(shm::Counter::kDeviceWaited, *lastOwnSeq_, wait, "device events");
  if (!st.isOk())
    LIBCOMM_LOG(kDebug, "mem") << "rank " << rank_ << ": destroying its own-path events without every peer past "
                               << "them: " << st.message();
}

}  // namespace libcomm
