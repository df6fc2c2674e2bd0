#include "registrations.h"

namespace shim {

void Registrations::add(void* handle, void* ptr, size_t bytes) { ranges_[handle] = Range{handle, ptr, bytes}; }

std::optional<Registrations::Range> Registrations::remove(void* handle) {
  auto it = ranges_.find(handle);
  if (it == ranges_.end()) return std::nullopt;
  Range r = it->second;
  ranges_.erase(it);
  return r;
}

std::vector<Registrations::Range> Registrations::pending() const {
  std::vector<Range> out;
  for (const auto& [handle, r] : ranges_)
    if (r.held == Held::kPending) out.push_back(r);
  return out;
}

void Registrations::setHeld(void* handle, Held held) {
  auto it = ranges_.find(handle);
  if (it != ranges_.end()) it->second.held = held;
}

void Registrations::forgetLibcomm() {
  for (auto& [handle, r] : ranges_)
    if (r.held == Held::kByLibcomm) r.held = Held::kPending;
}

bool Registrations::contains(uintptr_t begin, uintptr_t end) const {
  for (const auto& [handle, r] : ranges_) {
    const auto b = reinterpret_cast<uintptr_t>(r.ptr);
    if (begin >= b && end <= b + r.bytes) return true;
  }
  return false;
}

}  // namespace shim
