// The own path's collectives on one host, and the inter-process events that order them across
// processes (the protocol: device_path.h).
//  - all_gather: one cudaMemcpyAsync per peer, from its registered input (through the IPC mapping)
//    into this rank's output: copy engines move the data, no SM is used;
//  - reduce_scatter: the reduce kernel (cuda_reduce.cu) reads chunk `rank` of every rank's input
//    through the mappings, sums in fp32 and writes this rank's output once;
//  - barrier: the event protocol alone.

#include <cstring>

#include "backends/cuda/cuda_error.h"
#include "backends/cuda/cuda_own_path.h"
#include "backends/cuda/cuda_reduce.h"
#include "backends/cuda/cudart_library.h"
#include "core/log.h"

namespace libcomm::cuda {

Status OwnPathImpl::markReady(void* stream, int device) {
  if (eventDevice_ < 0) {
    LIBCOMM_RETURN_IF_ERROR(makeEvents(device));
  } else if (device != eventDevice_) {
    return makeError(StatusCode::kInvalidUsage, "rank ", rank_, ": a device collective on a stream of device ", device,
                     ", but this rank's earlier ones ran on device ", eventDevice_,
                     "; a communicator uses one device per rank (create one communicator per device)");
  }
  return LIBCOMM_CUDA_STATUS(cudart().cudaEventRecord(ready_, static_cast<cudaStream_t>(stream)));
}

Status OwnPathImpl::makeEvents(int device) {
  DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  const unsigned flags = cudaEventInterprocess | cudaEventDisableTiming;
  cudaEvent_t ready = nullptr, done = nullptr;
  // All or nothing: on a failure the events made so far are destroyed and this rank stays without
  // events (the next collective tries again), never with events that no record names.
  auto made = [&]() -> Result<shm::Segment> {
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaEventCreateWithFlags(&ready, flags)));
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaEventCreateWithFlags(&done, flags)));
    IpcRecord rec;
    rec.kind = IpcRecord::Kind::kEvents;
    rec.device = device;
    rec.owner = thisProcess();
    rec.address = reinterpret_cast<uintptr_t>(ready);
    rec.address2 = reinterpret_cast<uintptr_t>(done);
    cudaIpcEventHandle_t h;
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaIpcGetEventHandle(&h, ready)));
    std::memcpy(rec.handle.data(), &h, sizeof(h));
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaIpcGetEventHandle(&h, done)));
    std::memcpy(rec.handle2.data(), &h, sizeof(h));
    const std::vector<unsigned char> wire = encodeIpcRecord(rec);
    LIBCOMM_ASSIGN_OR_RETURN(shm::Segment seg, shm::Segment::create(recordName(prefix_, 0), wire.size()));
    std::memcpy(seg.data(), wire.data(), wire.size());
    return seg;
  }();
  if (!made.isOk()) {
    if (ready) (void)cudart().cudaEventDestroy(ready);
    if (done) (void)cudart().cudaEventDestroy(done);
    return made.status().withContext(
        detail::strCat("rank ", rank_, ": making its inter-process events on device ", device));
  }
  eventRecord_ = std::move(*made);
  ready_ = ready;
  done_ = done;
  eventDevice_ = device;
  return Status::ok();
}

Status OwnPathImpl::markDone(void* stream) {
  auto s = static_cast<cudaStream_t>(stream);
  // "done" must follow every own-path collective of this rank, also one on another stream: the host
  // waits for it alone before it closes mappings. On the same stream the wait orders nothing new.
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaStreamWaitEvent(s, done_, 0)));
  return LIBCOMM_CUDA_STATUS(cudart().cudaEventRecord(done_, s));
}

Result<OwnPathImpl::PeerEvents*> OwnPathImpl::peerEvents(int peer, int device, const std::string& what) {
  auto it = peerEvents_.find(peer);
  if (it != peerEvents_.end()) return &it->second;
  LIBCOMM_ASSIGN_OR_RETURN(IpcRecord rec, readRecord(peer, 0, what));
  if (rec.kind != IpcRecord::Kind::kEvents)
    return makeError(StatusCode::kInvalidUsage, what, ": rank ", peer,
                     "'s event record has the kind of a memory record");
  PeerEvents ev;
  const ProcessId self = thisProcess();
  if (sameProcess(rec.owner, self)) {
    ev.ready = reinterpret_cast<cudaEvent_t>(rec.address);
    ev.done = reinterpret_cast<cudaEvent_t>(rec.address2);
  } else {
    DeviceGuard guard(device);
    cudaIpcEventHandle_t h;
    std::memcpy(&h, rec.handle.data(), sizeof(h));
    const std::string ctx =
        detail::strCat(what, ": rank ", rank_, " opening the events of rank ", peer);
    LIBCOMM_RETURN_IF_ERROR(LIBCOMM_CUDA_STATUS(cudart().cudaIpcOpenEventHandle(&ev.ready, h)).withContext(ctx));
    std::memcpy(&h, rec.handle2.data(), sizeof(h));
    Status s = LIBCOMM_CUDA_STATUS(cudart().cudaIpcOpenEventHandle(&ev.done, h)).withContext(ctx);
    if (!s.isOk()) {
      (void)cudart().cudaEventDestroy(ev.ready);
      return s;
    }
    ev.opened = true;
  }
  return &peerEvents_.emplace(peer, ev).first->second;
}

Status OwnPathImpl::waitPeersDone(void* stream, const std::string& what) {
  for (auto& [peer, ev] : peerEvents_)
    LIBCOMM_RETURN_IF_ERROR(
        LIBCOMM_CUDA_STATUS(cudart().cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), ev.done, 0))
            .withContext(detail::strCat(what, ": rank ", rank_, " waiting for rank ", peer, "'s done event")));
  return Status::ok();
}

Status OwnPathImpl::run(const CollArgs& args, const std::vector<PeerInput>& inputs, void* stream, int device,
                        const std::string& what) {
  const int size = static_cast<int>(prefixes_.size());
  auto s = static_cast<cudaStream_t>(stream);
  DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status().withContext(what));
  std::vector<const char*> in(size, nullptr);
  // One bound for every peer's unmapping below (each may wait for this rank's device work).
  const Deadline unmapBy = Deadline::after(timeout_);
  for (int p = 0; p < size; ++p) {
    if (p == rank_) {
      in[p] = static_cast<const char*>(args.send);
      continue;
    }
    const bool readsInputs = args.kind != CollKind::kBarrier && args.count != 0;
    LIBCOMM_RETURN_IF_ERROR(dropDeregistered(p, readsInputs ? inputs[p].registration : 0, what, unmapBy));
    LIBCOMM_ASSIGN_OR_RETURN(PeerEvents * ev, peerEvents(p, device, what));
    LIBCOMM_RETURN_IF_ERROR(
        LIBCOMM_CUDA_STATUS(cudart().cudaStreamWaitEvent(s, ev->ready, 0))
            .withContext(detail::strCat(what, ": rank ", rank_, " waiting for rank ", p, "'s ready event")));
    if (!readsInputs) continue;
    LIBCOMM_ASSIGN_OR_RETURN(in[p], resolve(p, inputs[p], device, what));
  }
  if (args.kind == CollKind::kBarrier || args.count == 0) return Status::ok();
  if (args.kind == CollKind::kAllGather) return allGather(args, in, s, what);
  if (args.kind == CollKind::kReduceScatter) return reduceScatter(args, in, s, device, what);
  return makeError(StatusCode::kInternalError, what, ": the own path has no ", collName(args.kind));
}

Status OwnPathImpl::allGather(const CollArgs& args, const std::vector<const char*>& in, cudaStream_t s,
                              const std::string& what) {
  const size_t chunk = args.count * dataTypeSize(args.inType);
  char* out = static_cast<char*>(args.recv);
  for (int p = 0; p < static_cast<int>(in.size()); ++p) {
    if (p == rank_ && args.inPlace) continue;
    // Default direction: UVA tells the copy where each side lives (a peer's device, or this one).
    LIBCOMM_RETURN_IF_ERROR(
        LIBCOMM_CUDA_STATUS(cudart().cudaMemcpyAsync(out + p * chunk, in[p], chunk, cudaMemcpyDefault, s))
            .withContext(detail::strCat(what, ": rank ", rank_, " copying rank ", p, "'s input")));
  }
  return Status::ok();
}

Status OwnPathImpl::reduceScatter(const CollArgs& args, const std::vector<const char*>& in, cudaStream_t s, int device,
                                  const std::string& what) {
  ReduceLaunch l;
  const size_t chunk = args.count * dataTypeSize(args.inType);
  l.numInputs = static_cast<int>(in.size());
  for (int p = 0; p < l.numInputs; ++p) l.inputs[p] = in[p] + rank_ * chunk;
  l.out = args.recv;
  l.count = args.count;
  l.inType = args.inType;
  l.outType = args.outType;
  l.scale = args.postScale(l.numInputs);
  l.accumulate = args.reduce.accumulate;
  return launchReduce(l, s, device).withContext(what);
}

}  // namespace libcomm::cuda
