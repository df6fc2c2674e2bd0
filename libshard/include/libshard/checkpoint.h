#pragma once
// Sharded checkpoints of the training state (fp32 master weights, AdamW moments, step) that load
// at the same or at a different world size, and one-file exports of the whole unsharded model.
//
// A sharded checkpoint is a directory:
//   rank-<r>-of-<W>.shard   one per rank: a 64-byte header (magic "SHCKSHRD", format version,
//                           rank, world, elements per array, step, chunk size, checksums), a table
//                           of CRC32C checksums, one per chunk of the data, then the rank's flat
//                           state arrays master, adamM, adamV (ShardPlan::stateNumel fp32 each,
//                           padding included) -- the rank's ShardState as it is in memory.
//   index.txt               written last, by rank 0: format version, world size, alignment,
//                           precision, step, every group (name, layer, numel, padded and shard
//                           sizes, state offset) and parameter (name, kind, decay, offset in its
//                           group, numel, shape), and per shard file its size and the checksum of
//                           its chunk table, and the caller's notes (CheckpointNotes, version 2);
//                           the index ends with a CRC32C of itself. Its presence marks a complete
//                           checkpoint.
//   .save-claim             while a save that claimed the directory runs (SaveClaim); never read
//                           by a load.
// Every file is written under a temporary name in the same directory, fsync'd, moved to its final
// name, and the directory fsync'd: a final name never holds a half-written file. Shard files are
// renamed over it; the index is hard-linked to it (so that an existing index is never replaced;
// renamed where the filesystem has no hard links) and the temporary name removed.
//
// Loading reads the index, checks that the checkpoint's parameters are exactly the model's (same
// names, same shapes; layers, kinds, alignment and world size may differ), and for each parameter
// element of the loading rank's new shards reads it from whichever old shard file holds it, with
// pread, chunk by chunk: only the 1 MiB checksum chunks that hold needed elements are read, and
// every chunk read is checked against its CRC32C before use; at most 64 shard files are open at
// a time, whatever the old world size. Padding is zero. Everything is read
// into temporaries first; the destination state is written only once the whole load has
// succeeded, so an error leaves it untouched (the price: 12 bytes of temporary memory per state
// element -- master, m and v -- until the commit).
//
// Values: a checkpoint holds finite weights and moments and no negative second moment. A save of
// a state that holds anything else (a diverged run) is refused before anything is written; a load
// or verifyCheckpoint refuses such a value under checksums that are all right (a file written or
// altered by something else), naming the parameter or element, rather than let training run on NaN.
//
// The full-model file ("SHCKFULL") holds a header, a text index of the parameters (name, kind,
// decay, offset, numel, shape) in the sharded layout's order (layer groups, then the norm
// parameters), the chunk checksum table, then every parameter's fp32 weights packed without
// padding, optionally followed by the AdamW m and v sections (same packing). It always carries the
// step. Importing restores m, v and step when the file has the moments and the caller asks for
// them; otherwise m = v = 0 and step = 0 (a fresh optimizer on the imported weights).
//
// Multi-process coordination is the caller's: rank 0 draws a save tag (newCheckpointSaveTag),
// claims the directory with it (SaveClaim, best before the run trains) and every rank learns it; every rank calls
// saveCheckpointShard() with it; the ranks agree that every one succeeded (an allGather of each rank's ok over the
// bootstrap -- a bare barrier would let rank 0 go on after another rank's failure); rank 0 calls writeCheckpointIndex()
// with the tag; the ranks agree on that outcome before anyone relies on the checkpoint. examples/tinylm/train.cc
// (saveSharded) does exactly this. The tag is what keeps a file of another save out of the index. Loading needs
// no coordination to run (each rank reads what it needs; the directory must be visible to every
// rank), but its outcome can differ between ranks: a rank reads only the chunks its new shard
// needs, so one rank may load while another finds a corrupt chunk or a missing file; and each
// rank resolves the path itself, so a link switched meanwhile gives two ranks two checkpoints.
// Before using the loaded state (training on it), the ranks must agree that every load succeeded
// and read the same index (CheckpointInfo::indexCrc from loadCheckpoint), e.g. an allGather over
// the bootstrap, as examples/tinylm does. Each checkpoint
// goes into a directory of its own (e.g. step-00001000): a directory that already holds a
// complete checkpoint (its index exists) is refused by both phases, before anything is written,
// so a save never destroys the previous good checkpoint. A directory left by an interrupted save
// (shard files, no index) may be saved into again. One save into a directory at a time: that is
// what SaveClaim holds; a second, concurrent save that does not claim may replace a shard file
// after the first wrote its index (a load or verifyCheckpoint then reports that file as
// rewritten after the index). A process killed while writing leaves its
// temporary (".<final name>.tmp-<pid>-<n>", dot-named, never read by a load); no save removes
// it, since on a shared filesystem its pid may belong to a live writer on another host (or
// another container: pids are reused). A later writer whose name is taken tries the next one.
// Delete such files once no save into the directory is running.
//
// Errors: kSystemError for failed system calls (the path and errno text in the message),
// kSystemError too when a file is in place but the fsync of its directory failed (the message says
// so; the file may not survive a crash),
// kInvalidArgument for a checkpoint that is missing a file, truncated, corrupt (checksum, magic,
// version) or does not match the model, and for a save into a directory that already holds a
// checkpoint; the message names the file or directory and what is wrong, and a load's or an
// import's error names the loading rank ("rank 1 of 4 loading: ...").
//
// All functions are reentrant: different ranks (threads) may save or load concurrently, as long
// as no two calls write the same file or the same ShardState.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/plan.h"
#include "libshard/state.h"

namespace libshard {

/// Format version of the shard and full-model files, written and accepted by this build.
inline constexpr uint32_t kCheckpointVersion = 1;
/// Newest index format this build reads: 1, or 2 (with notes). It writes 1 when a save has no
/// notes, so such a checkpoint stays readable by builds from before notes.
inline constexpr uint32_t kCheckpointIndexVersion = 2;

/// The caller's own records, kept in a checkpoint's index and covered by its checksum: what a
/// trainer must know to resume the run (its data settings, its model's flags), which libshard's
/// layout does not hold. Keys and values are any non-empty text (escaped in the file).
using CheckpointNotes = std::map<std::string, std::string>;
/// The index file of a sharded checkpoint directory.
inline constexpr const char* kCheckpointIndexFile = "index.txt";

/// "rank-<rank>-of-<worldSize>.shard".
std::string checkpointShardFileName(int rank, int worldSize);

/// The size in bytes of the shard file a save writes for one rank of `plan` (every rank's is the
/// same): for a check that the save will fit, before the run that makes it.
uint64_t checkpointShardFileBytes(const ShardPlan& plan);

/// A fresh random save tag (never 0), for one save: rank 0 draws it and every rank passes the
/// same one to both phases (share it the way the ranks agree on the outcome, e.g. an allGather over
/// the bootstrap, as examples/tinylm does).
uint32_t newCheckpointSaveTag();

/// The file a SaveClaim keeps in the directory it holds (dot-named: a load never reads it).
inline constexpr const char* kCheckpointClaimFile = ".save-claim";

/// Holds a checkpoint directory for one save, from before a run trains to after its index is
/// written, so that a second run saving into the same directory is refused when it starts (and
/// writes nothing), not after both trained, when the two would replace each other's shard files.
/// Rank 0 acquires it (one claim per save) and passes its saveTag() to every rank's
/// saveCheckpointShard and to writeCheckpointIndex: those refuse (kInvalidUsage) a directory
/// claimed for another tag, before writing and again just before each file is moved into place
/// (which narrows the window to the rename itself: a shard of a dead save that still lands after
/// another save's index is reported by a load as rewritten after the index). A save without a
/// claim is not refused by them where there is no claim, so every writer into shared directories
/// should claim. Indexes with notes (format 2) are not readable by builds from before notes.
///
/// The claim is the file kCheckpointClaimFile: tag, pid, host, boot id and time, made whole under
/// a temporary name and linked into place, flock'ed by its holder for as long as it lives, and
/// refreshed (its modification time) every kSaveClaimRefreshSeconds by a thread of the holder. A
/// claim whose holder has gone (killed before it let go) is taken over: at once where that can be
/// told -- made on this host (same boot id) and its lock free (where the filesystem has no flock:
/// its pid gone) --, and, made on another host (where locks on a shared filesystem may be kept per
/// host, so a free lock says nothing), once it has not been refreshed for kSaveClaimStaleSeconds,
/// by the filesystem's clock (a job requeued on another node after its node died). Until then the
/// error says which host and pid hold it, and since when.
/// Reentrant; one object per save.
class SaveClaim {
 public:
  /// Claims `dir` for a save tagged `saveTag` (newCheckpointSaveTag; never 0), creating `dir`
  /// (its parent must exist) when it is missing. kInvalidUsage when another save holds it;
  /// kInvalidArgument when it already holds a complete checkpoint; kSystemError when the claim
  /// cannot be made.
  static libcomm::Result<std::unique_ptr<SaveClaim>> acquire(const std::string& dir, uint32_t saveTag);
  /// OK when acquire could claim `dir` now as far as its claim tells: none, or one whose holder is
  /// gone; else acquire's kInvalidUsage. Claims nothing (a launcher's check before it starts the
  /// ranks; acquire decides).
  static libcomm::Status checkFree(const std::string& dir);
  /// Lets go: removes the claim file (when it is still this claim's), and `dir` when acquire made
  /// it and nothing was saved into it.
  ~SaveClaim();
  SaveClaim(const SaveClaim&) = delete;
  SaveClaim& operator=(const SaveClaim&) = delete;

  uint32_t saveTag() const { return tag_; }
  const std::string& dir() const { return dir_; }
  /// The stale claim this one replaced (its holder, pid, host, time), for the caller to report;
  /// empty when the directory was free.
  const std::string& replaced() const { return replaced_; }

  static constexpr int kSaveClaimRefreshSeconds = 30;
  static constexpr int kSaveClaimStaleSeconds = 300;

 private:
  SaveClaim(std::string dir, uint32_t tag, int fd, bool madeDir);
  struct Refresher;
  std::string dir_;
  uint32_t tag_;
  int fd_;  // open on the claim file, holding its flock
  bool madeDir_;
  std::string replaced_;
  std::unique_ptr<Refresher> refresher_;  // the thread that keeps the claim's time fresh
};

/// Phase 1 of a save, on every rank: writes this rank's shard file of `state` (laid out by `plan`,
/// rank plan.options.rank) into `dir`, creating `dir` if it is missing (its parent must exist),
/// marked with `saveTag`. Reads state.master/adamM/adamV/step only. kInvalidArgument, with nothing
/// written, when `dir` already holds a complete checkpoint (index.txt exists).
libcomm::Status saveCheckpointShard(const std::string& dir, const ShardPlan& plan, const ShardState& state,
                                    uint32_t saveTag = 0);

/// Phase 2 of a save, on rank 0 after every rank's saveCheckpointShard succeeded: checks every
/// shard file's header (rank, world, size, same step, and, unless `saveTag` is 0, that phase 1
/// marked it with `saveTag`), then writes the index with their checksums. `plan` is any rank's
/// plan (the layout is the same on all ranks). Never replaces an existing index: kInvalidArgument
/// when one is there (or appears concurrently), and the old one stays. Without a tag, a file left
/// at the same step by an earlier, interrupted save is taken for this save's when this save's
/// rank did not write its own: the checkpoint would mix two states.
/// `notes` go into the index (readCheckpointInfo returns them); none: a version-1 index.
libcomm::Status writeCheckpointIndex(const std::string& dir, const ShardPlan& plan, uint32_t saveTag = 0,
                                     const CheckpointNotes& notes = {});

/// Both phases for a world whose ranks all live in this process (tests, tools, single-process
/// trainers): plans[r] and states[r] belong to rank r, under a SaveClaim of its own. Refuses a
/// directory holding a checkpoint, as above, or claimed by a live save.
libcomm::Status saveCheckpoint(const std::string& dir, const std::vector<ShardPlan>& plans,
                               const std::vector<const ShardState*>& states);

/// What a checkpoint holds, from its index.
struct CheckpointInfo {
  uint32_t version = 0;
  int worldSize = 0;
  size_t alignmentBytes = 0;
  Precision precision = Precision::kBf16;
  uint64_t step = 0;
  size_t stateNumel = 0;  // per rank
  size_t numParams = 0;
  size_t paramNumel = 0;           // sum of the parameters' numel (no padding)
  std::vector<std::string> files;  // shard file names, rank order
  std::vector<uint64_t> fileBytes;  // their sizes, as the index records them
  CheckpointNotes notes;           // writeCheckpointIndex's notes
  uint32_t indexCrc = 0;           // the index's own CRC32C: two checkpoints differ in it
};

/// Loads the checkpoint in `dir` into `state`, laid out by `plan` (rank plan.options.rank of
/// plan.options.worldSize: any world size). Fills master, adamM, adamV (padding zero) and step,
/// and refreshes state.compute from master when it is non-null; leaves state.grad alone.
/// On error `state` is unchanged. Another rank's load of the same checkpoint may fail where this
/// one succeeded (it reads other chunks): agree on the outcome before training (see above).
/// `loaded`, when non-null, receives what the index read by this load says (readCheckpointInfo):
/// its indexCrc names the checkpoint, so ranks can check that they all loaded the same one (a
/// path is resolved by each rank: a link switched during the start names two).
libcomm::Status loadCheckpoint(const std::string& dir, const ShardPlan& plan, ShardState& state,
                               CheckpointInfo* loaded = nullptr);

/// Reads every file of the checkpoint in `dir` -- header, index, chunk table and every data chunk
/// (not the zero padding that aligns them) -- and checks every checksum and the index's
/// consistency. OK means any world size can load it.
libcomm::Status verifyCheckpoint(const std::string& dir);

/// Reads and checks the index of the checkpoint in `dir` (not the shard files).
libcomm::Result<CheckpointInfo> readCheckpointInfo(const std::string& dir);

/// Writes the whole model held by the sharded checkpoint in `checkpointDir` into one file at
/// `path` (atomically, as above): fp32 weights by name, plus m, v and step when
/// `withOptimizerState`. Runs in one process; reads every shard file (checksums checked).
libcomm::Status exportFullModel(const std::string& checkpointDir, const std::string& path, bool withOptimizerState);

/// Loads the full-model file at `path` into `state` (any world size, as loadCheckpoint). Restores
/// m, v and step when the file has them and `restoreOptimizerState` is true; otherwise sets m and
/// v to 0 and step to 0. Parameters must match the model exactly. On error `state` is unchanged.
libcomm::Status importFullModel(const std::string& path, const ShardPlan& plan, ShardState& state,
                                bool restoreOptimizerState);

/// CRC32C (Castagnoli, reflected, init and final xor 0xFFFFFFFF), the checksum of every
/// checkpoint file; crc32c("123456789") == 0xE3069283. Chainable: crc32c(b, m, crc32c(a, n))
/// is the CRC of a followed by b. Uses the SSE4.2 instruction when the CPU has it. Reentrant.
uint32_t crc32c(const void* data, size_t bytes, uint32_t crc = 0);

}  // namespace libshard
