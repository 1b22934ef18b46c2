// ConfigReader (see config/config_reader.h).
#include "config/config_reader.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "core/error.h"
#include "core/units.h"
#include "config/json_input.h"

namespace strata {
namespace {

std::string describe(const nlohmann::json& v) {
  std::string text = fmt::format("{} {}", v.type_name(), json_excerpt(v));
  if (v.is_string()) {  // "AUTO", "Auto": the keyword is lower case
    std::string lower = v.get<std::string>();
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (lower == "auto") text += " (did you mean \"auto\"? it is written in lower case)";
  }
  return text;
}

bool auto_value(const nlohmann::json& v) { return v.is_string() && v.get<std::string>() == "auto"; }

}  // namespace

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {
// The '_'-separated words of a key, sorted: "comm_overlap" and "overlap_comm" have the same.
std::vector<std::string_view> sorted_words(std::string_view key) {
  std::vector<std::string_view> words;
  std::size_t start = 0;
  while (start <= key.size()) {
    const std::size_t end = std::min(key.find('_', start), key.size());
    if (end > start) words.push_back(key.substr(start, end - start));
    start = end + 1;
  }
  std::sort(words.begin(), words.end());
  return words;
}
}  // namespace

std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates) {
  // The same words in another order first (a swapped key is the likeliest slip).
  for (const auto& candidate : candidates) {
    if (candidate != name && sorted_words(candidate) == sorted_words(name)) return candidate;
  }
  std::string best;
  std::size_t best_distance = std::numeric_limits<std::size_t>::max();
  for (const auto& candidate : candidates) {
    const std::size_t d = edit_distance(name, candidate);
    if (d < best_distance) {
      best_distance = d;
      best = candidate;
    }
  }
  return best_distance <= std::max<std::size_t>(3, name.size() / 3) ? best : std::string();
}

ConfigReader::ConfigReader(const nlohmann::json& object, std::string source, std::string path,
                           std::vector<IgnoredKey>* ignored_keys, std::vector<ResolvedAuto>* resolved_autos,
                           std::vector<std::string>* accepted_keys)
    : object_(object.is_null() ? nlohmann::json::object() : object),
      source_(std::move(source)),
      path_(std::move(path)),
      ignored_keys_(ignored_keys),
      resolved_autos_(resolved_autos),
      accepted_keys_(accepted_keys) {
  if (!object_.is_object()) {
    throw ConfigError(fmt::format("{}: '{}' must be an object, found {}", source_, path_.empty() ? "<top>" : path_,
                                  describe(object_)));
  }
}

std::string ConfigReader::key_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void ConfigReader::fail(std::string_view key, std::string_view problem) const {
  throw ConfigError(fmt::format("{}: {}: {}", source_, key_path(key), problem));
}

bool ConfigReader::has(std::string_view key) const { return object_.contains(std::string(key)); }

bool ConfigReader::is_auto(std::string_view key) {
  const auto* v = find(key);
  return v != nullptr && auto_value(*v);
}

void ConfigReader::resolved(std::string_view key, std::string value, std::string why) {
  if (resolved_autos_ != nullptr) resolved_autos_->push_back({key_path(key), std::move(value), std::move(why)});
}

void ConfigReader::accept(std::string_view key) {
  known_.emplace(key);
  if (accepted_keys_ == nullptr) return;
  std::string path = key_path(key);
  if (std::find(accepted_keys_->begin(), accepted_keys_->end(), path) == accepted_keys_->end()) {
    accepted_keys_->push_back(std::move(path));
  }
}

const nlohmann::json* ConfigReader::find(std::string_view key) {
  accept(key);
  auto it = object_.find(std::string(key));
  if (it == object_.end() || it->is_null()) return nullptr;
  return &*it;
}

void ConfigReader::get_bool(std::string_view key, bool* out) {
  const auto* v = find(key);
  if (v == nullptr) return;
  if (!v->is_boolean()) fail(key, fmt::format("expected true or false, found {}", describe(*v)));
  *out = v->get<bool>();
}

void ConfigReader::get_int(std::string_view key, std::int64_t* out, std::int64_t min, std::int64_t max) {
  const auto* v = find(key);
  if (v == nullptr || auto_value(*v)) return;
  std::int64_t value = 0;
  if (v->is_number_unsigned() && v->get<std::uint64_t>() > std::uint64_t{std::numeric_limits<std::int64_t>::max()}) {
    fail(key, fmt::format("{} is out of range; allowed {}..{}", v->get<std::uint64_t>(), min, max));
  } else if (v->is_number_integer()) {
    value = v->get<std::int64_t>();
  } else if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
             std::fabs(v->get<double>()) < 9e18) {
    value = static_cast<std::int64_t>(v->get<double>());
  } else {
    fail(key, fmt::format("expected an integer, found {}", describe(*v)));
  }
  if (value < min || value > max) fail(key, fmt::format("{} is out of range; allowed {}..{}", value, min, max));
  *out = value;
}

void ConfigReader::get_int(std::string_view key, int* out, int min, int max) {
  std::int64_t value = *out;
  get_int(key, &value, min, max);
  *out = static_cast<int>(value);
}

void ConfigReader::get_count(std::string_view key, std::uint64_t* out, std::uint64_t min, std::uint64_t max) {
  const auto* v = find(key);
  if (v == nullptr || auto_value(*v)) return;
  double value = 0;
  if (v->is_number()) {
    value = v->get<double>();
    if (v->is_number_unsigned()) value = static_cast<double>(v->get<std::uint64_t>());
  } else if (v->is_string()) {
    std::uint64_t parsed = 0;
    const std::string text = v->get<std::string>();
    char* end = nullptr;
    const double d = std::strtod(text.c_str(), &end);
    if (end != nullptr && *end == '\0' && !text.empty()) {
      value = d;
    } else if (parse_count(text, &parsed)) {
      value = static_cast<double>(parsed);
    } else {
      fail(key, fmt::format("expected a count such as 1e9 or 500M, found {}", describe(*v)));
    }
  } else {
    fail(key, fmt::format("expected a count such as 1e9 or 500M, found {}", describe(*v)));
  }
  if (!(value >= 0) || std::floor(value) != value || value > 1.8e19) {
    fail(key, fmt::format("expected a non-negative whole count, found {}", describe(*v)));
  }
  const auto count = static_cast<std::uint64_t>(value);
  if (count < min || count > max) fail(key, fmt::format("{} is out of range; allowed {}..{}", count, min, max));
  *out = count;
}

void ConfigReader::get_double(std::string_view key, double* out, double min, double max) {
  const auto* v = find(key);
  if (v == nullptr || auto_value(*v)) return;
  if (!v->is_number()) fail(key, fmt::format("expected a number, found {}", describe(*v)));
  const double value = v->get<double>();
  if (!std::isfinite(value) || value < min || value > max) {
    fail(key, fmt::format("{} is out of range; allowed {}..{}", value, min, max));
  }
  *out = value;
}

void ConfigReader::get_bytes(std::string_view key, std::uint64_t* out, std::uint64_t min) {
  const auto* v = find(key);
  if (v == nullptr || auto_value(*v)) return;
  std::size_t bytes = 0;
  if (v->is_number_unsigned() || (v->is_number_integer() && v->get<std::int64_t>() >= 0)) {
    bytes = v->get<std::uint64_t>();
  } else if (v->is_number_float() && v->get<double>() >= 0 && v->get<double>() < 1.8e19 &&
             std::floor(v->get<double>()) == v->get<double>()) {
    bytes = static_cast<std::size_t>(v->get<double>());
  } else if (!v->is_string()) {
    fail(key, fmt::format("expected a byte size such as 67108864 or \"64MiB\", found {}", describe(*v)));
  } else if (!parse_bytes(v->get<std::string>(), &bytes)) {
    fail(key, bad_bytes_message(v->get<std::string>()));
  }
  if (bytes < min) fail(key, fmt::format("{} is too small; at least {}", format_bytes(bytes), format_bytes(min)));
  *out = bytes;
}

void ConfigReader::get_string(std::string_view key, std::string* out) {
  const auto* v = find(key);
  if (v == nullptr) return;
  if (!v->is_string()) fail(key, fmt::format("expected a string, found {}", describe(*v)));
  *out = v->get<std::string>();
}

void ConfigReader::get_choice(std::string_view key, std::string* out, const std::vector<std::string>& allowed) {
  std::string value = *out;
  get_string(key, &value);
  if (std::find(allowed.begin(), allowed.end(), value) == allowed.end()) {
    fail(key, fmt::format("'{}' is not one of: {}", value, fmt::join(allowed, ", ")));
  }
  *out = value;
}

void ConfigReader::get_string_list(std::string_view key, std::vector<std::string>* out) {
  const auto* v = find(key);
  if (v == nullptr) return;
  if (v->is_string()) {
    *out = {v->get<std::string>()};
    return;
  }
  if (!v->is_array()) fail(key, fmt::format("expected a string or a list of strings, found {}", describe(*v)));
  std::vector<std::string> values;
  for (const auto& item : *v) {
    if (!item.is_string()) fail(key, fmt::format("expected a list of strings, found an element {}", describe(item)));
    values.push_back(item.get<std::string>());
  }
  *out = std::move(values);
}

void ConfigReader::get_raw(std::string_view key, nlohmann::json* out) {
  const auto* v = find(key);
  if (v != nullptr) *out = *v;
}

ConfigReader ConfigReader::section(std::string_view key) {
  const auto* v = find(key);
  if (v != nullptr && !v->is_object()) fail(key, fmt::format("expected an object {{...}}, found {}", describe(*v)));
  return ConfigReader(v != nullptr ? *v : nlohmann::json::object(), source_, key_path(key), ignored_keys_,
                      resolved_autos_, accepted_keys_);
}

void ConfigReader::unsupported(std::string_view key, std::string_view advice, const nlohmann::json& off) {
  const auto* v = find(key);
  if (v == nullptr) return;
  const bool switched_off = *v == false || (v->is_object() && v->contains("enabled") && (*v)["enabled"] == false) ||
                            (!off.is_null() && *v == off);
  if (!switched_off) fail(key, fmt::format("this DeepSpeed key is not supported by Strata; {}", advice));
}

void ConfigReader::ignored(std::string_view key, std::string_view reason, const nlohmann::json& same_as) {
  const auto* v = find(key);
  if (v == nullptr || ignored_keys_ == nullptr) return;
  IgnoredKey k{key_path(key), std::string(reason)};
  k.silent = !same_as.is_null() && *v == same_as;
  ignored_keys_->push_back(std::move(k));
}

void ConfigReader::translate(std::string_view other, std::string_view section, std::string_view field,
                             const nlohmann::json& value) {
  accept(other);
  nlohmann::json& sec = object_[std::string(section)];
  if (sec.is_null()) sec = nlohmann::json::object();
  if (!sec.is_object()) fail(section, fmt::format("expected an object {{...}}, found {}", describe(sec)));
  const std::string name(field);
  if (sec.contains(name) && !sec[name].is_null() && sec[name] != value) {
    fail(other, fmt::format("it means {}.{} = {}, which is also given as {}; keep one", key_path(section), field,
                            value.dump(), sec[name].dump()));
  }
  sec[name] = value;
  if (ignored_keys_ != nullptr) {
    IgnoredKey k{key_path(other), fmt::format("read as {}.{} = {}", key_path(section), field, value.dump())};
    k.kind = IgnoredKey::Kind::Translated;
    ignored_keys_->push_back(std::move(k));
  }
}

void ConfigReader::ignored_section(std::string_view key, std::string_view reason) {
  const auto* v = find(key);
  if (v == nullptr || ignored_keys_ == nullptr) return;
  if (!v->is_object()) fail(key, fmt::format("expected an object {{...}}, found {}", describe(*v)));
  IgnoredKey k{key_path(key), std::string(reason)};
  k.silent = !v->contains("enabled") || (*v)["enabled"] == false;
  ignored_keys_->push_back(std::move(k));
}

void ConfigReader::alias(std::string_view other, std::string_view key) {
  const auto* v = find(other);
  if (v == nullptr) return;
  const std::string name(key);
  if (object_.contains(name) && !object_[name].is_null() && object_[name] != *v) {
    fail(other, fmt::format("it is DeepSpeed's other name for '{}', which is also given, with another value ({} and "
                            "{}); keep one",
                            key_path(key), json_excerpt(*v), json_excerpt(object_[name])));
  }
  object_[name] = *v;
  if (ignored_keys_ != nullptr) {
    IgnoredKey k{key_path(other), fmt::format("read as {}", key_path(key))};
    k.kind = IgnoredKey::Kind::Translated;
    ignored_keys_->push_back(std::move(k));
  }
}

void ConfigReader::finish() const {
  for (const auto& [key, value] : object_.items()) {
    if (known_.count(key) != 0) continue;
    const std::vector<std::string> names(known_.begin(), known_.end());
    const std::string best = nearest_name(key, names);
    std::string hint;
    if (!best.empty()) {
      hint = fmt::format("; did you mean '{}'?", best);
    } else if (!known_.empty()) {
      hint = fmt::format("; known keys here: {}", fmt::join(names, ", "));
    }
    fail(key, fmt::format("unknown key{}", hint));
  }
}

void apply_override(nlohmann::json& root, std::string_view assignment) {
  const auto eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw ConfigError(fmt::format("--set '{}': expected key.path=value, e.g. --set zero_optimization.stage=3", assignment));
  }
  const std::string path(assignment.substr(0, eq));
  const std::string text(assignment.substr(eq + 1));
  JsonInputError error;
  std::optional<nlohmann::json> parsed = parse_json_input(text, JsonComments::Refuse, &error);
  if (!parsed && error.too_deep) throw ConfigError(fmt::format("--set '{}': {}", assignment.substr(0, 200), error.message));
  nlohmann::json value = parsed ? std::move(*parsed) : nlohmann::json(text);
  if (value.is_string()) {
    // Not JSON, so taken as a plain string; configs are UTF-8 (it would also be written into checkpoints).
    try {
      (void)value.dump();
    } catch (const nlohmann::json::type_error&) {
      throw ConfigError(fmt::format("--set '{}': the value is not valid UTF-8", path));
    }
  }

  nlohmann::json* node = &root;
  std::size_t start = 0;
  for (;;) {
    const auto dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part.empty()) throw ConfigError(fmt::format("--set '{}': empty key in the path '{}'", assignment, path));
    if (!node->is_object()) {
      throw ConfigError(fmt::format("--set '{}': '{}' is not an object, so it has no key '{}'", assignment,
                                    path.substr(0, start > 0 ? start - 1 : 0), part));
    }
    if (dot == std::string::npos) {
      (*node)[part] = value;
      return;
    }
    nlohmann::json& child = (*node)[part];
    if (child.is_null()) child = nlohmann::json::object();
    node = &child;
    start = dot + 1;
  }
}

}  // namespace strata
