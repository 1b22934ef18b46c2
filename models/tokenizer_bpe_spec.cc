// Reading a tokenizer.json into a BpeSpec (see models/tokenizer_bpe.h). Every field that changes
// the ids is either implemented or refused here, naming the field and what this build reads, so a
// tokenizer that loads encodes as HF's does. Fields that cannot change encode's ids (truncation,
// padding, the post-processor: encode adds no special tokens) are read for BOS/EOS or ignored.
#include "models/tokenizer_bpe.h"

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <xxhash.h>

#include "core/error.h"
#include "core/file_io.h"
#include "config/json_input.h"

namespace strata::models {

namespace {

using nlohmann::json;

constexpr const char* kSupported =
    "this build reads byte-level BPE tokenizer.json files (GPT-2, LLaMA 3, Qwen2 style: model BPE, pre_tokenizer "
    "ByteLevel or Sequence of Split regexes then ByteLevel, normalizer none or NFC) and SentencePiece tokenizer.model "
    "files";

class SpecReader {
 public:
  explicit SpecReader(std::string path) : path_(std::move(path)) {}

  [[noreturn]] void unsupported(const std::string& field, const std::string& what) const {
    throw FormatError(fmt::format("tokenizer.json '{}': {} {} is not supported; {}", path_, field, what, kSupported));
  }
  [[noreturn]] void bad(const std::string& field, const std::string& what) const {
    throw FormatError(fmt::format("tokenizer.json '{}': {} {}; the file is damaged or not a Hugging Face tokenizer.json",
                                  path_, field, what));
  }

  const json& member(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key)) bad(where, fmt::format("has no field \"{}\"", key));
    return obj.at(key);
  }
  std::string string_of(const json& obj, const char* key, const std::string& where) const {
    const json& v = member(obj, key, where);
    if (!v.is_string()) bad(where + "." + key, fmt::format("is {}, not a string", json_excerpt(v)));
    return v.get<std::string>();
  }
  // A boolean that must hold `want` (absent counts as `absent`).
  void require_flag(const json& obj, const char* key, bool want, bool absent, const std::string& where) const {
    const bool value = obj.contains(key) && obj.at(key).is_boolean() ? obj.at(key).get<bool>() : absent;
    if (value != want) unsupported(where + "." + key, fmt::format("= {}", value));
  }
  bool flag(const json& obj, const char* key, bool absent) const {
    return obj.contains(key) && obj.at(key).is_boolean() ? obj.at(key).get<bool>() : absent;
  }

  void read_normalizer(const json& n, BpeSpec& spec) const {
    if (n.is_null()) return;
    const std::string type = string_of(n, "type", "normalizer");
    if (type == "NFC") {
      spec.nfc = true;
    } else if (type == "Sequence" && member(n, "normalizers", "normalizer").is_array()) {
      for (const json& inner : n.at("normalizers")) read_normalizer(inner, spec);
    } else {
      unsupported("normalizer.type", fmt::format("\"{}\" (this build implements none and NFC)", type));
    }
  }

  void read_byte_level(const json& p, BpeSpec& spec, const std::string& where) const {
    spec.add_prefix_space = flag(p, "add_prefix_space", true);
    if (flag(p, "use_regex", true)) spec.split_patterns.emplace_back(kGpt2SplitPattern);
    (void)where;
  }

  void read_split(const json& p, BpeSpec& spec, const std::string& where) const {
    const json& pattern = member(p, "pattern", where);
    std::string regex;
    if (pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      regex = pattern.at("Regex").get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") && pattern.at("String").is_string()) {
      regex = "\\Q" + pattern.at("String").get<std::string>() + "\\E";
      if (pattern.at("String").get<std::string>().find("\\E") != std::string::npos) {
        unsupported(where + ".pattern.String", "containing \\E");
      }
    } else {
      bad(where + ".pattern", "is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    const std::string behavior = string_of(p, "behavior", where);
    if (behavior != "Isolated") unsupported(where + ".behavior", fmt::format("\"{}\" (this build implements Isolated)", behavior));
    require_flag(p, "invert", false, false, where);
    spec.split_patterns.push_back(std::move(regex));
  }

  void read_pre_tokenizer(const json& p, BpeSpec& spec) const {
    if (p.is_null()) unsupported("pre_tokenizer", "null (no ByteLevel step: not a byte-level BPE)");
    const std::string type = string_of(p, "type", "pre_tokenizer");
    if (type == "ByteLevel") return read_byte_level(p, spec, "pre_tokenizer");
    if (type != "Sequence") unsupported("pre_tokenizer.type", fmt::format("\"{}\"", type));
    const json& list = member(p, "pretokenizers", "pre_tokenizer");
    if (!list.is_array() || list.empty()) bad("pre_tokenizer.pretokenizers", "is not a list of pre-tokenizers");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
      const std::string inner = string_of(list[i], "type", where);
      const bool last = i + 1 == list.size();
      if (inner == "Split" && !last) {
        read_split(list[i], spec, where);
      } else if (inner == "ByteLevel" && last) {
        read_byte_level(list[i], spec, where);
      } else {
        unsupported(where + ".type", fmt::format("\"{}\" {}", inner, last ? "as the last step (it must be ByteLevel)"
                                                                           : "(before ByteLevel only Split is implemented)"));
      }
    }
  }

  void read_decoder(const json& d) const {
    if (d.is_null()) unsupported("decoder", "null (a byte-level BPE decodes through ByteLevel)");
    const std::string type = string_of(d, "type", "decoder");
    if (type == "ByteLevel") return;
    if (type == "Sequence" && member(d, "decoders", "decoder").is_array() && d.at("decoders").size() == 1) {
      return read_decoder(d.at("decoders")[0]);
    }
    unsupported("decoder.type", fmt::format("\"{}\" (this build decodes ByteLevel)", type));
  }

  void read_model(const json& m, BpeSpec& spec) const {
    const std::string type = string_of(m, "type", "model");
    if (type != "BPE") unsupported("model.type", fmt::format("\"{}\"", type));
    if (m.contains("dropout") && !m.at("dropout").is_null() && !(m.at("dropout").is_number() && m.at("dropout").get<double>() == 0)) {
      unsupported("model.dropout", fmt::format("= {} (ids would be random; set it to null)", json_excerpt(m.at("dropout"))));
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.contains(key) && !m.at(key).is_null() && m.at(key) != "") {
        unsupported(std::string("model.") + key, fmt::format("= {}", json_excerpt(m.at(key))));
      }
    }
    require_flag(m, "byte_fallback", false, false, "model");
    spec.fuse_unk = flag(m, "fuse_unk", false);
    spec.ignore_merges = flag(m, "ignore_merges", false);
    const json& vocab = member(m, "vocab", "model");
    if (!vocab.is_object()) bad("model.vocab", "is not an object of token -> id");
    spec.vocab.reserve(vocab.size());
    for (const auto& [token, id] : vocab.items()) {
      if (!id.is_number_unsigned() || id.get<std::uint64_t>() > 0xFFFFFFFFull) {
        bad("model.vocab", fmt::format("gives token {} the id {}", json(token).dump(), json_excerpt(id)));
      }
      spec.vocab.emplace(token, id.get<std::uint32_t>());
    }
    const json& merges = member(m, "merges", "model");
    if (!merges.is_array()) bad("model.merges", "is not a list");
    spec.merges.reserve(merges.size());
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const json& e = merges[i];
      // tokenizers < 0.20 writes "a b"; later versions ["a", "b"] (which allows spaces in tokens).
      if (e.is_string()) {
        const std::string s = e.get<std::string>();
        const std::size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          bad(fmt::format("model.merges[{}]", i), fmt::format("is {}, not two tokens separated by one space", json(s).dump()));
        }
        spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {
        spec.merges.emplace_back(e[0].get<std::string>(), e[1].get<std::string>());
      } else {
        bad(fmt::format("model.merges[{}]", i), fmt::format("is {}, not a pair of tokens", json_excerpt(e)));
      }
    }
    if (m.contains("unk_token") && m.at("unk_token").is_string()) {
      const auto it = spec.vocab.find(m.at("unk_token").get<std::string>());
      if (it == spec.vocab.end()) bad("model.unk_token", "is not in model.vocab");
      spec.unk_id = it->second;
    }
  }

  void read_added(const json& list, BpeSpec& spec) const {
    if (list.is_null()) return;
    if (!list.is_array()) bad("added_tokens", "is not a list");
    for (std::size_t i = 0; i < list.size(); ++i) {
      const std::string where = fmt::format("added_tokens[{}]", i);
      const json& id = member(list[i], "id", where);
      if (!id.is_number_unsigned() || id.get<std::uint64_t>() > 0xFFFFFFFFull) bad(where + ".id", "is not a token id");
      BpeAddedToken t;
      t.id = id.get<std::uint32_t>();
      t.content = string_of(list[i], "content", where);
      if (t.content.empty()) bad(where + ".content", "is empty");
      t.single_word = flag(list[i], "single_word", false);
      t.lstrip = flag(list[i], "lstrip", false);
      t.rstrip = flag(list[i], "rstrip", false);
      t.special = flag(list[i], "special", false);
      t.normalized = flag(list[i], "normalized", !t.special);
      spec.added.push_back(std::move(t));
    }
  }

  // BOS/EOS as the TemplateProcessing post-processor places them around a single sequence.
  void read_post_processor(const json& p, BpeSpec& spec) const {
    if (!p.is_object()) return;
    if (p.value("type", "") == "Sequence" && p.contains("processors") && p.at("processors").is_array()) {
      for (const json& inner : p.at("processors")) read_post_processor(inner, spec);
      return;
    }
    if (p.value("type", "") != "TemplateProcessing" || !p.contains("single") || !p.at("single").is_array()) return;
    bool after_sequence = false;
    for (const json& piece : p.at("single")) {
      if (piece.contains("Sequence")) after_sequence = true;
      if (!piece.contains("SpecialToken") || !piece.at("SpecialToken").contains("id")) continue;
      const json& name = piece.at("SpecialToken").at("id");
      if (!name.is_string()) continue;
      auto& slot = after_sequence ? spec.eos_token : spec.bos_token;
      if (!slot) slot = name.get<std::string>();
    }
  }

 private:
  std::string path_;
};

// bos_token / eos_token of tokenizer_config.json: a string or {"content": ...}.
std::optional<std::string> config_token(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& v = config.at(key);
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v.at("content").is_string()) return v.at("content").get<std::string>();
  return std::nullopt;
}

}  // namespace

BpeSpec read_bpe_spec(const std::string& path) {
  const std::string text = read_text_file(path, "tokenizer.json");
  JsonInputError error;
  const auto doc = parse_json_input(text, JsonComments::Refuse, &error);
  if (!doc || !doc->is_object()) {
    throw FormatError(fmt::format("tokenizer.json '{}' is not a JSON object{}{}; download it again", path,
                                  doc ? "" : ": " + error.message,
                                  doc ? "" : " at " + json_error_place(text, error)));
  }
  const SpecReader r(path);
  BpeSpec spec;
  spec.path = path;
  spec.file_hash = XXH64(text.data(), text.size(), 0);
  // The model first: a WordPiece or Unigram file is refused for its model, the clearest reason.
  r.read_model(r.member(*doc, "model", "the file"), spec);
  r.read_normalizer(doc->value("normalizer", json()), spec);
  r.read_pre_tokenizer(doc->value("pre_tokenizer", json()), spec);
  r.read_decoder(doc->value("decoder", json()));
  r.read_added(doc->value("added_tokens", json()), spec);
  r.read_post_processor(doc->value("post_processor", json()), spec);

  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    const std::string config_text = read_text_file(config_path.string(), "tokenizer_config.json");
    JsonInputError config_error;
    const auto config = parse_json_input(config_text, JsonComments::Refuse, &config_error);
    if (!config) {
      throw FormatError(fmt::format("tokenizer_config.json '{}' is not valid JSON ({} at {}); fix or remove it",
                                    config_path.string(), config_error.message, json_error_place(config_text, config_error)));
    }
    if (auto bos = config_token(*config, "bos_token")) spec.bos_token = bos;
    if (auto eos = config_token(*config, "eos_token")) spec.eos_token = eos;
  }
  if (!spec.eos_token) {
    // Without a config the end-of-text token of the known families is the document separator.
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"}) {
      for (const auto& t : spec.added) {
        if (t.special && t.content == name && !spec.eos_token) spec.eos_token = name;
      }
    }
  }
  return spec;
}

}  // namespace strata::models
