// A latch for stream tests: work items (host-stream items, CUDA host functions) block on it until
// the test opens it. Their wait is bounded, so a broken test cannot hang a stream's thread.

#pragma once

#include <chrono>
#include <functional>
#include <future>

#include "libcomm/status.h"

namespace libcomm::test {

class Gate {
 public:
  Gate() : future_(promise_.get_future().share()) {}
  void open() { promise_.set_value(); }
  /// An item that returns once the gate is open, or kTimeout after 10 s.
  std::function<Status()> item() const {
    return [f = future_] {
      if (f.wait_for(std::chrono::seconds(10)) != std::future_status::ready)
        return makeError(StatusCode::kTimeout, "gate never opened");
      return Status::ok();
    };
  }

 private:
  std::promise<void> promise_;
  std::shared_future<void> future_;
};

}  // namespace libcomm::test
