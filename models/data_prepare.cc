// `strata data prepare`'s work: documents read, mixed, encoded and written (see models/data_prepare.h).
#include "models/data_prepare.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include <tbb/enumerable_thread_specific.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/file_io.h"
#include "config/json_input.h"
#include "models/chat_template.h"
#include "models/token_data.h"

namespace strata::models {

namespace {

std::uint64_t mix(std::uint64_t x) {  // splitmix64's finalizer
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform draw in [0, 1) fixed by (seed, purpose, source, document).
double draw(std::uint64_t seed, std::uint64_t purpose, std::uint64_t source, std::uint64_t doc) {
  const std::uint64_t h = mix(mix(mix(seed ^ purpose) ^ source) ^ doc);
  return static_cast<double>(h >> 11) * 0x1.0p-53;
}

struct Entry {
  std::uint32_t source;
  std::uint32_t doc;
};

// A text file's documents: the whole file, its paragraphs or its lines.
std::vector<SourceDocument> read_text_documents(const std::string& path, const std::string& contents,
                                                TextDocuments text_documents) {
  std::vector<SourceDocument> docs;
  check_utf8(contents, fmt::format("text file '{}'", path));
  if (text_documents == TextDocuments::File) {
    docs.push_back({false, {}, contents, 1, {}});
    return docs;
  }
  std::size_t begin = 0, line = 0, doc_begin = 0, doc_end = 0, doc_line = 0;
  bool open = false;  // a document has begun and not been flushed
  const auto flush = [&] {
    if (open) docs.push_back({false, {}, contents.substr(doc_begin, doc_end - doc_begin), doc_line, {}});
    open = false;
  };
  while (begin < contents.size()) {
    std::size_t end = contents.find('\n', begin);
    if (end == std::string::npos) end = contents.size();
    ++line;
    const bool blank = contents.find_first_not_of(" \t\r", begin) >= end;
    if (blank || text_documents == TextDocuments::Lines) flush();
    if (!blank) {
      if (!open) doc_begin = begin, doc_line = line, open = true;
      // A paragraph keeps the newlines inside it; a line document drops its own.
      doc_end = text_documents == TextDocuments::Lines ? end : std::min(end + 1, contents.size());
    }
    begin = end + 1;
  }
  flush();
  return docs;
}

using FailFn = std::function<void(const std::string&)>;  // throws the line's FormatError

// Whether a chat's "messages" are well formed and hold an assistant message.
bool chat_has_reply(const nlohmann::json& messages, const FailFn& fail) {
  if (!messages.is_array() || messages.empty()) {
    fail(fmt::format("\"messages\" is {}, not a non-empty array of messages", json_excerpt(messages)));
  }
  bool has_reply = false;
  for (std::size_t m = 0; m < messages.size(); ++m) {
    const auto& message = messages[m];
    const auto field = [&](const char* key) -> const std::string& {
      if (!message.is_object()) fail(fmt::format("message {} is {}, not an object with \"role\" and \"content\"", m + 1, json_excerpt(message)));
      const auto f = message.find(key);
      if (f == message.end()) fail(fmt::format("message {} has no \"{}\" (each message needs \"role\" and \"content\")", m + 1, key));
      if (!f->is_string()) fail(fmt::format("message {}'s \"{}\" is {}, not a string", m + 1, key, json_excerpt(*f)));
      return f->get_ref<const std::string&>();
    };
    has_reply = field("role") == "assistant" || has_reply;
    field("content");
  }
  return has_reply;
}

// One JSONL line's document (a text, a prompt and completion, or a chat), or none: a chat without
// a reply (counted in `chats_without_reply`).
std::optional<SourceDocument> read_jsonl_row(std::string_view row, std::uint64_t line, const std::string& text_field,
                                             const FailFn& fail, std::uint64_t* chats_without_reply) {
  JsonInputError error;
  const auto value = parse_json_input(row, JsonComments::Refuse, &error);
  if (!value) fail(fmt::format("{} at {}; each line must be one JSON object", error.message, json_error_place(row, error)));
  if (!value->is_object()) fail("not a JSON object; each line must be one JSON object");
  const auto string_field = [&](const std::string& key) -> const std::string* {
    const auto it = value->find(key);
    if (it == value->end()) return nullptr;
    if (!it->is_string()) fail(fmt::format("the \"{}\" field is {}, not a string", key, json_excerpt(*it)));
    return it->get_ptr<const std::string*>();
  };
  if (const std::string* text = string_field(text_field)) return SourceDocument{false, {}, *text, line, {}};
  const std::string* prompt = string_field("prompt");
  const std::string* completion = string_field("completion");
  if (prompt != nullptr && completion != nullptr) return SourceDocument{true, *prompt, *completion, line, {}};
  if (const auto it = value->find("messages"); it != value->end()) {
    if (!chat_has_reply(*it, fail)) {
      if (chats_without_reply != nullptr) ++*chats_without_reply;
      return std::nullopt;
    }
    SourceDocument doc;
    doc.line = line;
    doc.chat_messages = it->dump();
    return doc;
  }
  std::vector<std::string> keys;
  for (const auto& [key, v] : value->items()) keys.push_back(key);
  fail(fmt::format("no \"{}\" field, no \"prompt\" + \"completion\" pair and no chat \"messages\" (it has: {}); "
                   "give the text field with --field or fix the line",
                   text_field, keys.empty() ? std::string("no fields") : fmt::format("{}", fmt::join(keys, ", "))));
  return std::nullopt;
}

}  // namespace

std::vector<SourceDocument> read_documents(const std::string& path, const std::string& contents,
                                           const std::string& text_field, TextDocuments text_documents,
                                           std::uint64_t* chats_without_reply) {
  if (!path.ends_with(".jsonl")) return read_text_documents(path, contents, text_documents);
  std::vector<SourceDocument> docs;
  std::size_t begin = 0, line = 0;
  while (begin < contents.size()) {
    std::size_t end = contents.find('\n', begin);
    if (end == std::string::npos) end = contents.size();
    ++line;
    const std::string_view row(contents.data() + begin, end - begin);
    begin = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const FailFn fail = [&](const std::string& what) {
      throw FormatError(fmt::format("JSONL file '{}' line {}: {}", path, line, what));
    };
    if (auto doc = read_jsonl_row(row, line, text_field, fail, chats_without_reply)) docs.push_back(std::move(*doc));
  }
  return docs;
}

namespace {

// The token that ends each document, the one that may begin it, and whether it does.
struct Separators {
  std::uint32_t eos = 0;
  std::optional<std::uint32_t> bos;
  bool add_bos = false;
};

Separators check_options(const Tokenizer& tokenizer, const PrepareOptions& o) {
  if (o.sources.empty()) throw ConfigError("strata data prepare: give at least one --input file");
  for (const auto& s : o.sources) {
    if (!(s.weight > 0) || !std::isfinite(s.weight)) {
      throw ConfigError(fmt::format("--weight {} for '{}' must be a positive number (2 repeats its documents twice, "
                                    "0.5 takes half of them)",
                                    s.weight, s.path));
    }
  }
  if (!(o.val_fraction >= 0 && o.val_fraction < 1)) {
    throw ConfigError(fmt::format("--val-fraction {} must be at least 0 and below 1", o.val_fraction));
  }
  std::optional<std::uint32_t> eos = tokenizer.eos_id();
  if (o.eos_token) {
    eos = tokenizer.token_id(*o.eos_token);
    if (!eos) throw ConfigError(fmt::format("--eos '{}' is not a token of '{}'", *o.eos_token, tokenizer.identity().path));
  }
  if (!eos) {
    throw ConfigError(fmt::format("the tokenizer '{}' names no end-of-text token (no eos_token in tokenizer_config.json); "
                                  "give the token that separates documents with --eos",
                                  tokenizer.identity().path));
  }
  const std::optional<std::uint32_t> bos_candidate = tokenizer.bos_id();
  if (o.bos == BosPolicy::Always && !bos_candidate) {
    throw ConfigError(fmt::format("--bos always: the tokenizer '{}' has no BOS token", tokenizer.identity().path));
  }
  const bool add_bos = o.bos == BosPolicy::Always || (o.bos == BosPolicy::Auto && bos_candidate && bos_candidate != eos);
  return Separators{*eos, bos_candidate, add_bos};
}

// The documents of every source, in source order; their bytes join the identity of the data.
std::vector<std::vector<SourceDocument>> read_sources(const PrepareOptions& o, PrepareReport& report,
                                                      std::vector<std::uint64_t>& identity) {
  std::vector<std::vector<SourceDocument>> docs(o.sources.size());
  for (std::size_t s = 0; s < o.sources.size(); ++s) {
    const std::string contents = read_text_file(o.sources[s].path, "data file");
    identity.push_back(XXH64(contents.data(), contents.size(), 0));
    identity.push_back(static_cast<std::uint64_t>(o.sources[s].weight * 1e9));
    std::uint64_t without_reply = 0;
    docs[s] = read_documents(o.sources[s].path, contents, o.text_field, o.text_documents, &without_reply);
    if (without_reply > 0) {
      spdlog::warn("'{}': {} conversations have no assistant message and were left out (none of their tokens would "
                   "count toward the loss)",
                   o.sources[s].path, without_reply);
    }
    report.chats_without_reply += without_reply;
    report.source_documents += docs[s].size();
    report.source_bytes += contents.size();
  }
  return docs;
}

// Chats are rendered in one renderer for all sources; each chat's assistant spans are kept by its
// index among all documents (`first`: each source's first index).
std::vector<std::vector<ByteSpan>> render_chats(const Tokenizer& tokenizer, const PrepareOptions& o,
                                                std::vector<std::vector<SourceDocument>>& docs,
                                                const std::vector<std::size_t>& first, PrepareReport& report,
                                                std::vector<std::uint64_t>& identity) {
  std::vector<std::vector<ByteSpan>> assistant(report.source_documents);
  std::vector<std::string> conversations;
  for (const auto& d : docs) {
    for (const auto& doc : d) {
      if (doc.is_chat()) conversations.push_back(doc.chat_messages);
    }
  }
  if (conversations.empty()) return assistant;
  if (tokenizer.identity().kind != TokenizerKind::ByteLevelBpe) {
    throw ConfigError(fmt::format("chat \"messages\" need a byte-level BPE tokenizer (tokenizer.json) in this build; "
                                  "'{}' is {}, whose tokens do not map onto the rendered text byte for byte; give "
                                  "the data as \"prompt\" and \"completion\" fields",
                                  tokenizer.identity().path, tokenizer_kind_name(tokenizer.identity().kind)));
  }
  const auto render_start = std::chrono::steady_clock::now();
  const ChatTemplate chat_template = load_chat_template(tokenizer.identity().path, tokenizer);
  report.chat_template = chat_template.source;
  const std::string variables = chat_template.variables.dump();
  identity.push_back(XXH64(chat_template.text.data(), chat_template.text.size(), 0));
  identity.push_back(XXH64(variables.data(), variables.size(), 0));
  std::vector<RenderedChat> rendered = ChatRenderer(chat_template).render(conversations);
  std::size_t c = 0;
  for (std::size_t s = 0; s < docs.size(); ++s) {
    for (std::size_t d = 0; d < docs[s].size(); ++d) {
      SourceDocument& doc = docs[s][d];
      if (!doc.is_chat()) continue;
      RenderedChat& r = rendered[c++];
      if (!r.error.empty()) {
        throw FormatError(fmt::format("JSONL file '{}' line {}: {} ({})", o.sources[s].path, doc.line, r.error,
                                      chat_template.source));
      }
      doc.text = std::move(r.text);
      assistant[first[s] + d] = std::move(r.assistant);
    }
  }
  report.chats = conversations.size();
  report.render_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - render_start).count();
  return assistant;
}

// Which documents go where, decided before encoding so the order depends on the seed alone.
void split_documents(const PrepareOptions& o, const std::vector<std::vector<SourceDocument>>& docs,
                     const PrepareReport& report, std::vector<Entry>& train, std::vector<Entry>& validation) {
  for (std::uint32_t s = 0; s < docs.size(); ++s) {
    const double w = o.sources[s].weight;
    const auto whole = static_cast<std::uint64_t>(std::floor(w));
    for (std::uint32_t d = 0; d < docs[s].size(); ++d) {
      if (draw(o.seed, 1, s, d) < o.val_fraction) {
        validation.push_back({s, d});
        continue;
      }
      const std::uint64_t copies = whole + (draw(o.seed, 2, s, d) < w - std::floor(w) ? 1 : 0);
      for (std::uint64_t c = 0; c < copies; ++c) train.push_back({s, d});
    }
  }
  if (train.empty()) {
    throw ConfigError(fmt::format("no document is left for training ({} documents, --val-fraction {}); give more "
                                  "documents (--text-documents paragraphs or lines splits text files) or a smaller "
                                  "--val-fraction",
                                  report.source_documents, o.val_fraction));
  }
  if (o.val_fraction > 0 && validation.empty()) {
    spdlog::warn("the validation split drew none of the {} documents (--val-fraction {}); val.tok will be empty",
                 report.source_documents, o.val_fraction);
  }
  // Fisher-Yates with our own draws: std::shuffle's sequence differs between standard libraries.
  for (std::size_t i = train.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(mix(o.seed ^ mix(i)) % i);
    std::swap(train[i - 1], train[j]);
  }
}

// Every document's tokens, by its index among all documents.
struct EncodedDocuments {
  std::vector<std::vector<std::uint32_t>> prompt_ids, text_ids;
  std::vector<std::vector<std::uint8_t>> chat_masks;
};

// Encodes every document once, in parallel over documents.
EncodedDocuments encode_documents(const Tokenizer& tokenizer, const PrepareOptions& o,
                                  const std::vector<std::vector<SourceDocument>>& docs,
                                  const std::vector<std::size_t>& first,
                                  const std::vector<std::vector<ByteSpan>>& assistant, PrepareReport& report,
                                  const PrepareProgress& progress) {
  EncodedDocuments out;
  out.prompt_ids.resize(report.source_documents);
  out.text_ids.resize(report.source_documents);
  out.chat_masks.resize(report.source_documents);
  std::atomic<std::uint64_t> done_bytes{0};
  tbb::enumerable_thread_specific<std::unique_ptr<EncodeScratch>> scratch([&] { return tokenizer.new_scratch(); });
  const auto start = std::chrono::steady_clock::now();
  tbb::task_arena arena(o.threads > 0 ? o.threads : tbb::task_arena::automatic);
  arena.execute([&] {
    tbb::parallel_for(tbb::blocked_range<std::size_t>(0, report.source_documents, 8), [&](const auto& r) {
      EncodeScratch& sc = *scratch.local();
      std::uint64_t bytes = 0;
      for (std::size_t k = r.begin(); k != r.end(); ++k) {
        const auto s = static_cast<std::size_t>(std::upper_bound(first.begin(), first.end(), k) - first.begin() - 1);
        const SourceDocument& doc = docs[s][k - first[s]];
        // Text files were checked whole (their message names the line); JSONL strings are valid
        // UTF-8 once parsed.
        tokenizer.encode_into(doc.prompt, sc, out.prompt_ids[k]);
        tokenizer.encode_into(doc.text, sc, out.text_ids[k]);
        if (doc.is_chat()) {
          out.chat_masks[k] = assistant_token_mask(tokenizer, out.text_ids[k], doc.text, assistant[k],
                                                   fmt::format("JSONL file '{}' line {}", o.sources[s].path, doc.line));
        }
        bytes += doc.prompt.size() + doc.text.size();
      }
      const std::uint64_t now = done_bytes += bytes;
      if (progress) progress(now, report.source_bytes);
    });
  });
  report.encode_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace

PrepareReport prepare_token_data(const Tokenizer& tokenizer, const PrepareOptions& o, const PrepareProgress& progress) {
  const Separators sep = check_options(tokenizer, o);
  PrepareReport report;
  std::vector<std::uint64_t> identity = {tokenizer.identity().file_hash, o.seed,
                                         static_cast<std::uint64_t>(o.val_fraction * 1e9), sep.add_bos, sep.eos,
                                         XXH64(o.text_field.data(), o.text_field.size(), 0),
                                         static_cast<std::uint64_t>(o.text_documents)};
  std::vector<std::vector<SourceDocument>> docs = read_sources(o, report, identity);
  std::vector<std::size_t> first(docs.size() + 1, 0);
  for (std::size_t s = 0; s < docs.size(); ++s) first[s + 1] = first[s] + docs[s].size();
  const std::vector<std::vector<ByteSpan>> assistant = render_chats(tokenizer, o, docs, first, report, identity);
  report.source_hash = XXH64(identity.data(), identity.size() * sizeof(std::uint64_t), 0);

  std::vector<Entry> train, validation;
  split_documents(o, docs, report, train, validation);
  const EncodedDocuments encoded = encode_documents(tokenizer, o, docs, first, assistant, report, progress);
  for (const auto& d : docs) {
    for (const auto& doc : d) report.has_loss_mask = report.has_loss_mask || doc.has_prompt || doc.is_chat();
  }

  ensure_directory(o.out_dir, "--out");
  const auto write_split = [&](const std::vector<Entry>& entries, const std::string& name, PrepareSplit& split) {
    std::vector<std::uint32_t> tokens;
    std::vector<std::uint8_t> mask;
    for (const Entry& e : entries) {
      const std::size_t k = first[e.source] + e.doc;
      const std::vector<std::uint32_t>& text_ids = encoded.text_ids[k];
      if (docs[e.source][e.doc].is_chat()) {  // the template's tokens as they are: Note [Chat templates] in models/chat_template.h
        tokens.insert(tokens.end(), text_ids.begin(), text_ids.end());
        mask.insert(mask.end(), encoded.chat_masks[k].begin(), encoded.chat_masks[k].end());
        continue;
      }
      const std::vector<std::uint32_t>& prompt_ids = encoded.prompt_ids[k];
      const bool prompted = docs[e.source][e.doc].has_prompt;
      if (sep.add_bos) tokens.push_back(*sep.bos), mask.push_back(prompted ? 0 : 1);
      tokens.insert(tokens.end(), prompt_ids.begin(), prompt_ids.end());
      mask.insert(mask.end(), prompt_ids.size(), 0);
      tokens.insert(tokens.end(), text_ids.begin(), text_ids.end());
      tokens.push_back(sep.eos);
      mask.insert(mask.end(), text_ids.size() + 1, 1);
    }
    split.documents = entries.size();
    split.tokens = tokens.size();
    split.masked_tokens = static_cast<std::uint64_t>(std::count(mask.begin(), mask.end(), 0));
    split.path = (std::filesystem::path(o.out_dir) / name).string();
    TokenFileMeta meta;
    meta.vocab_size = tokenizer.vocab_size();
    meta.tokenizer_hash = tokenizer.identity().file_hash;
    meta.tokenizer_kind = tokenizer.identity().kind == TokenizerKind::ByteLevelBpe ? 1 : 2;
    meta.source_hash = report.source_hash;
    if (report.has_loss_mask) meta.loss_mask = mask;
    write_token_file(split.path, tokens, meta);
  };
  write_split(train, "train.tok", report.train);
  if (o.val_fraction > 0) write_split(validation, "val.tok", report.validation);
  return report;
}

}  // namespace strata::models
