#pragma once
// The state of a communicator whose ranks span hosts (cross_host.cc): every rank on one ring over
// the UCX channel. Ring order: hosts in order of their first rank, the ranks of a host in rank
// order, so that only one hop per host boundary leaves a host.

#include <array>
#include <memory>
#include <vector>

#include "algos/ring/ring.h"
#include "backends/ucx/ucx_channel.h"

namespace libcomm {

struct CrossHost {
  /// A failure notice: the error that made a rank give up on the communicator, sent to its ring
  /// neighbours just before it closes its endpoints, so that their errors carry the cause (and
  /// not only "rank p was lost"). Fixed size: a UCX receive takes exactly the bytes it was posted for.
  static constexpr size_t kNoticeBytes = 1024;
  struct NoticeSlot {
    int from = -1;
    ucx::Request request;
    std::array<char, kNoticeBytes> text{};
  };

  // Declared before the channel, so destroyed after it: UCX may write into a pending receive's
  // buffer until the channel is gone.
  std::array<NoticeSlot, 2> notices;  // from the previous and (if another rank) the next rank
  std::unique_ptr<ucx::Channel> channel;
  std::vector<int> order;  // ranks in ring order
  int pos = 0;             // this rank's place in `order`
  int prev = -1, next = -1;
  ring::Scratch scratch;     // the ring reduce_scatter's fp32 partials
  std::vector<char> padded;  // all_reduce: its zero-padded copy
  bool disconnected = false;
};

}  // namespace libcomm
