#pragma once
// Command-line flags of the tinylm trainer and of bench/shard_bench (which runs the same trainer):
// "--flag value", "--flag=value" (long flags only), switches, short aliases, and the forwarding of
// every flag given to the rank processes that -np starts. Errors are kInvalidArgument naming the
// flag and value ("--dim '0': out of range [1, 2147483647]").

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "libcomm/status.h"

namespace tinylm::flags {

libcomm::Status usageError(const std::string& flag, const std::string& value, const std::string& why);

/// A whole-string integer in [lo, hi]; K/M/G/T (binary) suffixes when `sizes`.
libcomm::Status parseInt(const std::string& flag, const std::string& s, long long lo, long long hi, long long& out,
                         bool sizes = false);
/// The same into an int.
libcomm::Status parseInt(const std::string& flag, const std::string& s, int lo, int hi, int& out);

using Handler = std::function<libcomm::Status(const std::string& flag, const std::string& value)>;

/// A flag that takes one of two words: sets `out` to whether it was `whenTrue` (--embedding-grad
/// and --embedding-gather: rows|dense; --leading: free|depth).
Handler choiceFlag(bool& out, const char* whenTrue, const char* whenFalse);

struct Table {
  std::map<std::string, Handler> valued;       // flags that take a value
  std::map<std::string, bool*> switches;       // flags that take none: set to true when given
  std::map<std::string, std::string> aliases;  // another spelling -> the flag it stands for
};

/// Applies `args` to `table` in order. Every flag given but -np (which says how many ranks to
/// start) is appended to *forward, valued ones as "flag value" under their full name. -h or --help
/// sets *help and stops there.
libcomm::Status parse(const std::vector<std::string>& args, const Table& table, std::vector<std::string>* forward,
                      bool* help);

}  // namespace tinylm::flags
