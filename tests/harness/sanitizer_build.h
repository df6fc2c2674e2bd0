#pragma once
// Which sanitizer this test program was built with, for tests that must take another way under one.

namespace shardcomm::testing {

// ThreadSanitizer ends a forked child of a threaded process as soon as the child starts a thread
// (its die_after_fork default): tests whose children start threads skip that part under it.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

// AddressSanitizer maps its own allocator's regions among the program's mappings, so where the
// kernel places a new mapping (and what a freed range is refilled with) is not the plain build's.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif
#else
constexpr bool kAddressSanitizer = false;
#endif

}  // namespace shardcomm::testing
