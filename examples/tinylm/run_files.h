#pragma once
// The files the trainer's flags name, checked at set-up before anything is allocated (train.h:
// options errors): the directory --save-checkpoint saves into, the checkpoint --load-checkpoint
// resumes, and tinylm's own record in a checkpoint directory (kRunInfoFile). Internal to the
// trainer (train.cc). Reentrant: ranks as threads may check and write at once (one writer per file).

#include <cstdint>
#include <string>
#include <utility>

#include "libcomm/status.h"
#include "libshard/checkpoint.h"
#include "tinylm/train.h"

namespace tinylm {

/// An options error (isOptionsError): kInvalidArgument whose message starts with the flag, as the
/// parser's do.
template <typename... Args>
libcomm::Status optionsError(const char* flag, Args&&... args) {
  return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, flag, std::forward<Args>(args)...);
}

/// Whether `dir` holds a complete checkpoint as a save sees it: its index is there, even as a link
/// to nothing (a save refuses it).
bool holdsCheckpoint(const std::string& dir);

/// An options error unless a save into `dir` can succeed as far as can be told before it: `dir`
/// holds no checkpoint and is a directory, or its parent is; creating there what the save will
/// create (a probe, removed at once) works.
libcomm::Status checkSaveDirectory(const std::string& dir);

/// An options error unless the filesystem of `dir` (or of its parent, before the save makes it)
/// has room for the shard files of `ranksOnMachine` ranks, `shardFileBytes` each
/// (libshard::checkpointShardFileBytes; every rank of this machine saving there: a shared
/// filesystem may need more, which this cannot see).
/// `saves`: how many checkpoints the filesystem must hold at once (--keep-last K: K + 1, the new
/// one written before the oldest goes; else 1).
libcomm::Status checkSaveRoom(const std::string& dir, uint64_t shardFileBytes, int ranksOnMachine, int saves = 1);

/// --keep-last K, once the save of step `saved` is complete on every rank (for rank 0): keeps that
/// checkpoint and the newest K - 1 complete ones below it, and removes the DIR/step-<k> checkpoints
/// below those (complete or not: an older one that never finished is a save that died). Nothing
/// above `saved` is touched: a run resumed from an older step into the same DIR leaves the other
/// branch's later checkpoints alone. Returns the directories removed; stops at the first that
/// cannot be (its error names it).
libcomm::Result<std::vector<std::string>> pruneStepCheckpoints(const std::string& dir, int keep, int saved);

/// Where a resume starts: the checkpoint's step, and the settings this run changes against the run
/// that saved it ("--lr 0.003 -> 0.001, --clip 1 -> 0.5"; empty when none or unrecorded).
struct ResumePoint {
  uint64_t step = 0;
  std::string changed;
  std::string notice;  // what could not be checked (a checkpoint with no tinylm record); empty: none
  uint32_t indexCrc = 0;  // of the index checked: the load must read the same one
};

/// An options error unless options.loadCheckpoint holds a checkpoint this run may resume: its
/// precision and the data settings kRunInfoFile records (seed, sequence length, global batch) are
/// the options', its step is not past options.steps. A checkpoint that is there but unreadable is
/// the checkpoint's error, not the flag's.
libcomm::Result<ResumePoint> checkResume(const TrainOptions& options);

/// The run's settings that a resume checks (checkResume), as notes for the checkpoint's index
/// (libshard::writeCheckpointIndex), where the index's checksum covers them.
libshard::CheckpointNotes runNotes(const TrainOptions& options);

}  // namespace tinylm
