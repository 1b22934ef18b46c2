// Token caches with their sources' identity, and the data identity a checkpoint records (see
// train/token_cache.h, Note [Token cache identity] in train/token_cache.h).
#include "train/token_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/file_io.h"
#include "config/json_input.h"
#include "models/token_data.h"

namespace strata::train {
namespace fs = std::filesystem;

namespace {

constexpr const char* kRecordFormat = "strata-token-cache";
constexpr const char* kTokenizer = "bytes";  // models::ByteTokenizer

std::string hex64(std::uint64_t v) { return fmt::format("{:016x}", v); }
std::string xxh64_of(std::string_view bytes) { return hex64(XXH64(bytes.data(), bytes.size(), 0)); }

std::int64_t mtime_ns(const struct stat& st) {
  return static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// {"bytes", "mtime_ns"} of a regular file; nullopt when it is missing or not one.
std::optional<nlohmann::json> file_stat(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
  return nlohmann::json{{"bytes", static_cast<std::uint64_t>(st.st_size)}, {"mtime_ns", mtime_ns(st)}};
}

// The XXH64 of a file's bytes, read in pieces (a token file may be large).
std::string file_xxh64(const std::string& path) {
  const UniqueFd fd = open_for_read(path, "token file");
  const std::uint64_t size = file_size_bytes(fd.get(), path);
  XXH64_state_t* state = XXH64_createState();
  XXH64_reset(state, 0);
  std::vector<char> buf(std::size_t{4} << 20);
  for (std::uint64_t at = 0; at < size;) {
    const std::size_t n = static_cast<std::size_t>(std::min<std::uint64_t>(buf.size(), size - at));
    read_exact(fd.get(), buf.data(), n, at, path);
    XXH64_update(state, buf.data(), n);
    at += n;
  }
  const std::uint64_t h = XXH64_digest(state);
  XXH64_freeState(state);
  return hex64(h);
}

// The fortunes corpus as a source: its directory, and the bytes and newest mtime of the files
// load_fortunes reads. nullopt when the directory cannot be listed.
std::optional<nlohmann::json> fortunes_source(const std::string& dir) {
  std::error_code ec;
  std::uint64_t bytes = 0, files = 0;
  std::int64_t newest = 0;
  fs::directory_iterator it(dir, ec);
  if (ec) return std::nullopt;
  for (const auto& e : it) {
    const std::string ext = e.path().extension().string();
    if (!e.is_regular_file(ec) || e.is_symlink(ec) || ext == ".dat" || ext == ".u8") continue;
    const std::optional<nlohmann::json> st = file_stat(e.path().string());
    if (!st) continue;
    bytes += (*st)["bytes"].get<std::uint64_t>();
    newest = std::max(newest, (*st)["mtime_ns"].get<std::int64_t>());
    ++files;
  }
  return nlohmann::json{{"kind", "fortunes"}, {"path", fs::weakly_canonical(dir, ec).string()},
                        {"bytes", bytes}, {"mtime_ns", newest}, {"files", files}};
}

std::optional<nlohmann::json> text_source(const std::string& path) {
  std::optional<nlohmann::json> st = file_stat(path);
  if (!st) return std::nullopt;
  std::error_code ec;
  (*st)["kind"] = "text";
  (*st)["path"] = fs::weakly_canonical(path, ec).string();
  return st;
}

std::optional<nlohmann::json> read_record(const std::string& cache) {
  const std::string path = cache + ".source";
  if (!file_stat(path)) return std::nullopt;
  try {
    JsonInputError error;
    std::optional<nlohmann::json> j =
        parse_json_input(read_text_file(path, "token cache record"), JsonComments::Refuse, &error);
    if (j && j->is_object() && j->value("format", "") == kRecordFormat) return j;
  } catch (const Error&) {
  }
  return std::nullopt;
}

// Why the cache cannot be used as made from `source` (nullopt: it can). `source` null: the source
// is not at hand (the corpus is gone); the cache is then judged by itself.
std::optional<std::string> stale_reason(const std::string& cache, const std::optional<nlohmann::json>& source) {
  const std::optional<nlohmann::json> record = read_record(cache);
  const std::optional<nlohmann::json> now = file_stat(cache);
  if (!now) return "it does not exist yet";
  if (!record) return "it has no record of its source (Note [Token cache identity] in train/token_cache.h)";
  if (record->value("tokenizer", "") != kTokenizer) return "it was made by another tokenizer";
  nlohmann::json recorded = record->value("source", nlohmann::json::object());
  recorded.erase("xxh64");
  if (source && recorded != *source) {
    if (recorded.value("kind", "") == source->value("kind", "") && recorded.value("path", "") == source->value("path", "")) {
      return fmt::format("its source '{}' changed since (size or modification time)", source->value("path", "?"));
    }
    return fmt::format("it was made from {} '{}', not from this run's {} '{}'", recorded.value("kind", "?"),
                       recorded.value("path", "?"), source->value("kind", "?"), source->value("path", "?"));
  }
  nlohmann::json cache_recorded = record->value("cache", nlohmann::json::object());
  cache_recorded.erase("xxh64");
  if (cache_recorded != *now) return "the cache file was changed or replaced after it was made";
  return std::nullopt;
}

void make_cache_dir(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    throw IoError(fmt::format("cannot make the token cache directory '{}': {}; it lies in strata.checkpoint.dir (or "
                              "strata-run/ without one): choose a directory that can hold it",
                              dir, ec.message()),
                  ec.value());
  }
}

// Holds DIR/.strata-tokenize.lock: one run at a time makes the caches of a directory.
class TokenizeLock {
 public:
  explicit TokenizeLock(const std::string& dir) {
    const std::string path = dir + "/.strata-tokenize.lock";
    fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd_.valid()) {
      const int err = errno;
      throw IoError(fmt::format("cannot create the lock file {} of the token caches in {}: {}{}", path, dir,
                                errno_text(err), err == ELOOP ? " (a symbolic link; remove it)" : ""),
                    err);
    }
    while (::flock(fd_.get(), LOCK_EX) != 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      throw IoError(fmt::format("cannot lock {}: {}", path, errno_text(err)), err);
    }
  }

 private:
  UniqueFd fd_;
};

// Writes `tokens` to `cache` and then its record.
void write_cache(const std::string& cache, const std::vector<std::uint32_t>& tokens, const nlohmann::json& source,
                 std::string_view content) {
  models::write_token_file(cache, tokens, models::ByteTokenizer::kVocabSize);
  nlohmann::json cache_id = *file_stat(cache);
  cache_id["xxh64"] = file_xxh64(cache);
  nlohmann::json src = source;
  src["xxh64"] = xxh64_of(content);
  const nlohmann::json record = {{"format", kRecordFormat}, {"version", 1}, {"tokenizer", kTokenizer},
                                 {"source", src}, {"cache", cache_id}};
  const std::string text = record.dump(1) + "\n";
  AtomicFileWriter out(cache + ".source");
  out.append(text.data(), text.size());
  out.commit();
}

}  // namespace

std::string fortunes_token_cache(const std::string& cache_dir, const std::string& fortunes_dir) {
  const std::string train = cache_dir + "/train.tok", val = cache_dir + "/val.tok";
  const std::optional<nlohmann::json> source = fortunes_source(fortunes_dir);
  auto reason = [&] {
    std::optional<std::string> why = stale_reason(train, source);
    return why ? why : stale_reason(val, source);
  };
  if (!reason()) return train;
  make_cache_dir(cache_dir);
  const TokenizeLock lock(cache_dir);
  const std::optional<std::string> why = reason();  // another run may have made it meanwhile
  if (!why) return train;
  const models::TextCorpus corpus = models::load_fortunes(fortunes_dir);  // throws naming the directory
  if (!source) throw IoError(fmt::format("cannot list the fortunes directory '{}'", fortunes_dir), EIO);
  spdlog::info("tokenizing the fortunes corpus into {} ({})", cache_dir, *why);
  write_cache(train, models::ByteTokenizer::encode(corpus.train), *source, corpus.train + corpus.validation);
  write_cache(val, models::ByteTokenizer::encode(corpus.validation), *source, corpus.train + corpus.validation);
  return train;
}

void text_token_cache(const std::string& source_path, const std::string& what, const std::string& cache) {
  const std::optional<nlohmann::json> source = text_source(source_path);
  if (!source) {
    struct stat st {};
    const bool exists = ::stat(source_path.c_str(), &st) == 0;
    throw ConfigError(fmt::format("{}: cannot open '{}': {}", what, source_path,
                                  exists ? std::string("not a regular file") : errno_text(errno)));
  }
  if (!stale_reason(cache, source)) return;
  const std::string dir = fs::path(cache).parent_path().string();
  make_cache_dir(dir);
  const TokenizeLock lock(dir);
  const std::optional<std::string> why = stale_reason(cache, source);
  if (!why) return;  // another run made it meanwhile
  const std::string content = read_text_file(source_path, what);
  spdlog::info("tokenizing {} into {} ({})", source_path, cache, *why);
  write_cache(cache, models::ByteTokenizer::encode(content), *source, content);
}

nlohmann::json token_data_identity(const std::string& path) {
  std::error_code ec;
  const std::optional<nlohmann::json> now = file_stat(path);
  nlohmann::json id = {{"path", fs::weakly_canonical(path, ec).string()},
                       {"bytes", now ? (*now)["bytes"] : nlohmann::json(0)}};
  if (!stale_reason(path, std::nullopt)) {
    id["xxh64"] = (*read_record(path))["cache"]["xxh64"];
  } else {
    id["xxh64"] = file_xxh64(path);
  }
  return id;
}

void check_resumed_data(const nlohmann::json& manifest, const nlohmann::json& data, bool allow_new_data,
                        const std::string& checkpoint) {
  const nlohmann::json saved = manifest.is_object() ? manifest.value("data", nlohmann::json()) : nlohmann::json();
  if (!saved.is_object() || !saved.contains("xxh64")) {
    spdlog::warn("checkpoint {} records no identity of the data it was trained on (written by an older Strata); "
                 "this run cannot check that it resumes on the same data",
                 checkpoint);
    return;
  }
  if (saved["xxh64"] == data.value("xxh64", nlohmann::json())) return;
  const auto describe = [](const nlohmann::json& d) {
    return fmt::format("'{}' ({} bytes, xxh64 {})", d.value("path", "?"), d.value("bytes", nlohmann::json(0)).dump(),
                       d.value("xxh64", "?"));
  };
  if (allow_new_data) {
    spdlog::warn("--allow-new-data: resuming checkpoint {}, trained on {}, on other data {}", checkpoint,
                 describe(saved), describe(data));
    return;
  }
  throw ConfigError(fmt::format("--resume {}: the checkpoint was trained on {}, but this run's data is {}: other "
                                "data. Resume on the data it was trained on, or pass --allow-new-data to go on "
                                "training on this data",
                                checkpoint, describe(saved), describe(data)));
}

}  // namespace strata::train
