// ShardPlan::describe: the human-readable report of a plan (what `tinylm` and the tools print).

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "libshard/plan.h"

namespace libshard {
namespace planner_detail {

// 1234567 -> "1,234,567": byte and element counts in plans run to billions.
std::string groupDigits(uint64_t v) {
  std::string digits = std::to_string(v);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace planner_detail

namespace {

using planner_detail::groupDigits;

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.2f MiB", static_cast<double>(bytes) / (1024.0 * 1024.0));
  return buf;
}

std::string padRight(const std::string& s, size_t width) {
  return s + std::string(width > s.size() ? width - s.size() : 0, ' ');
}
std::string padLeft(const std::string& s, size_t width) {
  return std::string(width > s.size() ? width - s.size() : 0, ' ') + s;
}

// A plain text table: left-aligned text columns, right-aligned number columns.
class Table {
 public:
  Table(std::vector<std::string> header, std::vector<bool> rightAligned)
      : right_(std::move(rightAligned)), rows_{std::move(header)} {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  void print(std::ostringstream& os, const std::string& indent) const {
    std::vector<size_t> width(right_.size(), 0);
    for (const auto& r : rows_)
      for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    for (const auto& r : rows_) {
      std::string line = indent;
      for (size_t c = 0; c < r.size(); ++c) {
        if (c > 0) line += "  ";
        line += right_[c] ? padLeft(r[c], width[c]) : padRight(r[c], width[c]);
      }
      while (!line.empty() && line.back() == ' ') line.pop_back();
      os << line << "\n";
    }
  }

 private:
  std::vector<bool> right_;
  std::vector<std::vector<std::string>> rows_;
};

std::string bufferName(const ShardPlan& plan, int index) {
  if (index < 0 || static_cast<size_t>(index) >= plan.gatherBuffers.size()) return "-";
  return plan.gatherBuffers[index].name;
}

// A layer's gradient buffer: its dedicated one, "rotating" for the shared ones, "-" for none.
std::string gradBufferName(const ShardPlan& plan, const FlatGroup& g) {
  if (g.paddedNumel == 0) return "-";
  if (g.gradBuffer < 0) return "rotating";
  if (static_cast<size_t>(g.gradBuffer) >= plan.gradBuffers.size()) return "?";
  return plan.gradBuffers[g.gradBuffer].name;
}

std::string layerName(const ShardPlan& plan, int layer) {
  if (layer < 0) return "resident";
  if (static_cast<size_t>(layer) >= plan.layers.size()) return "?";
  return plan.layers[layer].name;
}

}  // namespace

std::string ShardPlan::describe() const {
  const PlanOptions& o = options;
  const size_t elemBytes = libcomm::dataTypeSize(computeType(o.precision));
  std::ostringstream os;
  os << "shard plan: world " << o.worldSize << ", rank " << o.rank << ", precision " << precisionName(o.precision)
     << ", alignment " << o.alignmentBytes << " B (" << o.alignmentBytes / elemBytes << " elements), block buffers "
     << o.blockBuffers << ", prefetch depth " << o.prefetchDepth << ", gradient buffers " << o.gradBuffers
     << ", micro-batches " << o.microBatches << ", budget "
     << (o.memoryBudgetBytes == 0 ? std::string("none") : groupDigits(o.memoryBudgetBytes) + " B");
  // The margin for dedicated embedding/head buffers (PlanOptions::dedicatedSlack), where it applied.
  if (o.memoryBudgetBytes == 0 && o.dedicatedSlack > 0) {
    char pct[32];
    std::snprintf(pct, sizeof pct, "%.1f%%", 100.0 * o.dedicatedSlack);
    os << ", dedicated-buffer margin " << pct;
  }
  os << "\n";

  os << "layers (" << layers.size() << "; elements, " << precisionName(o.precision)
     << " when gathered; shard = padded / world; activation bytes per micro-batch, in full / when "
        "checkpointed):\n";
  Table t({"#", "layer", "params", "numel", "padded", "shard", "stateOffset", "buffer", "grad buffer", "act. full",
           "act. ckpt", "checkpointed"},
          {true, false, true, true, true, true, true, false, false, true, true, false});
  for (size_t k = 0; k < layers.size(); ++k) {
    const FlatGroup& g = layers[k];
    const bool ckpt = k < checkpointed.size() && checkpointed[k];
    t.add({std::to_string(k), g.name, std::to_string(g.params.size()), groupDigits(g.numel), groupDigits(g.paddedNumel),
           groupDigits(g.shardNumel), groupDigits(g.stateOffset), bufferName(*this, g.gatherBuffer),
           gradBufferName(*this, g), groupDigits(g.activationBytes), groupDigits(g.checkpointActivationBytes),
           ckpt ? "yes" : "no"});
  }
  t.print(os, "  ");
  for (const FlatGroup& g : layers)
    if (g.sparseRows > 0)
      os << "  " << g.name << ": row-sparse gradient, at most " << groupDigits(g.sparseRows) << " of "
         << groupDigits(g.tableRows) << " rows (" << groupDigits(g.rowNumel)
         << " elements each) per rank and micro-batch; its slot holds " << groupDigits(g.rowExchangeNumel)
         << " of the shard's " << groupDigits(g.shardNumel) << " elements per rank\n";
  for (const FlatGroup& g : layers)
    if (g.gatherRows > 0)
      os << "  " << g.name << ": gathered by rows where the trainer names them, at most " << groupDigits(g.gatherRows)
         << " of " << groupDigits(g.tableRows) << " rows per rank and step; its slot holds "
         << groupDigits(g.gatherExchangeNumel) << " of the shard's " << groupDigits(g.shardNumel)
         << " elements per rank\n";

  os << "resident group (norm parameters, gathered once per step, reduced once per step): " << resident.params.size()
     << " params, numel " << groupDigits(resident.numel) << ", padded " << groupDigits(resident.paddedNumel)
     << ", shard " << groupDigits(resident.shardNumel) << ", stateOffset " << groupDigits(resident.stateOffset)
     << ", buffer " << bufferName(*this, resident.gatherBuffer) << "\n";
  if (!resident.params.empty()) {
    Table r({"param", "offset", "numel"}, {false, true, true});
    for (const ParamPlacement& p : resident.params) r.add({p.name, groupDigits(p.offset), groupDigits(p.numel)});
    r.print(os, "    ");
  }
  os << "state per rank: " << groupDigits(stateNumel) << " elements in each flat state array\n";

  os << "gather buffers (" << gatherBuffers.size() << ", " << precisionName(o.precision) << "):\n";
  Table b({"buffer", "numel", "bytes", "users"}, {false, true, true, false});
  for (const GatherBuffer& g : gatherBuffers) {
    std::string users;
    for (int l : g.layers) users += (users.empty() ? "" : ", ") + layerName(*this, l);
    b.add({g.name, groupDigits(g.numel), groupDigits(g.bytes), users});
  }
  b.print(os, "  ");
  os << "gradient buffers (" << gradBuffers.size() << ", " << precisionName(o.precision) << "; largest layer gradient "
     << groupDigits(gradBufferNumel) << " elements):\n";
  Table gb({"buffer", "numel", "bytes", "users"}, {false, true, true, false});
  for (const GradBuffer& g : gradBuffers) {
    std::string users;
    for (int l : g.layers) users += (users.empty() ? "" : ", ") + layerName(*this, l);
    gb.add({g.name, groupDigits(g.numel), groupDigits(g.bytes), (g.rotating ? "in turn: " : "") + users});
  }
  gb.print(os, "  ");

  os << "memory per rank:\n";
  Table m({"term", "bytes", "MiB", "owner", "formula"}, {false, true, true, false, false});
  for (const MemoryTerm& term : memory)
    m.add({term.name, groupDigits(term.bytes), mib(term.bytes), term.libshardOwned ? "libshard" : "trainer",
           term.formula});
  m.add({"libshard total", groupDigits(libshardBytes), mib(libshardBytes), "libshard", "sum of libshard's terms"});
  m.add({"total", groupDigits(totalBytes), mib(totalBytes), "", "sum of all terms"});
  m.print(os, "  ");

  const int ckpt = numCheckpointed();
  // Only layers with block weights may be checkpointed (the planner's candidates).
  const auto candidates = std::count_if(layers.begin(), layers.end(), [](const FlatGroup& g) {
    return std::any_of(g.params.begin(), g.params.end(),
                       [](const ParamPlacement& p) { return p.kind == ParamKind::kBlock; });
  });
  if (o.memoryBudgetBytes == 0) {
    os << "budget: none given; no layer checkpointed\n";
  } else if (totalBytes <= o.memoryBudgetBytes) {
    os << "budget: " << groupDigits(o.memoryBudgetBytes) << " B: fits with " << ckpt << " of " << candidates
       << " block layers checkpointed, " << groupDigits(o.memoryBudgetBytes - totalBytes) << " B to spare\n";
  } else {
    os << "budget: " << groupDigits(o.memoryBudgetBytes) << " B: does NOT fit, over by "
       << groupDigits(totalBytes - o.memoryBudgetBytes) << " B\n";
  }
  return os.str();
}

}  // namespace libshard
