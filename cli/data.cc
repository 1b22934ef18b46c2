// `strata data prepare` (models/data_prepare.h does the work), `strata data inspect` (a token file's
// header and first documents, decoded) and `strata data tokenize`: a model folder's tokenizer (models/tokenizer.h) over a text file (one
// document) or a JSONL file (one document per line, its "text" field), in parallel over documents.
// Writes the ids as flat little-endian uint32 (what `--flat-u32` token readers take) or prints them,
// one line per document, and reports the throughput. The reference test against HF tokenizers
// (tests/models/tokenizer_reference_test.sh) runs through it.
#include "cli/commands.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <initializer_list>
#include <utility>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "models/data_prepare.h"
#include "models/token_data.h"
#include "models/tokenizer.h"
#include "train/output_file.h"

namespace strata::cli {

namespace {

struct TokenizeOptions {
  std::string tokenizer;
  std::string text;
  std::string jsonl;
  std::string field = "text";
  std::string out;
  int threads = 0;
  bool json = false;
};

int run_tokenize(const TokenizeOptions& o) {
  if (o.text.empty() == o.jsonl.empty()) throw ConfigError("strata data tokenize: give exactly one of --text FILE and --jsonl FILE");
  if (o.threads < 0) throw ConfigError(fmt::format("--threads {} must be 0 (all cores) or more", o.threads));
  train::check_output_path(o.out, "--out", train::OutputWrite::Replaced);
  train::check_output_not_input(o.out, "--out", {o.text, o.jsonl}, {o.tokenizer});
  const auto tokenizer = models::load_tokenizer(o.tokenizer);
  const std::string& input = o.text.empty() ? o.jsonl : o.text;
  if (!o.jsonl.empty() && !o.jsonl.ends_with(".jsonl")) {
    throw ConfigError(fmt::format("--jsonl '{}': the file name must end in .jsonl", o.jsonl));
  }
  if (!o.text.empty() && o.text.ends_with(".jsonl")) {
    throw ConfigError(fmt::format("--text '{}' is a JSONL file; give it with --jsonl", o.text));
  }
  const std::string contents = read_text_file(input, o.text.empty() ? "JSONL file" : "text file");
  const auto source = models::read_documents(input, contents, o.field);
  std::vector<std::string_view> docs;
  for (const auto& d : source) {
    if (d.is_chat()) {
      throw FormatError(fmt::format("JSONL file '{}' line {}: a chat (\"messages\"); `strata data tokenize` encodes one "
                                    "text per line, `strata data prepare` renders chats with the model's chat template",
                                    input, d.line));
    }
    if (d.has_prompt) {
      throw FormatError(fmt::format("JSONL file '{}' line {}: a prompt/completion pair; `strata data tokenize` encodes "
                                    "one text per line, `strata data prepare` takes pairs",
                                    input, d.line));
    }
    docs.push_back(d.text);
  }
  std::size_t bytes = 0;
  for (auto d : docs) bytes += d.size();

  const auto start = std::chrono::steady_clock::now();
  const auto ids = models::encode_documents(*tokenizer, docs, o.threads, fmt::format("'{}'", input));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::size_t tokens = 0;
  for (const auto& d : ids) tokens += d.size();

  if (!o.out.empty()) {
    AtomicFileWriter out(o.out);
    for (const auto& d : ids) out.append(d.data(), d.size() * sizeof(std::uint32_t));
    out.commit();
  } else {
    std::string text;
    for (const auto& d : ids) text += fmt::format("{}\n", fmt::join(d, " "));
    std::fwrite(text.data(), 1, text.size(), stdout);
  }
  const auto& id = tokenizer->identity();
  const double mb_per_s = seconds > 0 ? static_cast<double>(bytes) / 1e6 / seconds : 0.0;
  if (o.json) {
    nlohmann::json row = {{"tokenizer", id.path},     {"kind", models::tokenizer_kind_name(id.kind)},
                          {"hash", fmt::format("{:016x}", id.file_hash)},
                          {"vocab_size", tokenizer->vocab_size()},
                          {"documents", docs.size()}, {"bytes", bytes},
                          {"tokens", tokens},         {"seconds", seconds},
                          {"mb_per_s", mb_per_s},     {"threads", o.threads}};
    fmt::print(stderr, "{}\n", row.dump());
  } else {
    fmt::print(stderr, "{} documents, {:.1f} MB -> {} tokens in {:.3f} s: {:.1f} MB/s ({} threads; {} '{}', vocab {}, "
                       "hash {:016x})\n",
               docs.size(), static_cast<double>(bytes) / 1e6, tokens, seconds, mb_per_s,
               o.threads == 0 ? std::string("all") : std::to_string(o.threads), models::tokenizer_kind_name(id.kind),
               id.path, tokenizer->vocab_size(), id.file_hash);
  }
  return 0;
}

struct PrepareCliOptions {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::vector<double> weights;
  std::string bos = "auto";
  std::string eos;
  std::string text_documents = "file";
  bool json = false;
  models::PrepareOptions prepare;
};

// The value of a flag with named choices; ConfigError listing them otherwise.
template <typename E>
E parse_choice(const char* flag, const std::string& value, std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  for (const auto& [name, choice] : choices) {
    if (value == name) return choice;
    names += (names.empty() ? "" : ", ") + std::string(name);
  }
  throw ConfigError(fmt::format("{} '{}': give one of {}", flag, value, names));
}

int run_prepare(PrepareCliOptions o) {
  if (!o.weights.empty() && o.weights.size() != o.inputs.size()) {
    throw ConfigError(fmt::format("--weight was given {} times for {} --input files; give one weight per input, in "
                                  "the same order, or none",
                                  o.weights.size(), o.inputs.size()));
  }
  for (std::size_t i = 0; i < o.inputs.size(); ++i) {
    o.prepare.sources.push_back({o.inputs[i], o.weights.empty() ? 1.0 : o.weights[i]});
  }
  o.prepare.bos = parse_choice<models::BosPolicy>(
      "--bos", o.bos,
      {{"auto", models::BosPolicy::Auto}, {"always", models::BosPolicy::Always}, {"never", models::BosPolicy::Never}});
  o.prepare.text_documents = parse_choice<models::TextDocuments>("--text-documents", o.text_documents,
                                                                 {{"file", models::TextDocuments::File},
                                                                  {"paragraphs", models::TextDocuments::Paragraphs},
                                                                  {"lines", models::TextDocuments::Lines}});
  if (!o.eos.empty()) o.prepare.eos_token = o.eos;
  if (o.prepare.threads < 0) throw ConfigError(fmt::format("--threads {} must be 0 (all cores) or more", o.prepare.threads));
  train::check_output_not_input(o.prepare.out_dir + "/train.tok", "--out", o.inputs, {o.tokenizer});
  const auto tokenizer = models::load_tokenizer(o.tokenizer);
  // A progress line on a terminal, redrawn at each whole percent.
  const bool tty = ::isatty(STDERR_FILENO) != 0;
  std::atomic<int> shown{-1};
  const auto progress = [&](std::uint64_t done, std::uint64_t total) {
    if (!tty || total == 0) return;
    const int percent = static_cast<int>(100 * done / total);
    int before = shown.load();
    while (percent > before && !shown.compare_exchange_weak(before, percent)) {
    }
    if (percent > before) fmt::print(stderr, "\rencoding: {:3d}% of {:.1f} MB", percent, static_cast<double>(total) / 1e6);
  };
  const models::PrepareReport r = models::prepare_token_data(*tokenizer, o.prepare, progress);
  if (tty) fmt::print(stderr, "\n");
  const auto& id = tokenizer->identity();
  if (o.json) {
    const auto split = [](const models::PrepareSplit& s) {
      return nlohmann::json{{"path", s.path}, {"documents", s.documents}, {"tokens", s.tokens}, {"masked_tokens", s.masked_tokens}};
    };
    nlohmann::json row = {{"tokenizer", id.path},
                          {"hash", fmt::format("{:016x}", id.file_hash)},
                          {"vocab_size", tokenizer->vocab_size()},
                          {"source_documents", r.source_documents},
                          {"source_bytes", r.source_bytes},
                          {"source_hash", fmt::format("{:016x}", r.source_hash)},
                          {"loss_mask", r.has_loss_mask},
                          {"chats", r.chats},
                          {"chats_without_reply", r.chats_without_reply},
                          {"render_seconds", r.render_seconds},
                          {"train", split(r.train)},
                          {"encode_seconds", r.encode_seconds}};
    if (!r.validation.path.empty()) row["validation"] = split(r.validation);
    if (r.chats > 0) row["chat_template"] = r.chat_template;
    fmt::print("{}\n", row.dump());
    return 0;
  }
  fmt::print("{} documents ({:.1f} MB) from {} files, encoded in {:.2f} s by {} '{}' (vocab {}, hash {:016x})\n",
             r.source_documents, static_cast<double>(r.source_bytes) / 1e6, o.inputs.size(), r.encode_seconds,
             models::tokenizer_kind_name(id.kind), id.path, tokenizer->vocab_size(), id.file_hash);
  if (r.chats > 0) {
    fmt::print("{} chats rendered in {:.2f} s with {}{}\n", r.chats, r.render_seconds, r.chat_template,
               r.chats_without_reply > 0 ? fmt::format(" ({} without an assistant message left out)", r.chats_without_reply)
                                         : std::string());
  }
  for (const auto* s : {&r.train, &r.validation}) {
    if (s->path.empty()) continue;
    fmt::print("wrote {}: {} documents, {} tokens{}\n", s->path, s->documents, s->tokens,
               r.has_loss_mask ? fmt::format(" ({} masked from the loss)", s->masked_tokens) : std::string());
  }
  return 0;
}

struct InspectOptions {
  std::string file;
  std::string tokenizer;
  int samples = 3;
  bool flat_u32 = false;
};

// The header, then the first documents decoded with their masked spans marked.
int run_inspect(const InspectOptions& o) {
  if (o.samples < 0) throw ConfigError(fmt::format("--samples {} must be 0 or more", o.samples));
  const models::TokenFile data = models::TokenFile::open(o.file, o.flat_u32 ? models::FlatTokenWidth::U32 : models::FlatTokenWidth::U16);
  const char* kinds[] = {"bytes or unknown", "byte-level BPE", "SentencePiece"};
  fmt::print("{}: {} tokens of {} bytes; vocabulary {}; tokenizer {} (hash {:016x}); sources {:016x}; loss mask: {}\n",
             o.file, data.size(), data.token_bytes(), data.declared_vocab_size(),
             kinds[std::min<std::uint32_t>(data.tokenizer_kind(), 2)], data.tokenizer_hash(), data.source_hash(),
             data.has_loss_mask() ? "yes" : "no");
  if (o.tokenizer.empty() || o.samples == 0) return 0;
  const auto tokenizer = models::load_tokenizer(o.tokenizer);
  if (data.tokenizer_hash() != 0 && data.tokenizer_hash() != tokenizer->identity().file_hash) {
    throw FormatError(fmt::format("token file '{}' was written with the tokenizer of hash {:016x}, but '{}' has hash "
                                  "{:016x}; give the tokenizer the data was prepared with",
                                  o.file, data.tokenizer_hash(), tokenizer->identity().path,
                                  tokenizer->identity().file_hash));
  }
  data.check_vocab(static_cast<std::int64_t>(tokenizer->vocab_size()));
  const auto eos = tokenizer->eos_id();
  if (data.has_loss_mask()) fmt::print("(text between \u27ea and \u27eb is masked from the loss)\n");
  std::size_t t = 0;
  for (int d = 0; d < o.samples && t < data.size(); ++d) {
    std::string shown;
    const std::size_t begin = t;
    while (t < data.size()) {
      // A run of tokens with the same mask is decoded together, so characters are not cut.
      std::vector<std::uint32_t> run;
      const bool counts = data.counts_in_loss(t);
      bool end = false;
      while (t < data.size() && data.counts_in_loss(t) == counts && !end) {
        run.push_back(data[t]);
        end = eos && data[t] == *eos;
        ++t;
      }
      shown += counts ? tokenizer->decode(run) : "\u27ea" + tokenizer->decode(run) + "\u27eb";
      if (end) break;
    }
    fmt::print("--- document {} (tokens {}..{})\n{}\n", d + 1, begin, t - 1, shown);
  }
  return 0;
}

}  // namespace

void register_data(CLI::App& app, bench::CommandTable& table) {
  CLI::App* data = app.add_subcommand("data", "text to tokens through a model's tokenizer: prepare, tokenize, inspect");
  data->require_subcommand(1);
  auto o = std::make_shared<TokenizeOptions>();
  auto* cmd = data->add_subcommand("tokenize", "token ids of a text or JSONL file through a model folder's tokenizer");
  cmd->add_option("--tokenizer", o->tokenizer, "model folder with tokenizer.json or tokenizer.model (or the file)")->required();
  cmd->add_option("--text", o->text, "a UTF-8 text file, encoded as one document");
  cmd->add_option("--jsonl", o->jsonl, "a JSONL file, one document per line (its --field)");
  cmd->add_option("--field", o->field, "the JSONL field holding the text (default: text)");
  cmd->add_option("--out", o->out, "write the ids as flat little-endian uint32 here (default: print them)");
  cmd->add_option("--threads", o->threads, "encoding threads (default 0: all cores)");
  cmd->add_flag("--json", o->json, "report as one JSON object on stderr");
  table[cmd] = [o]() { return run_tokenize(*o); };

  auto p = std::make_shared<PrepareCliOptions>();
  auto* prep = data->add_subcommand("prepare", "token files for training (train.tok, val.tok) from text and JSONL files");
  prep->add_option("--tokenizer", p->tokenizer, "model folder with tokenizer.json or tokenizer.model (or the file)")->required();
  prep->add_option("--input", p->inputs, "a text file (one document) or a .jsonl file (per line: text, prompt + completion, or "
                                         "chat messages); repeat for several")->required();
  prep->add_option("--weight", p->weights, "one per --input, in order: how many times its documents enter training "
                                           "(fractions sample; default 1)");
  prep->add_option("--out", p->prepare.out_dir, "directory for train.tok and val.tok")->required();
  prep->add_option("--val-fraction", p->prepare.val_fraction, "share of the documents held out for val.tok (default 0)");
  prep->add_option("--seed", p->prepare.seed, "seed of the mix, the shuffle and the split (default 0)");
  prep->add_option("--threads", p->prepare.threads, "encoding threads (default 0: all cores)");
  prep->add_option("--field", p->prepare.text_field, "the JSONL field holding a document's text (default: text)");
  prep->add_option("--text-documents", p->text_documents,
                   "how a text file splits into documents: file (default), paragraphs (at blank lines) or lines");
  prep->add_option("--bos", p->bos, "auto (when the tokenizer has a BOS distinct from EOS), always or never");
  prep->add_option("--eos", p->eos, "the token ending each document (default: the tokenizer's EOS)");
  prep->add_flag("--json", p->json, "report as one JSON object");
  table[prep] = [p]() { return run_prepare(*p); };

  auto i = std::make_shared<InspectOptions>();
  auto* insp = data->add_subcommand("inspect", "a token file's header and its first documents decoded, masked spans marked");
  insp->add_option("file", i->file, "token file (Strata, llm.c or flat)")->required();
  insp->add_option("--tokenizer", i->tokenizer, "model folder to decode with (default: header only)");
  insp->add_option("--samples", i->samples, "documents to show (default 3)");
  insp->add_flag("--flat-u32", i->flat_u32, "a headerless token file holds uint32 tokens (default uint16)");
  table[insp] = [i]() { return run_inspect(*i); };
}

}  // namespace strata::cli
