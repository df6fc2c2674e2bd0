// BufferPool: one rank's libshard memory, allocated once from libcomm.

#include "libshard/buffers.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "libcomm/convert.h"
#include "libcomm/cuda.h"
#include "shard_internal.h"

namespace libshard {

using libcomm::Status;
using libcomm::StatusCode;

const char* memoryKindName(MemoryKind kind) { return kind == MemoryKind::kDevice ? "device" : "host"; }

std::vector<PoolAllocation> BufferPool::plannedAllocations(const ShardPlan& plan) {
  const uint64_t n = plan.stateNumel;
  const uint64_t es = detail::computeElementSize(plan);
  std::vector<PoolAllocation> out;
  // State arrays. The grad shard is the reduce-scatters' output, so it sits with their communicator.
  out.push_back({"fp32 master shard", 4 * n, nullptr, true});
  out.push_back({"fp32 grad shard", 4 * n, nullptr, false});
  if (plan.options.precision == Precision::kBf16) out.push_back({"bf16 compute shard", 2 * n, nullptr, true});
  out.push_back({"AdamW m", 4 * n, nullptr, true});
  out.push_back({"AdamW v", 4 * n, nullptr, true});
  for (const GatherBuffer& b : plan.gatherBuffers)
    out.push_back({"gather buffer " + b.name, static_cast<uint64_t>(b.numel) * es, nullptr, true});
  for (const GradBuffer& b : plan.gradBuffers)
    out.push_back({"grad buffer " + b.name, static_cast<uint64_t>(b.numel) * es, nullptr, false});
  out.push_back(
      {"fp32 resident grad accumulator", 4 * static_cast<uint64_t>(plan.resident.paddedNumel), nullptr, false});
  // Row-sparse layers: their row ids and packed rows, both moved by the reduce-scatter communicator.
  for (const FlatGroup& g : plan.layers) {
    if (g.sparseRows == 0) continue;
    out.push_back({"row ids " + g.name, g.rowIdsBytes(plan.options.worldSize), nullptr, false});
    out.push_back({"row exchange " + g.name, g.rowExchangeBytes(plan.options.worldSize, es), nullptr, false});
  }
  // Row gathers: their row ids and packed rows, both moved by the all_gather communicator.
  for (const FlatGroup& g : plan.layers) {
    if (g.gatherRows == 0) continue;
    out.push_back({"gather row ids " + g.name, g.gatherRowIdsBytes(plan.options.worldSize), nullptr, true});
    out.push_back({"gather row exchange " + g.name, g.gatherExchangeBytes(plan.options.worldSize, es), nullptr, true});
  }
  return out;
}

libcomm::Result<std::unique_ptr<BufferPool>> BufferPool::create(const ShardPlan& plan, libcomm::Communicator& agComm,
                                                                libcomm::Communicator& rsComm, PoolOptions options) {
  if (plan.options.gradBuffers < 1)
    return libcomm::makeError(StatusCode::kInvalidArgument, "BufferPool: plan has gradBuffers ",
                              plan.options.gradBuffers, " (need >= 1)");
  if (options.memory == MemoryKind::kDevice) {
    // libcomm's answer: kInvalidUsage "built without CUDA", kCudaError "no CUDA device: ...", or an
    // index out of range. (libcomm loads the CUDA runtime itself: libshard never links it.)
    Status st = Status::ok();
    if (auto n = libcomm::cudaDeviceCount(); !n.isOk())
      st = n.status();
    else if (options.device < 0 || options.device >= *n)
      st = libcomm::makeError(StatusCode::kInvalidArgument, "CUDA device ", options.device, " out of range (", *n,
                              " device(s) visible)");
    if (!st.isOk())
      return st.withContext("BufferPool rank " + std::to_string(agComm.rank()) + ": device memory on CUDA device " +
                            std::to_string(options.device) + " asked for");
  }
  std::unique_ptr<BufferPool> pool(new BufferPool(agComm, rsComm, options));
  Status st = pool->allocateAll(plan);
  if (!st.isOk()) {
    (void)pool->freeAll();
    return st;
  }
  return pool;
}

Status BufferPool::allocateAll(const ShardPlan& plan) {
  allocations_ = plannedAllocations(plan);
  for (PoolAllocation& a : allocations_) {
    if (a.bytes == 0) continue;  // nothing to hold: no pointer, no bytes
    libcomm::Communicator& comm = a.fromGatherComm ? agComm_ : rsComm_;
    auto mem = allocateOne(comm, a);
    if (!mem.isOk())
      return mem.status().withContext("BufferPool rank " + std::to_string(comm.rank()) + ": allocating " + a.name +
                                      " (" + std::to_string(a.bytes) + " bytes of " + memoryKindName(options_.memory) +
                                      " memory)");
    a.data = mem.value();
    current_ += a.bytes;
    if (current_ > peak_) peak_ = current_;
  }
  // Hand out the views, in plannedAllocations() order.
  size_t i = 0;
  state_.numel = plan.stateNumel;
  state_.onDevice = options_.memory == MemoryKind::kDevice;
  state_.writable = &writable_;
  state_.stamping = &stamping_;
  state_.master = static_cast<float*>(allocations_[i++].data);
  state_.grad = static_cast<float*>(allocations_[i++].data);
  if (plan.options.precision == Precision::kBf16) state_.compute = static_cast<uint16_t*>(allocations_[i++].data);
  state_.adamM = static_cast<float*>(allocations_[i++].data);
  state_.adamV = static_cast<float*>(allocations_[i++].data);
  for (size_t b = 0; b < plan.gatherBuffers.size(); ++b) gatherBuffers_.push_back(allocations_[i++].data);
  for (size_t g = 0; g < plan.gradBuffers.size(); ++g) gradBuffers_.push_back(allocations_[i++].data);
  residentGrad_ = static_cast<float*>(allocations_[i++].data);
  rowIds_.assign(plan.layers.size(), nullptr);
  rowExchange_.assign(plan.layers.size(), nullptr);
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    if (plan.layers[k].sparseRows == 0) continue;
    rowIds_[k] = allocations_[i++].data;
    rowExchange_[k] = allocations_[i++].data;
  }
  gatherRowIds_.assign(plan.layers.size(), nullptr);
  gatherExchange_.assign(plan.layers.size(), nullptr);
  for (size_t k = 0; k < plan.layers.size(); ++k) {
    if (plan.layers[k].gatherRows == 0) continue;
    gatherRowIds_[k] = allocations_[i++].data;
    gatherExchange_[k] = allocations_[i++].data;
  }
  return Status::ok();
}

// Zero-filled, and reachable by `comm`'s peers: registered host memory, or device memory
// registered with the communicator (CUDA IPC for the own path's peers).
libcomm::Result<void*> BufferPool::allocateOne(libcomm::Communicator& comm, const PoolAllocation& a) {
  if (options_.memory == MemoryKind::kHost) {
    LIBCOMM_ASSIGN_OR_RETURN(void* p, comm.allocRegistered(a.bytes));
    // Padding and not-yet-written elements must read as zero: the gradient path relies on free
    // buffers being zero, and padding flows into norms and checksums. Fresh shared memory is
    // zero already, but other backends promise nothing.
    std::memset(p, 0, a.bytes);
    return p;
  }
  LIBCOMM_ASSIGN_OR_RETURN(void* p, libcomm::allocateCudaMemory(a.bytes, options_.device));  // zero-filled
  Status st = comm.registerBuffer(p, a.bytes);
  if (!st.isOk()) {
    (void)libcomm::freeCudaMemory(p, options_.device);
    return st.withContext("registering it with the communicator");
  }
  return p;
}

Status BufferPool::freeOne(libcomm::Communicator& comm, void* data) {
  if (options_.memory == MemoryKind::kHost) return comm.freeRegistered(data);
  Status st = comm.deregisterBuffer(data);
  Status f = libcomm::freeCudaMemory(data, options_.device);
  return st.isOk() ? f : st;
}

BufferPool::~BufferPool() {
  if (executor_ != nullptr) {
    // Returning would free memory the executor's streams may still be reading and writing, and its
    // destructor would then drain them over freed memory: stop here, saying what happened.
    std::fprintf(stderr,
                 "libshard: a BufferPool was destroyed while the Executor built on it still exists; destroy the "
                 "Executor first (its streams use the pool's memory until it is gone)\n");
    std::abort();
  }
  (void)freeAll();
}

Status BufferPool::freeAll() {
  if (executor_ != nullptr)
    return libcomm::makeError(libcomm::StatusCode::kInvalidUsage,
                              "BufferPool::freeAll: an Executor built on this pool still exists; destroy it first "
                              "(its streams use the pool's memory); nothing was freed");
  Status first;
  // A host free waits for the queued collectives that use the allocation, up to its op timeout;
  // when one timed out (a stream held up, which likely holds more of these buffers), the rest of
  // that communicator's memory is left to it (it goes with the communicator) instead of each
  // allocation waiting a timeout of its own.
  bool gaveUp[2] = {false, false};
  for (PoolAllocation& a : allocations_) {
    if (!a.data) continue;
    libcomm::Communicator& comm = a.fromGatherComm ? agComm_ : rsComm_;
    bool& skip = gaveUp[a.fromGatherComm ? 0 : 1];
    Status st = skip ? Status::ok() : freeOne(comm, a.data);
    if (st.code() == libcomm::StatusCode::kTimeout) skip = true;
    if (!st.isOk() && first.isOk()) first = st.withContext("BufferPool: freeing " + a.name);
    a.data = nullptr;
    current_ -= a.bytes;
  }
  state_ = ShardState{};
  gatherBuffers_.clear();
  gradBuffers_.clear();
  residentGrad_ = nullptr;
  rowIds_.clear();
  rowExchange_.clear();
  gatherRowIds_.clear();
  gatherExchange_.clear();
  return first;
}

void* BufferPool::gatherBuffer(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= gatherBuffers_.size()) return nullptr;
  return gatherBuffers_[static_cast<size_t>(index)];
}

void* BufferPool::gradBuffer(int index) const {
  if (index < 0 || static_cast<size_t>(index) >= gradBuffers_.size()) return nullptr;
  return gradBuffers_[static_cast<size_t>(index)];
}

std::string BufferPool::describe() const {
  std::ostringstream os;
  for (const PoolAllocation& a : allocations_)
    os << "  " << a.name << ": " << a.bytes << " bytes" << (a.bytes && !a.data ? " (freed)" : "") << "\n";
  os << "  total now " << current_ << " bytes, peak " << peak_ << " bytes\n";
  return os.str();
}

Status setParameter(const ShardPlan& plan, ShardState& state, std::string_view name, const float* values,
                    size_t count) {
  LIBCOMM_RETURN_IF_ERROR(detail::checkWritable(state, "setParameter", false));
  if (state.onDevice)
    return libcomm::makeError(StatusCode::kInvalidUsage, "setParameter: the state is device memory; write its ",
                              "shards with the device's copies");
  auto find = [&](const FlatGroup& g) -> const ParamPlacement* {
    for (const ParamPlacement& p : g.params)
      if (p.name == name) return &p;
    return nullptr;
  };
  const FlatGroup* group = nullptr;
  const ParamPlacement* param = nullptr;
  for (size_t k = 0; k <= plan.layers.size() && !param; ++k) {
    group = k < plan.layers.size() ? &plan.layers[k] : &plan.resident;
    param = find(*group);
  }
  if (!param)
    return libcomm::makeError(StatusCode::kInvalidArgument, "setParameter: the plan holds no parameter '", name, "'");
  if (count != param->numel || (count > 0 && values == nullptr))
    return libcomm::makeError(StatusCode::kInvalidArgument, "setParameter: '", name, "' has ", param->numel,
                              " elements, given ", count, values ? "" : " (and no values)");
  // This rank's shard of the group's padded flat buffer, and the parameter's part of it.
  const size_t lo = static_cast<size_t>(plan.options.rank) * group->shardNumel, hi = lo + group->shardNumel;
  const size_t b = std::max(lo, param->offset), e = std::min(hi, param->offset + param->numel);
  if (b >= e) return Status::ok();  // none of it on this rank
  float* master = state.master + group->stateOffset + (b - lo);
  std::memcpy(master, values + (b - param->offset), (e - b) * sizeof(float));
  if (state.compute) libcomm::floatToBf16(master, state.compute + group->stateOffset + (b - lo), e - b);
  return Status::ok();
}

}  // namespace libshard
