// Status and Result<T>: run-time failures as values.
//
// A Status is cheap when ok (a null pointer) and carries a code and a message otherwise. Errors
// are created with named constructors (Status::IOError(...)); errno is turned into a Status once,
// where the system call is made (Status::FromErrno). Result<T> holds either a value or a non-ok
// Status. Both are [[nodiscard]]: a dropped error is a compile error under -Werror.
//
// Thread-safety: distinct objects may be used from distinct threads; a single object is not
// synchronized.
#pragma once

#include <cassert>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace ferry {

enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument,   // the caller asked for something malformed or impossible
  kNotFound,          // a file, tensor or key that should exist does not
  kOutOfMemory,       // an arena, pool or budget cap was hit
  kIOError,           // the operating system refused or failed an I/O
  kNoSpace,           // a disk or reserved space is full
  kCorruption,        // data read back does not match what was written
  kUnavailable,       // a facility is not offered here (io_uring refused, no GPU)
  kFailedPrecondition,// the object is not in a state that allows the call
  kCancelled,         // the work was abandoned (earlier error in the stream, shutdown)
  kInternal,          // a bug in ferry; please report it
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok
  Status(const Status& other) : state_(other.state_ ? std::make_unique<State>(*other.state_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) state_ = other.state_ ? std::make_unique<State>(*other.state_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) { return Status(StatusCode::kInvalidArgument, std::move(msg)); }
  static Status NotFound(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
  static Status OutOfMemory(std::string msg) { return Status(StatusCode::kOutOfMemory, std::move(msg)); }
  static Status IOError(std::string msg) { return Status(StatusCode::kIOError, std::move(msg)); }
  static Status NoSpace(std::string msg) { return Status(StatusCode::kNoSpace, std::move(msg)); }
  static Status Corruption(std::string msg) { return Status(StatusCode::kCorruption, std::move(msg)); }
  static Status Unavailable(std::string msg) { return Status(StatusCode::kUnavailable, std::move(msg)); }
  static Status FailedPrecondition(std::string msg) { return Status(StatusCode::kFailedPrecondition, std::move(msg)); }
  static Status Cancelled(std::string msg) { return Status(StatusCode::kCancelled, std::move(msg)); }
  static Status Internal(std::string msg) { return Status(StatusCode::kInternal, std::move(msg)); }
  // `what` names the operation and its object, e.g. "open /data/x.bin". ENOSPC/EDQUOT map to
  // kNoSpace, ENOENT to kNotFound, everything else to kIOError.
  static Status FromErrno(int err, std::string_view what);

  bool ok() const { return state_ == nullptr; }
  StatusCode code() const { return state_ ? state_->code : StatusCode::kOk; }
  // Empty when ok.
  const std::string& message() const;
  // "OK" or "<CodeName>: <message>".
  std::string ToString() const;
  // Returns a copy whose message is "<context>: <message>" (ok stays ok).
  Status WithContext(std::string_view context) const;

 private:
  struct State {
    StatusCode code;
    std::string message;
  };
  Status(StatusCode code, std::string msg) : state_(std::make_unique<State>(State{code, std::move(msg)})) {}
  std::unique_ptr<State> state_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result constructed from an ok Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  // The error, or ok when a value is held.
  const Status& status() const {
    static const Status kOk;  // immutable
    return ok() ? kOk : std::get<Status>(v_);
  }

  // REQUIRES: ok().
  T& value() & { assert(ok()); return std::get<T>(v_); }
  const T& value() const& { assert(ok()); return std::get<T>(v_); }
  T&& value() && { assert(ok()); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace ferry

#define FERRY_CONCAT_INNER(a, b) a##b
#define FERRY_CONCAT(a, b) FERRY_CONCAT_INNER(a, b)

// Returns from the enclosing function when `expr` (a Status) is not ok.
#define FERRY_RETURN_IF_ERROR(expr)                     \
  do {                                                  \
    ::ferry::Status ferry_status_ = (expr);             \
    if (!ferry_status_.ok()) return ferry_status_;      \
  } while (0)

// `lhs = value of expr` (a Result<T>), or returns its error from the enclosing function.
#define FERRY_ASSIGN_OR_RETURN(lhs, expr) \
  FERRY_ASSIGN_OR_RETURN_IMPL(FERRY_CONCAT(ferry_result_, __LINE__), lhs, expr)
#define FERRY_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
