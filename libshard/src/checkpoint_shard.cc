// Sharded checkpoints: writing a rank's shard file and the index, reading parameters back from
// the shard files of any world size, and whole-checkpoint verification.

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>

#include "checkpoint_format.h"

namespace libshard {
namespace {

using libcomm::Result;
using libcomm::Status;
using libcomm::StatusCode;
using namespace ckpt;  // NOLINT: this file is the checkpoint implementation

// Opens rank `rank`'s shard file and checks that it is the one the index describes.
Result<std::unique_ptr<ChunkedFile>> openShardFile(const std::string& dir, const CheckpointIndex& x, int rank) {
  const ShardFileEntry& e = x.files[static_cast<size_t>(rank)];
  const std::string path = joinPath(dir, e.file);
  // Checked before the chunk table is read (its length follows the header's element count).
  auto belongs = [&](const FileHeader& h) -> Status {
    if (h.rank != static_cast<uint32_t>(rank) || h.world != static_cast<uint32_t>(x.world) || h.sections != 3 ||
        h.numel != x.stateNumel || h.step != x.step)
      return badFile(path, "does not belong to this checkpoint: it holds rank ", h.rank, " of ", h.world, ", ", h.numel,
                     " elements, step ", h.step, "; the index expects rank ", rank, " of ", x.world, ", ", x.stateNumel,
                     " elements, step ", x.step);
    return Status::ok();
  };
  LIBCOMM_ASSIGN_OR_RETURN(auto f, ChunkedFile::open(path, kShardMagic, "shard", belongs));
  const FileHeader& h = f->header();
  if (h.tableCrc != e.tableCrc || f->layout().fileBytes != e.bytes)
    return badFile(path, "does not match the index (checksum or size differ): it was rewritten after the index");
  return f;
}

// Keeps at most kMaxOpenShardFiles shard files open (the least recently used is closed first):
// a load at a smaller world size, or an export, walks every old shard once per group, and one
// descriptor (and one cached chunk) per old rank would run out of descriptors with a thousand.
// A file opened again is checked again against the index.
class ShardedSource final : public ParamSource {
 public:
  static constexpr size_t kMaxOpenShardFiles = 64;

  ShardedSource(std::string dir, const CheckpointIndex& index)
      : dir_(std::move(dir)), index_(index), files_(static_cast<size_t>(index.world)),
        lastUse_(static_cast<size_t>(index.world), 0) {}

  Status read(const LayoutParam& p, int section, uint64_t first, size_t n, float* dst) override {
    const LayoutGroup& g = index_.groups[static_cast<size_t>(p.group)];
    uint64_t pos = p.offset + first;  // in the group's flat buffer
    while (n > 0) {
      const uint64_t owner = pos / g.shardNumel, within = pos % g.shardNumel;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(n, g.shardNumel - within));
      LIBCOMM_ASSIGN_OR_RETURN(ChunkedFile * f, file(static_cast<int>(owner)));
      LIBCOMM_RETURN_IF_ERROR(
          f->read(static_cast<uint64_t>(section) * index_.stateNumel + g.stateOffset + within, take, dst));
      pos += take;
      dst += take;
      n -= take;
    }
    return Status::ok();
  }

 private:
  Result<ChunkedFile*> file(int rank) {
    const size_t r = static_cast<size_t>(rank);
    lastUse_[r] = ++clock_;
    if (files_[r]) return files_[r].get();
    if (open_.size() == kMaxOpenShardFiles) {
      auto lru = std::min_element(open_.begin(), open_.end(),
                                  [&](size_t a, size_t b) { return lastUse_[a] < lastUse_[b]; });
      files_[*lru].reset();
      *lru = open_.back();
      open_.pop_back();
    }
    LIBCOMM_ASSIGN_OR_RETURN(files_[r], openShardFile(dir_, index_, rank));
    open_.push_back(r);
    return files_[r].get();
  }

  std::string dir_;
  const CheckpointIndex& index_;                     // the caller's (a copy doubled a load's largest allocation)
  std::vector<std::unique_ptr<ChunkedFile>> files_;  // index = old rank; null when closed
  std::vector<uint64_t> lastUse_;                    // index = old rank
  std::vector<size_t> open_;                         // ranks whose file is open
  uint64_t clock_ = 0;
};

// The header of rank plan.options.rank's shard file of `numel` elements per section.
FileHeader shardHeader(const ShardPlan& plan, uint64_t numel, uint64_t step, uint32_t saveTag) {
  FileHeader h{};
  std::memcpy(h.magic, kShardMagic, sizeof(h.magic));
  h.version = kCheckpointVersion;
  h.rank = static_cast<uint32_t>(plan.options.rank);
  h.world = static_cast<uint32_t>(plan.options.worldSize);
  h.sections = 3;
  h.numel = numel;
  h.step = step;
  h.chunkElems = kChunkElems;
  h.saveTag = saveTag;
  return h;
}

Status checkStateValues(const ShardPlan& plan, const ShardState& state);

Status checkSaveArgs(const ShardPlan& plan, const ShardState& state) {
  const int rank = plan.options.rank, world = plan.options.worldSize;
  if (world < 1 || rank < 0 || rank >= world)
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: plan has rank ", rank, " of ", world);
  if (state.onDevice)
    return libcomm::makeError(StatusCode::kInvalidUsage,
                              "checkpoint save: the state is device memory; copy it to the host first");
  if (state.numel != plan.stateNumel)
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: state has ", state.numel,
                              " elements, the plan ", plan.stateNumel);
  if (state.numel > 0 && (!state.master || !state.adamM || !state.adamV))
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: state is missing master or moments");
  // Past an executor's groupUpdated the optimizer's step is partly done: some groups updated,
  // others not, all under the old step count -- a checkpoint that would load without complaint
  // and resume from a state no step produced.
  if (state.stamping != nullptr && state.stamping->load(std::memory_order_acquire))
    return libcomm::makeError(StatusCode::kInvalidUsage,
                              "checkpoint save: the optimizer's step is under way (the executor's groupUpdated "
                              "started the next step's gathers); save after optimizerDone, or before AdamW's "
                              "beginStep");
  return checkStateValues(plan, state);
}

// The group of the plan whose shard holds element `at` of the state, "" if none (padding).
std::string groupHolding(const ShardPlan& plan, size_t at) {
  auto holds = [at](const FlatGroup& g) { return at >= g.stateOffset && at - g.stateOffset < g.shardNumel; };
  for (const FlatGroup& g : plan.layers)
    if (holds(g)) return g.name;
  return holds(plan.resident) ? plan.resident.name : std::string();
}

// A state with a value no checkpoint may hold (ckpt::firstBadValue) is not saved: it would load
// and train on NaN, or fail every later load.
Status checkStateValues(const ShardPlan& plan, const ShardState& state) {
  const float* sections[] = {state.master, state.adamM, state.adamV};
  for (int s = 0; s < 3; ++s) {
    const size_t at = firstBadValue(sections[s], state.numel, s);
    if (at == state.numel) continue;
    const std::string group = groupHolding(plan, at);
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: rank ", plan.options.rank, "'s state",
                              badValueText(sections[s][at], s, at, group.empty() ? "" : " (group '" + group + "')"),
                              ": the training has diverged, or the state was written over. Nothing was saved");
  }
  return Status::ok();
}

}  // namespace

namespace ckpt {
// A directory whose index exists holds a complete checkpoint: saving into it would replace that
// checkpoint file by file, and a save that fails halfway would leave neither the old checkpoint
// nor the new one. So it is refused before anything is written.
Status refuseCompleteCheckpoint(const std::string& dir, const char* what) {
  const std::string index = joinPath(dir, kCheckpointIndexFile);
  struct stat sb;
  if (::lstat(index.c_str(), &sb) == 0)
    return libcomm::makeError(StatusCode::kInvalidArgument, what, ": '", dir, "' already holds a checkpoint (",
                              kCheckpointIndexFile,
                              " exists); save into a fresh directory -- the existing checkpoint is left untouched");
  if (errno != ENOENT && errno != ENOTDIR)
    return systemError("cannot check for an existing checkpoint at", index, errno);
  return Status::ok();
}

std::unique_ptr<ParamSource> makeShardedSource(const std::string& dir, const CheckpointIndex& index) {
  return std::make_unique<ShardedSource>(dir, index);
}
}  // namespace ckpt

std::string checkpointShardFileName(int rank, int worldSize) {
  return "rank-" + std::to_string(rank) + "-of-" + std::to_string(worldSize) + ".shard";
}

uint64_t checkpointShardFileBytes(const ShardPlan& plan) {
  return layoutOf(shardHeader(plan, plan.stateNumel, 0, 0)).fileBytes;
}

uint32_t newCheckpointSaveTag() {
  uint32_t tag = 0;
  try {
    std::random_device rd;
    while (tag == 0) tag = rd();
  } catch (const std::exception&) {
    // No entropy source (std::random_device may throw): the clock, the pid and an address, mixed.
    // A tag only has to differ between saves into one directory, not be unpredictable.
    uint64_t v = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
                 (static_cast<uint64_t>(::getpid()) << 32) ^ reinterpret_cast<uintptr_t>(&tag);
    v ^= v >> 33;
    v *= 0xff51afd7ed558ccdull;
    v ^= v >> 33;
    tag = static_cast<uint32_t>(v) | 1u;
  }
  return tag;
}

Status saveCheckpointShard(const std::string& dir, const ShardPlan& plan, const ShardState& state,
                           uint32_t saveTag) {
  LIBCOMM_RETURN_IF_ERROR(
      checkSaveArgs(plan, state).withContext("rank " + std::to_string(plan.options.rank) + ", checkpoint '" + dir + "'"));
  LIBCOMM_RETURN_IF_ERROR(refuseCompleteCheckpoint(dir, "checkpoint save"));
  LIBCOMM_RETURN_IF_ERROR(checkSaveClaim(dir, saveTag));
  LIBCOMM_RETURN_IF_ERROR(makeDirectoryDurably(dir));
  const std::string path = joinPath(dir, checkpointShardFileName(plan.options.rank, plan.options.worldSize));
  const FileHeader h = shardHeader(plan, state.numel, state.step, saveTag);
  const FileLayout layout = layoutOf(h);
  return writeFileAtomically(
      path,
      [&](int fd) -> Status {
        ChunkedWriter w(fd, path, layout.dataOffset, h.chunkElems);
        for (const float* section : {state.master, state.adamM, state.adamV})
          LIBCOMM_RETURN_IF_ERROR(w.append(section, state.numel));
        return writeTableAndHeader(fd, path, h, "", w.finish());
      },
      /*replace=*/true, [&] { return checkSaveClaim(dir, saveTag); });
}

Status writeCheckpointIndex(const std::string& dir, const ShardPlan& plan, uint32_t saveTag,
                            const CheckpointNotes& notes) {
  // A plan of no ranks would write an index listing no shard files: a directory that counts as a
  // complete checkpoint (later saves refuse it) and that nothing can load.
  if (plan.options.worldSize < 1)
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint index: plan has world size ",
                              plan.options.worldSize);
  for (const auto& [key, value] : notes)
    if (key.empty() || value.empty())
      return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint index: note '", key, "' has an empty ",
                                key.empty() ? "key" : "value");
  LIBCOMM_RETURN_IF_ERROR(refuseCompleteCheckpoint(dir, "checkpoint index"));
  LIBCOMM_RETURN_IF_ERROR(checkSaveClaim(dir, saveTag));
  CheckpointIndex x = indexFromPlan(plan);
  if (!notes.empty()) {
    x.version = kCheckpointIndexVersion;
    x.notes = notes;
  }
  for (int r = 0; r < x.world; ++r) {
    const std::string name = checkpointShardFileName(r, x.world);
    const std::string path = joinPath(dir, name);
    auto planned = [&](const FileHeader& h) -> Status {
      if (h.rank != static_cast<uint32_t>(r) || h.world != static_cast<uint32_t>(x.world) || h.sections != 3 ||
          h.numel != x.stateNumel)
        return badFile(path, "holds rank ", h.rank, " of ", h.world, " with ", h.numel,
                       " elements; the plan expects rank ", r, " of ", x.world, " with ", x.stateNumel);
      return Status::ok();
    };
    LIBCOMM_ASSIGN_OR_RETURN(auto f, ChunkedFile::open(path, kShardMagic, "shard", planned));
    const FileHeader& h = f->header();
    // A file of another save (an earlier attempt's, at the same step, left where this save's rank
    // failed to write; or a concurrent save's) would make a checkpoint that mixes two states and
    // loads without complaint.
    if (saveTag != 0 && h.saveTag != saveTag)
      return badFile(path, "was written by another save (save tag ", hex32(h.saveTag), ", this save's is ",
                     hex32(saveTag), "): rank ", r,
                     "'s saveCheckpointShard did not complete in this save; the checkpoint is not complete");
    if (r == 0) x.step = h.step;
    if (h.step != x.step)
      return badFile(path, "is at step ", h.step, " but rank 0's file is at step ", x.step,
                     " (ranks saved different steps)");
    x.files.push_back({r, name, f->layout().fileBytes, h.tableCrc});
  }
  const std::string text = formatIndex(x);
  const std::string path = joinPath(dir, kCheckpointIndexFile);
  if (text.size() > kMaxIndexBytes)  // what readIndex accepts
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint index for '", dir, "' would be ", text.size(),
                              " bytes, more than the ", kMaxIndexBytes, " a reader accepts");
  return writeFileAtomically(
      path, [&](int fd) { return pwriteAll(fd, text.data(), text.size(), 0, path); }, /*replace=*/false,
      [&] { return checkSaveClaim(dir, saveTag); });
}

Status saveCheckpoint(const std::string& dir, const std::vector<ShardPlan>& plans,
                      const std::vector<const ShardState*>& states) {
  if (plans.empty() || plans.size() != states.size())
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: ", plans.size(), " plans and ",
                              states.size(), " states (one of each per rank)");
  for (size_t r = 0; r < plans.size(); ++r) {
    if (plans[r].options.rank != static_cast<int>(r) || plans[r].options.worldSize != static_cast<int>(plans.size()))
      return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: plans[", r, "] is for rank ",
                                plans[r].options.rank, " of ", plans[r].options.worldSize);
    if (!states[r]) return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint save: states[", r, "] is null");
  }
  // Claimed like any save (a stale claim of a killed run is taken over; a live one refuses).
  LIBCOMM_ASSIGN_OR_RETURN(std::unique_ptr<SaveClaim> claim, SaveClaim::acquire(dir, newCheckpointSaveTag()));
  for (size_t r = 0; r < plans.size(); ++r)
    LIBCOMM_RETURN_IF_ERROR(saveCheckpointShard(dir, plans[r], *states[r], claim->saveTag()));
  return writeCheckpointIndex(dir, plans[0], claim->saveTag());
}

Status verifyCheckpoint(const std::string& dir) {
  LIBCOMM_ASSIGN_OR_RETURN(CheckpointIndex x, readIndex(dir));
  std::vector<float> buf;
  for (int r = 0; r < x.world; ++r) {
    LIBCOMM_ASSIGN_OR_RETURN(auto f, openShardFile(dir, x, r));
    const uint64_t numel = f->header().numel, total = 3 * numel;
    buf.resize(std::min<uint64_t>(total, kChunkElems));
    for (uint64_t at = 0; at < total; at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), total - at));
      LIBCOMM_RETURN_IF_ERROR(f->read(at, n, buf.data()));
      // The values too (ckpt::firstBadValue), section by section: a read may span two.
      for (uint64_t i = at; i < at + n;) {
        const int section = static_cast<int>(i / numel);
        const uint64_t end = std::min<uint64_t>(at + n, (section + 1) * numel);
        const size_t bad = firstBadValue(buf.data() + (i - at), static_cast<size_t>(end - i), section);
        if (bad < end - i)
          return badFile(
              joinPath(dir, x.files[static_cast<size_t>(r)].file),
              badValueText(buf[i - at + bad], section, i + bad - section * numel, " of its state").substr(1));
        i = end;
      }
    }
  }
  return Status::ok();
}

namespace ckpt {
CheckpointInfo infoOf(const CheckpointIndex& x) {
  CheckpointInfo info;
  info.version = x.version;
  info.worldSize = x.world;
  info.alignmentBytes = x.alignmentBytes;
  info.precision = x.precision;
  info.step = x.step;
  info.stateNumel = x.stateNumel;
  info.numParams = x.params.size();
  for (const LayoutParam& p : x.params) info.paramNumel += p.numel;
  for (const ShardFileEntry& e : x.files) {
    info.files.push_back(e.file);
    info.fileBytes.push_back(e.bytes);
  }
  info.notes = x.notes;
  info.indexCrc = x.crc;
  return info;
}
}  // namespace ckpt

Result<CheckpointInfo> readCheckpointInfo(const std::string& dir) {
  LIBCOMM_ASSIGN_OR_RETURN(CheckpointIndex x, readIndex(dir));
  return infoOf(x);
}

}  // namespace libshard
