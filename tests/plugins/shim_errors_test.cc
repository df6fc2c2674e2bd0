// The shim's own errors (errors.h): the buffer ncclGetLastError returns for them, and the codes.

#include "errors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <thread>

#include "libcomm/status.h"

namespace shim {
namespace {

using libcomm::Status;
using libcomm::StatusCode;

TEST(Errors, LastErrorBufferStaysPutAcrossErrors) {
  EXPECT_EQ(failWith("ncclFirst", Status(StatusCode::kInvalidUsage, "short")), ncclInvalidUsage);
  const char* first = ownLastError();
  ASSERT_NE(first, nullptr);
  EXPECT_NE(std::string(first).find("libcomm_nccl: ncclFirst: "), std::string::npos) << first;
  // A longer text: a string reallocated for it would have freed the buffer `first` points into.
  EXPECT_EQ(failWith("ncclSecond", Status(StatusCode::kRemoteError, std::string(300, 'x'))), ncclRemoteError);
  const char* second = ownLastError();
  ASSERT_EQ(second, first);
  EXPECT_NE(std::string(first).find("libcomm_nccl: ncclSecond: "), std::string::npos) << first;
  EXPECT_NE(std::string(first).find(std::string(300, 'x')), std::string::npos);
}

TEST(Errors, LongTextsAreCut) {
  (void)failWith("ncclLong", Status(StatusCode::kInternalError, std::string(5000, 'y')));
  const char* text = ownLastError();
  ASSERT_NE(text, nullptr);
  EXPECT_EQ(std::strlen(text), kOwnErrorBytes - 1);
  EXPECT_EQ(std::string(text).rfind("libcomm_nccl: ncclLong: ", 0), 0u) << text;
}

TEST(Errors, NcclsErrorReplacesTheShimsOnThisThreadOnly) {
  (void)failWith("ncclMine", Status(StatusCode::kInvalidArgument, "mine"));
  const char* other = "unset";
  std::thread([&] { other = ownLastError(); }).join();
  EXPECT_EQ(other, nullptr);  // another thread has no error of the shim's
  ASSERT_NE(ownLastError(), nullptr);
  ncclErrorIsNewest();
  EXPECT_EQ(ownLastError(), nullptr);
}

}  // namespace
}  // namespace shim
