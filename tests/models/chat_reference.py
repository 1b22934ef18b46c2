#!/usr/bin/env python3
"""Reference test of chat data (`strata data prepare` of JSONL "messages", models/chat_template.h)
against transformers' apply_chat_template.

Trains a small byte-level BPE here and saves it as model folders with chat templates in
tokenizer_config.json: Qwen2's ChatML (NFC normalizer and Qwen2's regex, as Qwen2 ships), LLaMA 3's
(header tokens, bos_token from the config, content trimmed), a ChatML template that marks replies with
{% generation %} and refuses unknown roles (saved as a list of named templates, "default" among them),
and a folder without a template, which gets Strata's default ChatML template. For each, a seeded set
of conversations in many scripts (decomposed accents, emoji, code, leading newlines and spaces, a
trailing user turn, several rounds) is prepared by Strata and, conversation by conversation in the
order of Strata's seeded shuffle, must equal:
  * ids: transformers' apply_chat_template(messages, tokenize=True);
  * loss mask: return_assistant_tokens_mask where the template has {% generation %}; otherwise the
    tokens overlapping each assistant reply, found from the render up to it with
    add_generation_prompt=True and the render through it, mapped onto tokens by the fast tokenizer's
    char_to_token as transformers does.
Conversations without an assistant message are left out and counted. Each bad input must end in
exit 1 with one message naming the file and line (or the missing package). One `strata train` step on
the prepared chats of a tiny GPT-2 saved with the tokenizer must exit 0 with a finite loss.
Throughput of rendering + tokenizing (Strata) beside apply_chat_template (transformers) is printed,
never asserted.

Usage: chat_reference.py STRATA_BINARY WORKDIR
Exits 77 (skip) when transformers, tokenizers or jinja2 is missing.
"""
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_reference as tr  # noqa: E402  (the corpus generator, the split regexes, tokenizer folders)

try:
    import jinja2  # noqa: F401  (apply_chat_template needs it)
    import tokenizers  # noqa: F401
    import transformers
except ImportError as e:
    print(f"skipped: {e} (bash tools/setup-python.sh makes .venv; apt-get install python3-jinja2)")
    sys.exit(77)
# Strata's renderer runs /usr/bin/python3 (models/chat_template.h), which needs jinja2 of its own.
if subprocess.run([os.environ.get("STRATA_CHAT_PYTHON") or "/usr/bin/python3", "-c", "import jinja2"],
                  capture_output=True).returncode != 0:
    print("skipped: /usr/bin/python3 cannot import jinja2 (apt-get install python3-jinja2; tools/setup.sh does)")
    sys.exit(77)

QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
GENERATION_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}{{ '\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
# Strata's default (models/chat_template.h, kDefaultChatTemplate), spelled here to compare against.
DEFAULT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
LLAMA3_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]


def shuffled(items, seed):
    """Strata's Fisher-Yates over the training documents (models/data_prepare.cc)."""
    items = list(items)
    for i in range(len(items), 1, -1):
        j = tr.splitmix64(seed ^ tr.splitmix64(i)) % i
        items[i - 1], items[j] = items[j], items[i - 1]
    return items


def conversations(rng, pieces, n):
    """n chats: an optional system turn, 1-3 rounds of user/assistant, sometimes a trailing user turn;
    content with leading newlines/spaces, decomposed accents, emoji and code. Plus 3 without a reply."""
    def content():
        text = rng.choice(pieces)[: rng.randint(1, 300)]
        return rng.choice(["", "", "", "\n", " ", "\n\n", "  "]) + text + rng.choice(["", "", "\n", " "])
    chats = []
    for _ in range(n):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": content()})
        for _ in range(rng.randint(1, 3)):
            messages.append({"role": "user", "content": content()})
            messages.append({"role": "assistant", "content": content()})
        if rng.random() < 0.15:
            messages.append({"role": "user", "content": content()})
        chats.append(messages)
    lonely = [[{"role": "user", "content": "hello"}], [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
              [{"role": "user", "content": "only a question?"}]]
    return chats, lonely


def train_bpe(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(tr.LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    t.train_from_iterator(texts, trainer=trainer)
    return json.loads(t.to_str())


def write_folder(work, name, spec, normalizer, pattern, ignore_merges, specials, config):
    """tokenizer_reference's BPE folder with `specials` as special tokens, loadable by AutoTokenizer."""
    return tr.write_bpe(work, name, spec, normalizer, pattern, ignore_merges, [(c, True, False) for c in specials],
                        dict(config, tokenizer_class="PreTrainedTokenizerFast"))


def byte_offsets(tok, ids, text):
    """token -> (begin, end) character offsets from each token's bytes (GPT-2's byte-to-unicode map
    inverted): for tokenizers whose HF offsets are wrong (see char_to_token below)."""
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    added = {t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values()}
    raw, spans = text.encode("utf-8"), []
    starts = [0]  # starts[x]: characters beginning before byte x
    for byte in raw:
        starts.append(starts[-1] + ((byte & 0xC0) != 0x80))
    at = 0
    for piece in tok.convert_ids_to_tokens(ids):
        b = piece.encode("utf-8") if piece in added else bytes(to_byte[c] for c in piece)
        assert raw[at:at + len(b)] == b
        # A token holding part of a character covers that character, as HF's offsets have it.
        first = starts[at] - ((raw[at] & 0xC0) == 0x80)
        spans.append((first, starts[at + len(b)]))
        at += len(b)
    assert at == len(raw)
    return spans


def reference(tok, template, messages):
    """transformers' ids and assistant mask of one conversation (see the module's docstring)."""
    if "{% generation %}" in template:
        out = tok.apply_chat_template(messages, chat_template=template, tokenize=True, return_dict=True,
                                      return_assistant_tokens_mask=True)
        return out["input_ids"], out["assistant_masks"]
    ids = tok.apply_chat_template(messages, chat_template=template, tokenize=True)
    text = tok.apply_chat_template(messages, chat_template=template, tokenize=False)
    enc = tok(text, add_special_tokens=False)
    assert enc["input_ids"] == ids
    # tokenizers 0.19 reports zero-width offsets for the tokens that ignore_merges finds whole in
    # the vocabulary (LLaMA 3's), so char_to_token (and return_assistant_tokens_mask) is wrong there:
    # such a tokenizer's offsets come from its tokens' bytes instead.
    if json.loads(tok.backend_tokenizer.to_str())["model"].get("ignore_merges"):
        offsets = byte_offsets(tok, ids, text)
        def char_to_token(c):
            return next(k for k, (a, b) in enumerate(offsets) if a <= c < b)
    else:
        char_to_token = enc.char_to_token
    mask = [0] * len(ids)
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = tok.apply_chat_template(messages[:i], chat_template=template, tokenize=False, add_generation_prompt=True)
        through = tok.apply_chat_template(messages[:i + 1], chat_template=template, tokenize=False)
        assert through.startswith(before) and text.startswith(through), (before, through)
        if len(through) == len(before):
            continue
        for k in range(char_to_token(len(before)), char_to_token(len(through) - 1) + 1):
            mask[k] = 1
    return ids, mask


def prepare(strata, folder, data, out, env=None, extra=()):
    return subprocess.run([strata, "--log-level", "warn", "data", "prepare", "--tokenizer", folder, "--input", data,
                           "--out", out, "--json", *extra], capture_output=True, text=True, env=env)


def check_template(strata, work, name, folder, template, chats, lonely, seed):
    tok = transformers.PreTrainedTokenizerFast.from_pretrained(folder)
    data = os.path.join(work, f"chats-{os.path.basename(folder)}.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for messages in chats + lonely:
            f.write(json.dumps({"messages": messages}, ensure_ascii=False) + "\n")
    out = os.path.join(work, "prepared-" + os.path.basename(folder))
    t0 = time.perf_counter()
    proc = prepare(strata, folder, data, out, extra=("--seed", str(seed), "--threads", "1"))
    strata_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"FAILED: {name}: strata data prepare exited {proc.returncode}: {proc.stderr}")
    report = json.loads(proc.stdout)
    ids, mask, header = tr.read_token_file(os.path.join(out, "train.tok"))
    vocab = header["vocab"]

    t0 = time.perf_counter()
    want = [reference(tok, template, m) for m in chats]
    ref_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    for m in chats:
        tok.apply_chat_template(m, chat_template=template, tokenize=True)
    ids_only_s = time.perf_counter() - t0

    at, bad = 0, 0
    for k in shuffled(range(len(chats)), seed):
        w_ids, w_mask = want[k]
        g_ids, g_mask = ids[at:at + len(w_ids)], mask[at:at + len(w_ids)]
        if g_ids != w_ids or g_mask != w_mask:
            bad += 1
            if bad <= 2:
                where = next((i for i in range(len(w_ids)) if g_ids[i:i + 1] != w_ids[i:i + 1] or g_mask[i:i + 1] != w_mask[i:i + 1]), None)
                print(f"  {name}: conversation {k} differs at token {where}: ids {g_ids[max(0, (where or 0) - 3):(where or 0) + 4]} "
                      f"vs {w_ids[max(0, (where or 0) - 3):(where or 0) + 4]}, mask {g_mask[max(0, (where or 0) - 3):(where or 0) + 4]} "
                      f"vs {w_mask[max(0, (where or 0) - 3):(where or 0) + 4]}\n  {chats[k]!r:.400}")
        at += len(w_ids)
    counted = sum(sum(m) for _, m in want)
    if bad or at != len(ids) or report["chats"] != len(chats) or report["chats_without_reply"] != len(lonely) \
            or vocab != tok.backend_tokenizer.get_vocab_size() or report["train"]["masked_tokens"] != at - counted:
        sys.exit(f"FAILED: {name}: {bad} of {len(chats)} conversations differ from transformers' (tokens {len(ids)} vs {at}; "
                 f"chats {report['chats']}, left out {report['chats_without_reply']} of {len(lonely)}; "
                 f"masked {report['train']['masked_tokens']} vs {at - counted})")
    print(f"ok: {name}: {len(chats)} chats, {at} tokens ({counted} assistant) identical to apply_chat_template, "
          f"mask as {'return_assistant_tokens_mask' if '{% generation %}' in template else 'the prefix renders'}; "
          f"{len(lonely)} without a reply left out ({report['chat_template']})")
    return {"name": name, "chats": len(chats), "tokens": at, "strata_s": strata_s,
            "strata_work_s": report["render_seconds"] + report["encode_seconds"], "render_s": report["render_seconds"],
            "ref_s": ref_s, "ids_only_s": ids_only_s, "out": out}


def expect_refusal(strata, name, folder, lines, want, work, env=None):
    data = os.path.join(work, f"bad-{name}.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines))
    proc = prepare(strata, folder, data, os.path.join(work, "bad-out"), env=env)
    lines_out = [l for l in proc.stderr.splitlines() if l.strip()]
    ok = proc.returncode == 1 and all(w in proc.stderr for w in want)
    print(f"{'ok' if ok else 'FAILED'}: refused ({name}): {proc.stderr.strip()[:400]}")
    if not ok:
        sys.exit(f"FAILED: {name}: exit {proc.returncode}, wanted one message with {want}; got {lines_out}")


def check_bad_inputs(strata, work, folders):
    good = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}
    g = folders["generation"]
    expect_refusal(strata, "no role", g, [good, {"messages": [{"content": "x"}]}],
                   ["line 2", "message 1 has no \"role\""], work)
    expect_refusal(strata, "no content", g, [good, good, {"messages": [{"role": "user", "content": None}]}],
                   ["line 3", "\"content\" is null, not a string"], work)
    expect_refusal(strata, "messages not a list", g, [{"messages": "hi"}], ["line 1", "not a non-empty array"], work)
    expect_refusal(strata, "no messages", g, [good, {"chat": []}], ["line 2", "no chat \"messages\""], work)
    expect_refusal(strata, "role refused by the template", g,
                   [good, {"messages": [{"role": "tool", "content": "x"}, {"role": "assistant", "content": "y"}]}],
                   ["line 2", "Unknown role: tool"], work)
    broken = os.path.join(work, "broken")
    shutil.copytree(g, broken, dirs_exist_ok=True)
    config = json.load(open(os.path.join(broken, "tokenizer_config.json")))
    config["chat_template"] = "{% for message in messages %}{{ message['content'] }"
    json.dump(config, open(os.path.join(broken, "tokenizer_config.json"), "w"))
    expect_refusal(strata, "template does not compile", broken, [good], ["does not compile", "tokenizer_config.json"], work)
    config["chat_template"] = "{{ messages[0]['content'] + 1 }}"
    json.dump(config, open(os.path.join(broken, "tokenizer_config.json"), "w"))
    expect_refusal(strata, "template fails to render", broken, [good], ["line 1", "the chat template failed: TypeError"], work)
    expect_refusal(strata, "no template, no ChatML tokens", folders["llama3-notemplate"], [good],
                   ["no chat_template", "<|im_start|>", "default ChatML"], work)
    expect_refusal(strata, "no python3", g, [good], ["cannot run", "apt-get install python3-jinja2"], work,
                   env=dict(os.environ, STRATA_CHAT_PYTHON=os.path.join(work, "no-such-python3")))
    nojinja = os.path.join(work, "python3-without-site")
    with open(nojinja, "w") as f:
        f.write("#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n")
    os.chmod(nojinja, 0o755)
    expect_refusal(strata, "no jinja2", g, [good], ["cannot import jinja2", "apt-get install python3-jinja2"], work,
                   env=dict(os.environ, STRATA_CHAT_PYTHON=nojinja))
    dies = os.path.join(work, "python3-that-dies")
    with open(dies, "w") as f:
        f.write("#!/bin/sh\nexit 3\n")
    os.chmod(dies, 0o755)
    expect_refusal(strata, "renderer dies", g, [good], ["exited before rendering", "apt-get install python3-jinja2"], work,
                   env=dict(os.environ, STRATA_CHAT_PYTHON=dies))


def check_training(strata, work, folder, prepared):
    """One masked SFT step of a tiny GPT-2 saved beside the tokenizer, on the prepared chats."""
    import torch
    torch.manual_seed(0)
    model_dir = os.path.join(work, "model")
    shutil.copytree(folder, model_dir, dirs_exist_ok=True)
    vocab = transformers.PreTrainedTokenizerFast.from_pretrained(folder).backend_tokenizer.get_vocab_size()
    config = transformers.GPT2Config(vocab_size=vocab, n_positions=128, n_embd=32, n_layer=2, n_head=4, n_inner=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(model_dir, safe_serialization=True)
    metrics = os.path.join(work, "train-metrics.jsonl")
    strata_config = {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": 0},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}},
        "strata": {"seed": 1, "model": model_dir, "steps": 1, "metrics": metrics,
                   "data": {"train": os.path.join(prepared, "train.tok"), "seq_len": 64},
                   "device": {"kind": "sim", "memory": "256MiB"},
                   "checkpoint": {"dir": os.path.join(work, "ckpt")}},
    }
    path = os.path.join(work, "train.json")
    json.dump(strata_config, open(path, "w"))
    proc = subprocess.run([strata, "--log-level", "warn", "train", "--config", path], capture_output=True, text=True)
    rows = [json.loads(l) for l in open(metrics)] if os.path.exists(metrics) else []
    if proc.returncode != 0 or len(rows) != 1 or not math.isfinite(rows[0]["loss"]):
        sys.exit(f"FAILED: strata train on the prepared chats: exit {proc.returncode}, {rows}: {proc.stderr}")
    print(f"ok: strata train, 1 step on the prepared chats: loss {rows[0]['loss']:.4f} over {rows[0]['loss_tokens']} "
          f"assistant targets (ln V = {math.log(vocab):.4f})")


def main():
    strata, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    rng = random.Random(35)
    pieces, _ = tr.make_corpus(random.Random(36), 400_000)
    chats, lonely = conversations(rng, pieces, 300)
    spec = train_bpe(pieces)
    folders = {
        "qwen2": write_folder(work, "qwen2", spec, {"type": "NFC"}, tr.QWEN2_PATTERN, False, CHATML_TOKENS,
                              {"chat_template": QWEN2_TEMPLATE, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                               "bos_token": None}),
        "llama3": write_folder(work, "llama3", spec, None, tr.LLAMA3_PATTERN, True, LLAMA3_TOKENS,
                               {"chat_template": LLAMA3_TEMPLATE, "bos_token": "<|begin_of_text|>",
                                "eos_token": "<|eot_id|>"}),
        "generation": write_folder(work, "generation", spec, None, tr.QWEN2_PATTERN, False, CHATML_TOKENS,
                                   {"chat_template": [{"name": "rag", "template": "{{ raise_exception('not this') }}"},
                                                      {"name": "default", "template": GENERATION_TEMPLATE}],
                                    "eos_token": {"__type": "AddedToken", "content": "<|im_end|>", "lstrip": False,
                                                  "normalized": False, "rstrip": False, "single_word": False,
                                                  "special": True}}),
        "default": write_folder(work, "default", spec, None, tr.QWEN2_PATTERN, False, CHATML_TOKENS,
                                {"eos_token": "<|endoftext|>"}),
        "llama3-notemplate": write_folder(work, "llama3-notemplate", spec, None, tr.LLAMA3_PATTERN, True, LLAMA3_TOKENS,
                                          {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}),
    }
    print(f"tokenizers built in {time.perf_counter() - t0:.1f} s")
    rows = [
        check_template(strata, work, "Qwen2 ChatML (NFC)", folders["qwen2"], QWEN2_TEMPLATE, chats, lonely, 11),
        check_template(strata, work, "LLaMA 3", folders["llama3"], LLAMA3_TEMPLATE, chats, lonely, 12),
        check_template(strata, work, "ChatML with {% generation %}", folders["generation"], GENERATION_TEMPLATE, chats,
                       lonely, 13),
        check_template(strata, work, "Strata's default ChatML", folders["default"], DEFAULT_TEMPLATE, chats, lonely, 14),
    ]
    check_bad_inputs(strata, work, folders)
    check_training(strata, work, folders["qwen2"], rows[0]["out"])
    print("throughput (conversations/s; strata: python3 jinja2 render + C++ tokenize and mask on 1 thread, from "
          "strata data prepare's report, and its whole run; transformers: apply_chat_template(tokenize=True)):")
    for r in rows:
        print(f"  {r['name']:30s} strata {r['chats'] / r['strata_work_s']:7.0f} (render {r['render_s']:.2f} s; whole run "
              f"{r['chats'] / r['strata_s']:5.0f}) | transformers ids {r['chats'] / r['ids_only_s']:7.0f}, "
              f"ids + mask {r['chats'] / r['ref_s']:6.0f}")
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
