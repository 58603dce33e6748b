// The host-function error rules of CudaDevice (kernels/cuda/stream_errors.h) in plain C++: these
// run without a GPU wherever the CUDA backend is built.
#ifdef FERRY_WITH_CUDA

#include "kernels/cuda/stream_errors.h"

#include <gtest/gtest.h>

namespace ferry {
namespace {

constexpr int kCompute = int(StreamId::kCompute);
constexpr int kUpload = int(StreamId::kUpload);
constexpr int kDownload = int(StreamId::kDownload);

TEST(StreamErrorBookTest, FailurePoisonsLaterItemsAndRecordsOnly) {
  StreamErrorBook book;
  const uint64_t first = book.EnqueueHostItem(kCompute);
  const StreamErrorBook::Mark before = book.MarkRecord(kCompute);
  const uint64_t failing = book.EnqueueHostItem(kCompute);
  const uint64_t later = book.EnqueueHostItem(kCompute);
  const StreamErrorBook::Mark after = book.MarkRecord(kCompute);

  EXPECT_FALSE(book.Poisoned(kCompute, first));
  book.Finish(kCompute, first, Status::Ok());
  book.Finish(kCompute, failing, Status::Internal("boom"));
  EXPECT_FALSE(book.Poisoned(kCompute, failing));  // an item is not poisoned by itself
  EXPECT_TRUE(book.Poisoned(kCompute, later));
  EXPECT_TRUE(book.ErrorBefore(kCompute, before.seq).ok());
  EXPECT_EQ(book.ErrorBefore(kCompute, after.seq).message(), "boom");
  EXPECT_TRUE(book.ErrorBefore(kUpload, book.NextSeq(kUpload)).ok());  // other streams are clean
}

TEST(StreamErrorBookTest, KnownFailureBeforeMarkPoisonsWaiterFromTheWaitOn) {
  StreamErrorBook book;
  const uint64_t dst_before = book.EnqueueHostItem(kDownload);
  const uint64_t failing = book.EnqueueHostItem(kCompute);
  book.Finish(kCompute, failing, Status::Internal("boom"));
  const StreamErrorBook::Mark mark = book.MarkRecord(kCompute);

  EXPECT_FALSE(StreamErrorBook::Wait(book, mark, book, kDownload));  // nothing left to carry
  const uint64_t dst_after = book.EnqueueHostItem(kDownload);
  EXPECT_FALSE(book.Poisoned(kDownload, dst_before));
  EXPECT_TRUE(book.Poisoned(kDownload, dst_after));
  EXPECT_EQ(book.ErrorBefore(kDownload, book.NextSeq(kDownload)).message(), "boom");
}

TEST(StreamErrorBookTest, WaitOnCleanFinishedWorkCarriesNothing) {
  StreamErrorBook book;
  const uint64_t item = book.EnqueueHostItem(kCompute);
  book.Finish(kCompute, item, Status::Ok());
  const StreamErrorBook::Mark mark = book.MarkRecord(kCompute);
  EXPECT_FALSE(StreamErrorBook::Wait(book, mark, book, kUpload));
  EXPECT_TRUE(book.ErrorBefore(kUpload, book.NextSeq(kUpload)).ok());
}

TEST(StreamErrorBookTest, PendingItemsArePropagatedWhenTheWaitRuns) {
  StreamErrorBook src, dst;  // two devices
  const uint64_t failing = src.EnqueueHostItem(kUpload);
  const StreamErrorBook::Mark mark = src.MarkRecord(kUpload);
  const uint64_t after_mark = src.EnqueueHostItem(kUpload);
  ASSERT_TRUE(StreamErrorBook::Wait(src, mark, dst, kCompute));  // outcome not known yet
  const uint64_t carrier = dst.EnqueueHostItem(kCompute);
  const uint64_t dst_later = dst.EnqueueHostItem(kCompute);

  src.Finish(kUpload, failing, Status::IOError("disk"));
  src.Finish(kUpload, after_mark, Status::Ok());
  StreamErrorBook::Propagate(src, mark, dst, kCompute, carrier);
  EXPECT_TRUE(dst.Poisoned(kCompute, dst_later));
  EXPECT_EQ(dst.ErrorBefore(kCompute, dst.NextSeq(kCompute)).code(), StatusCode::kIOError);
}

TEST(StreamErrorBookTest, ErrorAfterTheMarkIsNotPropagated) {
  StreamErrorBook book;
  const uint64_t ok_item = book.EnqueueHostItem(kUpload);
  const StreamErrorBook::Mark mark = book.MarkRecord(kUpload);
  const uint64_t failing = book.EnqueueHostItem(kUpload);  // after the record: not covered
  ASSERT_TRUE(StreamErrorBook::Wait(book, mark, book, kCompute));
  const uint64_t carrier = book.EnqueueHostItem(kCompute);
  book.Finish(kUpload, ok_item, Status::Ok());
  book.Finish(kUpload, failing, Status::Internal("late"));
  StreamErrorBook::Propagate(book, mark, book, kCompute, carrier);
  EXPECT_TRUE(book.ErrorBefore(kCompute, book.NextSeq(kCompute)).ok());
  EXPECT_TRUE(book.ErrorBefore(kUpload, mark.seq).ok());
}

TEST(StreamErrorBookTest, TakeFirstErrorReturnsTheEarliestAndClearsAll) {
  StreamErrorBook book;
  const uint64_t a = book.EnqueueHostItem(kDownload);
  const uint64_t b = book.EnqueueHostItem(kCompute);
  book.Finish(kDownload, a, Status::Internal("first"));
  book.Finish(kCompute, b, Status::Internal("second"));
  EXPECT_EQ(book.TakeFirstError().message(), "first");
  EXPECT_TRUE(book.TakeFirstError().ok());
  const uint64_t c = book.EnqueueHostItem(kCompute);
  EXPECT_FALSE(book.Poisoned(kCompute, c));  // usable again
}

}  // namespace
}  // namespace ferry

#endif  // FERRY_WITH_CUDA
