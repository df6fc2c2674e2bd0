// Checkpoint errors (libshard/checkpoint.h): every corruption case (truncation, flipped bytes in
// header, checksum table, data and index, wrong magic or version, missing or foreign files), a model
// that does not match, broken full-model files -- each a clear error naming the file and the
// problem, with the destination state untouched -- and saves that never leave a partial file
// under a final name.

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using namespace testutil;  // NOLINT

// ---- Corruption: each case damages a copy of a good 2-rank checkpoint, then every rank of a
// 3-rank layout tries to load it. Ranks that need the damaged part fail with a message naming
// the file and the problem; a failed load leaves its state exactly as it was.

struct Corruption {
  std::string name;
  std::function<void(const std::string& dir)> damage;
  std::vector<std::string> expect;  // substrings of the error
};

TEST(Checkpoint, CorruptionIsDetectedAndOverwritesNothing) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string good = tmp.sub("good");
  savedWorld(model, 2, good, 5);
  savedWorld(model, 2, tmp.sub("other-step"), 6);
  savedWorld(model, 2, tmp.sub("other-values"), 5, 50);
  const std::string r0 = "rank-0-of-2.shard", r1 = "rank-1-of-2.shard";
  auto file = [](const std::string& dir, const std::string& n) { return dir + "/" + n; };
  std::vector<Corruption> cases = {
      {"truncated rank file",
       [&](const std::string& d) { fs::resize_file(file(d, r1), fs::file_size(file(d, r1)) - 100); },
       {r1, "truncated"}},
      {"rank file cut inside the header",
       [&](const std::string& d) { fs::resize_file(file(d, r0), 10); },
       {r0, "truncated"}},
      {"flipped data byte",
       [&](const std::string& d) { flipByte(file(d, r0), ckpt::layoutOf(headerOf(file(d, r0))).dataOffset + 1); },
       {r0, "checksum mismatch in data chunk 0"}},
      {"flipped header byte", [&](const std::string& d) { flipByte(file(d, r1), 33); }, {r1, "header checksum"}},
      {"flipped checksum-table byte",
       [&](const std::string& d) { flipByte(file(d, r0), ckpt::layoutOf(headerOf(file(d, r0))).tableOffset); },
       {r0, "chunk checksum table is corrupt"}},
      {"wrong magic", [&](const std::string& d) { flipByte(file(d, r0), 0); }, {r0, "bad magic"}},
      {"wrong version",
       [&](const std::string& d) {
         std::vector<char> b = readBytes(file(d, r1));
         ckpt::FileHeader h = headerOf(file(d, r1));
         h.version = 2;
         ckpt::sealHeader(h);
         std::memcpy(b.data(), &h, sizeof(h));
         writeBytes(file(d, r1), b);
       },
       {r1, "format version 2"}},
      {"missing rank file", [&](const std::string& d) { fs::remove(file(d, r1)); }, {r1, "missing"}},
      {"missing index",
       [&](const std::string& d) { fs::remove(file(d, kCheckpointIndexFile)); },
       {kCheckpointIndexFile, "missing"}},
      {"flipped index byte",
       [&](const std::string& d) { flipByte(file(d, kCheckpointIndexFile), 40); },
       {kCheckpointIndexFile, "index checksum mismatch"}},
      {"truncated index",
       [&](const std::string& d) {
         fs::resize_file(file(d, kCheckpointIndexFile), fs::file_size(file(d, kCheckpointIndexFile)) / 2);
       },
       {kCheckpointIndexFile, "truncated"}},
      {"rank file from another step",
       [&](const std::string& d) {
         fs::copy_file(file(tmp.sub("other-step"), r1), file(d, r1), fs::copy_options::overwrite_existing);
       },
       {r1, "does not belong to this checkpoint"}},
      // Not regular files: a FIFO blocked the open for ever (waiting for a writer), a directory
      // failed as "Is a directory" without saying what was expected.
      {"rank file replaced by a named pipe",
       [&](const std::string& d) {
         fs::remove(file(d, r1));
         ASSERT_EQ(::mkfifo(file(d, r1).c_str(), 0644), 0);
       },
       {r1, "is a named pipe (FIFO), not a regular file"}},
      {"index replaced by a named pipe",
       [&](const std::string& d) {
         fs::remove(file(d, kCheckpointIndexFile));
         ASSERT_EQ(::mkfifo(file(d, kCheckpointIndexFile).c_str(), 0644), 0);
       },
       {kCheckpointIndexFile, "named pipe"}},
      {"rank file replaced by a directory",
       [&](const std::string& d) {
         fs::remove(file(d, r0));
         fs::create_directory(file(d, r0));
       },
       {r0, "is a directory, not a regular file"}},
      {"rank file rewritten after the index",
       [&](const std::string& d) {
         fs::copy_file(file(tmp.sub("other-values"), r0), file(d, r0), fs::copy_options::overwrite_existing);
       },
       {r0, "does not match the index"}},
  };
  for (const Corruption& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = tmp.sub("case");
    fs::remove_all(dir);
    fs::copy(good, dir);
    c.damage(dir);
    Status verify = verifyCheckpoint(dir);
    EXPECT_FALSE(verify.isOk());
    World w = makeWorld(model, 3, 16, 7.0f);  // recognisable contents that a load must not touch
    int failures = 0;
    for (int r = 0; r < 3; ++r) {
      Snapshot before(*w.states[r]);
      Status st = loadCheckpoint(dir, w.plans[r], w.states[r]->view);
      if (st.isOk()) continue;  // this rank did not need the damaged part
      ++failures;
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
      for (const std::string& s : c.expect) EXPECT_NE(st.message().find(s), std::string::npos) << st.toString();
      EXPECT_TRUE(before.sameAs(*w.states[r])) << "rank " << r << " state was modified by a failed load";
    }
    EXPECT_GT(failures, 0) << "no rank noticed the damage";
  }
}

// Writes `value` as element `at` of section `section` of the shard file at `path`, and reseals
// the file and its checkpoint's index (chunk checksum, table checksum, header, the index's entry
// for the file and the index's own checksum): a file every checksum vouches for.
void writeResealed(const std::string& dir, const std::string& name, int section, uint64_t at, float value) {
  const std::string path = dir + "/" + name;
  std::vector<char> b = readBytes(path);
  ckpt::FileHeader h = headerOf(path);
  const ckpt::FileLayout l = ckpt::layoutOf(h);
  const uint64_t element = static_cast<uint64_t>(section) * h.numel + at;
  std::memcpy(b.data() + l.dataOffset + 4 * element, &value, 4);
  const uint64_t chunk = element / h.chunkElems, first = chunk * h.chunkElems;
  const uint64_t count = std::min<uint64_t>(h.chunkElems, static_cast<uint64_t>(h.sections) * h.numel - first);
  const uint32_t crc = crc32c(b.data() + l.dataOffset + 4 * first, 4 * count);
  std::memcpy(b.data() + l.tableOffset + 4 * chunk, &crc, 4);
  const uint32_t oldTable = h.tableCrc;
  h.tableCrc = crc32c(b.data() + l.tableOffset, 4 * l.numChunks);
  ckpt::sealHeader(h);
  std::memcpy(b.data(), &h, sizeof(h));
  writeBytes(path, b);
  const std::string indexPath = dir + "/" + kCheckpointIndexFile;
  std::vector<char> ib = readBytes(indexPath);
  std::string text(ib.begin(), ib.end());
  char oldHex[16], newHex[16];
  std::snprintf(oldHex, sizeof(oldHex), "%08x", oldTable);
  std::snprintf(newHex, sizeof(newHex), "%08x", h.tableCrc);
  const size_t entry = text.find(std::string(" ") + oldHex + "\n");
  ASSERT_NE(entry, std::string::npos) << "no index entry with checksum " << oldHex;
  text.replace(entry + 1, 8, newHex);
  text.resize(text.size() - 16);  // "crc32c xxxxxxxx\n"
  char trailer[24];
  std::snprintf(trailer, sizeof(trailer), "crc32c %08x\n", crc32c(text.data(), text.size()));
  text += trailer;
  writeBytes(indexPath, std::vector<char>(text.begin(), text.end()));
}

// Values no save writes -- NaN or infinite weights or moments, a negative second moment -- under
// checksums that are all right: a load refused them with the state untouched, and so does
// verifyCheckpoint (they loaded, and a trainer without a norm check trained on NaN; tinylm blamed
// its --lr). A save of a state that holds one is refused, with nothing written.
TEST(Checkpoint, ValuesNoSaveWritesAreRefusedUnderGoodChecksums) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string good = tmp.sub("good");
  savedWorld(model, 1, good, 5);
  const std::string r0 = checkpointShardFileName(0, 1);
  struct Case {
    int section;
    float value;
    const char* name;
  };
  for (const Case& c : {Case{0, NAN, "nan in the weights"}, Case{1, INFINITY, "inf in the AdamW first moment"},
                        Case{2, -1.0f, "-1 in the AdamW second moment"}}) {
    SCOPED_TRACE(c.name);
    const std::string dir = tmp.sub("case");
    fs::remove_all(dir);
    fs::copy(good, dir);
    writeResealed(dir, r0, c.section, 3, c.value);
    ASSERT_TRUE(readCheckpointInfo(dir).isOk()) << "the resealed index does not read";
    const Status verify = verifyCheckpoint(dir);
    EXPECT_NE(verify.message().find(std::string(c.name) + " at element 3"), std::string::npos) << verify.toString();
    EXPECT_NE(verify.message().find(r0), std::string::npos) << verify.toString();
    World w = makeWorld(model, 2, 16, 7.0f);
    for (int r = 0; r < 2; ++r) {
      Snapshot before(*w.states[r]);
      const Status st = loadCheckpoint(dir, w.plans[r], w.states[r]->view);
      if (r == 1 && st.isOk()) continue;  // element 3 is rank 0's at 2 ranks too
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
      EXPECT_NE(st.message().find(c.name), std::string::npos) << st.toString();
      EXPECT_NE(st.message().find("parameter '"), std::string::npos) << st.toString();
      EXPECT_TRUE(before.sameAs(*w.states[r])) << "rank " << r << " state was modified by a failed load";
    }
  }
  World w = makeWorld(model, 1, 16, 0.0f);
  fillState(w.plans[0], *w.states[0], 5);
  w.states[0]->v[2] = -0.5f;
  const Status st = saveCheckpoint(tmp.sub("diverged"), w.plans, w.views());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("-0.5 in the AdamW second moment at element 2"), std::string::npos) << st.toString();
  EXPECT_FALSE(fs::exists(tmp.sub("diverged") + "/" + r0));
}

TEST(Checkpoint, ModelMismatchIsReportedAndOverwritesNothing) {
  TempDir tmp;
  savedWorld(testModel(2, 5, 11), 2, tmp.sub("ckpt"), 1);
  savedWorld(testModel(2, 5, 11), 2, tmp.sub("src"), 1);
  ASSERT_TRUE(exportFullModel(tmp.sub("src"), tmp.sub("model.full"), true).isOk());
  struct Case {
    ModelSpec model;
    std::string expect;
  };
  ModelSpec renamed = testModel(2, 5, 11);
  renamed.layers[1].params[1].name = "blocks.0.w1_renamed";
  const std::vector<Case> cases = {
      {testModel(2, 6, 11), "parameter 'embed.weight' has shape [11x5] there and [11x6] in the model"},
      {testModel(3, 5, 11), "model parameter 'blocks.2.w1' is not in it"},
      {testModel(1, 5, 11), "is not in the model"},
      {renamed, "'blocks.0.w1_renamed' is not in it"}};
  for (const Case& c : cases) {
    World w = makeWorld(c.model, 2, 16, 3.0f);
    Snapshot before(*w.states[1]);
    Status st = loadCheckpoint(tmp.sub("ckpt"), w.plans[1], w.states[1]->view);
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(st.message().find("does not match the model"), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.toString();
    EXPECT_TRUE(before.sameAs(*w.states[1]));
    Status imp = importFullModel(tmp.sub("model.full"), w.plans[1], w.states[1]->view, true);
    ASSERT_FALSE(imp.isOk());
    EXPECT_NE(imp.message().find("model.full"), std::string::npos) << imp.toString();
    EXPECT_NE(imp.message().find(c.expect), std::string::npos) << imp.toString();
    EXPECT_TRUE(before.sameAs(*w.states[1]));
  }
}

TEST(Checkpoint, FullModelFileErrorsOverwriteNothing) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  savedWorld(model, 2, tmp.sub("ckpt"), 4);
  const std::string full = tmp.sub("model.full");
  ASSERT_TRUE(exportFullModel(tmp.sub("ckpt"), full, true).isOk());
  const ckpt::FileLayout layout = ckpt::layoutOf(headerOf(full));
  struct Case {
    std::string name;
    std::function<std::string()> make;  // returns the path to import
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"truncated",
       [&] {
         const std::string p = tmp.sub("t.full");
         fs::copy_file(full, p);
         fs::resize_file(p, layout.fileBytes - 4);
         return p;
       },
       "truncated"},
      {"flipped weight",
       [&] {
         const std::string p = tmp.sub("f.full");
         fs::copy_file(full, p);
         flipByte(p, layout.dataOffset + 8);
         return p;
       },
       "checksum mismatch in data chunk 0"},
      {"flipped index",
       [&] {
         const std::string p = tmp.sub("i.full");
         fs::copy_file(full, p);
         flipByte(p, ckpt::kHeaderBytes + 3);
         return p;
       },
       "parameter index is corrupt"},
      {"a shard file instead", [&] { return tmp.sub("ckpt") + "/rank-0-of-2.shard"; }, "bad magic"},
      {"missing", [&] { return tmp.sub("nothing.full"); }, "missing"},
      {"a named pipe",
       [&] {
         const std::string p = tmp.sub("fifo.full");
         EXPECT_EQ(::mkfifo(p.c_str(), 0644), 0);
         return p;
       },
       "is a named pipe (FIFO), not a regular file"},
  };
  World w = makeWorld(model, 3, 16, 5.0f);
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = c.make();
    Snapshot before(*w.states[0]);
    Status st = importFullModel(path, w.plans[0], w.states[0]->view, true);
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find(path), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.toString();
    EXPECT_TRUE(before.sameAs(*w.states[0]));
  }
}

// Exporting into one of the checkpoint's own files (the index, a shard file, by any spelling of the
// path) is refused: the rename over it destroyed the checkpoint being exported.
TEST(Checkpoint, ExportIntoTheCheckpointsOwnFilesIsRefused) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  savedWorld(model, 2, dir, 4);
  for (const std::string& target :
       {dir + "/" + kCheckpointIndexFile, dir + "/rank-1-of-2.shard", dir + "/./rank-0-of-2.shard"}) {
    SCOPED_TRACE(target);
    const std::vector<char> before = readBytes(target);
    const Status st = exportFullModel(dir, target, true);
    ASSERT_FALSE(st.isOk());
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find("which the export reads and would replace"), std::string::npos) << st.toString();
    EXPECT_EQ(readBytes(target), before);
  }
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
  // A new file in the same directory is fine, also under the longest name a file may have (its
  // temporary name had run past NAME_MAX).
  EXPECT_TRUE(exportFullModel(dir, dir + "/model.full", false).isOk());
  const std::string longest = dir + "/" + std::string(250, 'm') + ".full";
  const Status st = exportFullModel(dir, longest, false);
  EXPECT_TRUE(st.isOk()) << st.toString();
  EXPECT_TRUE(fs::exists(longest));
  EXPECT_TRUE(tempNamesIn(dir).empty());
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
}

// Rewrites the index of `dir` with `edit` applied to its lines, then seals it with a correct
// checksum line: the damage must be found by the parser, not by the checksum.
void craftIndex(const std::string& dir, const std::function<void(std::vector<std::string>&)>& edit) {
  const std::string path = dir + "/" + kCheckpointIndexFile;
  const std::vector<char> bytes = readBytes(path);
  std::vector<std::string> lines;
  std::string line;
  for (char c : std::string(bytes.begin(), bytes.end())) {
    if (c != '\n') {
      line += c;
      continue;
    }
    lines.push_back(line);
    line.clear();
  }
  ASSERT_FALSE(lines.empty());
  ASSERT_EQ(lines.back().rfind("crc32c ", 0), 0u);
  lines.pop_back();
  edit(lines);
  std::string text;
  for (const std::string& l : lines) text += l + "\n";
  char crc[32];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", crc32c(text.data(), text.size()));
  text += crc;
  writeBytes(path, std::vector<char>(text.begin(), text.end()));
}

TEST(Checkpoint, CraftedIndexNumbersAreRejectedWithoutThrowingOrWrapping) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  struct Case {
    std::string name;
    std::function<void(std::vector<std::string>&)> edit;
    std::string expect;
  };
  auto setField = [](std::vector<std::string>& lines, const std::string& key, size_t field, const std::string& v) {
    for (std::string& l : lines) {
      if (l.rfind(key + " ", 0) != 0) continue;
      std::vector<std::string> t;
      std::string cur;
      for (char c : l + " ") {
        if (c != ' ') {
          cur += c;
        } else if (!cur.empty()) {
          t.push_back(cur);
          cur.clear();
        }
      }
      ASSERT_LT(field, t.size());
      t[field] = v;
      l.clear();
      for (size_t i = 0; i < t.size(); ++i) l += (i ? " " : "") + t[i];
      return;
    }
    FAIL() << "no '" << key << "' line";
  };
  const std::vector<Case> cases = {
      // One past UINT64_MAX: std::stoull would throw out of the library.
      {"step past 2^64", [&](auto& l) { setField(l, "step", 1, "18446744073709551616"); }, "is not a number"},
      {"state_numel of 25 digits", [&](auto& l) { setField(l, "state_numel", 1, "1234567890123456789012345"); },
       "is not a number"},
      // 2^16 four times is 2^64, which wraps to 0 and would match a numel of 0.
      {"shape product wraps to 0",
       [&](auto& l) {
         setField(l, "param", 5, "0");
         setField(l, "param", 6, "65536x65536x65536x65536");
       },
       "overflows 64 bits"},
      // A shape of more extents than a parameter may have (kMaxParamDims): a 250 MiB line of
      // 1x1x... became a vector of 125 M extents. One past the bound is refused by the parser.
      {"65 extents",
       [&](auto& l) {
         std::string ones = "1";
         for (size_t i = 1; i <= kMaxParamDims; ++i) ones += "x1";
         setField(l, "param", 5, "1");
         setField(l, "param", 6, ones);
       },
       "bad offset, numel or shape"},
      // offset + numel wraps around to a small end that "fits" the group.
      {"offset + numel wraps", [&](auto& l) { setField(l, "param", 4, "18446744073709551615"); }, "lies outside group"},
      // The first group's shard moved one element up: it overlaps the next group's, every size
      // still adding up (it loaded, the two groups sharing an element).
      {"groups overlapping in the state", [&](auto& l) { setField(l, "group", 6, "1"); }, "overlap in the state"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string dir = tmp.sub("crafted");
    fs::remove_all(dir);
    savedWorld(model, 2, dir, 4);
    craftIndex(dir, c.edit);
    if (::testing::Test::HasFatalFailure()) return;
    auto info = readCheckpointInfo(dir);
    ASSERT_FALSE(info.isOk());
    EXPECT_EQ(info.status().code(), StatusCode::kInvalidArgument) << info.status().toString();
    EXPECT_NE(info.status().message().find(kCheckpointIndexFile), std::string::npos) << info.status().toString();
    EXPECT_NE(info.status().message().find(c.expect), std::string::npos) << info.status().toString();
    World w = makeWorld(model, 3, 16, 7.0f);
    Snapshot before(*w.states[0]);
    EXPECT_FALSE(loadCheckpoint(dir, w.plans[0], w.states[0]->view).isOk());
    EXPECT_TRUE(before.sameAs(*w.states[0]));
  }
}

// Rewrites the full-model file `src` as `dst` with its parameter list and header edited, every
// checksum recomputed: the damage must be found by the reader's checks of the numbers themselves.
void craftFullModelFile(const std::string& src, const std::string& dst, const std::function<void(std::string&)>& editList,
                        const std::function<void(ckpt::FileHeader&)>& editHeader) {
  auto f = ckpt::ChunkedFile::open(src, ckpt::kFullMagic, "full-model");
  ASSERT_TRUE(f.isOk()) << f.status().toString();
  ckpt::FileHeader h = f.value()->header();
  std::vector<float> data(static_cast<size_t>(h.sections * h.numel));
  ASSERT_TRUE(f.value()->read(0, data.size(), data.data()).isOk());
  std::string list = f.value()->indexText();
  editList(list);
  editHeader(h);
  h.indexBytes = static_cast<uint32_t>(list.size());
  const ckpt::FileLayout layout = ckpt::layoutOf(h);
  const int fd = ::open(dst.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  ckpt::ChunkedWriter w(fd, dst, layout.dataOffset, h.chunkElems);
  ASSERT_TRUE(w.append(data.data(), data.size()).isOk());
  ASSERT_TRUE(ckpt::writeTableAndHeader(fd, dst, h, list, w.finish()).isOk());
  ::close(fd);
}

// Numbers a damaged or hostile file could carry that every checksum vouches for: each is refused
// with a clear error before it can cost an allocation or shift data, and no state changes.
TEST(Checkpoint, CraftedNumbersInFullModelFilesAndIndexesAreRefused) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  savedWorld(model, 2, tmp.sub("ckpt"), 4);
  const std::string full = tmp.sub("model.full");
  ASSERT_TRUE(exportFullModel(tmp.sub("ckpt"), full, true).isOk());
  auto keepList = [](std::string&) {};
  auto keepHeader = [](ckpt::FileHeader&) {};
  struct Case {
    std::string name;
    std::function<void(std::string&)> list;
    std::function<void(ckpt::FileHeader&)> header;
    std::string expect;
  };
  const std::vector<Case> cases = {
      // A reader holds a whole chunk: a chunk of 2^32 elements would be a 16 GiB allocation.
      {"chunk size beyond the format's", keepList, [](ckpt::FileHeader& h) { h.chunkElems = UINT32_MAX; },
       "impossible layout"},
      // Chunks of one element make the checksum table as large as the data: with a sparse file,
      // a header of 64 bytes on disk asked for a table of any size (a 1 TiB file, 512 GiB).
      {"chunk size below the format's", keepList, [](ckpt::FileHeader& h) { h.chunkElems = 1; }, "impossible layout"},
      {"parameter offset that wraps",
       [](std::string& list) {
         const size_t line = list.find("param ");
         ASSERT_NE(line, std::string::npos);
         size_t at = line;
         for (int field = 0; field < 4; ++field) at = list.find(' ', at) + 1;  // the offset is field 4
         list.replace(at, list.find(' ', at) - at, "18446744073709551615");
       },
       keepHeader, "lies outside"},
      // The second parameter moved onto the first one's elements (in bounds, checksums recomputed).
      {"parameters that overlap",
       [](std::string& list) {
         const size_t second = list.find("param ", list.find("param ") + 1);
         ASSERT_NE(second, std::string::npos);
         size_t at = second;
         for (int field = 0; field < 4; ++field) at = list.find(' ', at) + 1;  // the offset is field 4
         list.replace(at, list.find(' ', at) - at, "0");
       },
       keepHeader, "overlap"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string path = tmp.sub("crafted.full");
    craftFullModelFile(full, path, c.list, c.header);
    World w = makeWorld(model, 2, 16, 5.0f);
    for (int r = 0; r < 2; ++r) {
      Snapshot before(*w.states[r]);
      Status st = importFullModel(path, w.plans[r], w.states[r]->view, true);
      ASSERT_FALSE(st.isOk()) << "rank " << r << " imported a crafted file";
      EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
      EXPECT_NE(st.message().find(path), std::string::npos) << st.toString();
      EXPECT_NE(st.message().find(c.expect), std::string::npos) << st.toString();
      EXPECT_TRUE(before.sameAs(*w.states[r])) << "rank " << r;
    }
  }
  // An index file far larger than any index (a sparse or foreign file under that name) is refused
  // by its size, before it is read into memory.
  const std::string dir = tmp.sub("big-index");
  fs::copy(tmp.sub("ckpt"), dir);
  fs::resize_file(dir + "/" + kCheckpointIndexFile, ckpt::kMaxIndexBytes + 1);
  World w = makeWorld(model, 2, 16, 5.0f);
  Snapshot before(*w.states[0]);
  Status st = loadCheckpoint(dir, w.plans[0], w.states[0]->view);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("a checkpoint index may have"), std::string::npos) << st.toString();
  EXPECT_TRUE(before.sameAs(*w.states[0]));
}

// A shard file whose header (checksum intact) claims another element count is named as not
// belonging to the checkpoint from its header alone: the chunk table's length follows that count,
// and a header claiming 2^56 elements on a sparse file made the open read terabytes of table
// before the comparison with the index. Here the file keeps its size, so reading on would have
// reported it truncated instead.
TEST(Checkpoint, AShardHeaderThatDisagreesWithTheIndexIsNamedBeforeItsTableIsRead) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  savedWorld(model, 2, dir, 4);
  const std::string shard = dir + "/" + checkpointShardFileName(1, 2);
  ckpt::FileHeader h{};
  {
    const int fd = ::open(shard.c_str(), O_RDWR | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pread(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    h.numel = uint64_t{1} << 56;
    h.headerCrc = crc32c(&h, offsetof(ckpt::FileHeader, headerCrc));
    ASSERT_EQ(::pwrite(fd, &h, sizeof(h), 0), static_cast<ssize_t>(sizeof(h)));
    ::close(fd);
  }
  // Rank 1 at the same world size reads that file (rank 0 only its own); every rank at 1.
  for (int world : {2, 1}) {
    World w = makeWorld(model, world, 16, 5.0f);
    const int r = world - 1;
    Snapshot before(*w.states[r]);
    Status st = loadCheckpoint(dir, w.plans[r], w.states[r]->view);
    ASSERT_FALSE(st.isOk()) << "rank " << r << " of " << world;
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
    EXPECT_NE(st.message().find(shard), std::string::npos) << st.toString();
    EXPECT_NE(st.message().find("does not belong to this checkpoint"), std::string::npos) << st.toString();
    EXPECT_EQ(st.message().find("truncated"), std::string::npos) << st.toString();
    EXPECT_TRUE(before.sameAs(*w.states[r])) << "rank " << r << " of " << world;
  }
}

// An index whose lines are all empty (a foreign file under that name, with a valid closing
// checksum) is refused at its first line, without first splitting every line into tokens: a
// 32 MiB one took 17.6 s and 870 MB of memory before.
TEST(Checkpoint, AnIndexOfEmptyLinesIsRefusedAtItsFirstLine) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  savedWorld(model, 1, dir, 4);
  std::string text(size_t{32} << 20, '\n');
  char crc[32];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", crc32c(text.data(), text.size()));
  text += crc;
  {
    std::ofstream out(dir + "/" + kCheckpointIndexFile, std::ios::binary | std::ios::trunc);
    out << text;
  }
  text = std::string();
  struct rusage before {}, after {};
  getrusage(RUSAGE_SELF, &before);
  World w = makeWorld(model, 1, 16, 5.0f);
  Snapshot snap(*w.states[0]);
  Status st = loadCheckpoint(dir, w.plans[0], w.states[0]->view);
  getrusage(RUSAGE_SELF, &after);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  EXPECT_NE(st.message().find("line 1: expected 'shardcomm-checkpoint-index'"), std::string::npos) << st.toString();
  EXPECT_TRUE(snap.sameAs(*w.states[0]));
  // The text itself (32 MiB) and its one read: far below the 870 MB the eager split took.
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "peak grew by " << after.ru_maxrss - before.ru_maxrss << " KiB";
}

// The index takes no shard file of another save. A restarted run saves step 8 into the directory
// an interrupted save of step 8 left (rank 1's file only), and this time rank 1 fails to write:
// without save tags rank 0 indexed the stale file next to its own, and the checkpoint mixed two
// states and loaded without complaint.
TEST(Checkpoint, TheIndexTakesNoShardFileOfAnotherSave) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("step-8");
  World earlier = makeWorld(model, 2, 16, 0.0f), now = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) {
    fillState(earlier.plans[r], *earlier.states[r], 8, /*salt=*/1);
    fillState(now.plans[r], *now.states[r], 8, /*salt=*/2);
  }
  const uint32_t interrupted = newCheckpointSaveTag(), tag = newCheckpointSaveTag();
  ASSERT_NE(interrupted, 0u);
  ASSERT_NE(interrupted, tag);
  ASSERT_TRUE(saveCheckpointShard(dir, earlier.plans[1], earlier.states[1]->view, interrupted).isOk());
  ASSERT_TRUE(saveCheckpointShard(dir, now.plans[0], now.states[0]->view, tag).isOk());
  Status st = writeCheckpointIndex(dir, now.plans[0], tag);
  ASSERT_FALSE(st.isOk()) << "indexed another save's file";
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.toString();
  for (const std::string& word : {std::string("rank-1-of-2.shard"), std::string("another save"), ckpt::hex32(tag),
                                  ckpt::hex32(interrupted), std::string("not complete")})
    EXPECT_NE(st.message().find(word), std::string::npos) << word << " missing: " << st.toString();
  EXPECT_FALSE(fs::exists(dir + "/" + kCheckpointIndexFile));
  // Once rank 1 writes its file in this save, the same call succeeds and every rank loads this save.
  ASSERT_TRUE(saveCheckpointShard(dir, now.plans[1], now.states[1]->view, tag).isOk());
  ASSERT_TRUE(writeCheckpointIndex(dir, now.plans[0], tag).isOk());
  World loaded = makeWorld(model, 2);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(loadCheckpoint(dir, loaded.plans[r], loaded.states[r]->view).isOk());
    EXPECT_TRUE(checkState(loaded.plans[r], *loaded.states[r], 8, true, /*salt=*/2).isOk()) << "rank " << r;
  }
}

TEST(Checkpoint, SavesAreAtomicAndLeaveNoTemporaries) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  // A directory that holds a checkpoint is never saved into: each phase refuses it before writing
  // anything, and the old checkpoint stays complete and loadable.
  savedWorld(model, 2, dir, 1);
  World again = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) fillState(again.plans[r], *again.states[r], 2, 30);
  for (const Status& refused :
       {saveCheckpoint(dir, again.plans, again.views()),
        saveCheckpointShard(dir, again.plans[1], again.states[1]->view), writeCheckpointIndex(dir, again.plans[0])}) {
    ASSERT_FALSE(refused.isOk());
    EXPECT_EQ(refused.code(), StatusCode::kInvalidArgument) << refused.toString();
    EXPECT_NE(refused.message().find("already holds a checkpoint"), std::string::npos) << refused.toString();
    EXPECT_NE(refused.message().find(dir), std::string::npos) << refused.toString();
  }
  EXPECT_TRUE(tempNamesIn(dir).empty());
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
  {
    World w = makeWorld(model, 2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(loadCheckpoint(dir, w.plans[r], w.states[r]->view).isOk());
      EXPECT_TRUE(checkState(w.plans[r], *w.states[r], 1, true).isOk());
    }
  }
  // An index that appears between the check and the write (another job saving into the same
  // directory) is not replaced either: the index write itself refuses an existing name.
  const std::string racing = tmp.sub("racing");
  savedWorld(model, 2, racing, 3);
  const std::vector<char> firstIndex = readBytes(racing + "/" + kCheckpointIndexFile);
  Status raced = ckpt::writeFileAtomically(
      racing + "/" + kCheckpointIndexFile, [](int) { return Status::ok(); }, /*replace=*/false);
  ASSERT_FALSE(raced.isOk());
  EXPECT_NE(raced.message().find("already exists"), std::string::npos) << raced.toString();
  EXPECT_EQ(readBytes(racing + "/" + kCheckpointIndexFile), firstIndex);
  EXPECT_TRUE(tempNamesIn(racing).empty());
  // What an interrupted save leaves (shard files, no index) may be saved into again.
  fs::remove(racing + "/" + kCheckpointIndexFile);
  ASSERT_TRUE(saveCheckpoint(racing, again.plans, again.views()).isOk());
  {
    World w = makeWorld(model, 2);
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(loadCheckpoint(racing, w.plans[r], w.states[r]->view).isOk());
      EXPECT_TRUE(checkState(w.plans[r], *w.states[r], 2, true, 30).isOk());
    }
  }
  // The final name cannot be replaced (a non-empty directory sits there): the save fails, the
  // temporary is removed, and what was at the final name is untouched.
  const std::string blocked = tmp.sub("blocked");
  fs::create_directories(blocked + "/" + checkpointShardFileName(0, 1) + "/keep");
  World one = makeWorld(model, 1, 16, 0.0f);
  Status st = saveCheckpointShard(blocked, one.plans[0], one.states[0]->view);
  ASSERT_FALSE(st.isOk());
  EXPECT_EQ(st.code(), StatusCode::kSystemError);
  EXPECT_NE(st.message().find(checkpointShardFileName(0, 1)), std::string::npos) << st.toString();
  EXPECT_TRUE(tempNamesIn(blocked).empty());
  EXPECT_TRUE(fs::is_directory(blocked + "/" + checkpointShardFileName(0, 1) + "/keep"));
  // The index is not written unless every rank's file is there and sound.
  const std::string partial = tmp.sub("partial");
  World two = makeWorld(model, 2, 16, 0.0f);
  ASSERT_TRUE(saveCheckpointShard(partial, two.plans[0], two.states[0]->view).isOk());
  Status idx = writeCheckpointIndex(partial, two.plans[0]);
  ASSERT_FALSE(idx.isOk());
  EXPECT_NE(idx.message().find("rank-1-of-2.shard"), std::string::npos) << idx.toString();
  EXPECT_FALSE(fs::exists(partial + "/" + kCheckpointIndexFile));
  EXPECT_TRUE(tempNamesIn(partial).empty());
  // Bad arguments are refused before anything is created.
  ShardState wrong = one.states[0]->view;
  wrong.numel += 1;
  EXPECT_EQ(saveCheckpointShard(tmp.sub("never"), one.plans[0], wrong).code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(tmp.sub("never")));
  EXPECT_EQ(saveCheckpointShard("/nonexistent-parent/ckpt", one.plans[0], one.states[0]->view).code(),
            StatusCode::kSystemError);
}

// A temporary left by a killed save whose pid this process now has (containers reuse pids) does
// not block a later save: the next name is taken, and the stranger's file is left alone.
// A shard file past the process's file-size limit (ulimit -f): the save fails naming the limit,
// leaving no temporary, where the write's SIGXFSZ ended the process (both ranks of a tinylm save,
// a resource-exhaustion review). In a child: the limit is the process's.
TEST(Checkpoint, AFilePastTheFileSizeLimitIsAnErrorNotSigxfsz) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  World w = makeWorld(model, 2, 16, 0.0f);
  for (int r = 0; r < 2; ++r) fillState(w.plans[r], *w.states[r], 2, 30);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    const struct rlimit lim { 1024, RLIM_INFINITY };  // soft limit 1 KiB: every shard file is larger
    if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(90);
    const Status st = saveCheckpoint(dir, w.plans, w.views());
    if (st.isOk()) _exit(91);
    if (st.message().find("above this process's file-size limit of 1024 bytes (ulimit -f") == std::string::npos) {
      std::fprintf(stderr, "%s\n", st.toString().c_str());
      _exit(92);
    }
    _exit(!fs::exists(dir) || tempNamesIn(dir).empty() ? 0 : 93);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "ended by signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

TEST(Checkpoint, ATemporaryLeftByAKilledWriterWithOurPidDoesNotBlockASave) {
  TempDir tmp;
  const std::string path = tmp.sub(checkpointShardFileName(0, 1));
  // The counter starts at 0 in a fresh process (ctest runs each test alone); a few more cover a
  // run of the whole binary.
  std::vector<std::string> stale;
  for (int n = 0; n < 16; ++n) {
    stale.push_back(
        tmp.sub("." + checkpointShardFileName(0, 1) + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(n)));
    std::FILE* f = std::fopen(stale.back().c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  Status st = ckpt::writeFileAtomically(path, [](int fd) { return ckpt::pwriteAll(fd, "data", 4, 0, "test"); });
  EXPECT_TRUE(st.isOk()) << st.toString();
  EXPECT_EQ(readBytes(path), std::vector<char>({'d', 'a', 't', 'a'}));
  EXPECT_EQ(tempNamesIn(tmp.path()).size(), stale.size());
  for (const std::string& s : stale) EXPECT_TRUE(fs::exists(s)) << s;
}

}  // namespace
}  // namespace libshard
