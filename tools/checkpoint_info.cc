// checkpoint_info: what a sharded checkpoint directory holds, for an operator deciding what to
// resume from or delete (libshard/include/libshard/checkpoint.h).
//
//   checkpoint_info [--verify] DIR...
//
// For each DIR: complete (its index: format version, step, world size, precision, parameters,
// shard files, the run's notes), or not (why: no index and what a save that did not finish left,
// a corrupt index), a save claim and whether its holder runs, and leftover temporaries of killed
// writers. --verify also reads every shard file and checks every checksum (what any world size's
// load would read). Exit 0 when every DIR holds a complete checkpoint (verified, with --verify),
// 1 when one does not, 2 on usage errors.

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "libshard/checkpoint.h"

namespace {

namespace fs = std::filesystem;

int usage(const char* why) {
  if (why) std::fprintf(stderr, "checkpoint_info: %s\n", why);
  std::fprintf(why ? stderr : stdout,
               "usage: checkpoint_info [--verify] DIR...\n"
               "  what each checkpoint directory holds: complete or not (and why), step, world size,\n"
               "  precision, shard files, the saving run's notes, a save claim, leftover temporaries\n"
               "  --verify  also read every shard file and check every checksum\n"
               "exit 0: every DIR holds a complete checkpoint (verified with --verify); 1: one does not; 2: usage\n");
  return why ? 2 : 0;
}

std::string sizeText(uintmax_t bytes) {
  char buf[32];
  if (bytes < (1u << 20))
    std::snprintf(buf, sizeof(buf), "%.1f KiB", static_cast<double>(bytes) / 1024);
  else if (bytes < (uintmax_t{1} << 30))
    std::snprintf(buf, sizeof(buf), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  else
    std::snprintf(buf, sizeof(buf), "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  return buf;
}

// Files a killed writer left (".<name>.tmp-<pid>-<n>"), and shard files, by name.
struct Listing {
  std::vector<std::string> temporaries;
  std::vector<std::string> shards;
  uintmax_t temporaryBytes = 0;
};

Listing list(const std::string& dir) {
  Listing l;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.size() > 1 && name[0] == '.' && name.find(".tmp-") != std::string::npos) {
      l.temporaries.push_back(name);
      l.temporaryBytes += e.file_size(ec);
    } else if (name.rfind("rank-", 0) == 0 && name.size() > 6 && name.compare(name.size() - 6, 6, ".shard") == 0) {
      l.shards.push_back(name);
    }
  }
  return l;
}

// Prints DIR's report; true when it holds a complete (and, with verify, verified) checkpoint.
bool report(const std::string& dir, bool verify) {
  std::printf("%s:\n", dir.c_str());
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::is_directory(st)) {
    std::printf("  not a checkpoint: %s\n", fs::exists(st)                                     ? "not a directory"
                                            : ec && ec != std::errc::no_such_file_or_directory ? ec.message().c_str()
                                                                                               : "no such directory");
    return false;
  }
  const Listing files = list(dir);
  bool ok = true;
  auto info = libshard::readCheckpointInfo(dir);
  if (!fs::exists(fs::symlink_status(fs::path(dir) / libshard::kCheckpointIndexFile, ec))) {
    ok = false;
    std::printf("  not a complete checkpoint: no %s", libshard::kCheckpointIndexFile);
    if (!files.shards.empty())
      std::printf(" (%zu shard file(s) of a save that did not finish: it may be saved into again)",
                  files.shards.size());
    std::printf("\n");
    // A directory of checkpoints (tinylm --save-every's DIR/step-<k>): name them, so that the
    // answer to "checkpoint_info DIR" is not only "no".
    std::vector<std::string> held;
    for (const auto& e : fs::directory_iterator(dir, ec))
      if (e.is_directory(ec) && fs::exists(e.path() / libshard::kCheckpointIndexFile, ec))
        held.push_back(e.path().filename().string());
    // By length first: step-<8 digits> grows a digit past step 99999999.
    std::sort(held.begin(), held.end(), [](const std::string& a, const std::string& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    std::string named;  // the newest three
    for (size_t i = held.size() > 3 ? held.size() - 3 : 0; i < held.size(); ++i)
      named += (named.empty() ? "" : ", ") + held[i];
    if (!held.empty())
      std::printf("  holds %zu checkpoint director%s: %s%s (checkpoint_info %s/%s)\n", held.size(),
                  held.size() == 1 ? "y" : "ies", held.size() > 3 ? "..., " : "", named.c_str(), dir.c_str(),
                  held.back().c_str());
  } else if (!info.isOk()) {
    ok = false;
    std::printf("  not a usable checkpoint: %s\n", info.status().toString().c_str());
  } else {
    const libshard::CheckpointInfo& x = *info;
    std::printf("  complete: step %llu, saved by %d ranks, %s, index format %u (crc32c %08x)\n",
                static_cast<unsigned long long>(x.step), x.worldSize, libshard::precisionName(x.precision), x.version,
                x.indexCrc);
    std::printf("  model: %zu parameters, %zu elements; %zu state elements per rank (alignment %zu B)\n", x.numParams,
                x.paramNumel, x.stateNumel, x.alignmentBytes);
    // Each shard file the index lists, there and of the size it records (what a load needs before
    // it reads a byte; --verify reads them all).
    uintmax_t total = 0;
    for (size_t i = 0; i < x.files.size(); ++i) {
      const uintmax_t bytes = fs::file_size(fs::path(dir) / x.files[i], ec);
      if (ec) {
        ok = false;
        std::printf("  shard file %s: %s: the checkpoint cannot be loaded\n", x.files[i].c_str(), ec.message().c_str());
        continue;
      }
      total += bytes;
      if (bytes != x.fileBytes[i]) {
        ok = false;
        std::printf(
            "  shard file %s is %ju bytes, the index says %llu: truncated or rewritten; the checkpoint "
            "cannot be loaded\n",
            x.files[i].c_str(), bytes, static_cast<unsigned long long>(x.fileBytes[i]));
      }
    }
    std::printf("  shard files: %zu, %s in all\n", x.files.size(), sizeText(total).c_str());
    std::string notes;
    for (const auto& [key, value] : x.notes)
      notes += (notes.empty() ? "" : ", ") + libcomm::detail::printable(key) + "=" + libcomm::detail::printable(value);
    std::printf("  notes: %s\n", notes.empty() ? "none (the saving program recorded no settings)" : notes.c_str());
    if (verify) {
      const libcomm::Status v = libshard::verifyCheckpoint(dir);
      if (v.isOk()) {
        std::printf("  verified: every shard file read, every checksum matches\n");
      } else {
        ok = false;
        std::printf("  verify FAILED: %s\n", v.toString().c_str());
      }
    }
  }
  if (fs::exists(fs::path(dir) / libshard::kCheckpointClaimFile, ec)) {
    const libcomm::Status free = libshard::SaveClaim::checkFree(dir);
    const char* gone = ok ? "left by a process that is gone (harmless beside a complete checkpoint: delete it)"
                          : "left by a process that is gone (the next save that claims the directory takes it over)";
    std::printf("  save claim: %s\n", free.isOk() ? gone : free.message().c_str());
  }
  if (!files.temporaries.empty())
    std::printf("  %zu temporary file(s) of killed writers, %s (e.g. %s): delete them once no save into it runs\n",
                files.temporaries.size(), sizeText(files.temporaryBytes).c_str(), files.temporaries[0].c_str());
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  bool verify = false;
  std::vector<std::string> dirs;
  bool options = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (options && a == "--") {
      options = false;
    } else if (options && (a == "-h" || a == "--help")) {
      return usage(nullptr);
    } else if (options && a == "--verify") {
      verify = true;
    } else if (options && a.size() > 1 && a[0] == '-') {
      return usage(("unknown option '" + a + "'").c_str());
    } else {
      dirs.push_back(a);
    }
  }
  if (dirs.empty()) return usage("no checkpoint directory given");
  bool all = true;
  for (const std::string& d : dirs) all = report(d, verify) && all;
  if (std::fflush(stdout) != 0) {
    std::fprintf(stderr, "checkpoint_info: writing the report failed: %s\n", std::strerror(errno));
    return 1;
  }
  return all ? 0 : 1;
}
