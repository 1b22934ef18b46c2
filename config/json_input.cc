// parse_json_input (see config/json_input.h).
#include "config/json_input.h"

#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace strata {
namespace {

struct TooDeep {};
struct DuplicateKey {
  std::string message;
};

}  // namespace

std::optional<nlohmann::json> parse_json_input(std::string_view text, JsonComments comments, JsonInputError* error) {
  // The callback sees the depth of every container as it opens, before anything below it exists,
  // and every key with the depth of its object + 1: the keys seen so far in each open object are
  // kept by depth (an object's opening clears the level of its keys), so a repeated key is caught
  // before nlohmann keeps only its last value and silently drops the first.
  std::vector<std::set<std::string>> keys_at(1);
  std::vector<std::string> key_path(1);
  const auto check = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& value) {
    using Event = nlohmann::json::parse_event_t;
    if ((event == Event::object_start || event == Event::array_start) && depth >= kMaxJsonDepth) throw TooDeep{};
    const auto grow = [&](std::size_t level) {
      if (keys_at.size() <= level) keys_at.resize(level + 1);
      if (key_path.size() <= level) key_path.resize(level + 1);
    };
    if (event == Event::object_start) {
      const auto level = static_cast<std::size_t>(depth) + 1;
      grow(level);
      keys_at[level].clear();
    }
    if (event == Event::key && value.is_string()) {
      const auto at = static_cast<std::size_t>(depth);
      grow(at);
      std::string name = value.get<std::string>();
      if (!keys_at[at].insert(name).second) {
        std::string where;
        for (std::size_t i = 1; i < at; ++i) where += (where.empty() ? "" : ".") + key_path[i];
        throw DuplicateKey{fmt::format("the key \"{}\" appears twice in {}; JSON keeps only the last, so the first "
                                       "would be silently dropped: merge the two into one",
                                       name, where.empty() ? "the top-level object" : "the object at " + where)};
      }
      key_path[at] = std::move(name);
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), check, /*allow_exceptions=*/true,
                                 /*ignore_comments=*/comments == JsonComments::Allow);
  } catch (const TooDeep&) {
    *error = {fmt::format("arrays and objects are nested more than {} deep", kMaxJsonDepth), 0, true};
  } catch (const DuplicateKey& d) {
    *error = {d.message, 0, false};
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
