// parse_json_input (see engine/json_input.h).
#include "engine/json_input.h"

#include <fmt/format.h>

namespace strata {
namespace {

struct TooDeep {};

}  // namespace

std::optional<nlohmann::json> parse_json_input(std::string_view text, JsonComments comments, JsonInputError* error) {
  // The callback sees the depth of every container as it opens, before anything below it exists.
  const auto limit_depth = [](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
        depth >= kMaxJsonDepth) {
      throw TooDeep{};
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), limit_depth, /*allow_exceptions=*/true,
                                 /*ignore_comments=*/comments == JsonComments::Allow);
  } catch (const TooDeep&) {
    *error = {fmt::format("arrays and objects are nested more than {} deep", kMaxJsonDepth), 0, true};
  } catch (const nlohmann::json::parse_error& e) {
    *error = {e.what(), e.byte, false};
  } catch (const nlohmann::json::exception& e) {  // out_of_range 406: a number beyond double's range
    *error = {e.what(), 0, false};
  }
  return std::nullopt;
}

std::string json_error_place(std::string_view text, const JsonInputError& error) {
  if (error.byte == 0) return "";
  std::size_t line = 1, column = 1;
  for (std::size_t i = 0; i + 1 < error.byte && i < text.size(); ++i) {
    if (text[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return fmt::format("line {}, column {}", line, column);
}

std::string json_excerpt(const nlohmann::json& value, std::size_t max_chars) {
  std::string text = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (text.size() > max_chars) text = text.substr(0, max_chars - 3) + "...";
  return text;
}

}  // namespace strata
