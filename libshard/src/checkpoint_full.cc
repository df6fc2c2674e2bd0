// Export of a sharded checkpoint to one full-model file: the parameters unsharded, packed without
// padding, streamed through a bounded buffer so that the model never has to fit in memory.

#include <algorithm>
#include <cstring>

#include "checkpoint_format.h"

namespace libshard {

using libcomm::Status;
using namespace ckpt;  // NOLINT: this file is the checkpoint implementation

namespace {

// The export replaces whatever file is at `path`: refused when that is one of the files it reads
// (the index or a shard file of `checkpointDir`, by device and inode, so other spellings of the
// path count too). Renaming over it would destroy the checkpoint being exported.
Status checkNotReadFile(const std::string& checkpointDir, const CheckpointIndex& x, const std::string& path) {
  struct stat target {};
  if (::stat(path.c_str(), &target) != 0) return Status::ok();  // nothing there (or unreadable: the write says)
  std::vector<std::string> read = {kCheckpointIndexFile};
  for (const ShardFileEntry& f : x.files) read.push_back(f.file);
  for (const std::string& name : read) {
    struct stat st {};
    const std::string file = joinPath(checkpointDir, name);
    if (::stat(file.c_str(), &st) == 0 && st.st_dev == target.st_dev && st.st_ino == target.st_ino)
      return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "full-model export of '", checkpointDir,
                                "' into '", path, "': that is the checkpoint's own file '", file,
                                "', which the export reads and would replace; choose another path");
  }
  return Status::ok();
}

}  // namespace

Status exportFullModel(const std::string& checkpointDir, const std::string& path, bool withOptimizerState) {
  LIBCOMM_ASSIGN_OR_RETURN(CheckpointIndex x, readIndex(checkpointDir));
  LIBCOMM_RETURN_IF_ERROR(checkNotReadFile(checkpointDir, x, path));
  std::unique_ptr<ParamSource> source = makeShardedSource(checkpointDir, x);

  std::vector<LayoutParam> packed;
  uint64_t numel = 0;
  for (const LayoutParam& p : x.params) {
    LayoutParam q = p;
    q.group = -1;
    q.offset = numel;
    // Within what a reader accepts (ChunkedFile::open: 2^56 elements per section); an index the
    // parser took could still sum past it, or wrap.
    if (__builtin_add_overflow(numel, p.numel, &numel) || numel > (uint64_t{1} << 56))
      return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "full-model export of '", checkpointDir,
                                "': the parameters add up to more elements than the format holds (2^56)");
    packed.push_back(std::move(q));
  }
  const std::string indexText = formatParamList(packed);
  if (indexText.size() > kMaxIndexBytes)  // what a reader accepts (ChunkedFile::open)
    return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "full-model export of '", checkpointDir,
                              "': the parameter list is too long for the format (", indexText.size(),
                              " bytes, at most ", kMaxIndexBytes, ")");

  FileHeader h{};
  std::memcpy(h.magic, kFullMagic, sizeof(h.magic));
  h.version = kCheckpointVersion;
  h.rank = 0;
  h.world = 1;
  h.sections = withOptimizerState ? 3 : 1;
  h.numel = numel;
  h.step = x.step;
  h.chunkElems = kChunkElems;
  h.indexBytes = static_cast<uint32_t>(indexText.size());
  const FileLayout layout = layoutOf(h);

  return writeFileAtomically(path, [&](int fd) -> Status {
    ChunkedWriter w(fd, path, layout.dataOffset, h.chunkElems);
    std::vector<float> buf(kChunkElems);
    for (int s = 0; s < static_cast<int>(h.sections); ++s) {
      for (size_t i = 0; i < x.params.size(); ++i) {
        for (uint64_t at = 0; at < x.params[i].numel; at += buf.size()) {
          const size_t take = static_cast<size_t>(std::min<uint64_t>(buf.size(), x.params[i].numel - at));
          LIBCOMM_RETURN_IF_ERROR(source->read(x.params[i], s, at, take, buf.data()));
          LIBCOMM_RETURN_IF_ERROR(w.append(buf.data(), take));
        }
      }
    }
    return writeTableAndHeader(fd, path, h, indexText, w.finish());
  });
}

}  // namespace libshard
