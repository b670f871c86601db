// kolo::Status / StatusOr<T>: errors inside the C++ code. Codes are few and
// generic; the message carries the details. Exceptions never cross threads
// or the C ABI.
#pragma once

#include <cassert>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kolo {

// Keep in sync with kolo_status_t in client_lib/include/kolo/kolo_c.h
// (values are part of the C ABI).
enum class Code : int {
  kOk = 0,
  kInProgress = 1,          // not an error: the operation has not finished yet
  kInvalidArgument = 2,     // caller error: bad input, mismatched ranks, unknown name
  kUnavailable = 3,         // the agent / coordinator cannot be reached
  kTimedOut = 4,            // a deadline passed
  kAborted = 5,             // the job was shut down (a rank left, drain, shutdown)
  kPeerFailure = 6,         // a rank or node of the job failed
  kMembershipChanged = 7,   // the generation changed under the operation (elastic)
  kInternal = 8,            // a bug or an unexpected system error
  kPermissionDenied = 9,    // wrong job token, foreign process
};

const char* codeName(Code c);

class Status;
// The inverse of Status::toString() for a text that crossed a process
// boundary as one string ("TIMED_OUT: ..."): its code when the text starts
// with a code's name and ": ", else `fallback` with the whole text.
Status statusFromText(const std::string& text, Code fallback);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status ok() { return Status(); }

  bool isOk() const { return code_ == Code::kOk; }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string toString() const;

  // Prefixes context ("while joining job x: ...") keeping the code.
  Status withContext(std::string_view context) const;

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status okStatus() { return Status(); }
inline Status invalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
inline Status unavailable(std::string m) { return {Code::kUnavailable, std::move(m)}; }
inline Status timedOut(std::string m) { return {Code::kTimedOut, std::move(m)}; }
inline Status aborted(std::string m) { return {Code::kAborted, std::move(m)}; }
inline Status peerFailure(std::string m) { return {Code::kPeerFailure, std::move(m)}; }
inline Status internalError(std::string m) { return {Code::kInternal, std::move(m)}; }
inline Status permissionDenied(std::string m) { return {Code::kPermissionDenied, std::move(m)}; }
// An OS error with errno text: "what: strerror(errno)".
Status errnoStatus(std::string_view what, int err);

template <typename T>
class [[nodiscard]] StatusOr {
 public:
  StatusOr(T value) : v_(std::move(value)) {}  // NOLINT(implicit)
  StatusOr(Status status) : v_(std::move(status)) {  // NOLINT(implicit)
    assert(!std::get<Status>(v_).isOk());
  }
  bool isOk() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return isOk() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace kolo

#define KOLO_CONCAT_INNER(a, b) a##b
#define KOLO_CONCAT(a, b) KOLO_CONCAT_INNER(a, b)

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    ::kolo::Status _kolo_st = (expr);          \
    if (!_kolo_st.isOk()) return _kolo_st;     \
  } while (0)

#define ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                          \
  if (!tmp.isOk()) return tmp.status();       \
  lhs = std::move(tmp).value()

#define ASSIGN_OR_RETURN(lhs, expr) \
  ASSIGN_OR_RETURN_IMPL(KOLO_CONCAT(_kolo_sor_, __LINE__), lhs, expr)
