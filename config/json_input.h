// Parsing JSON that comes from outside the program (config files, --set values, checkpoint
// manifests, safetensors headers) without surprises.
//
// nlohmann's parser is iterative, but copying, comparing and dumping a value recurse once per
// level, so a document nested many thousands deep (a few hundred KB of "[[[[") parses and then
// overflows the stack when the reader copies it; and a number outside double's range ("1e999")
// is reported as json::out_of_range, not json::parse_error, so `catch (parse_error&)` misses it.
// parse_json_input refuses both with one message, leaving each reader to wrap it in its own
// typed error (ConfigError, FormatError) with the file's name.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace strata {

// Deeper nesting than any config, manifest or header Strata reads (they nest under 10 levels).
inline constexpr int kMaxJsonDepth = 128;

enum class JsonComments { Refuse, Allow };

struct JsonInputError {
  std::string message;    // nlohmann's text, or the nesting limit
  std::size_t byte = 0;   // 1-based offset of a syntax error; 0 when not known
  bool too_deep = false;  // well-formed, but nested deeper than kMaxJsonDepth
};

// The value of `text`, or nullopt with `*error` set.
std::optional<nlohmann::json> parse_json_input(std::string_view text, JsonComments comments, JsonInputError* error);

// Where in `text` a syntax error lies, for a message: "line 3, column 14" (1-based), or "" when
// `error.byte` is not known.
std::string json_error_place(std::string_view text, const JsonInputError& error);

// `value` as JSON text for a message: invalid UTF-8 replaced rather than thrown on, cut to `max_chars`.
std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars = 60);

}  // namespace strata
