#pragma once
// Internals of libshard's checkpoint files (not installed): the binary header, atomic writes,
// checksummed chunked data, the text index, and sources that read parameters from a sharded
// checkpoint or a full-model file.
//
// Binary file layout (shard and full files alike, all integers little-endian):
//   [0, 64)                 FileHeader
//   [64, tableOffset)       index text (full files only; shard files have indexBytes = 0),
//                           zero-padded to a multiple of 64
//   [tableOffset, data)     one CRC32C (u32) per data chunk, zero-padded to a multiple of 64
//   [dataOffset, end)       sections x numel fp32 elements, checksummed in chunks of chunkElems

#include <sys/stat.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "libcomm/status.h"
#include "libshard/checkpoint.h"
#include "libshard/plan.h"

namespace libshard::ckpt {

static_assert(std::endian::native == std::endian::little, "checkpoint files are little-endian");

/// Table-driven CRC32C, same result as crc32c(); exposed so tests can check both paths.
uint32_t crc32cPortable(const void* data, size_t bytes, uint32_t crc = 0);

inline constexpr char kShardMagic[8] = {'S', 'H', 'C', 'K', 'S', 'H', 'R', 'D'};
inline constexpr char kFullMagic[8] = {'S', 'H', 'C', 'K', 'F', 'U', 'L', 'L'};
inline constexpr size_t kHeaderBytes = 64;
/// 1 MiB of fp32 per checksum chunk: the most a reader fetches beyond what it needs.
inline constexpr uint32_t kChunkElems = 1u << 18;
/// Sections of a data area: master weights, AdamW m, AdamW v.
inline constexpr int kMaxSections = 3;

struct FileHeader {
  char magic[8];
  uint32_t version;
  uint32_t rank;      // shard files: the writer's rank; full files: 0
  uint32_t world;     // shard files: the writer's world size; full files: 1
  uint32_t sections;  // 3 (weights, m, v) or, full files only, 1 (weights)
  uint64_t numel;     // elements per section
  uint64_t step;
  uint32_t chunkElems;
  uint32_t tableCrc;  // CRC32C of the chunk table (no padding): the file's content checksum
  uint32_t indexBytes;
  uint32_t indexCrc;
  uint32_t saveTag;  // shard files: the save they belong to (writeCheckpointIndex checks it); 0: none
  uint32_t headerCrc;  // CRC32C of the 60 bytes before it
};
static_assert(sizeof(FileHeader) == kHeaderBytes, "FileHeader must be 64 bytes with no padding");

/// Where the parts of a file are, as implied by its header.
struct FileLayout {
  uint64_t tableOffset = 0;
  uint64_t numChunks = 0;
  uint64_t dataOffset = 0;
  uint64_t fileBytes = 0;
};
FileLayout layoutOf(const FileHeader& h);
/// Sets headerCrc from the other fields.
void sealHeader(FileHeader& h);

/// An owned file descriptor.
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const { return fd_; }
  int release() {
    int f = fd_;
    fd_ = -1;
    return f;
  }

 private:
  int fd_ = -1;
};

/// kSystemError "<what> '<path>': <strerror(err)> (errno <err>)".
libcomm::Status systemError(const std::string& what, const std::string& path, int err);
/// kInvalidArgument "checkpoint file '<path>': <args...>".
template <typename... Args>
libcomm::Status badFile(const std::string& path, Args&&... args) {
  return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "checkpoint file '", path,
                            "': ", std::forward<Args>(args)...);
}

std::string joinPath(const std::string& dir, const std::string& name);

/// A checkpoint's sections, in file order, and what each may hold: finite values, and no negative
/// second moment (AdamW divides by its square root). A save refuses a state that holds anything
/// else (a diverged run), and a load or verifyCheckpoint a file that does, with every checksum
/// right: such a state trains on NaN, silently unless the trainer checks its gradient norm.
inline constexpr int kWeightsSection = 0, kFirstMomentSection = 1, kSecondMomentSection = 2;
/// "weights", "AdamW first moment", "AdamW second moment".
const char* sectionName(int section);
/// The index of the first of v[0..n) that `section` may not hold, or n.
size_t firstBadValue(const float* v, size_t n, int section);
/// " holds <value> in the <section> at element <at><where>; a checkpoint holds finite values only,
/// and no negative second moment": a bad value, as the errors name it.
std::string badValueText(float value, int section, uint64_t at, const std::string& where = "");

/// "0x" and 8 hex digits.
std::string hex32(uint32_t v);
/// Reads exactly n bytes at offset; a short read is a "truncated" kInvalidArgument.
libcomm::Status preadExact(int fd, void* buf, size_t n, uint64_t offset, const std::string& path);
libcomm::Status pwriteAll(int fd, const void* buf, size_t n, uint64_t offset, const std::string& path);
/// The largest index file a reader accepts: far above any real model's (a few hundred bytes per
/// parameter), and a bound on the allocation a damaged or foreign file can cause: with shapes of
/// at most kMaxParamDims extents, the parsed index takes a small multiple of the text (about 7x
/// for a file of one-element parameters, the worst case).
inline constexpr uint64_t kMaxIndexBytes = uint64_t{256} << 20;
/// Whole small file (an index) into a string; a file over `maxBytes` is kInvalidArgument.
/// Opens `path` for reading, refusing what is not a regular file (a FIFO would block the open
/// with no deadline) with a badFile error naming `kind`; fills `st`.
libcomm::Result<Fd> openRegularFile(const std::string& path, struct stat* st, const std::string& kind);
libcomm::Result<std::string> readWholeFile(const std::string& path, uint64_t maxBytes = kMaxIndexBytes);

/// Creates a temporary file next to `path`, lets `write` fill it, fsyncs it, renames it to `path`
/// and fsyncs the directory. On any failure the temporary is removed and `path` is untouched.
/// With `replace` false an existing `path` is never replaced: the call fails (kInvalidArgument,
/// "already exists") instead, atomically where the filesystem has hard links.
/// `beforePublish`, when set, runs after the fsync, just before the rename: an error from it
/// leaves `path` untouched (a save checks there that its directory is still its own).
libcomm::Status writeFileAtomically(const std::string& path, const std::function<libcomm::Status(int fd)>& write,
                                    bool replace = true, const std::function<libcomm::Status()>& beforePublish = {});

/// kInvalidArgument when `dir` already holds a complete checkpoint (its index exists): saving into
/// it would replace that checkpoint file by file. `what` starts the message.
libcomm::Status refuseCompleteCheckpoint(const std::string& dir, const char* what);

/// OK unless `dir` holds a save claim (SaveClaim) of another save than `saveTag`'s: a save into a
/// directory that another run has claimed is refused (kInvalidUsage), before anything is written
/// and again before each file is moved into place. No claim: OK (saves need not claim).
libcomm::Status checkSaveClaim(const std::string& dir, uint32_t saveTag);

/// fsync() of a directory, so that the entries made in it are durable.
libcomm::Status fsyncDirectory(const std::string& dir);
/// mkdir(dir) unless it exists, then fsync() of its parent so that the new entry is durable.
libcomm::Status makeDirectoryDurably(const std::string& dir);

/// Streams the data area of a file being written, computing the chunk checksums on the way.
class ChunkedWriter {
 public:
  ChunkedWriter(int fd, std::string path, uint64_t dataOffset, uint32_t chunkElems)
      : fd_(fd), path_(std::move(path)), offset_(dataOffset), chunkElems_(chunkElems) {}
  /// Appends n elements after those already written.
  libcomm::Status append(const float* data, size_t n);
  /// The checksum of every chunk, the last one possibly partial.
  std::vector<uint32_t> finish();

 private:
  int fd_;
  std::string path_;
  uint64_t offset_;
  uint32_t chunkElems_;
  uint64_t inChunk_ = 0;  // elements of the current chunk written so far
  uint32_t crc_ = 0;
  std::vector<uint32_t> crcs_;
};

/// Writes the sealed header, the index text and the chunk table of a file whose data area is
/// already written (sets the header's indexBytes, indexCrc and tableCrc).
libcomm::Status writeTableAndHeader(int fd, const std::string& path, FileHeader header, const std::string& indexText,
                                    const std::vector<uint32_t>& crcs);

/// A checkpoint data file opened for reading: header, index text and chunk table checked. Holds
/// the descriptor, the index text and one chunk, whatever the file's size.
class ChunkedFile {
 public:
  /// Checks magic, version, header checksum, size, index and table checksums. `kind` names the
  /// file kind in errors ("shard", "full-model"). `expect`, when given, checks the header against
  /// what the caller knows (an index's rank, world and size) before the chunk table is read: the
  /// table's length follows the header, and a crafted header could otherwise make the open read
  /// terabytes of a sparse file before any mismatch is named.
  static libcomm::Result<std::unique_ptr<ChunkedFile>> open(
      const std::string& path, const char (&magic)[8], const char* kind,
      const std::function<libcomm::Status(const FileHeader&)>& expect = {});
  const FileHeader& header() const { return header_; }
  const FileLayout& layout() const { return layout_; }
  const std::string& indexText() const { return index_; }
  const std::string& path() const { return path_; }
  /// Copies data elements [first, first + n) (sections concatenated) into dst; every chunk it
  /// touches is read once and its checksum checked. Sequential calls reuse the last chunk read.
  libcomm::Status read(uint64_t first, size_t n, float* dst);

 private:
  libcomm::Status loadChunk(uint64_t chunk, float* into);

  std::string path_;
  Fd fd_;
  FileHeader header_{};
  FileLayout layout_;
  std::string index_;
  std::vector<float> cache_;
  uint64_t cachedChunk_ = UINT64_MAX;
};

// ---- The index of a sharded checkpoint, and the parameter list of a full-model file. ----

struct LayoutParam {
  std::string name;
  std::vector<int64_t> shape;
  ParamKind kind = ParamKind::kBlock;
  bool weightDecay = true;
  uint64_t offset = 0;  // sharded: in its group's flat buffer; full file: in each packed section
  uint64_t numel = 0;
  int group = -1;  // sharded: index into CheckpointIndex::groups; full file: -1
};

struct LayoutGroup {
  std::string name;
  int layer = -1;
  uint64_t numel = 0, paddedNumel = 0, shardNumel = 0, stateOffset = 0;
};

struct ShardFileEntry {
  int rank = 0;
  std::string file;  // name inside the checkpoint directory
  uint64_t bytes = 0;
  uint32_t tableCrc = 0;
};

struct CheckpointIndex {
  uint32_t version = 1;  // kCheckpointIndexVersion where there are notes
  int world = 1;
  uint64_t alignmentBytes = 0;
  Precision precision = Precision::kBf16;
  uint64_t step = 0;
  uint64_t stateNumel = 0;
  std::vector<LayoutGroup> groups;    // the plan's layers, then the resident group
  std::vector<LayoutParam> params;    // in group order
  std::vector<ShardFileEntry> files;  // one per rank, rank order
  CheckpointNotes notes;              // the caller's records (version 2; none in version 1)
  uint32_t crc = 0;                   // parseIndex: the CRC32C its closing line holds
};

/// The layout part of the index (no files, step 0) from a plan.
CheckpointIndex indexFromPlan(const ShardPlan& plan);
/// Text form, ending with its own CRC32C line.
std::string formatIndex(const CheckpointIndex& index);
/// Parses and checks (consistency, checksum) an index; `path` names it in errors.
libcomm::Result<CheckpointIndex> parseIndex(const std::string& text, const std::string& path);
/// The index of the checkpoint directory `dir`.
libcomm::Result<CheckpointIndex> readIndex(const std::string& dir);
/// What readCheckpointInfo returns for an index.
CheckpointInfo infoOf(const CheckpointIndex& index);

/// Parameter list of a full-model file (name kind decay offset numel shape per line).
std::string formatParamList(const std::vector<LayoutParam>& params);
libcomm::Result<std::vector<LayoutParam>> parseParamList(const std::string& text, const std::string& path);

/// Where parameters' elements come from when loading.
class ParamSource {
 public:
  virtual ~ParamSource() = default;
  /// Copies elements [first, first + n) of `p` (one of this source's parameters) from `section`
  /// (0 weights, 1 m, 2 v) into dst.
  virtual libcomm::Status read(const LayoutParam& p, int section, uint64_t first, size_t n, float* dst) = 0;
};

/// Reads from the shard files of a sharded checkpoint (each opened and checked on first use).
/// `index` must outlive the source.
std::unique_ptr<ParamSource> makeShardedSource(const std::string& dir, const CheckpointIndex& index);

/// Loads `srcParams` (by name; must match the plan's parameters exactly, `what` names the source
/// in errors) from `source` into fresh arrays for rank plan.options.rank: out[s] gets
/// plan.stateNumel elements for each of the first `sections` sections, padding zero.
libcomm::Status loadForPlan(ParamSource& source, const std::vector<LayoutParam>& srcParams, int sections,
                            const ShardPlan& plan, const std::string& what, std::vector<std::vector<float>>& out);

}  // namespace libshard::ckpt
