#pragma once

#include <cstdint>
// Algorithm selection: an explicit table {collective x input memory x layout -> algorithm}, first
// matching row wins. Printable (Communicator::describeSelection, tools/comm_info); LIBCOMM_ALGO
// overrides it; LIBCOMM_COLL_TRACE=1 logs every choice.
//
// Every rank computes the choice from the descriptors all ranks posted, so all ranks agree.

#include <string>
#include <vector>

#include "core/collective.h"
#include "libcomm/config.h"

namespace libcomm {

enum class Algo { kEager, kDirect, kStaged, kRing, kHier, kCudaIpc, kNccl };
const char* algoName(Algo a);

/// LIBCOMM_ALGO as it bears on host memory, as a small code that ranks compare in their
/// descriptors (ranks that chose different algorithms would wait for each other until the
/// deadline): 0 unset (or nccl, which chooses for device memory only), else 1 + the Algo named.
uint8_t algoSettingCode(const CommConfig& config);
/// The setting a code stands for ("unset" for 0).
const char* algoSettingName(uint8_t code);

struct SelectionQuery {
  CollKind kind;
  bool inputsRegistered;  // every rank that has an input has it in registered memory
  bool inPlace;           // some rank is in place
  size_t bytes;           // bytes of the input of a rank that has one (same on every rank)
  int unregisteredRank = -1;  // a rank whose input is not registered, for messages (-1: none known)
  bool allInPlace = false;    // every rank is in place
};

/// Whether a collective travels eagerly (its input copied into the eager area, or into the
/// descriptor itself when it is at most OpDescriptor::kInlineBytes, and posted with the arrival
/// handshake). Decided before arrival from what every rank knows alike: the size.
/// LIBCOMM_ALGO=eager on a too-large input is kInvalidUsage. Errors name the setting and the sizes;
/// the caller adds the rank and the collective (execute.cc).
Result<bool> chooseEager(const SelectionQuery& q, const CommConfig& config);

/// Across hosts, the most ranks for which every rank has a UCX endpoint to every other, and small
/// collectives take the flat eager algorithm (one message from each rank to each rank that needs
/// its input; cross_host.cc). Beyond it, without rails, they take its relayed form (relayEager:
/// every input reaches every rank in ceil(log2 n) rounds, with endpoints to the ranks 2^k places
/// along the flat ring), while n x the input fits kRailEagerPayloadScale x eagerBytes.
constexpr int kMaxEagerRanksAcrossHosts = 16;
/// Where every host has L >= 2 ranks, equally many (the rails layout), the eager algorithm takes
/// its two-level form instead: inputs through shared memory inside each host, one message per rail
/// peer across hosts (cross_host.cc, railsEager). It needs endpoints to every rank of the own rail,
/// made up to this many hosts, whatever the ranks per host; past it the rail step is relayed
/// (relayRounds over the rail, ceil(log2 H) rounds), while H x a host's entry fits
/// kRailEagerPayloadScale x eagerBytes (eagerLoad).
constexpr int kMaxEagerHostsAcrossHosts = 16;
/// The two-level and relayed eager forms' messages hold at most this many times LIBCOMM_EAGER_BYTES
/// of payload: an fp64 host sum of a bf16 input is 4x the input; a two-level all_gather's message
/// carries the host's L inputs, so it goes eager only where L x its input fits; a relayed message
/// up to n inputs, so that form runs only where n x the input fits.
constexpr size_t kRailEagerPayloadScale = 4;

/// What the eager algorithm's largest message (or, relayed, a rank's whole set of entries) carries
/// for the collective `q` describes, at most: the selector takes eager only while it fits
/// kRailEagerPayloadScale x eagerBytes (cross_host.cc sizes its buffers by the same bound).
/// (`partials`: CommConfig::reducePartials, which sizes a host's sums.)
struct CrossHostQuery;
size_t eagerLoad(const CrossHostQuery& q, PartialsType partials);

/// Whether LIBCOMM_ALGO=`algo` (a host algorithm's name; anything else passes) can run on a
/// communicator of `ranks` ranks over `hosts` hosts with fewestPerHost..mostPerHost ranks on each:
/// direct and staged need one host; ring and hier several; hier also at least 2 ranks on every
/// host, equally many; eager runs on one host, and across hosts on any number of ranks without
/// rails, and on a rails layout (hier's) on any number of hosts. kInvalidUsage naming the setting and the
/// hosts otherwise. Communicator creation checks every rank's setting with it, so a setting that cannot run fails
/// there, on every rank, rather than at the first collective it concerns.
Status checkAlgoPlacement(const std::string& algo, int hosts, int fewestPerHost, int mostPerHost, int ranks);

/// The table's choice, or the LIBCOMM_ALGO override where it is possible. An override that cannot
/// run (direct on unregistered memory: the message names q.unregisteredRank) is kInvalidUsage; the
/// caller adds the rank and the collective.
Result<Algo> selectAlgo(const SelectionQuery& q, const CommConfig& config, const char** why);

/// Across hosts (ranks that do not all share memory).
struct CrossHostQuery {
  CollKind kind;
  size_t bytes;           // input bytes per rank
  int hosts;
  int minRanksPerHost, maxRanksPerHost;
  /// all_reduce: its count is positive and it does not add into the output, so that it splits
  /// into a reduce_scatter and an all_gather of blocks in the output (the last ones cut short where
  /// the ranks do not divide the count): the two-level form then applies.
  bool splits = false;
  /// Ranks in the communicator (0: unknown, and the eager algorithm is not considered).
  int ranks = 0;
};

/// The cross-host choice: kEager (an input of at most CommConfig::eagerBytes, or a barrier, on at
/// most kMaxEagerRanksAcrossHosts ranks: every rank sends its fingerprint and what a peer needs of
/// its input straight to that peer, one network latency in all; on more ranks without rails its
/// relayed form, ceil(log2 n) latencies, while n x the input fits kRailEagerPayloadScale x
/// eagerBytes; on a rails layout its two-level form, whose all_gather also needs L x the input
/// within kRailEagerPayloadScale x eagerBytes, and past kMaxEagerHostsAcrossHosts hosts H x a
/// host's entry (eagerLoad)), kRing (every rank on one ring
/// over UCX) or kHier (the ranks of a host share memory, ranks with equal local index form one ring per index across
/// hosts). Every rank computes it from what all know alike (the host groups, the size, the settings), and the
/// fingerprint carries it, so a rank with another LIBCOMM_ALGO is named, not waited for. LIBCOMM_ALGO=eager on a larger
/// input is kInvalidUsage; LIBCOMM_ALGO=hier gives all_gather, reduce_scatter and an all_reduce that splits the
/// two-level form; other all_reduces, broadcast and barrier have only the ring form and take it.
Result<Algo> selectAcrossHosts(const CrossHostQuery& q, const CommConfig& config, const char** why);

/// One row of the table, as text (for comm_info --json); the eager row comes first.
struct SelectionRow {
  std::string collective;  // "*" or one collective name
  std::string inputs;      // "registered", "unregistered", "any", "<= eager size"
  std::string inPlace;     // "yes", "no", "any"
  std::string algorithm;
  std::string why;
};
std::vector<SelectionRow> selectionRows();

/// One row of the table across hosts, as text (comm_info --json); first matching row wins.
struct CrossHostRow {
  std::string collectives;
  std::string placement;  // which host layouts the row covers
  std::string algorithm;
  std::string why;
};
std::vector<CrossHostRow> crossHostSelectionRows();

/// Device memory (collectives on CUDA streams): libcomm's own path (CUDA IPC: copy engines for
/// all_gather, the reduce kernel for reduce_scatter, events for barrier) or NCCL.
struct DeviceQuery {
  CollKind kind;
  bool singleHost;        // every rank shares this host
  bool inputsRegistered;  // every rank that has an input has it in registered device memory
  bool ncclBuilt;
  int size;
};

/// kCudaIpc or kNccl from the device table; LIBCOMM_ALGO=nccl forces NCCL wherever NCCL has the
/// collective (the host algorithms' names do not apply to device memory and are ignored here).
/// kInvalidUsage when the choice needs NCCL and this build has none, or for a barrier on a CUDA
/// stream across hosts.
Result<Algo> selectDevicePath(const DeviceQuery& q, const CommConfig& config, const char** why);

/// One row of the device table, as text (comm_info --json); first matching row wins.
struct DeviceRow {
  std::string collectives;
  std::string placement;  // "one host", "across hosts", "any"
  std::string inputs;     // "registered", "unregistered", "any"
  std::string algorithm;  // "cuda_ipc", "nccl", "refused"
  std::string why;
};
std::vector<DeviceRow> deviceSelectionRows();

/// The most ranks the own path serves (the reduce kernel's inputs); more go to NCCL.
constexpr int kMaxOwnPathRanks = 64;

/// The table as text.
std::string describeSelectionTable(const CommConfig& config);

}  // namespace libcomm
