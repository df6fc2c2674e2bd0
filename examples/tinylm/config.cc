// TinyLmConfig checks and the ModelSpec handed to libshard.

#include "tinylm/config.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>

#include "tinylm/check.h"

namespace tinylm {

namespace {

constexpr uint64_t kMaxMatrixElements = uint64_t{1} << 31;
constexpr int kMaxLayers = 1 << 16;

libshard::ParamSpec param(std::string name, std::vector<int64_t> shape, libshard::ParamKind kind) {
  libshard::ParamSpec p;
  p.name = std::move(name);
  p.shape = std::move(shape);
  p.kind = kind;
  p.weightDecay = kind != libshard::ParamKind::kNorm;
  return p;
}

// The widest activation a token has: [T, dim], [T, hidden] or [T, vocab].
uint64_t widestActivation(const TinyLmConfig& cfg) { return uint64_t(std::max({1, cfg.dim, cfg.hidden, cfg.vocab})); }

}  // namespace

libcomm::Status TinyLmConfig::validate() const {
  using libcomm::StatusCode;
  struct Field {
    const char* name;
    int value;
    int min;
  };
  for (const Field& f : {Field{"vocab", vocab, 2}, Field{"dim", dim, 1}, Field{"hidden", hidden, 1},
                         Field{"layers", layers, 1}, Field{"seqLen", seqLen, 1}}) {
    if (f.value < f.min)
      return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm config: ", f.name, " = ", f.value,
                                " (must be >= ", f.min, ")");
  }
  // Two parameters per block: a layer count beyond this is no model that runs here.
  if (layers > kMaxLayers)
    return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm config: layers = ", layers, " (must be <= ",
                              kMaxLayers, ")");
  // Kernels index a weight matrix with size_t, but token ids are int32 and the spec's extents are
  // int64: keeping every matrix under 2^31 elements keeps all of it comfortably in range.
  const uint64_t vd = uint64_t(vocab) * uint64_t(dim), hd = uint64_t(hidden) * uint64_t(dim);
  if (vd >= kMaxMatrixElements || hd >= kMaxMatrixElements)
    return libcomm::makeError(StatusCode::kInvalidArgument, "tinylm config: a weight matrix has >= 2^31 elements (",
                              describe(), ")");
  return libcomm::Status::ok();
}

uint64_t maxTokensPerMicroBatch(const TinyLmConfig& cfg) { return (kMaxMatrixElements - 1) / widestActivation(cfg); }

uint64_t layerMemoryBytes(const TinyLmConfig& cfg, uint64_t tokens, bool checkpointing) {
  const uint64_t layers = uint64_t(std::max(cfg.layers, 0)), d = uint64_t(std::max(cfg.dim, 0)),
                 h = uint64_t(std::max(cfg.hidden, 0)), v = uint64_t(std::max(cfg.vocab, 0));
  // fp32 elements per token: x_0..x_L, z and the gradient (dim each), every block's pre-activation,
  // the softmax; the Workspace's normed and its gradient (dim), rstd, hidden, act and its gradient
  // (hidden), logits (vocab). Then 4-byte ids, targets and the embedding's index scratch.
  const uint64_t preActs = checkpointing ? std::min<uint64_t>(layers, 1) : layers;  // blocks keeping theirs
  const uint64_t floatsPerToken = (layers + 3) * d + preActs * h + v + (2 * d + 1 + 3 * h + v);
  const uint64_t perToken = 4 * floatsPerToken + 3 * 4;
  // Per micro-batch whatever its size: the bf16 weight-gradient block (64 Ki floats), a norm scale,
  // the embedding's per-id offsets and cursors.
  const uint64_t fixed = 4 * ((uint64_t{64} << 10) + d + 2 * v + 1);
  const long double bytes = static_cast<long double>(tokens) * static_cast<long double>(perToken) + fixed;
  return bytes >= 0x1p64L ? UINT64_MAX : static_cast<uint64_t>(bytes);
}

namespace {

// The first line of `path` as a byte count: "max" (v2's no limit) or anything unreadable is none.
std::optional<uint64_t> readLimit(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word.empty() || word.find_first_not_of("0123456789") != std::string::npos) return std::nullopt;
  errno = 0;
  const unsigned long long v = std::strtoull(word.c_str(), nullptr, 10);
  if (errno == ERANGE) return std::nullopt;
  return uint64_t(v);
}

}  // namespace

MemoryLimit usableMemory(const std::string& root) {
  MemoryLimit limit;
  const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGESIZE);
  if (pages > 0 && pageSize > 0) limit.bytes = uint64_t(pages) * uint64_t(pageSize);
  // /proc/self/cgroup: "0::/path" (v2) and "N:controller,...:/path" (v1). The limits of the cgroup
  // and of each ancestor all apply; where a cgroup namespace hides the outer path, the mount's root
  // holds the container's own files.
  std::ifstream groups(root + "/proc/self/cgroup");
  for (std::string line; std::getline(groups, line);) {
    const size_t a = line.find(':'), b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    std::string dir, file;
    if (line.compare(0, a, "0") == 0 && controllers.empty()) {
      dir = root + "/sys/fs/cgroup";
      file = "memory.max";
    } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
      dir = root + "/sys/fs/cgroup/memory";
      file = "memory.limit_in_bytes";
    } else {
      continue;
    }
    for (std::string at = path.empty() || path[0] != '/' ? "/" : path;;) {
      const std::optional<uint64_t> v = readLimit(dir + (at == "/" ? "" : at) + "/" + file);
      if (v && *v < limit.bytes) {
        limit.bytes = *v;
        limit.what = libcomm::detail::strCat("the limit of cgroup ", at, " (its ", file, ")");
      }
      if (at == "/") break;
      const size_t slash = at.find_last_of('/');
      at = slash == 0 ? "/" : at.substr(0, slash);
    }
  }
  return limit;
}

std::optional<AddressSpace> addressSpaceLimit() {
  struct rlimit as;
  if (::getrlimit(RLIMIT_AS, &as) != 0 || as.rlim_cur == RLIM_INFINITY) return std::nullopt;
  AddressSpace out;
  out.limit = uint64_t(as.rlim_cur);
  std::ifstream statm("/proc/self/statm");  // its first field: the pages mapped (VmSize)
  uint64_t pages = 0;
  const long pageSize = ::sysconf(_SC_PAGESIZE);
  if (statm >> pages && pageSize > 0) out.mapped = pages * uint64_t(pageSize);
  return out;
}

libcomm::Status checkMicroBatchTokens(const TinyLmConfig& cfg, uint64_t tokens, const std::string& flags, int ranksHere,
                                      const MemoryLimit& memory, bool checkpointing) {
  using libcomm::StatusCode;
  const uint64_t most = maxTokensPerMicroBatch(cfg);
  if (tokens > most)
    return libcomm::makeError(StatusCode::kInvalidArgument, flags, " = ", tokens,
                              " tokens per rank and micro-batch, more than the ", most,
                              " this model allows: every activation, up to tokens x ", widestActivation(cfg),
                              " (max of dim, hidden, vocab) elements, must stay under 2^31");
  const uint64_t perRank = layerMemoryBytes(cfg, tokens, checkpointing);
  const long double need = static_cast<long double>(perRank) * std::max(ranksHere, 1);
  if (need > static_cast<long double>(memory.bytes))
    return libcomm::makeError(StatusCode::kInvalidArgument, flags, " = ", tokens,
                              " tokens per rank and micro-batch, whose activations and scratch (",
                              perRank >> 20, " MiB per rank", checkpointing ? " with every block but one checkpointed" : "",
                              ranksHere > 1 ? libcomm::detail::strCat(" x ", ranksHere, " ranks here") : "",
                              ") exceed ", memory.what, ": ", memory.bytes >> 20, " MiB");
  return libcomm::Status::ok();
}

std::string TinyLmConfig::describe() const {
  std::ostringstream os;
  os << "vocab=" << vocab << " dim=" << dim << " hidden=" << hidden << " layers=" << layers << " seqLen=" << seqLen;
  return os.str();
}

LayerActivationBytes embedActivationBytes(const TinyLmConfig&, size_t tokens) {
  const uint64_t b = 4 * uint64_t(tokens);
  return {b, b};
}

LayerActivationBytes blockActivationBytes(const TinyLmConfig& cfg, size_t tokens) {
  const uint64_t t = tokens;
  return {4 * t * (uint64_t(cfg.dim) + uint64_t(cfg.hidden)), 4 * t * uint64_t(cfg.dim)};
}

LayerActivationBytes finalNormActivationBytes(const TinyLmConfig& cfg, size_t tokens) {
  const uint64_t b = 4 * uint64_t(tokens) * uint64_t(cfg.dim);
  return {b, b};
}

LayerActivationBytes headActivationBytes(const TinyLmConfig& cfg, size_t tokens) {
  const uint64_t t = tokens;
  return {4 * t * (uint64_t(cfg.dim) + uint64_t(cfg.vocab) + 1), 4 * t * (uint64_t(cfg.dim) + 1)};
}

std::vector<libshard::ParamSpec> allParams(const TinyLmConfig& cfg) {
  std::vector<libshard::ParamSpec> out;
  for (const auto& layer : buildModelSpec(cfg, 1).layers)
    for (const auto& p : layer.params) out.push_back(p);
  return out;
}

libshard::ModelSpec buildModelSpec(const TinyLmConfig& cfg, size_t microBatchTokens, bool embeddingRows,
                                   size_t gatherRowsPerStep) {
  const libcomm::Status st = cfg.validate();
  TINYLM_CHECK(st.isOk(), "%s", st.toString().c_str());
  using libshard::ParamKind;
  const int64_t v = cfg.vocab, d = cfg.dim, h = cfg.hidden;
  libshard::ModelSpec spec;
  auto addLayer = [&](std::string name, std::vector<libshard::ParamSpec> params, LayerActivationBytes act) {
    libshard::LayerSpec l;
    l.name = std::move(name);
    l.params = std::move(params);
    l.activationBytes = act.kept;
    l.checkpointActivationBytes = act.checkpointed;
    spec.layers.push_back(std::move(l));
  };
  addLayer("embed", {param("embed.weight", {v, d}, ParamKind::kEmbedding)},
           embedActivationBytes(cfg, microBatchTokens));
  // The embedding's backward scatters the output gradient into the table's rows: it reads no
  // weights, so libshard need not gather the table again for it (only the forward reads it).
  spec.layers.back().backwardReadsWeights = false;
  // ... and it writes only the rows of the micro-batch's tokens (the trainer names them).
  if (embeddingRows) spec.layers.back().gradRowsPerMicroBatch = microBatchTokens;
  // Its forwards read only those rows too: the trainer names a step's tokens one step ahead.
  spec.layers.back().gatherRowsPerStep = gatherRowsPerStep;
  for (int i = 0; i < cfg.layers; ++i) {
    const std::string b = "blocks." + std::to_string(i);
    addLayer(b,
             {param(b + ".norm", {d}, ParamKind::kNorm), param(b + ".w1", {h, d}, ParamKind::kBlock),
              param(b + ".w2", {d, h}, ParamKind::kBlock)},
             blockActivationBytes(cfg, microBatchTokens));
  }
  addLayer("final_norm", {param("final_norm.weight", {d}, ParamKind::kNorm)},
           finalNormActivationBytes(cfg, microBatchTokens));
  addLayer("head", {param("head.weight", {v, d}, ParamKind::kHead)}, headActivationBytes(cfg, microBatchTokens));
  return spec;
}

}  // namespace tinylm
