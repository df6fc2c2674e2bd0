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

// The buffer is read without a lock, as NCCL's: past a shorter text every byte is a NUL (a reader
// meeting a copy halfway must find one), and the last byte always is.
TEST(Errors, TheBufferPastTheTextIsAllNuls) {
  (void)failWith("ncclLong", Status(StatusCode::kInternalError, std::string(5000, 'y')));
  (void)failWith("ncclShort", Status(StatusCode::kInternalError, "z"));
  const char* text = ownLastError();
  ASSERT_NE(text, nullptr);
  for (size_t i = std::strlen(text); i < kOwnErrorBytes; ++i) ASSERT_EQ(text[i], '\0') << "byte " << i;
}

// The C boundary's exception handlers format without allocating (one that allocated under memory
// exhaustion threw again, out of a noexcept function); the text names the code and the exception.
TEST(Errors, TheBoundarysTextNamesTheCodeAndTheException) {
  EXPECT_EQ(failWithText("ncclAllGather", StatusCode::kSystemError, "out of memory"), ncclSystemError);
  EXPECT_STREQ(ownLastError(), "libcomm_nccl: ncclAllGather: system error: out of memory");
  EXPECT_EQ(failWithText("ncclReduceScatter", StatusCode::kInternalError, "exception", "map::at"), ncclInternalError);
  EXPECT_STREQ(ownLastError(), "libcomm_nccl: ncclReduceScatter: internal error: exception: map::at");
  EXPECT_EQ(failWithText("ncclSend", StatusCode::kTimeout, "late"), ncclRemoteError);
  EXPECT_EQ(failWithText("ncclSend", StatusCode::kInProgress, "odd"), ncclInternalError);
}

// One buffer for the process, as NCCL's: another thread (a watchdog) sees a worker thread's error,
// and the text stays readable after that thread ended (a thread-local buffer dangled then: its
// memory went to the next thread started).
TEST(Errors, TheLastErrorIsTheProcesssAndOutlivesItsThread) {
  ncclErrorIsNewest();
  const char* seen = nullptr;
  std::thread([&] {
    (void)failWith("ncclWorker", Status(StatusCode::kRemoteError, "peer 2 gone"));
    seen = ownLastError();
  }).join();
  std::thread([] {
    volatile char scratch[4096];  // a new thread's stack and TLS where the old one's were
    for (auto& c : scratch) c = 0;
  }).join();
  ASSERT_NE(seen, nullptr);
  EXPECT_EQ(ownLastError(), seen);
  EXPECT_NE(std::string(seen).find("libcomm_nccl: ncclWorker: "), std::string::npos) << seen;
  EXPECT_NE(std::string(seen).find("peer 2 gone"), std::string::npos) << seen;
  ncclErrorIsNewest();  // NCCL's error is newer, for every thread
  const char* other = "unset";
  std::thread([&] { other = ownLastError(); }).join();
  EXPECT_EQ(other, nullptr);
  EXPECT_EQ(ownLastError(), nullptr);
}

// ncclCommGetAsyncError's libcomm error becomes the last error (a watchdog's ncclGetLastError shows
// libcomm's text), also again after NCCL's was newer (logged once while it stays the same).
TEST(Errors, APolledAsyncErrorIsTheLastErrorAgainAfterNccls) {
  ncclErrorIsNewest();
  const Status gone(StatusCode::kRemoteError, "rank 0: peer rank 3 died during all_gather seq 9");
  noteAsyncError("ncclCommGetAsyncError", gone);
  ASSERT_NE(ownLastError(), nullptr);
  EXPECT_NE(std::string(ownLastError()).find("peer rank 3 died"), std::string::npos) << ownLastError();
  ncclErrorIsNewest();
  noteAsyncError("ncclCommGetAsyncError", gone);
  ASSERT_NE(ownLastError(), nullptr);
  EXPECT_NE(std::string(ownLastError()).find("seq 9"), std::string::npos) << ownLastError();
}

TEST(Errors, AFailureIsNeverInProgressNorSuccess) {
  // libcomm's kInProgress (a stream or event not finished) is no answer a failed call may give: a
  // non-blocking NCCL caller would take ncclInProgress for "still running, no error".
  EXPECT_EQ(failWith("ncclAllGather", Status(StatusCode::kInProgress, "stream not finished")), ncclInternalError);
  EXPECT_NE(std::string(ownLastError()).find("stream not finished"), std::string::npos);
  EXPECT_EQ(failureResult(Status::ok()), ncclInternalError);
  EXPECT_EQ(failureResult(Status(StatusCode::kTimeout, "t")), ncclRemoteError);
  EXPECT_EQ(failureResult(Status(StatusCode::kCudaError, "c")), ncclUnhandledCudaError);
  EXPECT_EQ(failureResult(Status(StatusCode::kInvalidUsage, "u")), ncclInvalidUsage);
  // As a state (ncclCommGetAsyncError's answer), in progress stays in progress.
  EXPECT_EQ(toNcclResult(Status(StatusCode::kInProgress, "i")), ncclInProgress);
  EXPECT_EQ(toNcclResult(Status::ok()), ncclSuccess);
}

TEST(Errors, EndingACommunicatorFailsOnlyWhileItStillExists) {
  const Status failed(StatusCode::kRemoteError, "libcomm's finalize failed");
  // ncclCommDestroy/Abort: the real call freed the communicator, so the call succeeds (a caller that
  // fell back to ncclCommAbort on an error would pass a freed pointer); libcomm's failure is noted.
  EXPECT_EQ(endResult(ncclSuccess, failed, /*freesComm=*/true), EndResult::kRealNoteOwnError);
  // ncclCommFinalize/Revoke: the communicator is still there, so libcomm's failure is the call's.
  EXPECT_EQ(endResult(ncclSuccess, failed, /*freesComm=*/false), EndResult::kOwnError);
  // The real call's failure, or libcomm's success: the real result.
  EXPECT_EQ(endResult(ncclRemoteError, failed, true), EndResult::kReal);
  EXPECT_EQ(endResult(ncclRemoteError, failed, false), EndResult::kReal);
  EXPECT_EQ(endResult(ncclSuccess, Status::ok(), true), EndResult::kReal);
  EXPECT_EQ(endResult(ncclInProgress, Status::ok(), false), EndResult::kReal);
}

TEST(Errors, ANotedErrorIsTheLastErrorWithoutACode) {
  ncclErrorIsNewest();
  noteError("ncclCommDestroy", Status(StatusCode::kRemoteError, "peer 3 gone"));
  ASSERT_NE(ownLastError(), nullptr);
  EXPECT_NE(std::string(ownLastError()).find("libcomm_nccl: ncclCommDestroy: "), std::string::npos);
  EXPECT_NE(std::string(ownLastError()).find("peer 3 gone"), std::string::npos);
}

}  // namespace
}  // namespace shim
