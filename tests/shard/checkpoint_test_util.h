#pragma once
// Helpers of the checkpoint tests: a temporary directory, whole worlds of plans and states filled
// with values any world size can predict, checks of loaded states, snapshots that prove a failed
// load wrote nothing, and byte-level access to damage files on purpose.

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint_format.h"
#include "libcomm/convert.h"
#include "libshard/checkpoint.h"
#include "shard_state_util.h"

namespace libshard::testutil {

namespace fs = std::filesystem;

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/shardckpt-XXXXXX";
    const char* made = ::mkdtemp(tmpl);
    path_ = made ? made : "";
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string sub(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The state every rank holds for "checkpoint number `salt`": a pure function of (parameter,
// element), so any world size knows what it should load.
inline void fillState(const ShardPlan& plan, OwnedState& st, uint64_t step, int salt = 0) {
  forEachOwned(plan, [&](const ParamPlacement& p, size_t j, size_t i) {
    st.master[i] = valueOf(p.name, j, salt);
    st.m[i] = valueOf(p.name, j, salt + 1);
    st.v[i] = std::fabs(valueOf(p.name, j, salt + 2));
  });
  if (!st.compute.empty()) libcomm::floatToBf16(st.master.data(), st.compute.data(), st.master.size());
  st.view.step = step;
}

// Bit-identical parameters and moments (zero moments when !moments), zero padding, fresh compute.
inline libcomm::Status checkState(const ShardPlan& plan, const OwnedState& st, uint64_t step, bool moments,
                                  int salt = 0) {
  if (st.view.step != step)
    return libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", plan.options.rank, ": step ", st.view.step,
                              ", want ", step);
  libcomm::Status bad;
  forEachOwned(plan, [&](const ParamPlacement& p, size_t j, size_t i) {
    const float w = valueOf(p.name, j, salt), m = moments ? valueOf(p.name, j, salt + 1) : 0.0f,
                v = moments ? std::fabs(valueOf(p.name, j, salt + 2)) : 0.0f;
    if (bad.isOk() && (!sameBits(st.master[i], w) || !sameBits(st.m[i], m) || !sameBits(st.v[i], v)))
      bad = libcomm::makeError(libcomm::StatusCode::kInternalError, "rank ", plan.options.rank, " of ",
                               plan.options.worldSize, ": ", p.name, "[", j, "] differs");
  });
  if (!bad.isOk()) return bad;
  const std::vector<bool> mask = paramMask(plan);
  for (size_t i = 0; i < mask.size(); ++i) {
    if (!mask[i] && (!sameBits(st.master[i], 0.0f) || !sameBits(st.m[i], 0.0f) || !sameBits(st.v[i], 0.0f)))
      return libcomm::makeError(libcomm::StatusCode::kInternalError, "padding element ", i, " is not 0");
    if (!st.compute.empty() && st.compute[i] != libcomm::floatToBf16(st.master[i]))
      return libcomm::makeError(libcomm::StatusCode::kInternalError, "compute[", i, "] is not bf16(master)");
  }
  return libcomm::Status::ok();
}

struct World {
  std::vector<ShardPlan> plans;
  std::vector<std::unique_ptr<OwnedState>> states;

  std::vector<const ShardState*> views() const {
    std::vector<const ShardState*> v;
    for (const auto& s : states) v.push_back(&s->view);
    return v;
  }
};

// Plans (and states prefilled with `fill`) for every rank of a world.
inline World makeWorld(const ModelSpec& model, int world, size_t align = 16, float fill = NAN,
                       Precision precision = Precision::kBf16) {
  World w;
  for (int r = 0; r < world; ++r) {
    auto plan = makePlan(model, world, r, align, precision);
    EXPECT_TRUE(plan.isOk()) << plan.status().toString();
    w.plans.push_back(plan.isOk() ? std::move(plan).value() : ShardPlan{});
    w.states.push_back(std::make_unique<OwnedState>(w.plans.back(), fill));
  }
  return w;
}

inline World savedWorld(const ModelSpec& model, int world, const std::string& dir, uint64_t step, int salt = 0,
                        size_t align = 16) {
  World w = makeWorld(model, world, align, 0.0f);
  for (int r = 0; r < world; ++r) fillState(w.plans[r], *w.states[r], step, salt);
  libcomm::Status st = saveCheckpoint(dir, w.plans, w.views());
  EXPECT_TRUE(st.isOk()) << st.toString();
  return w;
}

inline std::vector<std::string> tempNamesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp-") != std::string::npos) names.push_back(e.path().string());
  return names;
}

// A full copy of a state, to prove that a failed load wrote nothing.
struct Snapshot {
  std::vector<float> master, grad, m, v;
  std::vector<uint16_t> compute;
  uint64_t step;
  explicit Snapshot(const OwnedState& s)
      : master(s.master), grad(s.grad), m(s.m), v(s.v), compute(s.compute), step(s.view.step) {}
  bool sameAs(const OwnedState& s) const {
    auto bits = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
    };
    return bits(master, s.master) && bits(grad, s.grad) && bits(m, s.m) && bits(v, s.v) && compute == s.compute &&
           step == s.view.step;
  }
};

// Byte-level access to checkpoint files, to damage them on purpose.
inline std::vector<char> readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>(std::istreambuf_iterator<char>(in), {});
}
inline void writeBytes(const std::string& path, const std::vector<char>& b) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(b.data(), static_cast<std::streamsize>(b.size()));
}
inline void flipByte(const std::string& path, size_t at) {
  std::vector<char> b = readBytes(path);
  ASSERT_LT(at, b.size());
  b[at] = static_cast<char>(b[at] ^ 0x5A);
  writeBytes(path, b);
}
inline ckpt::FileHeader headerOf(const std::string& path) {
  ckpt::FileHeader h{};
  std::vector<char> b = readBytes(path);
  if (b.size() >= sizeof(h)) std::memcpy(&h, b.data(), sizeof(h));
  return h;
}

}  // namespace libshard::testutil
