// File I/O for checkpoints: atomic writes, exact positional reads and writes, and the chunked,
// checksummed data area that lets a reader fetch and verify only the parts it needs.

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>

#include "checkpoint_format.h"

namespace libshard::ckpt {
namespace {

using libcomm::Status;

uint64_t align64(uint64_t n) { return (n + 63) / 64 * 64; }

}  // namespace

const char* sectionName(int section) {
  switch (section) {
    case kWeightsSection:
      return "weights";
    case kFirstMomentSection:
      return "AdamW first moment";
    case kSecondMomentSection:
      return "AdamW second moment";
  }
  return "unknown section";
}

size_t firstBadValue(const float* v, size_t n, int section) {
  const bool nonNegative = section == kSecondMomentSection;
  auto bad = [nonNegative](float x) { return !(std::fabs(x) <= FLT_MAX) || (nonNegative && x < 0.0f); };
  // Chunks of a branch-free test, so the common case (all good) runs at memory speed.
  constexpr size_t kBlock = 1024;
  for (size_t at = 0; at < n; at += kBlock) {
    const size_t end = std::min(n, at + kBlock);
    bool any = false;
    for (size_t i = at; i < end; ++i) any |= bad(v[i]);
    if (!any) continue;
    for (size_t i = at; i < end; ++i)
      if (bad(v[i])) return i;
  }
  return n;
}

std::string badValueText(float value, int section, uint64_t at, const std::string& where) {
  char text[48];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(value));
  return std::string(" holds ") + text + " in the " + sectionName(section) + " at element " + std::to_string(at) +
         where + "; a checkpoint holds finite values only, and no negative second moment";
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

FileLayout layoutOf(const FileHeader& h) {
  FileLayout l;
  const uint64_t total = static_cast<uint64_t>(h.sections) * h.numel;
  l.numChunks = h.chunkElems == 0 ? 0 : (total + h.chunkElems - 1) / h.chunkElems;
  l.tableOffset = kHeaderBytes + align64(h.indexBytes);
  l.dataOffset = l.tableOffset + align64(l.numChunks * 4);
  l.fileBytes = l.dataOffset + total * 4;
  return l;
}

void sealHeader(FileHeader& h) { h.headerCrc = crc32c(&h, offsetof(FileHeader, headerCrc)); }

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

Status systemError(const std::string& what, const std::string& path, int err) {
  return libcomm::makeError(libcomm::StatusCode::kSystemError, what, " '", path, "': ", std::strerror(err), " (errno ",
                            err, ")");
}

std::string joinPath(const std::string& dir, const std::string& name) {
  if (dir.empty()) return name;
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

Status preadExact(int fd, void* buf, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return systemError("cannot read", path, errno);
    }
    if (got == 0)
      return badFile(path, "truncated: needed bytes [", offset, ", ", offset + n, ") but the file ends at ",
                     offset + done);
    done += static_cast<size_t>(got);
  }
  return Status::ok();
}

Status pwriteAll(int fd, const void* buf, size_t n, uint64_t offset, const std::string& path) {
  // A write past the process's file-size limit raises SIGXFSZ, which ends the process (both ranks
  // of a save died so, leaving their temporaries): refused here, and the temporary goes.
  struct rlimit lim;
  if (n > 0 && ::getrlimit(RLIMIT_FSIZE, &lim) == 0 && lim.rlim_cur != RLIM_INFINITY && offset + n > lim.rlim_cur)
    return libcomm::makeError(libcomm::StatusCode::kSystemError, "cannot write '", path, "': it would reach ",
                              offset + n, " bytes, above this process's file-size limit of ", lim.rlim_cur,
                              " bytes (ulimit -f, RLIMIT_FSIZE): raise the limit");
  const auto* p = static_cast<const char*>(buf);
  size_t done = 0;
  while (done < n) {
    const ssize_t put = ::pwrite(fd, p + done, n - done, static_cast<off_t>(offset + done));
    if (put < 0) {
      if (errno == EINTR) continue;
      return systemError("cannot write", path, errno);
    }
    done += static_cast<size_t>(put);
  }
  return Status::ok();
}

libcomm::Result<Fd> openRegularFile(const std::string& path, struct stat* st, const std::string& kind) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer, with no deadline; for a regular
  // file it changes nothing.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) {
    if (errno == ENOENT) return badFile(path, "missing (no such ", kind, ")");
    return systemError("cannot open", path, errno);
  }
  if (::fstat(fd.get(), st) != 0) return systemError("cannot stat", path, errno);
  if (!S_ISREG(st->st_mode))
    return badFile(path, "is ",
                   S_ISDIR(st->st_mode)    ? "a directory"
                   : S_ISFIFO(st->st_mode) ? "a named pipe (FIFO)"
                   : S_ISSOCK(st->st_mode) ? "a socket"
                                           : "a device",
                   ", not a regular file: not a ", kind);
  return fd;
}

libcomm::Result<std::string> readWholeFile(const std::string& path, uint64_t maxBytes) {
  struct stat st {};
  LIBCOMM_ASSIGN_OR_RETURN(Fd fd, openRegularFile(path, &st, "file"));
  if (static_cast<uint64_t>(st.st_size) > maxBytes)
    return badFile(path, "is ", st.st_size, " bytes, more than the ", maxBytes, " a checkpoint index may have");
  std::string text(static_cast<size_t>(st.st_size), '\0');
  LIBCOMM_RETURN_IF_ERROR(preadExact(fd.get(), text.data(), text.size(), 0, path));
  return text;
}

Status writeFileAtomically(const std::string& path, const std::function<Status(int fd)>& write, bool replace,
                           const std::function<Status()>& beforePublish) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  // A dot name with ".tmp-" can never be a final name, and pid + counter keep concurrent writers
  // (ranks as threads or processes) apart. A name already taken is a temporary left by a killed
  // writer whose pid this process now has (pids are reused, from 1 again in each container), or a
  // live writer's on another host: neither is ours to remove, so the next counter is tried.
  static std::atomic<uint64_t> counter{0};
  constexpr int kNameAttempts = 100;
  std::string tmp;
  Fd fd;
  // The final name may be up to NAME_MAX (255) bytes: the temporary keeps as much of it as fits
  // beside its suffix (at most 1 + 5 + 10 + 1 + 20 bytes).
  const std::string stem = base.substr(0, std::min<size_t>(base.size(), 255 - 37));
  for (int attempt = 0; attempt < kNameAttempts && fd.get() < 0; ++attempt) {
    tmp = joinPath(dir, "." + stem + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fd = Fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (fd.get() < 0 && errno != EEXIST) return systemError("cannot create temporary file", tmp, errno);
  }
  if (fd.get() < 0)
    return libcomm::makeError(libcomm::StatusCode::kSystemError, "cannot create a temporary file for '", path,
                              "': the ", kNameAttempts, " names tried (the last '", tmp,
                              "') all exist; remove the leftover .tmp- files once no save into '", dir, "' runs");
  auto fail = [&](Status st) {
    fd = Fd();
    ::unlink(tmp.c_str());
    return st;
  };
  Status st;
  try {  // a writer's buffers (export's, say) may fail to allocate: the temporary goes all the same
    st = write(fd.get());
  } catch (const std::bad_alloc&) {
    st = libcomm::makeError(libcomm::StatusCode::kSystemError, "out of memory while writing '", path, "'");
  }
  if (!st.isOk()) return fail(st);
  if (::fsync(fd.get()) != 0) return fail(systemError("cannot fsync", tmp, errno));
  if (::close(fd.release()) != 0) return fail(systemError("cannot close", tmp, errno));
  if (beforePublish) {
    Status mayPublish = beforePublish();
    if (!mayPublish.isOk()) return fail(mayPublish);
  }
  if (!replace) {
    // link() is the atomic "create only if absent": a concurrent writer of the same final name
    // loses with EEXIST instead of silently replacing what the other one wrote.
    if (::link(tmp.c_str(), path.c_str()) == 0) {
      ::unlink(tmp.c_str());
    } else {
      const int err = errno;
      if (err == EEXIST) return fail(badFile(path, "already exists; it is left untouched"));
      // Filesystems without hard links: the caller's existence check is all there is.
      if (err != EPERM && err != ENOTSUP && err != EOPNOTSUPP && err != ENOSYS)
        return fail(systemError("cannot link temporary file '" + tmp + "' to", path, err));
      struct stat sb;
      if (::lstat(path.c_str(), &sb) == 0) return fail(badFile(path, "already exists; it is left untouched"));
      if (::rename(tmp.c_str(), path.c_str()) != 0) {
        const int err2 = errno;
        return fail(systemError("cannot rename temporary file '" + tmp + "' to", path, err2));
      }
    }
  } else if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    return fail(systemError("cannot rename temporary file '" + tmp + "' to", path, err));
  }
  // The rename is durable only once the directory entry is. A failure here leaves the file in
  // place: the error says so (an index in place marks the checkpoint complete all the same).
  return fsyncDirectory(dir).withContext("'" + path + "' is in place, but it may not survive a crash");
}

Status fsyncDirectory(const std::string& dir) {
  Fd dfd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dfd.get() < 0) return systemError("cannot open directory to fsync it", dir, errno);
  if (::fsync(dfd.get()) != 0) return systemError("cannot fsync directory", dir, errno);
  return Status::ok();
}

Status makeDirectoryDurably(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0755) != 0) {
    if (errno != EEXIST) return systemError("cannot create checkpoint directory", dir, errno);
    // Something is there: a directory (or a link to one) will do, anything else fails here rather
    // than at the first file written into it.
    struct stat st {};
    if (::stat(dir.c_str(), &st) != 0) return systemError("cannot use checkpoint directory", dir, errno);
    if (!S_ISDIR(st.st_mode))
      return libcomm::makeError(libcomm::StatusCode::kInvalidArgument, "checkpoint directory '", dir,
                                "' exists and is not a directory");
    return Status::ok();
  }
  // A new directory's own entry is durable only once its parent's is: without this, a power loss
  // can take the directory away with every file fsynced inside it.
  std::string parent = dir;
  while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
  const size_t slash = parent.rfind('/');
  parent = slash == std::string::npos ? "." : (slash == 0 ? "/" : parent.substr(0, slash));
  return fsyncDirectory(parent);
}

Status ChunkedWriter::append(const float* data, size_t n) {
  LIBCOMM_RETURN_IF_ERROR(pwriteAll(fd_, data, n * sizeof(float), offset_, path_));
  offset_ += n * sizeof(float);
  while (n > 0) {
    const size_t take = std::min<uint64_t>(n, chunkElems_ - inChunk_);
    crc_ = crc32c(data, take * sizeof(float), crc_);
    data += take;
    n -= take;
    inChunk_ += take;
    if (inChunk_ == chunkElems_) {
      crcs_.push_back(crc_);
      crc_ = 0;
      inChunk_ = 0;
    }
  }
  return Status::ok();
}

std::vector<uint32_t> ChunkedWriter::finish() {
  if (inChunk_ > 0) crcs_.push_back(crc_);
  inChunk_ = 0;
  crc_ = 0;
  return std::move(crcs_);
}

Status writeTableAndHeader(int fd, const std::string& path, FileHeader header, const std::string& indexText,
                           const std::vector<uint32_t>& crcs) {
  header.indexBytes = static_cast<uint32_t>(indexText.size());
  header.indexCrc = crc32c(indexText.data(), indexText.size());
  header.tableCrc = crc32c(crcs.data(), crcs.size() * 4);
  const FileLayout l = layoutOf(header);
  if (l.numChunks != crcs.size())
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "checkpoint writer: ", crcs.size(),
                              " chunk checksums for ", l.numChunks, " chunks of '", path, "'");
  sealHeader(header);
  // Padding between the parts is written explicitly so the file has no holes.
  std::vector<char> front(l.dataOffset, 0);
  std::memcpy(front.data(), &header, kHeaderBytes);
  std::memcpy(front.data() + kHeaderBytes, indexText.data(), indexText.size());
  std::memcpy(front.data() + l.tableOffset, crcs.data(), crcs.size() * 4);
  return pwriteAll(fd, front.data(), front.size(), 0, path);
}

libcomm::Result<std::unique_ptr<ChunkedFile>> ChunkedFile::open(
    const std::string& path, const char (&magic)[8], const char* kind,
    const std::function<libcomm::Status(const FileHeader&)>& expect) {
  auto f = std::unique_ptr<ChunkedFile>(new ChunkedFile());
  f->path_ = path;
  struct stat st {};
  LIBCOMM_ASSIGN_OR_RETURN(f->fd_, openRegularFile(path, &st, std::string(kind) + " file"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < kHeaderBytes) return badFile(path, "truncated: ", size, " bytes, less than the 64-byte header");
  FileHeader& h = f->header_;
  LIBCOMM_RETURN_IF_ERROR(preadExact(f->fd_.get(), &h, kHeaderBytes, 0, path));
  if (std::memcmp(h.magic, magic, sizeof(h.magic)) != 0)
    return badFile(path, "bad magic: not a shardcomm ", kind, " checkpoint file");
  const uint32_t headerCrc = crc32c(&h, offsetof(FileHeader, headerCrc));
  if (headerCrc != h.headerCrc)
    return badFile(path, "header checksum mismatch (stored ", hex32(h.headerCrc), ", computed ", hex32(headerCrc),
                   "): the header is corrupt");
  if (h.version != kCheckpointVersion)
    return badFile(path, "format version ", h.version, "; this build reads version ", kCheckpointVersion);
  // The chunk size is the format's: a reader holds one chunk in memory, and a tiny one would make
  // the chunk table as large as the data (a crafted sparse file of a few bytes on disk could then
  // ask for any allocation). The index text is bounded as an index file is; shard files have none.
  const uint64_t maxIndex = std::memcmp(magic, kShardMagic, sizeof(h.magic)) == 0 ? 0 : kMaxIndexBytes;
  if (h.chunkElems != kChunkElems || (h.sections != 1 && h.sections != 3) || h.numel > (uint64_t{1} << 56) ||
      h.indexBytes > maxIndex)
    return badFile(path, "header describes an impossible layout (chunk ", h.chunkElems, " elements, sections ",
                   h.sections, ", numel ", h.numel, ", index ", h.indexBytes, " bytes); this build writes chunks of ",
                   kChunkElems, " elements and at most ", maxIndex, " index bytes in such a file");
  if (expect) LIBCOMM_RETURN_IF_ERROR(expect(h));
  f->layout_ = layoutOf(h);
  if (size < f->layout_.fileBytes) return badFile(path, "truncated: ", size, " bytes, expected ", f->layout_.fileBytes);
  if (size > f->layout_.fileBytes)
    return badFile(path, size - f->layout_.fileBytes, " unexpected bytes after the ", f->layout_.fileBytes,
                   " the header describes");
  f->index_.resize(h.indexBytes);
  LIBCOMM_RETURN_IF_ERROR(preadExact(f->fd_.get(), f->index_.data(), h.indexBytes, kHeaderBytes, path));
  if (crc32c(f->index_.data(), f->index_.size()) != h.indexCrc) return badFile(path, "parameter index is corrupt");
  // The table is checked here in pieces and read an entry at a time with its chunk (loadChunk):
  // memory stays the same whatever size the header claims.
  uint32_t tableCrc = 0;
  std::vector<uint32_t> piece(std::min<uint64_t>(f->layout_.numChunks, 16384));
  for (uint64_t at = 0; at < f->layout_.numChunks; at += piece.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(piece.size(), f->layout_.numChunks - at));
    LIBCOMM_RETURN_IF_ERROR(preadExact(f->fd_.get(), piece.data(), n * 4, f->layout_.tableOffset + at * 4, path));
    tableCrc = crc32c(piece.data(), n * 4, tableCrc);
  }
  if (tableCrc != h.tableCrc) return badFile(path, "chunk checksum table is corrupt");
  return f;
}

Status ChunkedFile::loadChunk(uint64_t chunk, float* into) {
  const uint64_t total = static_cast<uint64_t>(header_.sections) * header_.numel;
  const uint64_t first = chunk * header_.chunkElems;
  const uint64_t len = std::min<uint64_t>(header_.chunkElems, total - first);
  const uint64_t byteBegin = layout_.dataOffset + first * 4;
  uint32_t stored = 0;  // the table as open() checked it: the descriptor holds that file
  LIBCOMM_RETURN_IF_ERROR(preadExact(fd_.get(), &stored, 4, layout_.tableOffset + chunk * 4, path_));
  LIBCOMM_RETURN_IF_ERROR(preadExact(fd_.get(), into, len * 4, byteBegin, path_));
  const uint32_t got = crc32c(into, len * 4);
  if (got != stored)
    return badFile(path_, "checksum mismatch in data chunk ", chunk, " (bytes [", byteBegin, ", ", byteBegin + len * 4,
                   ")): stored ", hex32(stored), ", computed ", hex32(got));
  return Status::ok();
}

Status ChunkedFile::read(uint64_t first, size_t n, float* dst) {
  const uint64_t total = static_cast<uint64_t>(header_.sections) * header_.numel;
  if (first > total || n > total - first)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "checkpoint reader: elements [", first, ", ",
                              first + n, ") outside the ", total, " of '", path_, "'");
  const uint64_t ce = header_.chunkElems;
  while (n > 0) {
    const uint64_t chunk = first / ce, within = first % ce;
    const uint64_t chunkLen = std::min<uint64_t>(ce, total - chunk * ce);
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, chunkLen - within));
    if (chunk != cachedChunk_ && within == 0 && take == chunkLen) {
      // A whole chunk is wanted: read and check it in place, no copy.
      LIBCOMM_RETURN_IF_ERROR(loadChunk(chunk, dst));
    } else {
      if (chunk != cachedChunk_) {
        cache_.resize(static_cast<size_t>(chunkLen));
        cachedChunk_ = UINT64_MAX;  // stays invalid if the load fails
        LIBCOMM_RETURN_IF_ERROR(loadChunk(chunk, cache_.data()));
        cachedChunk_ = chunk;
      }
      std::memcpy(dst, cache_.data() + within, take * sizeof(float));
    }
    first += take;
    dst += take;
    n -= take;
  }
  return Status::ok();
}

}  // namespace libshard::ckpt
