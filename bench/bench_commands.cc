// The command table's shared pieces (see bench/bench_commands.h).
#include "bench/bench_commands.h"

#include <string>

namespace strata::bench {

const CLI::Validator& non_empty_path() {
  static const CLI::Validator validator(
      [](std::string& value) -> std::string {
        if (!value.empty()) return {};
        return "an empty path; give a path, or leave the flag out (an unset shell variable?)";
      },
      "PATH", "non-empty path");
  return validator;
}

}  // namespace strata::bench
