#include "kernels/status.h"

#include <cerrno>
#include <cstring>

namespace ferry {

std::string_view StatusCodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk: return "OK";
    case StatusCode::kInvalidArgument: return "InvalidArgument";
    case StatusCode::kNotFound: return "NotFound";
    case StatusCode::kOutOfMemory: return "OutOfMemory";
    case StatusCode::kIOError: return "IOError";
    case StatusCode::kNoSpace: return "NoSpace";
    case StatusCode::kCorruption: return "Corruption";
    case StatusCode::kUnavailable: return "Unavailable";
    case StatusCode::kFailedPrecondition: return "FailedPrecondition";
    case StatusCode::kCancelled: return "Cancelled";
    case StatusCode::kInternal: return "Internal";
  }
  return "Unknown";
}

Status Status::FromErrno(int err, std::string_view what) {
  std::string msg(what);
  msg += ": ";
  msg += std::strerror(err);
  if (err == ENOSPC) msg += " (the disk is full)";
  switch (err) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return Status(StatusCode::kNoSpace, std::move(msg));
    case ENOENT:
      return Status(StatusCode::kNotFound, std::move(msg));
    default:
      return Status(StatusCode::kIOError, std::move(msg));
  }
}

const std::string& Status::message() const {
  static const std::string kEmpty;  // immutable
  return state_ ? state_->message : kEmpty;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string s(StatusCodeName(state_->code));
  s += ": ";
  s += state_->message;
  return s;
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return Status();
  std::string msg(context);
  msg += ": ";
  msg += state_->message;
  return Status(state_->code, std::move(msg));
}

}  // namespace ferry
