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

std::string filesystem_message(const std::filesystem::filesystem_error& e) {
  // libstdc++: "filesystem error: cannot create directories: Not a directory [a/b]".
  std::string what = e.what();
  const std::string prefix = "filesystem error: ";
  if (what.rfind(prefix, 0) == 0) what.erase(0, prefix.size());
  const std::size_t colon = what.find(": ");
  const std::string operation = colon == std::string::npos ? std::string("a file-system call") : what.substr(0, colon);
  std::string paths = fmt::format("'{}'", e.path1().string());
  if (!e.path2().empty()) paths += fmt::format(" and '{}'", e.path2().string());
  return fmt::format("{}: {} ({}); check the path, its parent directories and their permissions", paths,
                     e.code().message(), operation);
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
