// Out-of-line parts of the CHECK family (core/error.h).
#include "core/error.h"

#include <cstring>

namespace strata {

std::string errno_text(int err) {
  char buf[256];
  // GNU strerror_r returns a pointer that may or may not be buf.
  const char* text = strerror_r(err, buf, sizeof buf);
  return fmt::format("{} (errno {})", text, err);
}

namespace detail {

void check_failed(const char* file, int line, std::string_view expr, std::string_view detail) {
  if (detail.empty()) {
    throw InternalError(fmt::format("{}:{}: check failed: {}", file, line, expr));
  }
  throw InternalError(fmt::format("{}:{}: check failed: {}: {}", file, line, expr, detail));
}

void errno_check_failed(const char* file, int line, std::string_view expr, int err) {
  throw InternalError(fmt::format("{}:{}: {} failed: {}", file, line, expr, errno_text(err)));
}

}  // namespace detail
}  // namespace strata
