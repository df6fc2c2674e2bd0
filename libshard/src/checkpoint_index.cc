// The text index of a sharded checkpoint and the parameter list of a full-model file: one record
// per line, space-separated fields, names percent-encoded, the index closed by its own CRC32C.
// Text so that a person (or a script) can read what a checkpoint holds without a tool.

#include <algorithm>
#include <charconv>
#include <climits>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>
#include <string_view>
#include <vector>

#include "checkpoint_format.h"

namespace libshard::ckpt {
namespace {

using libcomm::Result;
using libcomm::Status;

constexpr const char* kIndexTag = "shardcomm-checkpoint-index";

// Percent-encodes bytes that would break the one-line, space-separated form.
std::string escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c <= 0x20 || c >= 0x7f || c == '%') {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

bool unescape(const std::string& s, std::string& out) {
  out.clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out += s[i];
      continue;
    }
    if (i + 2 >= s.size()) return false;
    unsigned v = 0;
    if (std::sscanf(s.substr(i + 1, 2).c_str(), "%2X", &v) != 1) return false;
    out += static_cast<char>(v);
    i += 2;
  }
  return !out.empty();
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += 'x';
    s += std::to_string(shape[i]);
  }
  return s;
}

// Digits only (no sign, no blanks), and no value past UINT64_MAX: an index is untrusted input, so
// parsing must neither throw nor wrap.
bool parseU64(const std::string& s, uint64_t& v) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) return false;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return ec == std::errc() && end == s.data() + s.size();
}

bool parseShape(const std::string& s, std::vector<int64_t>& shape) {
  shape.clear();
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, 'x')) {
    // A 250 MiB line of 1x1x1... became a vector of 125 M extents (1 GiB; found by a review).
    if (shape.size() == kMaxParamDims) return false;
    uint64_t v;
    if (!parseU64(part, v) || v == 0 || v > (uint64_t{1} << 56)) return false;  // ModelSpec's bound
    shape.push_back(static_cast<int64_t>(v));
  }
  return !shape.empty();
}

bool parseKind(const std::string& s, ParamKind& k) {
  for (ParamKind c : {ParamKind::kBlock, ParamKind::kNorm, ParamKind::kEmbedding, ParamKind::kHead})
    if (s == paramKindName(c)) {
      k = c;
      return true;
    }
  return false;
}

std::string paramLine(const LayoutParam& p) {
  return "param " + escape(p.name) + " " + paramKindName(p.kind) + " " + (p.weightDecay ? "1" : "0") + " " +
         std::to_string(p.offset) + " " + std::to_string(p.numel) + " " + shapeText(p.shape) + "\n";
}

// Reads the text's lines as token lists, one line at a time (a damaged or foreign file costs no
// more memory than its text), with 1-based line numbers for errors.
class Lines {
 public:
  Lines(std::string_view text, std::string path) : text_(text), path_(std::move(path)) {}
  bool done() const { return at_ >= text_.size(); }
  /// The next line, which must start with `key` and have `fields` fields after it.
  Result<std::vector<std::string>> expect(const std::string& key, size_t fields) {
    if (done()) return badFile(path_, "ends early: expected a '", key, "' line");
    const std::vector<std::string> t = nextLine(fields + 2);
    if (t.empty() || t[0] != key || t.size() != fields + 1)
      return badFile(path_, "line ", next_, ": expected '", key, "' with ", fields, " fields, got '",
                     t.empty() ? "" : t[0], "' with ", t.empty() ? 0 : t.size() - 1);
    return std::vector<std::string>(t.begin() + 1, t.end());
  }
  Status bad(const std::string& what) const { return badFile(path_, "line ", next_, ": ", what); }
  Result<uint64_t> number(const std::string& key) {
    LIBCOMM_ASSIGN_OR_RETURN(auto f, expect(key, 1));
    uint64_t v;
    if (!parseU64(f[0], v)) return bad("'" + f[0] + "' is not a number");
    return v;
  }
  Result<LayoutParam> param() {
    LIBCOMM_ASSIGN_OR_RETURN(auto f, expect("param", 6));
    LayoutParam p;
    if (!unescape(f[0], p.name)) return bad("bad parameter name '" + f[0] + "'");
    if (!parseKind(f[1], p.kind)) return bad("unknown parameter kind '" + f[1] + "'");
    if (f[2] != "0" && f[2] != "1") return bad("decay flag must be 0 or 1, got '" + f[2] + "'");
    p.weightDecay = f[2] == "1";
    if (!parseU64(f[3], p.offset) || !parseU64(f[4], p.numel) || !parseShape(f[5], p.shape))
      return bad("bad offset, numel or shape in parameter '" + p.name + "'");
    uint64_t n = 1;
    for (int64_t e : p.shape)
      if (__builtin_mul_overflow(n, static_cast<uint64_t>(e), &n))
        return bad("parameter '" + p.name + "' has shape " + f[5] + ", whose element count overflows 64 bits");
    if (n != p.numel) return bad("parameter '" + p.name + "' has numel " + f[4] + " but shape " + f[5]);
    return p;
  }

 private:
  // The next line's blank-separated tokens; stops collecting after `most` (the line is wrong then,
  // and its length is all that matters).
  std::vector<std::string> nextLine(size_t most) {
    size_t end = text_.find('\n', at_);
    if (end == std::string_view::npos) end = text_.size();
    const std::string_view line = text_.substr(at_, end - at_);
    at_ = end + 1;
    ++next_;
    constexpr std::string_view kBlanks = " \t\r\v\f";
    std::vector<std::string> tokens;
    for (size_t i = line.find_first_not_of(kBlanks); i != std::string_view::npos && tokens.size() < most;) {
      const size_t j = std::min(line.find_first_of(kBlanks, i), line.size());
      tokens.emplace_back(line.substr(i, j - i));
      i = line.find_first_not_of(kBlanks, j);
    }
    return tokens;
  }

  std::string_view text_;
  std::string path_;
  size_t at_ = 0;    // start of the next line in text_
  size_t next_ = 0;  // lines read so far
};

Status checkUniqueNames(const std::vector<LayoutParam>& params, const std::string& path) {
  std::set<std::string> seen;
  for (const LayoutParam& p : params)
    if (!seen.insert(p.name).second) return badFile(path, "parameter '", p.name, "' is listed twice");
  return Status::ok();
}

// Everything a reader relies on to compute positions: sizes that add up, nothing out of bounds.
Status checkIndex(const CheckpointIndex& x, const std::string& path) {
  if (x.world < 1 || x.world > (1 << 20)) return badFile(path, "world size ", x.world);
  for (size_t g = 0; g < x.groups.size(); ++g) {
    const LayoutGroup& gr = x.groups[g];
    // Every sum and product checked: a crafted index must not wrap around into "fits".
    uint64_t padded = 0, stateEnd = 0;
    if (gr.numel > gr.paddedNumel || __builtin_mul_overflow(gr.shardNumel, static_cast<uint64_t>(x.world), &padded) ||
        gr.paddedNumel != padded || __builtin_add_overflow(gr.stateOffset, gr.shardNumel, &stateEnd) ||
        stateEnd > x.stateNumel)
      return badFile(path, "group '", gr.name, "' sizes do not add up (numel ", gr.numel, ", padded ", gr.paddedNumel,
                     ", shard ", gr.shardNumel, ", state offset ", gr.stateOffset, ", state numel ", x.stateNumel, ")");
  }
  // The groups' shards lie side by side in the state, never on top of each other: two groups
  // sharing elements would load the one over the other without complaint (every checksum vouches
  // for the numbers; only a crafted or broken writer makes them).
  std::vector<size_t> byOffset;
  for (size_t g = 0; g < x.groups.size(); ++g)
    if (x.groups[g].shardNumel > 0) byOffset.push_back(g);
  std::sort(byOffset.begin(), byOffset.end(),
            [&](size_t a, size_t b) { return x.groups[a].stateOffset < x.groups[b].stateOffset; });
  for (size_t i = 1; i < byOffset.size(); ++i) {
    const LayoutGroup& a = x.groups[byOffset[i - 1]];
    const LayoutGroup& b = x.groups[byOffset[i]];
    if (b.stateOffset < a.stateOffset + a.shardNumel)  // no overflow: both ends checked above
      return badFile(path, "groups '", a.name, "' (state [", a.stateOffset, ", ", a.stateOffset + a.shardNumel,
                     ")) and '", b.name, "' (from ", b.stateOffset, ") overlap in the state");
  }
  std::vector<uint64_t> groupEnd(x.groups.size(), 0);
  for (const LayoutParam& p : x.params) {
    const LayoutGroup& gr = x.groups[static_cast<size_t>(p.group)];
    uint64_t end = 0;
    if (p.offset < groupEnd[static_cast<size_t>(p.group)] || __builtin_add_overflow(p.offset, p.numel, &end) ||
        end > gr.numel)
      return badFile(path, "parameter '", p.name, "' at [", p.offset, ", ", p.offset + p.numel,
                     ") overlaps another or lies outside group '", gr.name, "' of ", gr.numel, " elements");
    groupEnd[static_cast<size_t>(p.group)] = end;
  }
  LIBCOMM_RETURN_IF_ERROR(checkUniqueNames(x.params, path));
  if (x.files.size() != static_cast<size_t>(x.world))
    return badFile(path, "lists ", x.files.size(), " shard files for world size ", x.world);
  for (size_t r = 0; r < x.files.size(); ++r)
    if (x.files[r].rank != static_cast<int>(r) ||
        x.files[r].file != checkpointShardFileName(static_cast<int>(r), x.world))
      return badFile(path, "shard file entry ", r, " is '", x.files[r].file, "' for rank ", x.files[r].rank);
  return Status::ok();
}

}  // namespace

CheckpointIndex indexFromPlan(const ShardPlan& plan) {
  CheckpointIndex x;
  x.world = plan.options.worldSize;
  x.alignmentBytes = plan.options.alignmentBytes;
  x.precision = plan.options.precision;
  x.stateNumel = plan.stateNumel;
  auto add = [&](const FlatGroup& g) {
    const int gi = static_cast<int>(x.groups.size());
    x.groups.push_back({g.name, g.layer, g.numel, g.paddedNumel, g.shardNumel, g.stateOffset});
    for (const ParamPlacement& p : g.params)
      x.params.push_back({p.name, p.shape, p.kind, p.weightDecay, p.offset, p.numel, gi});
  };
  for (const FlatGroup& g : plan.layers) add(g);
  add(plan.resident);
  return x;
}

std::string formatIndex(const CheckpointIndex& x) {
  std::ostringstream os;
  os << kIndexTag << " " << x.version << "\n"
     << "world " << x.world << "\n"
     << "alignment_bytes " << x.alignmentBytes << "\n"
     << "precision " << precisionName(x.precision) << "\n"
     << "step " << x.step << "\n"
     << "state_numel " << x.stateNumel << "\n"
     << "groups " << x.groups.size() << "\n";
  // Each group's parameters, in their order among all parameters: one pass, not one per group (a
  // model of 16384 layers took seconds).
  std::vector<std::vector<const LayoutParam*>> byGroup(x.groups.size());
  for (const LayoutParam& p : x.params)
    if (p.group >= 0 && static_cast<size_t>(p.group) < byGroup.size())
      byGroup[static_cast<size_t>(p.group)].push_back(&p);
  for (size_t g = 0; g < x.groups.size(); ++g) {
    const LayoutGroup& gr = x.groups[g];
    os << "group " << escape(gr.name) << " " << gr.layer << " " << gr.numel << " " << gr.paddedNumel << " "
       << gr.shardNumel << " " << gr.stateOffset << " " << byGroup[g].size() << "\n";
    for (const LayoutParam* p : byGroup[g]) os << paramLine(*p);
  }
  // Version 1 has no notes: an index without them stays readable by the builds before notes.
  if (x.version >= 2) {
    os << "notes " << x.notes.size() << "\n";
    for (const auto& [key, value] : x.notes) os << "note " << escape(key) << " " << escape(value) << "\n";
  }
  os << "files " << x.files.size() << "\n";
  for (const ShardFileEntry& f : x.files) {
    char crc[16];
    std::snprintf(crc, sizeof(crc), "%08x", f.tableCrc);
    os << "file " << f.rank << " " << escape(f.file) << " " << f.bytes << " " << crc << "\n";
  }
  std::string text = os.str();
  char crc[32];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", crc32c(text.data(), text.size()));
  return text + crc;
}

Result<CheckpointIndex> parseIndex(const std::string& text, const std::string& path) {
  // The checksum line closes the file; checking it first turns any truncation or bit flip into
  // one clear message instead of a confusing parse error.
  size_t last = std::string::npos;
  if (text.size() >= 2 && text.back() == '\n') {
    const size_t nl = text.rfind('\n', text.size() - 2);
    last = nl == std::string::npos ? 0 : nl + 1;
  }
  unsigned stored = 0;
  if (last == std::string::npos || text.size() - last != 16 || text.compare(last, 7, "crc32c ") != 0 ||
      std::sscanf(text.c_str() + last, "crc32c %8x", &stored) != 1)
    return badFile(path, "truncated or not a checkpoint index (no closing crc32c line)");
  const uint32_t computed = crc32c(text.data(), last);
  if (computed != stored) return badFile(path, "index checksum mismatch: the index is corrupt");

  Lines in(std::string_view(text).substr(0, last), path);
  CheckpointIndex x;
  LIBCOMM_ASSIGN_OR_RETURN(auto tag, in.expect(kIndexTag, 1));
  uint64_t v;
  if (!parseU64(tag[0], v) || v < 1 || v > kCheckpointIndexVersion)
    return badFile(path, "index format version '", tag[0], "'; this build reads versions 1 to ",
                   kCheckpointIndexVersion, " (a newer shardcomm wrote it?)");
  x.version = static_cast<uint32_t>(v);
  x.crc = computed;
  LIBCOMM_ASSIGN_OR_RETURN(uint64_t world, in.number("world"));
  x.world = static_cast<int>(std::min<uint64_t>(world, 1u << 30));
  LIBCOMM_ASSIGN_OR_RETURN(x.alignmentBytes, in.number("alignment_bytes"));
  LIBCOMM_ASSIGN_OR_RETURN(auto prec, in.expect("precision", 1));
  if (prec[0] != precisionName(Precision::kBf16) && prec[0] != precisionName(Precision::kFp32))
    return in.bad("unknown precision '" + prec[0] + "'");
  x.precision = prec[0] == precisionName(Precision::kBf16) ? Precision::kBf16 : Precision::kFp32;
  LIBCOMM_ASSIGN_OR_RETURN(x.step, in.number("step"));
  LIBCOMM_ASSIGN_OR_RETURN(x.stateNumel, in.number("state_numel"));
  LIBCOMM_ASSIGN_OR_RETURN(uint64_t groups, in.number("groups"));
  for (uint64_t g = 0; g < groups; ++g) {
    LIBCOMM_ASSIGN_OR_RETURN(auto f, in.expect("group", 7));
    LayoutGroup gr;
    uint64_t n = 0;
    const bool noLayer = f[1] == "-1";
    uint64_t layer = 0;
    // A layer past INT_MAX would wrap to a negative number the index never held.
    if (!unescape(f[0], gr.name) || !(noLayer || (parseU64(f[1], layer) && layer <= INT_MAX)) ||
        !parseU64(f[2], gr.numel) || !parseU64(f[3], gr.paddedNumel) || !parseU64(f[4], gr.shardNumel) ||
        !parseU64(f[5], gr.stateOffset) || !parseU64(f[6], n))
      return in.bad("bad group record");
    gr.layer = noLayer ? -1 : static_cast<int>(layer);
    x.groups.push_back(gr);
    for (uint64_t i = 0; i < n; ++i) {
      LIBCOMM_ASSIGN_OR_RETURN(LayoutParam p, in.param());
      p.group = static_cast<int>(g);
      x.params.push_back(std::move(p));
    }
  }
  if (x.version >= 2) {
    LIBCOMM_ASSIGN_OR_RETURN(uint64_t notes, in.number("notes"));
    for (uint64_t i = 0; i < notes; ++i) {
      LIBCOMM_ASSIGN_OR_RETURN(auto f, in.expect("note", 2));
      std::string key, value;
      if (!unescape(f[0], key) || !unescape(f[1], value)) return in.bad("bad note record");
      if (!x.notes.emplace(std::move(key), std::move(value)).second) return in.bad("note '" + f[0] + "' twice");
    }
  }
  LIBCOMM_ASSIGN_OR_RETURN(uint64_t files, in.number("files"));
  for (uint64_t i = 0; i < files && i <= static_cast<uint64_t>(x.world); ++i) {
    LIBCOMM_ASSIGN_OR_RETURN(auto f, in.expect("file", 4));
    ShardFileEntry e;
    uint64_t rank = 0;
    unsigned crc = 0;
    if (!parseU64(f[0], rank) || !unescape(f[1], e.file) || !parseU64(f[2], e.bytes) || f[3].size() != 8 ||
        std::sscanf(f[3].c_str(), "%8x", &crc) != 1)
      return in.bad("bad file record");
    e.rank = static_cast<int>(std::min<uint64_t>(rank, 1u << 30));
    e.tableCrc = crc;
    x.files.push_back(std::move(e));
  }
  if (!in.done()) return in.bad("unexpected trailing records");
  LIBCOMM_RETURN_IF_ERROR(checkIndex(x, path));
  return x;
}

Result<CheckpointIndex> readIndex(const std::string& dir) {
  const std::string path = joinPath(dir, kCheckpointIndexFile);
  auto text = readWholeFile(path);
  if (!text.isOk()) return text.status().withContext("checkpoint '" + dir + "' has no readable index");
  return parseIndex(text.value(), path);
}

std::string formatParamList(const std::vector<LayoutParam>& params) {
  std::string out;
  for (const LayoutParam& p : params) out += paramLine(p);
  return out;
}

Result<std::vector<LayoutParam>> parseParamList(const std::string& text, const std::string& path) {
  Lines in(text, path);
  std::vector<LayoutParam> params;
  while (!in.done()) {
    LIBCOMM_ASSIGN_OR_RETURN(LayoutParam p, in.param());
    params.push_back(std::move(p));
  }
  LIBCOMM_RETURN_IF_ERROR(checkUniqueNames(params, path));
  return params;
}

}  // namespace libshard::ckpt
