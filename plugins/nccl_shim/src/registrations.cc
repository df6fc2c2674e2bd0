#include "registrations.h"

#include <iterator>

namespace shim {

uint64_t Registrations::add(void* handle, void* ptr, size_t bytes) {
  if (handle == nullptr) return 0;
  const uint64_t id = nextId_++;
  ranges_[id] = Range{id, handle, ptr, bytes};
  return id;
}

std::optional<Registrations::Range> Registrations::remove(void* handle) {
  for (auto it = ranges_.rbegin(); it != ranges_.rend(); ++it) {
    if (it->second.handle != handle) continue;
    Range r = it->second;
    ranges_.erase(std::next(it).base());
    return r;
  }
  return std::nullopt;
}

std::vector<Registrations::Range> Registrations::pending() const {
  std::vector<Range> out;
  for (const auto& [id, r] : ranges_)
    if (r.held == Held::kPending) out.push_back(r);
  return out;
}

void Registrations::setHeld(uint64_t id, Held held) {
  auto it = ranges_.find(id);
  if (it != ranges_.end()) it->second.held = held;
}

void Registrations::forgetLibcomm() {
  for (auto& [id, r] : ranges_)
    if (r.held == Held::kByLibcomm) r.held = Held::kPending;
}

bool Registrations::contains(uintptr_t begin, uintptr_t end) const {
  for (const auto& [id, r] : ranges_) {
    const auto b = reinterpret_cast<uintptr_t>(r.ptr);
    if (begin >= b && end <= b + r.bytes) return true;
  }
  return false;
}

}  // namespace shim
