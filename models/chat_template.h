// Chat conversations rendered as a model expects them: the chat template of a model folder
// (tokenizer_config.json's "chat_template") or the documented default, rendered by Python's jinja2
// in one python3 subprocess (models/chat_render.py, built into the binary), and the assistant
// replies' byte spans in the rendered text, from which the loss mask is made. See Note [Chat
// templates] in docs/DESIGN.md.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/tokenizer.h"

namespace strata::models {

// The default template when a folder has none: ChatML, each message as
// "<|im_start|>{role}\n{content}<|im_end|>\n", and "<|im_start|>assistant\n" as the generation prompt.
// It needs "<|im_start|>" and "<|im_end|>" to be single tokens of the tokenizer.
inline constexpr const char* kDefaultChatTemplate =
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + "
    "'\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

struct ChatTemplate {
  std::string text;
  std::string source;           // for messages: "the chat_template of 'PATH'" or "the default ChatML template"
  nlohmann::json variables;     // the special tokens transformers passes (bos_token, eos_token, ...)
  bool is_default = false;
  // The renderer returns the text in NFC (and the spans in it) for a tokenizer that normalizes to
  // NFC: the same ids, and tokens that add up to the text.
  bool nfc = false;
};

// The chat template for `model_folder` (a folder, or a tokenizer file in it): tokenizer_config.json's
// "chat_template" (a string, or a list of {"name", "template"} of which "default" is used), else the
// default ChatML template, which is refused (ConfigError) when `tokenizer` lacks its tokens. The
// variables are tokenizer_config.json's bos/eos/unk/sep/pad/cls/mask tokens and
// additional_special_tokens (special_tokens_map.json fills those it lacks), as strings.
ChatTemplate load_chat_template(const std::string& model_folder, const Tokenizer& tokenizer);

struct ByteSpan {
  std::uint64_t begin = 0, end = 0;
};

struct RenderedChat {
  std::string text;
  std::vector<ByteSpan> assistant;  // the replies' spans in `text`, in order
  std::string error;                // non-empty: the template refused or failed on this conversation
};

// One python3 subprocess (/usr/bin/python3, or $STRATA_CHAT_PYTHON) rendering with one template.
// Starting it compiles the template: a ConfigError says when python3 or jinja2 is missing (with the
// apt-get command) or the template does not compile. Move-only; the destructor closes the pipe and
// reaps the process.
class ChatRenderer {
 public:
  explicit ChatRenderer(const ChatTemplate& chat_template);
  ~ChatRenderer();
  ChatRenderer(const ChatRenderer&) = delete;
  ChatRenderer& operator=(const ChatRenderer&) = delete;

  // Renders each conversation (a JSON array of messages, as text), streaming them to the renderer
  // from a second thread while the replies are read. A conversation the template refuses gets its
  // error; the renderer dying is a ConfigError with its exit status. Called once.
  std::vector<RenderedChat> render(std::span<const std::string> conversations);

 private:
  void close_and_reap();
  std::string read_line();

  std::string source_;
  int fd_ = -1;         // our end of the socket pair that is the child's stdin and stdout
  pid_t pid_ = -1;
  std::string buffer_;  // bytes read past the last line
};

// The loss mask of `ids` (the tokens of `text`): 1 for each token that overlaps an assistant span,
// as transformers' return_assistant_tokens_mask marks them. Needs the tokenizer's token_bytes to
// add up to `text`; a FormatError naming `where` otherwise.
std::vector<std::uint8_t> assistant_token_mask(const Tokenizer& tokenizer, std::span<const std::uint32_t> ids,
                                               std::string_view text, std::span<const ByteSpan> assistant,
                                               std::string_view where);

}  // namespace strata::models
