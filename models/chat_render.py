"""Strata's chat renderer: conversations through a Jinja2 chat template, exactly as transformers does.

Run by `strata data prepare` as one python3 subprocess per invocation (models/chat_template.cc starts
it with this text built into the binary, `python3 -c`, so there is no file to find), talking JSON
lines over its stdin and stdout; see Note [Chat templates] in models/chat_template.h.

Protocol: the first line is {"template": TEXT, "variables": {name: value}, "nfc": BOOL}; the reply is {"ok": true}
or {"fatal": MESSAGE} (then the process exits). Each following line is one conversation's "messages"
array; the reply, in the same order, is {"text": RENDERED, "spans": [[BEGIN, END], ...]} with the
assistant spans as UTF-8 byte offsets into the text, or {"error": MESSAGE}. End of input ends it.

The environment mirrors transformers 4.44's `_compile_jinja_template`: ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the `raise_exception` global, its `tojson` filter and the
`{% generation %}` tag; rendering passes messages, tools=None, documents=None,
add_generation_prompt and the tokenizer's special tokens, as `apply_chat_template` does.

Assistant spans: when the template marks them with {% generation %}, those blocks (what transformers'
return_assistant_tokens_mask uses); otherwise, for each assistant message i, from the end of the
render of messages[:i] with add_generation_prompt=True to the end of the render of messages[:i+1]:
the reply and what closes its turn. The whole render must begin with each of those renders.
With "nfc" (a tokenizer that normalizes to NFC, as Qwen2's) the text comes back in NFC with the
spans in it: its tokens are the same, and they add up to it.
"""
import io
import json
import os
import re
import sys
import unicodedata

# `python3 -c` puts the working directory first on the path: a jinja2.py there must not win.
sys.path = [p for p in sys.path if p not in ("", os.getcwd())]

GENERATION_TAG = re.compile(r"\{\%-?\s*generation\s*-?\%\}")


def build_environment():
    import jinja2
    from jinja2 import nodes
    from jinja2.exceptions import TemplateError
    from jinja2.ext import Extension
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    class AssistantTracker(Extension):
        """transformers' {% generation %} tag: records the character range each block renders to."""
        tags = {"generation"}

        def __init__(self, environment):
            super().__init__(environment)
            self.blocks = None
            self.indices = None

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

        @jinja2.pass_eval_context
        def _generation_support(self, context, caller):
            rv = caller()
            if self.blocks is not None:
                start = len("".join(self.blocks))
                self.indices.append((start, start + len(rv)))
            return rv

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    tracker = next(e for e in env.extensions.values() if isinstance(e, AssistantTracker))
    return env, tracker


def byte_offset(text, char_index):
    return len(text[:char_index].encode("utf-8"))


class Renderer:
    def __init__(self, template_text, variables, nfc):
        self.nfc = nfc
        self.env, self.tracker = build_environment()
        self.template = self.env.from_string(template_text)
        self.variables = variables
        self.tracked = GENERATION_TAG.search(template_text) is not None

    def render(self, messages, add_generation_prompt):
        return self.template.render(messages=messages, tools=None, documents=None,
                                    add_generation_prompt=add_generation_prompt, **self.variables)

    def spans_by_generation(self, messages):
        self.tracker.blocks, self.tracker.indices = [], []
        try:
            for block in self.template.generate(messages=messages, tools=None, documents=None,
                                                add_generation_prompt=False, **self.variables):
                self.tracker.blocks.append(block)
            text = "".join(self.tracker.blocks)
            spans = [(byte_offset(text, a), byte_offset(text, b)) for a, b in self.tracker.indices if b > a]
        finally:
            self.tracker.blocks, self.tracker.indices = None, None
        return text, spans

    def spans_by_prefix(self, messages):
        text = self.render(messages, False)
        spans = []
        for i, message in enumerate(messages):
            if message.get("role") != "assistant":
                continue
            prompt = self.render(messages[:i], True)
            through = self.render(messages[:i + 1], False)
            if not through.startswith(prompt) or not text.startswith(through):
                which = "the conversation up to it with the generation prompt" if not through.startswith(prompt) \
                    else "the conversation through it"
                return None, (f"the template renders {which} as a text that the whole conversation does not begin "
                              f"with (assistant message {i + 1}), so the reply cannot be located; mark the replies "
                              "with {% generation %} in the template or give a conversation that does not begin "
                              "with the assistant")
            spans.append((byte_offset(text, len(prompt)), byte_offset(text, len(through))))
        return text, [s for s in spans if s[1] > s[0]]

    def __call__(self, messages):
        text, spans = self.spans_by_generation(messages) if self.tracked else self.spans_by_prefix(messages)
        if text is None or not self.nfc:
            return text, spans
        raw = text.encode("utf-8")
        normalized = unicodedata.normalize("NFC", text)
        moved = []
        for begin, end in spans:
            a = unicodedata.normalize("NFC", raw[:begin].decode("utf-8"))
            b = unicodedata.normalize("NFC", raw[:end].decode("utf-8"))
            if not normalized.startswith(a) or not normalized.startswith(b):
                return None, "the NFC form of the conversation moves an assistant reply's boundary"
            moved.append((len(a.encode("utf-8")), len(b.encode("utf-8"))))
        return normalized, moved


def main():
    stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="\n")
    stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", newline="\n")

    def reply(obj):
        stdout.write(json.dumps(obj, ensure_ascii=False) + "\n")
        stdout.flush()

    setup = stdin.readline()
    if not setup:
        return
    try:
        import jinja2
    except ImportError as e:
        reply({"fatal": f"python3 ({sys.executable}) cannot import jinja2 ({e}); install it: apt-get install python3-jinja2"})
        return
    major_minor = tuple(int(p) for p in jinja2.__version__.split(".")[:2])
    if major_minor < (3, 1):
        reply({"fatal": f"jinja2 {jinja2.__version__} is older than 3.1, which chat templates need (as transformers "
                        "requires); apt-get install python3-jinja2 from Debian 12 or later"})
        return
    setup = json.loads(setup)
    try:
        renderer = Renderer(setup["template"], setup["variables"], setup.get("nfc", False))
    except jinja2.TemplateError as e:
        where = f" (template line {e.lineno})" if getattr(e, "lineno", None) else ""
        reply({"fatal": f"the chat template does not compile: {e}{where}"})
        return
    reply({"ok": True})
    for line in stdin:
        try:
            text, spans = renderer(json.loads(line))
            reply({"text": text, "spans": spans} if text is not None else {"error": spans})
        except jinja2.TemplateError as e:
            reply({"error": f"the chat template refused it: {e}"})
        except Exception as e:  # a template's own failure (a missing key, a type error), as one message
            reply({"error": f"the chat template failed: {type(e).__name__}: {e}"})


if __name__ == "__main__":
    main()
