#pragma once
// The one registry of libcomm's settings. Every knob is declared once (name, type, default, doc)
// in src/core/config.cc; values come from LIBCOMM_* environment variables. Unknown LIBCOMM_*
// variables are warned about once; the non-default values in effect are logged at INFO.

#include <string>
#include <vector>

#include "libcomm/deadline.h"
#include "libcomm/status.h"
#include "libcomm/types.h"

namespace libcomm {

enum class SettingType { kInt, kBool, kString };

struct SettingInfo {
  const char* name;      // environment variable, e.g. "LIBCOMM_TIMEOUT_MS"
  SettingType type;
  const char* defaultValue;
  const char* doc;
};

/// Every declared setting, in declaration order. Thread-safe.
const std::vector<SettingInfo>& allSettings();

/// The raw value of a declared setting: the environment's if set to a non-empty value, else the
/// default (`LIBCOMM_X=` counts as not set, for every type, as `export X=$UNSET` in a job script
/// means). Asking for an undeclared name is an internal error (assert). Thread-safe.
std::string settingValue(const char* name);
/// Typed accessors; a malformed value in the environment is kInvalidArgument naming the variable.
Result<long long> settingInt(const char* name);
Result<bool> settingBool(const char* name);

/// Whether a setting's value is a credential (LIBCOMM_SECRET): logs and comm_info never show it.
bool isSecretSetting(const char* name);

/// A table of all settings with their effective values and docs (for tools/comm_info).
std::string describeSettings();

/// The type a reduction's partial sums travel in between hosts (CommConfig::reducePartials).
enum class PartialsType : uint8_t {
  kFloat32 = 0,   // bf16 input is widened: every hop adds in fp32 and rounds once
  kBFloat16 = 1,  // bf16 input only: half of fp32's bytes; every hop rounds to bf16
  kFloat64 = 2,   // every hop adds exactly (within fp64's 53 bits); the output rounds once
};
/// "fp32" / "bf16" / "fp64".
const char* partialsTypeName(PartialsType t);

/// Per-communicator configuration. Defaults come from the registry (environment).
///
/// Deadlines are layered, and validate() refuses an inverted set: a blocked wait checks its peers
/// every peerCheckInterval (< peerTimeout), a lost peer is named within peerTimeout, one
/// collective may take opTimeout, and creating a communicator -- which waits for the slowest rank
/// to arrive -- may take initTimeout (> opTimeout).
struct CommConfig {
  /// Deadline for any one collective: its clock starts at the collective's first wait that outlasts
  /// the spin (reading the clock on every call would cost the small ones), so it bounds the time
  /// from about its start on the stream to its end.
  Milliseconds opTimeout{300000};
  /// Deadline for Communicator::create (bootstrap exchange, mapping peers).
  Milliseconds initTimeout{600000};
  /// How often a blocked wait checks that its peers are still alive.
  Milliseconds peerCheckInterval{100};
  /// How long a lost peer may go unnoticed: a killed process on this host is seen at the next
  /// peer check; across hosts a killed process resets its connections at once, and a silent host
  /// or cut link is declared lost by TCP keepalive probes sized to fit this (process-wide: the
  /// communicator that creates the process's UCX context sets UCX_TCP_KEEP* from it, where the
  /// user set none; communicators created while that context lives share its values).
  Milliseconds peerTimeout{10000};
  /// Across hosts: how often a rank publishes how far it has got (the last collective called,
  /// started and finished) on the bootstrap's side channel, so that a rank whose collective times
  /// out can name the ranks that had not arrived (LIBCOMM_PROGRESS_REPORT_MS; 0: never, and a
  /// timeout names only the peers it waited on). Used at most every opTimeout / 4, so that a
  /// report is never as old as the timeout it explains. One store write per interval per rank,
  /// only while collectives run.
  Milliseconds progressReportInterval{1000};
  /// Algorithm override ("" = the selector's choice; one host: "eager", "direct", "staged"; across
  /// hosts: "eager" (past 16 ranks its relayed form; with equally many >= 2 ranks on every host,
  /// its two-level form, relayed along the rails past 16 hosts), "ring", "hier"; device memory: "nccl", which host
  /// collectives ignore), from LIBCOMM_ALGO. "eager" refuses inputs larger than eagerBytes (and,
  /// in the two-level form, an all_gather whose host's inputs exceed 4 x eagerBytes, and past 16
  /// hosts H x a host's entry past it; in the relayed form, n x the input past 4 x eagerBytes).
  /// "hier" applies to all_gather, reduce_scatter and an all_reduce that does not accumulate;
  /// accumulating all_reduces, broadcast and barrier have only the ring form. Communicator::create fails
  /// (kInvalidUsage, on every rank) when any rank's setting cannot run on the communicator's hosts: direct or staged
  /// across hosts, ring or hier on one host, hier without at least 2 ranks on every host, equally many.
  std::string algo;
  /// Compare every collective's fingerprint across ranks (LIBCOMM_CHECK_MISMATCH). Every rank must
  /// have the same value: creation refuses ranks that differ (kInvalidUsage, naming both).
  bool checkMismatch = true;
  /// Log each collective's algorithm choice (LIBCOMM_COLL_TRACE).
  bool collTrace = false;
  /// Across hosts, the type a reduce_scatter's partial sums travel in between hosts
  /// (LIBCOMM_RS_PARTIALS, PartialsType). fp32 (the default; bf16 input is widened first) keeps
  /// the error at fp32's level whatever the number of hosts. bf16 (bf16 input only) halves the
  /// bytes between hosts, but every ring hop rounds the partial to bf16 (one per host on the
  /// two-level algorithm; one per rank on the flat ring, hops inside a host included), so the
  /// error grows with the hops. fp64 (bf16 and fp32 input) doubles fp32's bytes and makes every
  /// addition exact (within fp64's 53 bits, reduce.h), so the result is the exact sum rounded once,
  /// the same at any number of hops and hosts (docs/PERFORMANCE.md): a communicator on one host
  /// forms its reduce_scatter sums in fp64 too. fp64 covers all_reduce as well (its ring moves
  /// fp64 sums in both halves, twice fp32's bytes, and every rank rounds the same exact sums once,
  /// an accumulation and the avg/premulSum scale included); with fp32 or bf16 all_reduce sums in
  /// fp32, in rank order on one host and in ring order across hosts, so across hosts its result
  /// depends on how the ranks are spread over them (the same on every rank of one run). On device
  /// memory only bf16 matters, on the NCCL path: a bf16-in, bf16-out reduction then goes to NCCL
  /// in bf16 (half the bytes, a bf16 rounding per ring step) instead of fp32 rounded once; the CUDA
  /// own path always sums in fp32. Every rank must use the same.
  PartialsType reducePartials = PartialsType::kFloat32;
  /// Across hosts (UCX): messages of at least this many bytes travel on a second endpoint per
  /// peer, created without UCX's peer-failure mode (LIBCOMM_UCX_BULK_BYTES; 0: every message on
  /// the first). With that mode UCX 1.13 keeps rendezvous off transports that cannot invalidate
  /// registered memory, tcp among them, and moves large messages as copied fragments instead of
  /// zero-copy; measured at 2 hosts x 1 rank, all_gather runs 1.2-1.25x faster on the second
  /// endpoint (docs/PERFORMANCE.md). A lost peer is still named within peerTimeout, through the
  /// first endpoint (UCX reports nothing on the second). Negative: automatic -- 64 KiB where this
  /// machine lists no RDMA device (/sys/class/infiniband), else 0: over RDMA the first endpoint
  /// may have zero-copy already, and an endpoint without the mode is untested there.
  int64_t ucxBulkBytes = -1;
  /// Bytes per staging chunk for unregistered buffers (LIBCOMM_STAGING_CHUNK).
  size_t stagingChunkBytes = 1 << 20;
  /// Collectives whose per-rank input is at most this many bytes travel with their arrival
  /// handshake (LIBCOMM_EAGER_BYTES; 0 leaves it to barriers and empty collectives, which carry
  /// no data): on one host in the eager areas, across hosts (communicators of at most 16 ranks)
  /// in one message with the fingerprint to each rank that needs it (on more ranks, while n x
  /// the input fits 4x this, relayed to every rank in log2(n) rounds), or, where every host has
  /// equally many >= 2 ranks, through the host's eager areas and then one message to each rank
  /// of the own rail (an all_gather while the host's inputs fit 4x this; each rank then holds
  /// receive slots of 4x this per host; past 16 hosts the hosts' entries relayed along the rail
  /// while they fit 4x this in all). Every rank must have the same value:
  /// creation refuses ranks that differ.
  size_t eagerBytes = 16384;
  /// How long a collective called on an inline stream (a blocking call: its thread has nothing
  /// else to do) polls for its peers before sleeping, from LIBCOMM_SPIN_US. Negative: automatic --
  /// 1 ms of polling when this host's ranks fit its usable cores; else 1 ms of polling with
  /// sched_yield() in between (a pure spin would hold the core the awaited peer needs).
  /// Collectives on threaded streams follow progressSpin.
  std::chrono::microseconds blockingSpin{-1};
  /// How long a threaded stream's progress thread polls for its peers before sleeping, from
  /// LIBCOMM_PROGRESS_SPIN_US. Negative: automatic -- 1 ms where the cores fit three threads per
  /// rank on this machine (compute and two streams' progress threads), else 20 us: there a longer
  /// poll takes the core from the caller's compute (docs/PERFORMANCE.md, "Progress-thread polling").
  /// Automatic only: then up to 1 ms more while a host thread of the process sleeps in a host
  /// stream's wait, on that thread's core (at most one progress thread per sleeping thread;
  /// docs/PERFORMANCE.md, "Borrowed cores").
  std::chrono::microseconds progressSpin{-1};
  /// This rank's host id (LIBCOMM_HOST_ID): ranks with equal ids share a host. Empty: hostname
  /// plus kernel boot id. Set it to tell apart "hosts" that are containers or network namespaces
  /// of one machine. At most 63 characters.
  std::string hostId;
  /// Collectives this communicator's flight recorder remembers (LIBCOMM_FLIGHT_RECORDER; 0: off;
  /// at most 2^20). Dumped on the first failed collective, on SIGUSR1 and by
  /// Communicator::dumpFlightRecorder.
  size_t flightRecorderEntries = 2000;
  /// Directory of flight-recorder dumps (LIBCOMM_FLIGHT_RECORDER_DIR; empty: $TMPDIR or /tmp,
  /// then libcomm-flight-<uid>).
  std::string flightRecorderDir;

  /// Reads every field from the registry; malformed values and inverted deadlines are errors.
  /// readEnvironment() then validate(). Thread-safe (reads the environment only).
  static Result<CommConfig> fromEnvironment();
  /// Reads every field from the registry; a malformed value is an error, but what validate()
  /// checks (layered deadlines, the algorithm's name, the host id's length) is not. For a caller
  /// that overrides fields from its own flags (a --timeout setting both deadlines): override, then
  /// call validate(), so that an environment value the flags replace cannot fail it.
  /// Communicator::create validates too. Thread-safe (reads the environment only).
  static Result<CommConfig> readEnvironment();
  /// kInvalidArgument naming the settings when a value is out of range or the deadlines are not
  /// layered (peerCheckInterval < peerTimeout, opTimeout < initTimeout). Communicator::create
  /// calls it, so a config built in code is checked too.
  Status validate() const;
};

}  // namespace libcomm
