#include "loaderx/status.h"

#include <system_error>

namespace loaderx {

const std::string& Status::message() const {
  static const std::string kEmpty;
  return rep_ ? rep_->msg : kEmpty;
}

const char* Status::CodeName(Code c) {
  switch (c) {
    case Code::kOk:
      return "OK";
    case Code::kInvalidArgument:
      return "InvalidArgument";
    case Code::kIndexError:
      return "IndexError";
    case Code::kSchemaError:
      return "SchemaError";
    case Code::kCorruption:
      return "Corruption";
    case Code::kIOError:
      return "IOError";
    case Code::kNotFound:
      return "NotFound";
    case Code::kAlreadyExists:
      return "AlreadyExists";
    case Code::kResourceExhausted:
      return "ResourceExhausted";
    case Code::kCancelled:
      return "Cancelled";
    case Code::kProtocol:
      return "Protocol";
    case Code::kDaemon:
      return "Daemon";
    case Code::kInternal:
      return "Internal";
    case Code::kState:
      return "State";
    case Code::kTimeout:
      return "Timeout";
  }
  return "Unknown";
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code())) + ": " + message();
}

Status Status::FromErrno(std::string_view context, int err) {
  Code c = Code::kIOError;
  if (err == ENOENT) c = Code::kNotFound;
  if (err == EEXIST) c = Code::kAlreadyExists;
  return Status(c, std::string(context) + ": " + std::generic_category().message(err));
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code(), std::string(context) + ": " + message());
}

}  // namespace loaderx
