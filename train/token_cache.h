// The token files `strata train` makes from a source (the fortunes corpus, a text file) and keeps in
// its data directory, and the identity of the data a run trains on, which its checkpoints record.
//
// Note [Token cache identity]: a cache X.tok has a record beside it, X.tok.source (JSON): its
// source's kind, canonical path, bytes and mtime (ns), the XXH64 of the source's content, the
// tokenizer, and the cache file's own bytes, mtime and XXH64. A cache is used only while its record
// matches the source and the cache file as they are now; otherwise it is made again and says why.
// So a text file named `train` cannot serve its tokens as the fortunes' train.tok, nor a replaced
// train.tok be trained on as the corpus it claims to be. Making a cache holds an exclusive flock on
// DIR/.strata-tokenize.lock (blocking, never unlinked, so no run can lock a file another has just
// removed): two runs that start at once in one directory make it once, and the second finds it
// made. The cache is written (atomically) before its record, so a crash between them leaves a
// record that does not match and the next run makes the cache again.
//
// A checkpoint records the identity of the token file its run trained on ({"path", "bytes",
// "xxh64"}, the manifest's "data"); a resume whose data has another XXH64 is refused unless the
// user asks for it (--allow-new-data). A checkpoint without a record (older Strata) is resumed with
// a warning that its data cannot be checked.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace strata::train {

// The fortunes corpus under `fortunes_dir` tokenized by bytes into `cache_dir`/train.tok and
// val.tok, made when missing or not matching their records; returns the path of train.tok.
std::string fortunes_token_cache(const std::string& cache_dir, const std::string& fortunes_dir);

// The text file `source` (named by `what`, e.g. "strata.data.train") tokenized by bytes into
// `cache`, made when missing or not matching its record.
void text_token_cache(const std::string& source, const std::string& what, const std::string& cache);

// The identity of the token file at `path`: {"path", "bytes", "xxh64"}, taken from its cache
// record when that matches the file, else read from the file.
nlohmann::json token_data_identity(const std::string& path);

// Refuses (ConfigError naming both data and the fix) resuming checkpoint `checkpoint`, whose
// manifest is `manifest`, on data other than it was trained on, unless `allow_new_data`; then,
// and for a checkpoint that records no data, warns.
void check_resumed_data(const nlohmann::json& manifest, const nlohmann::json& data, bool allow_new_data,
                        const std::string& checkpoint);

}  // namespace strata::train
