// ModelSpec checks and sizes.

#include "libshard/model_spec.h"

#include <set>

namespace libshard {

const char* paramKindName(ParamKind k) {
  switch (k) {
    case ParamKind::kBlock: return "block";
    case ParamKind::kNorm: return "norm";
    case ParamKind::kEmbedding: return "embedding";
    case ParamKind::kHead: return "head";
  }
  return "?";
}

size_t ParamSpec::numel() const {
  size_t n = 1;
  for (int64_t e : shape) n *= static_cast<size_t>(e);
  return n;
}

size_t ModelSpec::numel() const {
  size_t n = 0;
  for (const auto& l : layers)
    for (const auto& p : l.params) n += p.numel();
  return n;
}

libcomm::Status ModelSpec::validate() const {
  using libcomm::StatusCode;
  if (layers.empty()) return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: no layers");
  std::set<std::string> layerNames, paramNames;
  uint64_t total = 0;
  // Activation bytes are summed (and differences taken) by the planner's memory prediction: all of
  // them together stay below 2^62 (4 EiB), so no sum wraps into a plan that "fits".
  constexpr uint64_t kMaxActivationBytes = uint64_t{1} << 62;
  uint64_t activations = 0;
  for (size_t k = 0; k < layers.size(); ++k) {
    const LayerSpec& l = layers[k];
    if (l.activationBytes > kMaxActivationBytes - activations)
      return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer '", l.name, "': activationBytes ",
                                l.activationBytes, " brings the model's activations past 2^62 bytes");
    activations += l.activationBytes;
    if (l.name.empty()) return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer ", k, " has no name");
    if (!layerNames.insert(l.name).second)
      return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer name '", l.name, "' used twice");
    if (l.checkpointActivationBytes > l.activationBytes)
      return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer '", l.name,
                                "': checkpointActivationBytes ", l.checkpointActivationBytes, " > activationBytes ",
                                l.activationBytes);
    if (l.gradRowsPerMicroBatch > 0 || l.gatherRowsPerStep > 0) {
      // The rows are those of one table: a second non-norm parameter would share the group's
      // flat buffer with no row structure of its own.
      size_t tables = 0;
      for (const ParamSpec& p : l.params) tables += p.kind == ParamKind::kNorm ? 0 : 1;
      if (tables != 1)
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer '", l.name,
                                  "': ", l.gradRowsPerMicroBatch > 0 ? "gradRowsPerMicroBatch " : "gatherRowsPerStep ",
                                  l.gradRowsPerMicroBatch > 0 ? l.gradRowsPerMicroBatch : l.gatherRowsPerStep,
                                  " needs exactly one non-norm parameter (the table whose rows are named), not ",
                                  tables);
    }
    for (const ParamSpec& p : l.params) {
      if (p.name.empty())
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: layer '", l.name, "' has an unnamed parameter");
      if (!paramNames.insert(p.name).second)
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter name '", p.name, "' used twice");
      if (p.shape.empty())
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter '", p.name, "' has an empty shape");
      if (p.shape.size() > kMaxParamDims)
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter '", p.name, "' has ",
                                  p.shape.size(), " extents, more than ", kMaxParamDims);
      // Element counts and byte sizes stay exact: no parameter, and no model, may reach 2^56
      // elements (an fp32 copy of that much is 256 PiB).
      constexpr uint64_t kMaxElems = uint64_t{1} << 56;
      uint64_t numel = 1;
      for (int64_t e : p.shape) {
        if (e < 1)
          return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter '", p.name, "' has extent ", e,
                                    " (every extent must be >= 1)");
        if (static_cast<uint64_t>(e) > kMaxElems / numel)
          return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter '", p.name,
                                    "' has more than 2^56 elements");
        numel *= static_cast<uint64_t>(e);
      }
      total += numel;
      if (total > kMaxElems)
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: the model has more than 2^56 elements (at '",
                                  p.name, "')");
      if (static_cast<uint8_t>(p.kind) > static_cast<uint8_t>(ParamKind::kHead))
        return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: parameter '", p.name, "' has kind ",
                                  static_cast<int>(p.kind), ", not a ParamKind");
    }
  }
  if (total == 0)
    return libcomm::makeError(StatusCode::kInvalidArgument, "model spec: no layer has a parameter (",
                              layers.size(), " layers): there is nothing to shard or train");
  return libcomm::Status::ok();
}

}  // namespace libshard
