// Loading into a plan of any world size: match the source's parameters with the model's, read
// each parameter's part of this rank's shards into temporaries, then commit them in one go.

#include <algorithm>
#include <cstring>
#include <map>

#include "checkpoint_format.h"
#include "libcomm/convert.h"
#include "shard_internal.h"

namespace libshard {
namespace {

using libcomm::Status;
using libcomm::StatusCode;
using namespace ckpt;  // NOLINT: this file is the checkpoint implementation

Status checkLoadTarget(const ShardPlan& plan, const ShardState& state) {
  const int rank = plan.options.rank, world = plan.options.worldSize;
  if (world < 1 || rank < 0 || rank >= world)
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint load: plan has rank ", rank, " of ", world);
  if (state.onDevice)
    return libcomm::makeError(StatusCode::kInvalidUsage,
                              "checkpoint load: the state is device memory; load into host memory and copy it over");
  LIBCOMM_RETURN_IF_ERROR(detail::checkWritable(state, "checkpoint load", true));
  if (state.numel != plan.stateNumel)
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint load: state has ", state.numel,
                              " elements, the plan ", plan.stateNumel);
  if (state.numel > 0 && (!state.master || !state.adamM || !state.adamV))
    return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint load: state is missing master or moments");
  return Status::ok();
}

std::string shapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Nothing is written before this point, and nothing here can fail.
void commit(ShardState& state, const std::vector<std::vector<float>>& tmp, uint64_t step) {
  const size_t bytes = state.numel * sizeof(float);
  if (bytes > 0) {
    std::memcpy(state.master, tmp[0].data(), bytes);
    if (tmp.size() == 3) {
      std::memcpy(state.adamM, tmp[1].data(), bytes);
      std::memcpy(state.adamV, tmp[2].data(), bytes);
    } else {
      std::memset(state.adamM, 0, bytes);
      std::memset(state.adamV, 0, bytes);
    }
    if (state.compute != nullptr) libcomm::floatToBf16(state.master, state.compute, state.numel);
  }
  state.step = step;
}

class FullSource final : public ParamSource {
 public:
  explicit FullSource(ChunkedFile& file) : file_(file) {}
  Status read(const LayoutParam& p, int section, uint64_t first, size_t n, float* dst) override {
    return file_.read(static_cast<uint64_t>(section) * file_.header().numel + p.offset + first, n, dst);
  }

 private:
  ChunkedFile& file_;
};

}  // namespace

namespace ckpt {

Status loadForPlan(ParamSource& source, const std::vector<LayoutParam>& srcParams, int sections, const ShardPlan& plan,
                   const std::string& what, std::vector<std::vector<float>>& out) {
  std::map<std::string, const LayoutParam*> byName;
  for (const LayoutParam& p : srcParams) byName.emplace(p.name, &p);

  // Pair every model parameter with its source first: a mismatch is reported before any read.
  struct Job {
    const FlatGroup* group;
    const ParamPlacement* dst;
    const LayoutParam* src;
  };
  std::vector<Job> jobs;
  auto collect = [&](const FlatGroup& g) -> Status {
    for (const ParamPlacement& p : g.params) {
      auto it = byName.find(p.name);
      if (it == byName.end())
        return libcomm::makeError(StatusCode::kInvalidArgument, what, " does not match the model: model parameter '",
                                  p.name, "' is not in it");
      if (it->second->shape != p.shape)
        return libcomm::makeError(StatusCode::kInvalidArgument, what, " does not match the model: parameter '", p.name,
                                  "' has shape ", shapeString(it->second->shape), " there and ", shapeString(p.shape),
                                  " in the model");
      jobs.push_back({&g, &p, it->second});
      byName.erase(it);
    }
    return Status::ok();
  };
  for (const FlatGroup& g : plan.layers) LIBCOMM_RETURN_IF_ERROR(collect(g));
  LIBCOMM_RETURN_IF_ERROR(collect(plan.resident));
  if (!byName.empty())
    return libcomm::makeError(StatusCode::kInvalidArgument, what, " does not match the model: its parameter '",
                              byName.begin()->first, "' is not in the model (", byName.size(), " such)");

  const size_t rank = static_cast<size_t>(plan.options.rank);
  out.assign(static_cast<size_t>(sections), std::vector<float>(plan.stateNumel, 0.0f));
  // Section-major, parameters in layout order: reads walk each source file forwards, so every
  // chunk is fetched once.
  for (int s = 0; s < sections; ++s) {
    for (const Job& j : jobs) {
      const FlatGroup& g = *j.group;
      const size_t shardBegin = rank * g.shardNumel, shardEnd = shardBegin + g.shardNumel;
      const size_t begin = std::max(j.dst->offset, shardBegin);
      const size_t end = std::min(j.dst->offset + j.dst->numel, shardEnd);
      if (begin >= end) continue;
      if (g.stateOffset + (end - shardBegin) > plan.stateNumel)
        return libcomm::makeError(StatusCode::kInvalidArgument, "checkpoint load: group '", g.name,
                                  "' lies outside the plan's state of ", plan.stateNumel, " elements");
      float* dst = out[static_cast<size_t>(s)].data() + g.stateOffset + (begin - shardBegin);
      LIBCOMM_RETURN_IF_ERROR(source.read(*j.src, s, begin - j.dst->offset, end - begin, dst));
      // Every checksum may be right over a value no save writes (checkpoint_format.h): refused
      // here, before the state is touched, rather than trained on.
      if (const size_t bad = firstBadValue(dst, end - begin, s); bad < end - begin)
        return libcomm::makeError(StatusCode::kInvalidArgument, what, ": parameter '", j.dst->name, "'",
                                  badValueText(dst[bad], s, begin - j.dst->offset + bad),
                                  " (a save refuses them): the file was written by something else, or altered");
    }
  }
  return Status::ok();
}

}  // namespace ckpt

namespace {

// Every error of a load names the loading rank: ranks read different files and chunks, so which
// rank failed is half of what happened.
std::string loaderName(const ShardPlan& plan) {
  return "rank " + std::to_string(plan.options.rank) + " of " + std::to_string(plan.options.worldSize);
}

Status loadCheckpointImpl(const std::string& dir, const ShardPlan& plan, ShardState& state, CheckpointInfo* loaded) {
  LIBCOMM_RETURN_IF_ERROR(checkLoadTarget(plan, state).withContext("checkpoint '" + dir + "'"));
  LIBCOMM_ASSIGN_OR_RETURN(CheckpointIndex x, readIndex(dir));
  std::unique_ptr<ParamSource> source = makeShardedSource(dir, x);
  std::vector<std::vector<float>> tmp;
  LIBCOMM_RETURN_IF_ERROR(loadForPlan(*source, x.params, 3, plan, "checkpoint '" + dir + "'", tmp));
  // Again: the read may have taken long, and an executor's step may have begun meanwhile.
  LIBCOMM_RETURN_IF_ERROR(
      detail::checkWritable(state, "checkpoint load", true).withContext("checkpoint '" + dir + "'"));
  commit(state, tmp, x.step);
  if (loaded) *loaded = infoOf(x);
  return Status::ok();
}

Status importFullModelImpl(const std::string& path, const ShardPlan& plan, ShardState& state,
                           bool restoreOptimizerState) {
  LIBCOMM_RETURN_IF_ERROR(checkLoadTarget(plan, state).withContext("full-model file '" + path + "'"));
  LIBCOMM_ASSIGN_OR_RETURN(auto file, ChunkedFile::open(path, kFullMagic, "full-model"));
  const FileHeader& h = file->header();
  LIBCOMM_ASSIGN_OR_RETURN(std::vector<LayoutParam> params, parseParamList(file->indexText(), path));
  for (const LayoutParam& p : params) {
    uint64_t end = 0;
    if (__builtin_add_overflow(p.offset, p.numel, &end) || end > h.numel)
      return badFile(path, "parameter '", p.name, "' at offset ", p.offset, " with ", p.numel,
                     " elements lies outside the ", h.numel, " elements of each section");
  }
  // Parameters side by side, never on top of each other (two sharing elements imported one's
  // values as the other's, every checksum vouching for the file).
  std::vector<const LayoutParam*> byOffset;
  for (const LayoutParam& p : params)
    if (p.numel > 0) byOffset.push_back(&p);
  std::sort(byOffset.begin(), byOffset.end(),
            [](const LayoutParam* a, const LayoutParam* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < byOffset.size(); ++i)
    if (byOffset[i]->offset < byOffset[i - 1]->offset + byOffset[i - 1]->numel)  // no overflow: checked above
      return badFile(path, "parameters '", byOffset[i - 1]->name, "' and '", byOffset[i]->name, "' overlap (offsets ",
                     byOffset[i - 1]->offset, " and ", byOffset[i]->offset, ")");
  const bool withMoments = restoreOptimizerState && h.sections == 3;
  FullSource source(*file);
  std::vector<std::vector<float>> tmp;
  LIBCOMM_RETURN_IF_ERROR(
      loadForPlan(source, params, withMoments ? 3 : 1, plan, "full-model file '" + path + "'", tmp));
  LIBCOMM_RETURN_IF_ERROR(
      detail::checkWritable(state, "full-model import", true).withContext("full-model file '" + path + "'"));
  commit(state, tmp, withMoments ? h.step : 0);
  return Status::ok();
}

}  // namespace

Status loadCheckpoint(const std::string& dir, const ShardPlan& plan, ShardState& state, CheckpointInfo* loaded) {
  return loadCheckpointImpl(dir, plan, state, loaded).withContext(loaderName(plan) + " loading");
}

Status importFullModel(const std::string& path, const ShardPlan& plan, ShardState& state, bool restoreOptimizerState) {
  return importFullModelImpl(path, plan, state, restoreOptimizerState).withContext(loaderName(plan) + " importing");
}

}  // namespace libshard
