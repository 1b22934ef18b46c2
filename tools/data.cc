// `strata data tokenize`: a model folder's tokenizer (models/tokenizer.h) over a text file (one
// document) or a JSONL file (one document per line, its "text" field), in parallel over documents.
// Writes the ids as flat little-endian uint32 (what `--flat-u32` token readers take) or prints them,
// one line per document, and reports the throughput. The reference test against HF tokenizers
// (tests/models/tokenizer_reference_test.sh) runs through it.
#include "tools/commands.h"

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/file_io.h"
#include "engine/json_input.h"
#include "models/tokenizer.h"
#include "tools/output_file.h"

namespace strata::tools {

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

// The `field` string of each line of a JSONL file; blank lines are skipped. FormatError naming the
// file and line for a line that is not a JSON object or lacks the field.
std::vector<std::string> read_jsonl_field(const std::string& path, const std::string& text, const std::string& field) {
  std::vector<std::string> docs;
  std::size_t begin = 0, line = 0;
  while (begin < text.size()) {
    std::size_t end = text.find('\n', begin);
    if (end == std::string::npos) end = text.size();
    ++line;
    const std::string_view row(text.data() + begin, end - begin);
    begin = end + 1;
    if (row.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    JsonInputError error;
    const auto value = parse_json_input(row, JsonComments::Refuse, &error);
    if (!value || !value->is_object()) {
      throw FormatError(fmt::format("JSONL file '{}' line {}: {}; each line must be one JSON object", path, line,
                                    value ? "not a JSON object" : error.message + " at " + json_error_place(row, error)));
    }
    const auto it = value->find(field);
    if (it == value->end() || !it->is_string()) {
      throw FormatError(fmt::format("JSONL file '{}' line {}: {} \"{}\" string field; give the field to read with "
                                    "--field or fix the line",
                                    path, line, it == value->end() ? "no" : "a non-string", field));
    }
    docs.push_back(it->get<std::string>());
  }
  return docs;
}

int run_tokenize(const TokenizeOptions& o) {
  if (o.text.empty() == o.jsonl.empty()) throw ConfigError("strata data tokenize: give exactly one of --text FILE and --jsonl FILE");
  if (o.threads < 0) throw ConfigError(fmt::format("--threads {} must be 0 (all cores) or more", o.threads));
  check_output_path(o.out, "--out", OutputWrite::Replaced);
  check_output_not_input(o.out, "--out", {o.text, o.jsonl}, {o.tokenizer});
  const auto tokenizer = models::load_tokenizer(o.tokenizer);
  const std::string& input = o.text.empty() ? o.jsonl : o.text;
  std::string contents = read_text_file(input, o.text.empty() ? "JSONL file" : "text file");
  std::vector<std::string> storage;
  std::vector<std::string_view> docs;
  if (o.text.empty()) {
    storage = read_jsonl_field(input, contents, o.field);
    docs.assign(storage.begin(), storage.end());
  } else {
    docs.push_back(contents);
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

}  // namespace

void register_data(CLI::App& app, CommandTable& table) {
  CLI::App* data = app.add_subcommand("data", "tokenize text with a model's tokenizer");
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
}

}  // namespace strata::tools
