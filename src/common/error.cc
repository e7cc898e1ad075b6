#include "common/error.h"

namespace lathe {

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::InvalidArgument: return "invalid_argument";
    case ErrorKind::NotFound: return "not_found";
    case ErrorKind::Corrupt: return "corrupt";
    case ErrorKind::Unsupported: return "unsupported";
    case ErrorKind::Io: return "io";
    case ErrorKind::Internal: return "internal";
  }
  return "unknown";
}

}  // namespace lathe
