#pragma once
// Out-of-band rendezvous: how ranks find each other and exchange the few bytes (addresses,
// segment names, fingerprints) a Communicator needs before it can move data itself.
//
// Implementations: in-process (ranks are threads; tests), file store (a shared directory) and TCP
// store (a key-value server that rank 0 or a launcher hosts; every connection proves the job's
// secret; every message is length-bounded and versioned). All calls are collective in the obvious
// sense (every rank calls allGather/barrier in the same order) and every wait has a deadline.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"

namespace libcomm {

/// The largest world size a bootstrap accepts (resolveLaunchInfo and every create*Bootstrap refuse
/// more, naming the value): 2^20 ranks, far beyond any job libcomm runs, yet small enough that the
/// per-rank tables a rendezvous builds (a few bytes per rank) stay a few MiB and every count fits
/// an int. A backend may allow fewer (UCX's tag layout: 65536) and says so when it is chosen.
inline constexpr int kMaxWorldSize = 1 << 20;

/// A small key-value board next to the rendezvous, for diagnosis while the job runs: libcomm
/// publishes each rank's collective progress there, so that a rank whose collective times out can
/// say which ranks had not arrived without asking them (a stopped or busy rank cannot answer).
/// Values are overwritten, never queued. Thread-safe, and independent of the Bootstrap's own calls
/// (the TCP store gives it a connection of its own), so that it may be used while a collective
/// round of the Bootstrap is waiting.
class SideChannel {
 public:
  virtual ~SideChannel() = default;
  /// Sets `key` to `value` (a few dozen bytes; keys are printable ASCII).
  virtual Status publish(const std::string& key, const std::string& value, Deadline deadline) = 0;
  /// Deletes `key`; an absent key is fine.
  virtual Status remove(const std::string& key, Deadline deadline) = 0;
  /// The values of `keys`, in order; std::nullopt for a key nobody published. Never waits for an
  /// absent key to appear.
  virtual Result<std::vector<std::optional<std::string>>> lookup(const std::vector<std::string>& keys,
                                                                 Deadline deadline) = 0;
};

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Identifier shared by all ranks of one job (names shared-memory segments, log lines).
  virtual const std::string& jobId() const = 0;
  /// Human-readable kind and address ("tcp 127.0.0.1:29500", "file /tmp/x", "in-process").
  virtual std::string describe() const = 0;

  /// Gathers `bytes` bytes from every rank into `all` (size() * bytes, in rank order).
  /// Collective; every rank passes the same `bytes`. Not thread-safe against other calls on the
  /// same Bootstrap.
  virtual Status allGather(const void* mine, void* all, size_t bytes, Deadline deadline) = 0;
  /// Returns once every rank has entered the barrier. Collective.
  virtual Status barrier(Deadline deadline) = 0;
  /// Point-to-point: delivers `bytes` bytes to `peer` under `tag`. Messages with the same
  /// (source, destination, tag) are delivered in order. Does not wait for the receiver.
  virtual Status send(int peer, uint32_t tag, const void* data, size_t bytes, Deadline deadline) = 0;
  /// Receives exactly `bytes` bytes sent by `peer` under `tag`; a size mismatch is kInvalidUsage.
  virtual Status recv(int peer, uint32_t tag, void* data, size_t bytes, Deadline deadline) = 0;
  /// Opens a side channel (above) on this rendezvous. Not collective. The default answers
  /// kInvalidUsage ("no side channel"): a Bootstrap written outside libcomm need not offer one, and
  /// a communicator over it then names only the peers a timed-out rank was waiting on.
  virtual Result<std::unique_ptr<SideChannel>> openSideChannel(Deadline deadline);
};

/// `size` connected bootstraps for ranks that are threads of this process (index = rank).
/// `jobId` empty means a fresh random one.
std::vector<std::unique_ptr<Bootstrap>> createInProcessBootstraps(int size, std::string jobId = "");

/// Rendezvous through files in `dir` (which must be shared by all ranks; it is created if
/// missing). `jobId` must be the same on all ranks; it scopes the files inside `dir`. A `dir` where
/// every user may replace files (o+w and not sticky) is refused (kInvalidArgument): the files carry
/// no secret, so anyone could forge them. In a sticky one (/tmp) files are created exclusively and
/// never through a link, and only regular files of this process's user are read: a name another
/// user took first fails the job at once, naming it.
/// Collective: returns once every rank has joined and agreed on `size`. Each rank deletes its
/// files as soon as no rank can still read them; rank 0 removes the job's lock file when it ends,
/// and the last rank to destroy its bootstrap the run's remaining files (the last round's, the side
/// channel's, the run file), where every rank ran on its host (on a filesystem shared between hosts
/// a removal may show late, so the files stay): a run whose ranks all ended leaves nothing in `dir`.
/// Otherwise, and after a killed rank, they stay until the next run of the job id in `dir` (or until
/// `dir` is removed). A job id may be reused there by later runs:
/// rank 0 starts each run under a fresh nonce and removes what earlier runs of that id left, and
/// the other ranks join only a rank 0 that is alive. Two runs of one job id in one directory must
/// not overlap in time (the second's rank 0 would remove the first's files). A rank waiting for
/// another that died or closed its bootstrap fails within about 100 ms, naming it (kRemoteError),
/// where the directory's file system has flock locks (each rank locks a claim file while it lives);
/// elsewhere it waits out its deadline. A job id with a part after a '.' of exactly 16 hex digits
/// ("exp.deadbeefdeadbeef") is refused: its files would be named like those of a run of a shorter
/// job ("exp").
Result<std::unique_ptr<Bootstrap>> createFileBootstrap(const std::string& dir, const std::string& jobId, int rank,
                                                       int size, Deadline deadline);

/// A TCP key-value store for one job. Rank 0 or a launcher runs it; it serves until destroyed.
/// Destroying it stops its thread and closes every connection at once: ranks still using it get
/// kRemoteError, so destroy it only once the other ranks are done with it (the bootstrap that
/// createBootstrapFromEnvironment returns to the hosting rank waits for them).
class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  /// The port actually bound (useful when 0 was asked for).
  virtual int port() const = 0;
  virtual const std::string& host() const = 0;
  /// The connections it refused so far, for a rank's error when the job did not come together
  /// ("2 connections refused; rank 1: wrong job secret (from 10.0.0.2:40112)"), or empty.
  /// Thread-safe.
  virtual std::string refusals() const { return ""; }
};

/// Starts a store listening on `host:port` (port 0: any free port). Connections must present
/// `secret`; malformed or unauthenticated connections are dropped with a warning.
Result<std::unique_ptr<TcpStoreServer>> startTcpStore(const std::string& host, int port, const std::string& secret);

/// Connects rank `rank` of `size` to the store at `host:port`, retrying until `deadline` while the
/// store is not up yet. `jobId` empty: rank 0 picks one and the store hands it to the others.
/// Collective: returns once every rank has joined and agreed on `size` and the job id. A wrong
/// secret, or a rank already connected by another process, is kInvalidArgument at once.
Result<std::unique_ptr<Bootstrap>> createTcpBootstrap(const std::string& host, int port, const std::string& secret,
                                                      int rank, int size, Deadline deadline,
                                                      const std::string& jobId = "");

/// Where this process sits in the job, and how it was found out.
struct LaunchInfo {
  int rank = -1;
  int size = -1;
  int localRank = -1;  // -1 when the launcher does not say
  int localSize = -1;
  /// Which source gave rank and size: "explicit", "LIBCOMM", "torchrun", "openmpi", "slurm".
  std::string source;
  /// Rendezvous: TCP store address (host, port), or a file-store directory.
  std::string storeHost;
  int storePort = 0;
  std::string storeDir;
  /// Per-job secret for the TCP store.
  std::string secret;
  std::string jobId;
  /// True when this process should host the TCP store (rank 0 under torchrun-style launches).
  bool hostsStore = false;
};

/// Explicit values win over the environment; -1 / empty means "not given".
struct LaunchOverrides {
  int rank = -1;
  int size = -1;
};

/// Resolves rank and size from, in order: explicit overrides, LIBCOMM_RANK/LIBCOMM_WORLD_SIZE
/// (+ LIBCOMM_LOCAL_RANK, LIBCOMM_STORE_ADDR=host:port or LIBCOMM_STORE_DIR, LIBCOMM_SECRET,
/// LIBCOMM_JOB_ID), torchrun's RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT/LOCAL_RANK, Open MPI's
/// OMPI_COMM_WORLD_*, Slurm's SLURM_PROCID/SLURM_NTASKS. Two sources that both define rank or size
/// and disagree are an error naming both. The source used is logged at INFO.
/// Slurm's variables count only when no other launcher defines rank or size (children of mpirun
/// or torchrun inherit them from the enclosing Slurm step). A size above 1 also needs a
/// rendezvous: LIBCOMM_STORE_DIR (with LIBCOMM_JOB_ID) or a TCP store address with LIBCOMM_SECRET
/// (under torchrun a secret derived from TORCHELASTIC_RUN_ID is accepted, with a warning).
Result<LaunchInfo> resolveLaunchInfo(const LaunchOverrides& overrides = {});

/// True when a launcher started this process as a rank of a job: any rank or world-size variable
/// resolveLaunchInfo() reads is set (one alone is enough: resolveLaunchInfo then says what is
/// missing), or PMI_RANK/PMI_SIZE (MPICH, Intel MPI), or Slurm's SLURM_PROCID in a step whose
/// SLURM_NTASKS is not 1. A tool that can also launch its own ranks (`-np`) runs as a rank then,
/// rather than as a job of one. `which`, when given, is set to the variable that says so. Reads
/// the environment only; thread-safe.
bool startedAsRank(std::string* which = nullptr);

/// How many ranks of the job run on this host, as the launcher's variables say: LIBCOMM_LOCAL_SIZE,
/// torchrun's LOCAL_WORLD_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, or (in a Slurm step) this
/// node's entry of SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE; 0 when none says, or what it
/// says does not parse. Quiet (no log line, no error): for sizing, such as a trainer's check that
/// the ranks on the machine fit its memory. resolveLaunchInfo() checks and reports the same values.
int localSizeFromEnvironment();

/// resolveLaunchInfo() + the matching bootstrap (hosting the TCP store when hostsStore is set;
/// the returned bootstrap keeps it alive, and its destructor waits, up to the peer timeout
/// (LIBCOMM_PEER_TIMEOUT_MS, 10 s by default), for the other ranks to disconnect before stopping
/// the store). A world of size 1 (LIBCOMM_WORLD_SIZE=1, ...) gets an in-process bootstrap. With no
/// launcher variables at all it fails saying what to set: a program that may also run alone checks
/// startedAsRank() first and otherwise takes createInProcessBootstraps(1)[0] (as tinylm does).
Result<std::unique_ptr<Bootstrap>> createBootstrapFromEnvironment(Deadline deadline,
                                                                  const LaunchOverrides& overrides = {});

}  // namespace libcomm
