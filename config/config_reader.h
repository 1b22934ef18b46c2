// ConfigReader: walks a JSON config object and reads typed, validated fields out of it.
//
// The set of known keys of a section is exactly the set of keys the code asks for, so the schema
// cannot drift from the parser. finish() then reports any key nobody asked for as an error naming
// its full path and the nearest known key ("zero_optimization.stgae: unknown key; did you mean
// 'stage'?"). Keys that DeepSpeed has and Strata deliberately does not support are declared with
// unsupported(), and produce a message saying so and what to use instead. Keys that DeepSpeed has
// and Strata accepts without effect are declared with ignored() and a reason; the ones present in
// the config are collected as IgnoredKeys for one warning line at startup. Switched-off features
// pass unsupported(); alias() and translate() read DeepSpeed's other names and old forms.
//
// Every error is a ConfigError naming the config file, the key path, what was found and what is
// allowed.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

// A DeepSpeed key present in a config that Strata accepts but that has no effect, and why; or an
// old or alias name read as its current one.
struct IgnoredKey {
  enum class Kind { NoEffect, Translated };
  std::string key_path;  // e.g. "zero_optimization.reduce_bucket_size"
  std::string reason;    // NoEffect: why; Translated: "read as <key path>"
  // NoEffect: the value is DeepSpeed's default or what Strata does anyway, so nothing is said of it
  // at startup (log_ignored_keys).
  bool silent = false;
  Kind kind = Kind::NoEffect;
};

// A value written "auto" (as the Hugging Face Trainer's DeepSpeed configs do) and what Strata
// resolved it to, and why: printed in one block at startup (log_resolved_auto, config/config.h).
struct ResolvedAuto {
  std::string key_path;  // e.g. "optimizer.params.lr"
  std::string value;     // as it would be written with --set
  std::string why;
};

class ConfigReader {
 public:
  // `source` names the file (or "--set") in messages; `path` is the key path of `object` ("" at top).
  // ignored() appends to `ignored_keys` (when not null), also from the readers section() returns.
  // resolved() appends to `resolved_autos` (when not null), also from the readers section() returns.
  // Every key path asked for (present or not) goes to `accepted_keys` when not null: the schema,
  // for the test that every accepted key acts or is listed.
  ConfigReader(const nlohmann::json& object, std::string source, std::string path = "",
               std::vector<IgnoredKey>* ignored_keys = nullptr, std::vector<ResolvedAuto>* resolved_autos = nullptr,
               std::vector<std::string>* accepted_keys = nullptr);

  bool has(std::string_view key) const;
  // True when `key` is present and written "auto" (the key is marked known).
  bool is_auto(std::string_view key);
  // Records that `key`, written "auto", was resolved to `value` because of `why`.
  void resolved(std::string_view key, std::string value, std::string why);

  // Each getter marks `key` as known. When the key is absent (or, for numbers, "auto") the output
  // keeps its current value, which is the default.
  void get_bool(std::string_view key, bool* out);
  void get_int(std::string_view key, std::int64_t* out, std::int64_t min, std::int64_t max);
  void get_int(std::string_view key, int* out, int min, int max);
  // Element counts and similar: accepts 1e9, 1000000000, "1e9", "auto".
  void get_count(std::string_view key, std::uint64_t* out, std::uint64_t min, std::uint64_t max);
  void get_double(std::string_view key, double* out, double min, double max);
  // Byte sizes: accepts a number of bytes or a string like "64MiB".
  void get_bytes(std::string_view key, std::uint64_t* out, std::uint64_t min = 0);
  void get_string(std::string_view key, std::string* out);
  void get_choice(std::string_view key, std::string* out, const std::vector<std::string>& allowed);
  void get_string_list(std::string_view key, std::vector<std::string>* out);
  // Any JSON value, kept raw for a higher layer to interpret (e.g. strata.model).
  void get_raw(std::string_view key, nlohmann::json* out);

  // A nested object; absent -> an empty object, so defaults apply. Wrong type -> error.
  ConfigReader section(std::string_view key);

  // A DeepSpeed key Strata does not support: present and switched on -> error with `advice`.
  // Switched off, it is accepted without a word: null, false, an object whose "enabled" is false,
  // or a value equal to `off` (e.g. 1 for a partition size), when given.
  void unsupported(std::string_view key, std::string_view advice, const nlohmann::json& off = nullptr);
  // A DeepSpeed key accepted for compatibility but without effect in Strata: when present (and not
  // null), its path and `reason` go to the IgnoredKey list, silent when the value equals
  // `same_as` (DeepSpeed's default, or what Strata does anyway). Call after a getter to
  // range-check it.
  void ignored(std::string_view key, std::string_view reason, const nlohmann::json& same_as = nullptr);
  // A DeepSpeed section accepted without effect (a monitor): silent when its "enabled" is false or
  // absent (DeepSpeed's default), listed otherwise.
  void ignored_section(std::string_view key, std::string_view reason);
  // DeepSpeed's other name for `key` (an alias, or a deprecated form): its value is read as `key`'s
  // (both given with different values is an error) and the translation is listed. Call before the
  // getter of `key`.
  void alias(std::string_view other, std::string_view key);
  // An old form DeepSpeed still translates: `other` given means `section`.`field` = `value` (given
  // there too, with another value, is an error); the translation is listed. Call before section().
  void translate(std::string_view other, std::string_view section, std::string_view field,
                 const nlohmann::json& value);

  // Throws for any key of this object nobody asked for. Call after all getters and sections.
  void finish() const;

  std::string key_path(std::string_view key) const;
  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;

 private:
  const nlohmann::json* find(std::string_view key);

  nlohmann::json object_;
  std::string source_;
  std::string path_;
  std::set<std::string, std::less<>> known_;
  std::vector<IgnoredKey>* ignored_keys_;
  std::vector<ResolvedAuto>* resolved_autos_;
  std::vector<std::string>* accepted_keys_;
  void accept(std::string_view key);
};

// Edit distance, for "did you mean" suggestions.
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `name` by edit distance when it is near enough to be a likely typo (at
// most max(3, |name| / 3) edits), else "". The one rule for "did you mean" in config keys and in the
// command line (cli/commands.cc).
std::string nearest_name(std::string_view name, const std::vector<std::string>& candidates);

// Applies `key.path=value` to `root`: value is parsed as JSON when it is valid JSON (numbers, true,
// false, null, arrays, objects, quoted strings), else taken as a plain string. Intermediate objects
// are created. Throws ConfigError naming the override when the path crosses a non-object.
void apply_override(nlohmann::json& root, std::string_view assignment);

}  // namespace strata
