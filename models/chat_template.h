// Chat conversations rendered as a model expects them: the chat template of a model folder
// (tokenizer_config.json's "chat_template") or the documented default, rendered by Python's jinja2
// in one python3 subprocess (models/chat_render.py, built into the binary), and the assistant
// replies' byte spans in the rendered text, from which the loss mask is made.
//
// Note [Chat templates]:
//  * Which template: tokenizer_config.json's "chat_template" in the tokenizer's folder (a string,
//    or a list of {"name", "template"} of which "default" is used, as transformers picks it
//    without tools). Without one, the default below: ChatML, "<|im_start|>{role}\n{content}<|im_end|>\n"
//    per message, "<|im_start|>assistant\n" as the generation prompt; "<|im_start|>" and
//    "<|im_end|>" must each encode to one token of the tokenizer, else the default is refused with
//    a message saying to add the model's chat_template. Nothing else of the tokenizer (BOS, EOS)
//    enters the default.
//  * Who renders: jinja2 in python3 (Debian's python3-jinja2), the engine transformers uses; no C++
//    Jinja is in Debian, and a hand-written one would drift from it. The environment is
//    transformers 4.44's (_compile_jinja_template): ImmutableSandboxedEnvironment, trim_blocks,
//    lstrip_blocks, raise_exception, its tojson, the {% generation %} tag; the variables are
//    messages, tools=None, documents=None, add_generation_prompt and the special tokens of
//    tokenizer_config.json (special_tokens_map.json for those it lacks). One subprocess per
//    `data prepare`, started as `/usr/bin/python3 -c SCRIPT` ($STRATA_CHAT_PYTHON overrides the
//    interpreter): the script is compiled into the binary from models/chat_render.py by CMake, so
//    nothing has to be found at run time, from the build folder, CI or an install alike. Requests
//    and replies are JSON lines over a socket pair (MSG_NOSIGNAL: a dead renderer is an error, never
//    a SIGPIPE), written by one thread while another reads, so neither side can fill its buffer and
//    wait forever; at the end our side shuts, the renderer exits and is reaped.
//  * Which tokens count: the assistant replies. Where the template marks them with
//    {% generation %}, those blocks (transformers' return_assistant_tokens_mask). Otherwise, for
//    each assistant message i, the text from the end of the render of messages[:i] with
//    add_generation_prompt=True to the end of the render of messages[:i+1]: the reply, its
//    end-of-turn token and what the template writes after it in the turn (ChatML's newline); a
//    template whose renders are not prefixes of the whole (one that drops earlier replies'
//    reasoning, or a conversation opening with the assistant under a BOS-adding template) is refused
//    for that conversation. The whole conversation is encoded as one text, as
//    apply_chat_template(tokenize=True) does (never segment by segment, which can split a token at a
//    boundary), and a token counts when its bytes overlap a span, as transformers' char_to_token
//    marks them. A tokenizer that normalizes to NFC gets the NFC text (the same ids) with the spans
//    moved into it, so that its tokens add up to the text.
//  * The document: the template's tokens exactly; no BOS or EOS is added, since the template places
//    them (LLaMA 3's bos_token, the end-of-turn tokens). A conversation without an assistant
//    message is left out with a warning counting them: none of it would count toward the loss.
//  * Not supported: SentencePiece tokenizers (their tokens do not map onto the text byte for byte;
//    refused with a message), tools and documents (always None).
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
