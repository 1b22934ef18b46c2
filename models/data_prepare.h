// Turning the user's text into a model's training data (`strata data prepare`): documents from text
// files and JSONL, encoded by the model's tokenizer (models/tokenizer.h) in parallel, mixed by
// weight, split into train and validation, and written as Strata token files (version 2,
// models/token_data.h) that name the tokenizer, the vocabulary and the sources.
//
// Documents: a text file (any name not ending in .jsonl) is one document, or one per paragraph or
// line (TextDocuments; more documents also encode in parallel); a JSONL file gives one per
// line, from its `text` field (all tokens count toward the loss) or its `prompt` and `completion`
// fields (encoded separately, so the boundary is exact; the prompt's tokens are masked from the
// loss). Each document is [BOS] tokens EOS: BOS when the tokenizer has one distinct from EOS (as
// LLaMA's and SentencePiece's add it; GPT-2's has none), unless told otherwise.
//
// Mixing: a source of weight w contributes each of its training documents floor(w) times, plus once
// more with probability frac(w) (a seeded hash of the document, so reruns agree); the documents of
// all sources are then shuffled together by the seed. The validation split takes each document with
// probability val_fraction (seeded hash), once, whatever its weight, and never into training too.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/tokenizer.h"

namespace strata::models {

struct DataSource {
  std::string path;
  double weight = 1.0;
};

enum class BosPolicy { Auto, Always, Never };

// How a text file (not JSONL) splits into documents: the whole file; paragraphs (separated by one
// or more blank lines, which belong to no document); or each non-blank line (its newline dropped).
enum class TextDocuments { File, Paragraphs, Lines };

struct PrepareOptions {
  std::vector<DataSource> sources;
  std::string out_dir;              // gets train.tok and, with val_fraction > 0, val.tok
  double val_fraction = 0.0;
  std::uint64_t seed = 0;
  int threads = 0;                  // 0: all cores
  std::string text_field = "text";
  TextDocuments text_documents = TextDocuments::File;
  BosPolicy bos = BosPolicy::Auto;
  std::optional<std::string> eos_token;  // instead of the tokenizer's own
};

struct PrepareSplit {
  std::uint64_t documents = 0, tokens = 0, masked_tokens = 0;
  std::string path;  // empty when the split was not written
};

struct PrepareReport {
  std::uint64_t source_documents = 0, source_bytes = 0;
  PrepareSplit train, validation;
  bool has_loss_mask = false;
  std::uint64_t source_hash = 0;
  double encode_seconds = 0;
};

// One document of a source: a text (every token counts toward the loss), or a prompt and its
// completion (has_prompt; the prompt's tokens are masked). `line` is the JSONL line (1 for text).
struct SourceDocument {
  bool has_prompt = false;
  std::string prompt, text;
  std::uint64_t line = 1;
};

// The documents of `contents`, read from `path`: a JSONL file (name ending in .jsonl) one per line,
// any other file as `text_documents` says. FormatError naming the file and line for invalid UTF-8, a line that
// is not a JSON object, a line without `text_field` or a prompt/completion pair, chat messages.
std::vector<SourceDocument> read_documents(const std::string& path, const std::string& contents,
                                           const std::string& text_field,
                                           TextDocuments text_documents = TextDocuments::File);

// Called from the encoding threads with the bytes encoded so far and the total; must be thread-safe.
using PrepareProgress = std::function<void(std::uint64_t done_bytes, std::uint64_t total_bytes)>;

// ConfigError for bad options (a weight of 0 or below, a fraction outside [0, 1), no EOS token);
// FormatError naming the file and line for a bad document (invalid UTF-8, a JSONL line that is not
// an object or lacks its fields, chat `messages`, which this build does not render).
PrepareReport prepare_token_data(const Tokenizer& tokenizer, const PrepareOptions& options,
                                 const PrepareProgress& progress = {});

}  // namespace strata::models
