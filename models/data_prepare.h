// Turning the user's text into a model's training data (`strata data prepare`): documents from text
// files and JSONL, encoded by the model's tokenizer (models/tokenizer.h) in parallel, mixed by
// weight, split into train and validation, and written as Strata token files (version 2,
// models/token_data.h) that name the tokenizer, the vocabulary and the sources.
//
// Documents: a text file (any name not ending in .jsonl) is one document, or one per paragraph or
// line (TextDocuments; more documents also encode in parallel); a JSONL file gives one per
// line, from its `text` field (all tokens count toward the loss), its `prompt` and `completion`
// fields (encoded separately, so the boundary is exact; the prompt's tokens are masked from the
// loss), or its chat `messages` (rendered with the model's chat template, models/chat_template.h;
// only the assistant replies' tokens count). Each text or prompt/completion document is [BOS] tokens
// EOS: BOS when the tokenizer has one distinct from EOS (as LLaMA's and SentencePiece's add it;
// GPT-2's has none), unless told otherwise. A chat is the template's tokens exactly, as
// transformers' apply_chat_template(messages, tokenize=True) gives them: the template places BOS
// and the end-of-turn tokens itself, so neither BOS nor EOS is added (see Note [Chat templates] in
// models/chat_template.h).
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
  std::uint64_t chats = 0, chats_without_reply = 0;  // conversations rendered; skipped for having no assistant message
  std::string chat_template;                         // where the template came from, when there were chats
  double render_seconds = 0;
  PrepareSplit train, validation;
  bool has_loss_mask = false;
  std::uint64_t source_hash = 0;
  double encode_seconds = 0;
};

// One document of a source: a text (every token counts toward the loss), a prompt and its
// completion (has_prompt; the prompt's tokens are masked), or a chat (its "messages" array as JSON
// text in `chat_messages`; `text` is empty until rendered). `line` is the JSONL line (1 for text).
struct SourceDocument {
  bool has_prompt = false;
  std::string prompt, text;
  std::uint64_t line = 1;
  std::string chat_messages;
  bool is_chat() const { return !chat_messages.empty(); }
};

// The documents of `contents`, read from `path`: a JSONL file (name ending in .jsonl) one per line,
// any other file as `text_documents` says. FormatError naming the file and line for invalid UTF-8, a line that
// is not a JSON object, a line without `text_field`, a prompt/completion pair or "messages", and
// "messages" that are not a non-empty array of objects with string "role" and "content". A chat
// without an assistant message is left out (nothing of it would count), counted in `*chats_without_reply`.
std::vector<SourceDocument> read_documents(const std::string& path, const std::string& contents,
                                           const std::string& text_field,
                                           TextDocuments text_documents = TextDocuments::File,
                                           std::uint64_t* chats_without_reply = nullptr);

// Called from the encoding threads with the bytes encoded so far and the total; must be thread-safe.
using PrepareProgress = std::function<void(std::uint64_t done_bytes, std::uint64_t total_bytes)>;

// ConfigError for bad options (a weight of 0 or below, a fraction outside [0, 1), no EOS token) and
// for chats that cannot be rendered (no python3 with jinja2, no template and none of the default's
// tokens, a template that does not compile); FormatError naming the file and line for a bad
// document (invalid UTF-8, a JSONL line that is not an object or lacks its fields, a conversation
// the chat template refuses or fails on). The chat template is the tokenizer's folder's
// (load_chat_template).
PrepareReport prepare_token_data(const Tokenizer& tokenizer, const PrepareOptions& options,
                                 const PrepareProgress& progress = {});

}  // namespace strata::models
