// Status and Result<T>: the error currency of the loaderx engine.
//
// Every fallible engine call returns a Status (or a Result<T> carrying a value
// or a Status). Exceptions are used only at the Python edge, where each Code
// maps to one class of `loaderx.errors` (see python/src/module.cc).
//
// Messages carry context, leveldb style: "<path>: index checksum mismatch in
// block 3". A Status is cheap to move; the OK status allocates nothing.
//
// Thread-safety: Status and Result are plain values; distinct objects may be
// used from distinct threads without synchronisation.
#pragma once

#include <cassert>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace loaderx {

class [[nodiscard]] Status {
 public:
  // Codes are stable: they cross the wire in daemon error replies.
  enum class Code : int {
    kOk = 0,
    kInvalidArgument = 1,    // ValueError
    kIndexError = 2,         // IndexError
    kSchemaError = 3,        // TypeError-like: dtype / shape / ndim mismatch
    kCorruption = 4,         // CorruptStoreError
    kIOError = 5,            // OSError
    kNotFound = 6,           // FileNotFoundError
    kAlreadyExists = 7,      // FileExistsError
    kResourceExhausted = 8,  // ResourceExhausted (lease cap, memory cap)
    kCancelled = 9,          // loader closed while waiting
    kProtocol = 10,          // ProtocolError (daemon wire)
    kDaemon = 11,            // DaemonError (daemon gone / refused)
    kInternal = 12,          // a bug: should never be seen
    kState = 13,             // wrong object state (reading a builder, ...)
    kTimeout = 14,           // GroupTimeoutError: a group member waited too long for its peers
  };

  Status() = default;
  Status(Code code, std::string msg)
      : rep_(code == Code::kOk ? nullptr : std::make_unique<Rep>(Rep{code, std::move(msg)})) {}
  Status(const Status& o) : rep_(o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr) {}
  Status& operator=(const Status& o) {
    if (this != &o) rep_ = o.rep_ ? std::make_unique<Rep>(*o.rep_) : nullptr;
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status OK() { return Status(); }
  static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
  static Status IndexError(std::string m) { return {Code::kIndexError, std::move(m)}; }
  static Status SchemaError(std::string m) { return {Code::kSchemaError, std::move(m)}; }
  static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
  static Status IOError(std::string m) { return {Code::kIOError, std::move(m)}; }
  static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
  static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
  static Status ResourceExhausted(std::string m) {
    return {Code::kResourceExhausted, std::move(m)};
  }
  static Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }
  static Status Protocol(std::string m) { return {Code::kProtocol, std::move(m)}; }
  static Status Daemon(std::string m) { return {Code::kDaemon, std::move(m)}; }
  static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
  static Status State(std::string m) { return {Code::kState, std::move(m)}; }
  static Status Timeout(std::string m) { return {Code::kTimeout, std::move(m)}; }
  // IOError from errno, formatted "<context>: <strerror>".
  static Status FromErrno(std::string_view context, int err);

  bool ok() const { return rep_ == nullptr; }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& message() const;
  // "Corruption: <message>"
  std::string ToString() const;
  static const char* CodeName(Code c);

  // Returns a copy whose message is prefixed with `context + ": "`.
  Status WithContext(std::string_view context) const;

 private:
  struct Rep {
    Code code;
    std::string msg;
  };
  std::unique_ptr<Rep> rep_;
};

// Result<T>: a T or a non-OK Status. Accessing value() of an error is a bug
// (asserted in debug builds).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    assert(!std::get<Status>(v_).ok() && "Result built from an OK status");
  }
  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  T& value() & {
    assert(ok());
    return std::get<T>(v_);
  }
  const T& value() const& {
    assert(ok());
    return std::get<T>(v_);
  }
  T&& value() && {
    assert(ok());
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace loaderx

#define LOADERX_CONCAT_INNER(a, b) a##b
#define LOADERX_CONCAT(a, b) LOADERX_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if it is not OK.
#define LX_RETURN_IF_ERROR(expr)       \
  do {                                 \
    ::loaderx::Status _lx_st = (expr); \
    if (!_lx_st.ok()) return _lx_st;   \
  } while (0)

// `LX_ASSIGN_OR_RETURN(auto x, MakeX());`
#define LX_ASSIGN_OR_RETURN(lhs, rexpr) \
  LX_ASSIGN_OR_RETURN_IMPL(LOADERX_CONCAT(_lx_res_, __LINE__), lhs, rexpr)
// `tmp` is an identifier and `lhs` a declaration: neither can be parenthesized.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define LX_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                             \
  if (!tmp.ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
// NOLINTEND(bugprone-macro-parentheses)
