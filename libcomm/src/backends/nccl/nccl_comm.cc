// NCCL set-up over libcomm's bootstrap: the unique id from rank 0, and non-blocking creation of the
// communicator with a deadline (NCCL's blocking init waits for every peer without one).

#include "backends/nccl/nccl_comm.h"

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/cuda_error.h"
#include "backends/nccl/nccl_error.h"
#include "core/log.h"

namespace libcomm::nccl {
namespace {

constexpr uint32_t kIdMagic = 0x4e434944;  // "NCID"
constexpr uint32_t kIdVersion = 1;

// What each rank contributes to the exchange; only rank 0's id and outcome count.
struct IdRecord {
  uint32_t magic = kIdMagic;
  uint32_t version = kIdVersion;
  int32_t code = 0;       // rank 0: a StatusCode when it could not make an id
  char reason[116] = {};  // rank 0: why, truncated
  ncclUniqueId id{};
};
static_assert(sizeof(IdRecord) == 256, "the record is part of the bootstrap wire format");

// Polls NCCL's asynchronous state of `comm` until it is no longer in progress or the deadline
// passes (then ncclInProgress). NCCL's set-up takes milliseconds to seconds: 1 ms sleeps suffice.
ncclResult_t pollComm(ncclComm_t comm, Deadline deadline, ncclResult_t* callResult, const std::atomic<bool>* stop) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    *callResult = LIBCOMM_NCCL_FN(CommGetAsyncError)(comm, &state);
    if (*callResult != ncclSuccess) return state;
    if (state != ncclInProgress || deadline.expired() || (stop && stop->load())) return state;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

Result<ncclUniqueId> makeUniqueId() {
  LIBCOMM_RETURN_IF_ERROR(backendLibrary().status());
  ncclUniqueId id;
  LIBCOMM_RETURN_IF_ERROR(LIBCOMM_NCCL_CALL(GetUniqueId, &id));
  return id;
}

Result<ncclUniqueId> shareUniqueId(Bootstrap& boot, Deadline deadline, const UniqueIdSource& source) {
  const int rank = boot.rank();
  IdRecord mine;
  Status made;
  if (rank == 0) {
    Result<ncclUniqueId> id = source();
    if (id.isOk()) {
      mine.id = *id;
    } else {
      made = id.status();
      mine.code = static_cast<int32_t>(made.code());
      std::strncpy(mine.reason, made.message().c_str(), sizeof(mine.reason) - 1);
    }
  }
  std::vector<IdRecord> all(boot.size());
  LIBCOMM_RETURN_IF_ERROR(boot.allGather(&mine, all.data(), sizeof(IdRecord), deadline)
                              .withContext(detail::strCat("rank ", rank, ": sharing the NCCL unique id")));
  const IdRecord& root = all[0];
  if (root.magic != kIdMagic || root.version != kIdVersion)
    return makeError(StatusCode::kInvalidUsage, "rank ", rank, ": NCCL unique id from rank 0 has magic 0x", std::hex,
                     root.magic, std::dec, " version ", root.version, " (expected version ", kIdVersion,
                     "): mismatched libcomm builds or calls");
  if (root.code != 0) {
    if (rank == 0) return made.withContext("rank 0: making the NCCL unique id");
    const size_t len = strnlen(root.reason, sizeof(root.reason));
    return makeError(StatusCode::kRemoteError, "rank ", rank,
                     ": rank 0 could not make the NCCL unique id: ", std::string(root.reason, len));
  }
  return root.id;
}

Comm::~Comm() {
  if (!comm_) return;
  cuda::DeviceGuard guard(device_);
  (void)LIBCOMM_NCCL_FN(CommAbort)(comm_);
}

Status Comm::destroy(Deadline deadline, const std::atomic<bool>* stop) {
  if (!comm_) return Status::ok();
  const std::string who = detail::strCat("rank ", rank_, " of ", size_, " (device ", device_, ")");
  cuda::DeviceGuard guard(device_);
  Status s = LIBCOMM_NCCL_CALL(CommFinalize, comm_);
  if (s.isOk() || s.code() == StatusCode::kInProgress) {
    ncclResult_t call = ncclSuccess;
    const ncclResult_t state = pollComm(comm_, deadline, &call, stop);
    s = call != ncclSuccess ? LIBCOMM_NCCL_STATUS(call) : LIBCOMM_NCCL_STATUS(state);
    if (s.code() == StatusCode::kInProgress)
      s = stop && stop->load()
              ? makeError(StatusCode::kRemoteError, "NCCL communicator of ", who, " aborted while finalizing")
              : makeError(StatusCode::kTimeout, "NCCL communicator of ", who, " did not finalize by the deadline; aborted");
  }
  if (!s.isOk()) {
    (void)LIBCOMM_NCCL_FN(CommAbort)(comm_);
    comm_ = nullptr;
    return s.withContext(detail::strCat("destroying the NCCL communicator of ", who));
  }
  s = LIBCOMM_NCCL_CALL(CommDestroy, comm_);
  comm_ = nullptr;
  return s.isOk() ? s : s.withContext(detail::strCat("destroying the NCCL communicator of ", who));
}

Result<std::unique_ptr<Comm>> initComm(const ncclUniqueId& id, int rank, int size, int device, Deadline deadline,
                                       const std::atomic<bool>* stop) {
  const std::string who = detail::strCat("rank ", rank, " of ", size, " (device ", device, ")");
  if (size < 1 || rank < 0 || rank >= size)
    return makeError(StatusCode::kInvalidArgument, "NCCL communicator: ", who, " is not a rank of the world");
  LIBCOMM_RETURN_IF_ERROR(backendLibrary().status().withContext("NCCL communicator of " + who));
  LIBCOMM_RETURN_IF_ERROR(cuda::checkDevice(device, "NCCL communicator of " + who));
  cuda::DeviceGuard guard(device);
  LIBCOMM_RETURN_IF_ERROR(guard.status());
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // returns at once; we poll, so that the wait for the peers has a deadline
  ncclComm_t comm = nullptr;
  Status s = LIBCOMM_NCCL_CALL(CommInitRankConfig, &comm, size, id, rank, &config);
  if (s.code() == StatusCode::kInProgress) s = Status::ok();
  if (s.isOk() && comm) {
    ncclResult_t call = ncclSuccess;
    const ncclResult_t state = pollComm(comm, deadline, &call, stop);
    s = call != ncclSuccess ? LIBCOMM_NCCL_STATUS(call) : LIBCOMM_NCCL_STATUS(state);
    if (s.code() == StatusCode::kInProgress)
      s = stop && stop->load()
              ? makeError(StatusCode::kRemoteError, "NCCL communicator of ", who, " aborted while being created")
              : makeError(StatusCode::kTimeout, "NCCL communicator of ", who,
                          " was not ready by the deadline (a peer that never joined?); aborted");
  }
  if (!s.isOk()) {
    if (comm) (void)LIBCOMM_NCCL_FN(CommAbort)(comm);
    return s.withContext(detail::strCat("creating the NCCL communicator of ", who));
  }
  LIBCOMM_LOG(kInfo, "init") << "NCCL communicator ready: " << who;
  return std::make_unique<Comm>(comm, rank, size, device);
}

}  // namespace libcomm::nccl
