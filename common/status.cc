#include "common/status.h"

#include <cstring>

namespace kolo {

const char* codeName(Code c) {
  switch (c) {
    case Code::kOk: return "OK";
    case Code::kInProgress: return "IN_PROGRESS";
    case Code::kInvalidArgument: return "INVALID_ARGUMENT";
    case Code::kUnavailable: return "UNAVAILABLE";
    case Code::kTimedOut: return "TIMED_OUT";
    case Code::kAborted: return "ABORTED";
    case Code::kPeerFailure: return "PEER_FAILURE";
    case Code::kMembershipChanged: return "MEMBERSHIP_CHANGED";
    case Code::kInternal: return "INTERNAL";
    case Code::kPermissionDenied: return "PERMISSION_DENIED";
  }
  return "UNKNOWN";
}

Status statusFromText(const std::string& text, Code fallback) {
  for (int c = static_cast<int>(Code::kInProgress); c <= static_cast<int>(Code::kPermissionDenied);
       ++c) {
    const std::string prefix = std::string(codeName(static_cast<Code>(c))) + ": ";
    if (text.compare(0, prefix.size(), prefix) == 0)
      return Status(static_cast<Code>(c), text.substr(prefix.size()));
  }
  return Status(fallback, text);
}

std::string Status::toString() const {
  if (isOk()) return "OK";
  return std::string(codeName(code_)) + ": " + message_;
}

Status Status::withContext(std::string_view context) const {
  if (isOk()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

Status errnoStatus(std::string_view what, int err) {
  Code code = Code::kInternal;
  if (err == ENOENT || err == ECONNREFUSED || err == ECONNRESET || err == EPIPE) {
    code = Code::kUnavailable;
  } else if (err == EACCES || err == EPERM) {
    code = Code::kPermissionDenied;
  } else if (err == ETIMEDOUT) {
    code = Code::kTimedOut;
  }
  return Status(code, std::string(what) + ": " + std::strerror(err));
}

}  // namespace kolo
