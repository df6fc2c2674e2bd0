// Checkpoints (libshard/checkpoint.h), the good paths: round trips at the same world size,
// resharding 4 -> 2 and 2 -> 3 (and across checksum-chunk boundaries, reading only the chunks a
// rank needs), full-model export/import, and the documented multi-rank save protocol with ranks as
// threads and as processes. The error paths are in checkpoint_errors_test.cc.

#include "libshard/checkpoint.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_test_util.h"
#include "harness.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using namespace testutil;  // NOLINT

TEST(Crc32c, KnownVectorsAndChaining) {
  const char* digits = "123456789";
  EXPECT_EQ(crc32c(digits, 9), 0xE3069283u);
  EXPECT_EQ(ckpt::crc32cPortable(digits, 9), 0xE3069283u);
  EXPECT_EQ(crc32c(digits, 0), 0u);
  std::vector<unsigned char> data(10007);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + (i >> 7));
  const uint32_t whole = crc32c(data.data(), data.size());
  EXPECT_EQ(ckpt::crc32cPortable(data.data(), data.size()), whole);
  for (size_t cut : {size_t{1}, size_t{7}, size_t{8}, size_t{4096}, size_t{10006}})
    EXPECT_EQ(crc32c(data.data() + cut, data.size() - cut, crc32c(data.data(), cut)), whole) << cut;
}

// The index's text, byte for byte, for a small hand-made layout: each group's parameters follow
// its line, in their order. And the same grouping for many groups (formatIndex once scanned every
// parameter for every group: 16384 layers took seconds), checked by parsing it back.
TEST(Checkpoint, IndexTextListsEachGroupsParametersUnderIt) {
  ckpt::CheckpointIndex x;
  x.world = 2;
  x.alignmentBytes = 128;
  x.precision = Precision::kFp32;
  x.step = 7;
  x.stateNumel = 96;
  x.groups = {{"layer 0", 0, 10, 32, 16, 0}, {"resident", -1, 4, 64, 32, 16}};
  x.params = {{"w1", {2, 3}, ParamKind::kBlock, true, 0, 6, 0},
              {"w2", {4}, ParamKind::kBlock, false, 6, 4, 0},
              {"norm", {4}, ParamKind::kNorm, false, 0, 4, 1}};
  x.files = {{0, "rank-0-of-2.shard", 1000, 0xabcdef01u}, {1, "rank-1-of-2.shard", 1000, 0x12u}};
  const std::string text = ckpt::formatIndex(x);
  const std::string body =
      "shardcomm-checkpoint-index 1\n"
      "world 2\n"
      "alignment_bytes 128\n"
      "precision fp32\n"
      "step 7\n"
      "state_numel 96\n"
      "groups 2\n"
      "group layer%200 0 10 32 16 0 2\n"
      "param w1 block 1 0 6 2x3\n"
      "param w2 block 0 6 4 4\n"
      "group resident -1 4 64 32 16 1\n"
      "param norm norm 0 0 4 4\n"
      "files 2\n"
      "file 0 rank-0-of-2.shard 1000 abcdef01\n"
      "file 1 rank-1-of-2.shard 1000 00000012\n";
  char crc[32];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", crc32c(body.data(), body.size()));
  EXPECT_EQ(text, body + crc);

  ckpt::CheckpointIndex many;
  many.world = 1;
  constexpr int kGroups = 20000;
  for (int g = 0; g < kGroups; ++g) {
    many.groups.push_back({"layer" + std::to_string(g), g, 3, 64, 64, uint64_t(g) * 64});
    for (int p = 0; p < 3; ++p)
      many.params.push_back(
          {"l" + std::to_string(g) + ".p" + std::to_string(p), {1}, ParamKind::kBlock, true, uint64_t(p), 1, g});
  }
  many.stateNumel = uint64_t(kGroups) * 64;
  many.files = {{0, checkpointShardFileName(0, 1), 1, 0}};
  auto parsed = ckpt::parseIndex(ckpt::formatIndex(many), "many");
  ASSERT_TRUE(parsed.isOk()) << parsed.status().toString();
  ASSERT_EQ(parsed->params.size(), many.params.size());
  for (size_t i = 0; i < many.params.size(); ++i) {
    EXPECT_EQ(parsed->params[i].name, many.params[i].name) << i;
    EXPECT_EQ(parsed->params[i].group, many.params[i].group) << i;
    if (parsed->params[i].name != many.params[i].name) break;
  }
}

TEST(Checkpoint, RoundTripAtTheSameWorldSize) {
  const ModelSpec model = testModel(2, 5, 11);
  for (int world : {1, 2, 4}) {
    TempDir tmp;
    const std::string dir = tmp.sub("ckpt");
    World saved = savedWorld(model, world, dir, 42);
    ASSERT_TRUE(verifyCheckpoint(dir).isOk());
    auto info = readCheckpointInfo(dir);
    ASSERT_TRUE(info.isOk()) << info.status().toString();
    EXPECT_EQ(info->worldSize, world);
    EXPECT_EQ(info->step, 42u);
    EXPECT_EQ(info->numParams, 2u + 4u * 2u + 1u);
    EXPECT_EQ(info->paramNumel, model.numel());
    ASSERT_EQ(info->files.size(), static_cast<size_t>(world));
    EXPECT_EQ(info->files.back(), checkpointShardFileName(world - 1, world));
    EXPECT_TRUE(fs::exists(dir + "/" + kCheckpointIndexFile));
    EXPECT_TRUE(tempNamesIn(dir).empty());

    World loaded = makeWorld(model, world);  // NaN everywhere: padding must come back as 0
    for (int r = 0; r < world; ++r) {
      Status st = loadCheckpoint(dir, loaded.plans[r], loaded.states[r]->view);
      ASSERT_TRUE(st.isOk()) << st.toString();
      EXPECT_TRUE(checkState(loaded.plans[r], *loaded.states[r], 42, true).isOk());
      for (float g : loaded.states[r]->grad) ASSERT_TRUE(std::isnan(g)) << "load wrote the gradient shard";
      EXPECT_EQ(std::memcmp(loaded.states[r]->master.data(), saved.states[r]->master.data(),
                            saved.states[r]->master.size() * 4),
                0);
    }
  }
}

// Loads `dir` into every rank of a `world`-rank layout and checks each against the values.
void expectLoads(const ModelSpec& model, const std::string& dir, int world, uint64_t step, size_t align = 16,
                 Precision precision = Precision::kBf16) {
  World w = makeWorld(model, world, align, NAN, precision);
  for (int r = 0; r < world; ++r) {
    Status st = loadCheckpoint(dir, w.plans[r], w.states[r]->view);
    ASSERT_TRUE(st.isOk()) << st.toString();
    Status cmp = checkState(w.plans[r], *w.states[r], step, true);
    EXPECT_TRUE(cmp.isOk()) << "world " << world << ": " << cmp.toString();
  }
}

TEST(Checkpoint, ReshardsFourToTwoAndTwoToThree) {
  const ModelSpec model = testModel(3, 7, 13);
  TempDir tmp;
  savedWorld(model, 4, tmp.sub("w4"), 9);
  expectLoads(model, tmp.sub("w4"), 2, 9);
  savedWorld(model, 2, tmp.sub("w2"), 11);
  expectLoads(model, tmp.sub("w2"), 3, 11);
  // Other alignments and precision change every offset; the parameters still land in place.
  expectLoads(model, tmp.sub("w2"), 3, 11, 128, Precision::kFp32);
  expectLoads(model, tmp.sub("w4"), 7, 9, 64);
  expectLoads(model, tmp.sub("w4"), 1, 9);

  // A resharded state saves and reshards again: 4 -> 2 -> 3.
  World two = makeWorld(model, 2);
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(loadCheckpoint(tmp.sub("w4"), two.plans[r], two.states[r]->view).isOk());
  ASSERT_TRUE(saveCheckpoint(tmp.sub("again"), two.plans, two.views()).isOk());
  expectLoads(model, tmp.sub("again"), 3, 9);
}

TEST(Checkpoint, ReshardsAcrossChecksumChunks) {
  // About a million parameters: every shard file spans several 1 MiB checksum chunks, and ranges
  // start and end inside chunks.
  const ModelSpec model = testModel(2, 256, 1000);
  TempDir tmp;
  savedWorld(model, 2, tmp.sub("big"), 3, 0, 128);
  ASSERT_TRUE(verifyCheckpoint(tmp.sub("big")).isOk());
  expectLoads(model, tmp.sub("big"), 3, 3);
  expectLoads(model, tmp.sub("big"), 1, 3, 128, Precision::kFp32);
}

TEST(Checkpoint, ReadsOnlyTheChunksARankNeeds) {
  // One 1-rank file of ~30 checksum chunks (embedding and head of ~5 chunks each), loaded at 3
  // ranks. Damage a chunk that rank 0 does not need but another rank does: rank 0 still loads (it
  // never read that chunk), the other rank names the chunk.
  const ModelSpec model = testModel(1, 64, 20000);
  TempDir tmp;
  const std::string dir = tmp.sub("one");
  World old = savedWorld(model, 1, dir, 8, 0, 128);
  const ShardPlan& oldPlan = old.plans[0];
  std::map<std::string, size_t> oldPos;  // parameter -> its first element in the old file's sections
  auto index = [&](const FlatGroup& g) {
    for (const ParamPlacement& p : g.params) oldPos[p.name] = g.stateOffset + p.offset;
  };
  for (const FlatGroup& g : oldPlan.layers) index(g);
  index(oldPlan.resident);
  World w = makeWorld(model, 3, 16, 1.0f);
  const size_t chunks = (3 * oldPlan.stateNumel + ckpt::kChunkElems - 1) / ckpt::kChunkElems;
  ASSERT_GE(chunks, 10u);
  std::vector<std::vector<bool>> needs(3, std::vector<bool>(chunks, false));
  for (int r = 0; r < 3; ++r)
    forEachOwned(w.plans[r], [&](const ParamPlacement& p, size_t j, size_t) {
      for (size_t s = 0; s < 3; ++s) needs[r][(s * oldPlan.stateNumel + oldPos[p.name] + j) / ckpt::kChunkElems] = true;
    });
  size_t victim = chunks;
  int needer = -1;
  for (size_t c = 0; c < chunks && victim == chunks; ++c)
    for (int r = 1; r < 3; ++r)
      if (!needs[0][c] && needs[r][c]) {
        victim = c;
        needer = r;
        break;
      }
  ASSERT_LT(victim, chunks) << "the layout gives rank 0 a need for every chunk";
  const std::string file = dir + "/" + checkpointShardFileName(0, 1);
  flipByte(file, ckpt::layoutOf(headerOf(file)).dataOffset + victim * ckpt::kChunkElems * 4 + 17);
  Status ok = loadCheckpoint(dir, w.plans[0], w.states[0]->view);
  EXPECT_TRUE(ok.isOk()) << ok.toString();
  EXPECT_TRUE(checkState(w.plans[0], *w.states[0], 8, true).isOk());
  Status bad = loadCheckpoint(dir, w.plans[needer], w.states[needer]->view);
  ASSERT_FALSE(bad.isOk());
  EXPECT_NE(bad.message().find("checksum mismatch in data chunk " + std::to_string(victim)), std::string::npos)
      << bad.toString();
}

TEST(Checkpoint, ExportAndImportTheFullModel) {
  const ModelSpec model = testModel(2, 5, 11);
  TempDir tmp;
  savedWorld(model, 4, tmp.sub("w4"), 17);
  const std::string full = tmp.sub("model.full"), weights = tmp.sub("weights.full");
  ASSERT_TRUE(exportFullModel(tmp.sub("w4"), full, true).isOk());
  ASSERT_TRUE(exportFullModel(tmp.sub("w4"), weights, false).isOk());
  EXPECT_TRUE(tempNamesIn(tmp.path()).empty());
  for (int world : {1, 3}) {
    World w = makeWorld(model, world);
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(importFullModel(full, w.plans[r], w.states[r]->view, true).isOk());
      EXPECT_TRUE(checkState(w.plans[r], *w.states[r], 17, true).isOk());
      // Asked not to restore the optimizer state: fresh moments, step 0.
      ASSERT_TRUE(importFullModel(full, w.plans[r], w.states[r]->view, false).isOk());
      EXPECT_TRUE(checkState(w.plans[r], *w.states[r], 0, false).isOk());
      // A weights-only file has nothing to restore.
      ASSERT_TRUE(importFullModel(weights, w.plans[r], w.states[r]->view, true).isOk());
      EXPECT_TRUE(checkState(w.plans[r], *w.states[r], 0, false).isOk());
    }
  }
  // Weights-only is a third of the size (plus header and index).
  EXPECT_LT(fs::file_size(weights) * 2, fs::file_size(full));
}

// Loading a checkpoint of many ranks at world 1, and exporting it, read every old shard file once
// per group: one descriptor per old rank kept open ran out of descriptors ("Too many open files")
// at a thousand ranks under the common limit of 1024. Here: 150 ranks, 72 descriptors to spare.
TEST(Checkpoint, LoadsAndExportsMoreShardFilesThanItMayHaveOpen) {
  const ModelSpec model = testModel(2, 5, 200);
  TempDir tmp;
  savedWorld(model, 150, tmp.sub("w150"), 5);
  size_t open = 0;
  for (const auto& e : fs::directory_iterator("/proc/self/fd")) open += e.path().empty() ? 0 : 1;
  struct rlimit saved {};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &saved), 0);
  struct rlimit low = saved;
  low.rlim_cur = std::min<rlim_t>(saved.rlim_cur, open + 72);
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &low), 0);
  World w = makeWorld(model, 1);
  const Status load = loadCheckpoint(tmp.sub("w150"), w.plans[0], w.states[0]->view);
  const Status exported = exportFullModel(tmp.sub("w150"), tmp.sub("model.full"), true);
  setrlimit(RLIMIT_NOFILE, &saved);
  ASSERT_TRUE(load.isOk()) << load.toString();
  EXPECT_TRUE(checkState(w.plans[0], *w.states[0], 5, true).isOk());
  ASSERT_TRUE(exported.isOk()) << exported.toString();
  World again = makeWorld(model, 1);
  ASSERT_TRUE(importFullModel(tmp.sub("model.full"), again.plans[0], again.states[0]->view, true).isOk());
  EXPECT_TRUE(checkState(again.plans[0], *again.states[0], 5, true).isOk());
}

// ---- The documented protocol with real ranks: every rank saves its file, barrier, rank 0 writes
// the index, barrier; then every rank loads (same world) and checks.

class CheckpointRanks : public shardcomm::testing::RanksTest {};

TEST_P(CheckpointRanks, SaveWithBarriersThenLoad) {
  TempDir tmp;
  const std::string dir = tmp.sub("ckpt");
  auto body = [dir](shardcomm::testing::RankContext& ctx) -> Status {
    const ModelSpec model = testModel(2, 5, 11);
    const auto deadline = libcomm::Deadline::after(shardcomm::testing::scaledForSanitizers(std::chrono::seconds(60)));
    LIBCOMM_ASSIGN_OR_RETURN(ShardPlan plan, makePlan(model, ctx.size, ctx.rank));
    OwnedState st(plan);
    fillState(plan, st, 12);
    LIBCOMM_RETURN_IF_ERROR(saveCheckpointShard(dir, plan, st.view));
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(deadline));
    if (ctx.rank == 0) LIBCOMM_RETURN_IF_ERROR(writeCheckpointIndex(dir, plan));
    LIBCOMM_RETURN_IF_ERROR(ctx.bootstrap.barrier(deadline));
    OwnedState back(plan, NAN);
    LIBCOMM_RETURN_IF_ERROR(loadCheckpoint(dir, plan, back.view));
    return checkState(plan, back, 12, true);
  };
  EXPECT_RANKS_OK(run(3, body));
  EXPECT_TRUE(verifyCheckpoint(dir).isOk());
}

SHARDCOMM_INSTANTIATE_BOTH_MODES(CheckpointRanks);

}  // namespace
}  // namespace libshard
