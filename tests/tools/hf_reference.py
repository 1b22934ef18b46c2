#!/usr/bin/env python3
"""Reference test of Hugging Face model folders in and out of Strata (models/hf_config.h,
models/weight_source.h, models/hf_export.h), against transformers in fp32.

For each family -- GPT-2 (with a byte-level BPE tokenizer saved beside it), LLaMA with GQA and
tied embeddings, LLaMA with rope_scaling llama3, LLaMA with linear rope_scaling, Mistral with a
head_dim of its own, Qwen2 with q/k/v biases -- a tiny model with perturbed random weights is saved
by transformers as one file and as shards with an index, and:
  1. `strata eval --model FOLDER` gives transformers' fp32 loss on the same windows within 1e-6
     relative, for both folders;
  2. `strata train` from the sharded folder, exact mode, parameters and optimizer on NVMe: its
     first loss equals transformers' loss of the one window it can draw within 1e-6;
  3. after 3 steps, `strata ckpt export CK OUT --hf` (sharded once, whole once) loads with
     AutoModelForCausalLM.from_pretrained with no missing or unexpected keys, its loss equals
     `strata eval --model OUT` within 1e-6, the weights moved from the start, and (GPT-2) the
     tokenizer loads with AutoTokenizer and encodes as the source's.
A bf16 model larger than the host budget trains a step from its folder with parameters and
optimizer on NVMe: the import's peak host memory (reported in the summary) is under the budget,
and the first loss equals transformers' on the bf16 weights in fp32.
Then bad folders (a missing shard, an index naming a tensor its shard lacks, an unknown
model_type, a field Strata cannot honour, shapes that disagree with config.json, a folder with
pytorch_model.bin only) each end in exit 1 with one message naming the problem.

Usage: hf_reference.py STRATA_BINARY WORKDIR. Exits 77 (skip) when transformers is missing.
"""
import json
import math
import os
import shutil
import struct
import subprocess
import sys

try:
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, LlamaConfig, MistralConfig,
                              PreTrainedTokenizerFast, Qwen2Config)
except ImportError as e:  # the venv is missing or incomplete
    print(f"skipped: {e} (bash tools/setup-python.sh installs transformers into .venv)")
    sys.exit(77)

STRATA, WORK = sys.argv[1], sys.argv[2]
SEQ, WINDOWS = 32, 3
REL = 1e-6
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAILED: ") + what, flush=True)
    if not ok:
        failures.append(what)


def run(args, expect_ok=True):
    p = subprocess.run([STRATA, "--log-level", "warn"] + args, capture_output=True, text=True)
    if expect_ok and p.returncode != 0:
        print(p.stdout + p.stderr)
        raise SystemExit(f"FAILED: strata {' '.join(args)} exited {p.returncode}")
    return p


def write_llmc(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def ref_loss(model, tokens, windows):
    """Mean fp32 cross-entropy over `windows` consecutive windows of SEQ tokens, as transformers computes it."""
    total, count = 0.0, 0
    with torch.no_grad():
        for w in range(windows):
            ids = torch.tensor([tokens[w * SEQ:w * SEQ + SEQ + 1]])
            logits = model(ids[:, :-1]).logits.float()
            loss = torch.nn.functional.cross_entropy(logits[0], ids[0, 1:], reduction="sum")
            total += loss.item()
            count += SEQ
    return total / count


def close(a, b):
    return abs(a - b) <= REL * abs(b)


def make_tokenizer(folder, vocab):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog; " * 20, "Strata trains models larger than memory. " * 20]
    tok.train_from_iterator(text, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return fast


def families():
    common = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  max_position_embeddings=64, rms_norm_eps=1e-5)
    return [
        ("gpt2", GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=0,
                            eos_token_id=0)),
        ("llama-gqa-tied", LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=True, rope_theta=500000.0)),
        ("llama3-rope", LlamaConfig(**common, num_key_value_heads=2, rope_scaling={
            "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16})),
        ("llama-linear-rope", LlamaConfig(**common, num_key_value_heads=4, rope_scaling={"type": "linear", "factor": 2.0})),
        ("mistral-head-dim", MistralConfig(**common, num_key_value_heads=2, head_dim=16, sliding_window=None)),
        ("qwen2-bias", Qwen2Config(**common, num_key_value_heads=2, use_sliding_window=False, tie_word_embeddings=False)),
    ]


def train_config(folder, data, work):
    nvme = os.path.join(work, "nvme")
    os.makedirs(nvme, exist_ok=True)
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "nvme", "nvme_path": nvme},
            "offload_param": {"device": "nvme", "nvme_path": nvme},
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}},
        "strata": {
            "exact": True,
            "seed": 7,
            "model": folder,
            "data": {"train": data, "seq_len": SEQ},
            "device": {"kind": "sim", "memory": "64MiB"},
            "steps": 3,
            "checkpoint": {"dir": os.path.join(work, "ck"), "interval_steps": 3},
        },
    }


def family_test(name, config, rng):
    work = os.path.join(WORK, name)
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    torch.manual_seed(1000 + len(name))
    config.torch_dtype = "float32"
    model = AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():  # weights well away from the init, so every tensor matters to the loss
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    single, sharded = os.path.join(work, "hf"), os.path.join(work, "hf-sharded")
    model.save_pretrained(single, safe_serialization=True)
    model.save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
    tokenizer = make_tokenizer(sharded, config.vocab_size) if name == "gpt2" else None
    check(os.path.exists(os.path.join(sharded, "model.safetensors.index.json")), f"{name}: transformers wrote shards")

    vocab = config.vocab_size
    tokens = [rng.randrange(vocab) for _ in range(SEQ * WINDOWS + 1)]
    data = os.path.join(work, "eval.bin")
    write_llmc(data, tokens)
    want = ref_loss(model, tokens, WINDOWS)
    for folder in (single, sharded):
        got = json.loads(run(["eval", "--model", folder, "--data", data, "--seq-len", str(SEQ), "--json",
                              "--device", "sim"]).stdout)
        check(close(got["loss"], want) and got["weight_names"] == "huggingface",
              f"{name}: eval {os.path.basename(folder)} loss {got['loss']:.9f} vs transformers {want:.9f}")

    # Training from the sharded folder: a data file of SEQ + 2 tokens holds two windows (offsets 0, 1).
    train_tokens = tokens[:SEQ + 2]
    train_data = os.path.join(work, "train.bin")
    write_llmc(train_data, train_tokens)
    candidates = [ref_loss(model, train_tokens[o:], 1) for o in (0, 1)]
    cfg_path = os.path.join(work, "train.json")
    with open(cfg_path, "w") as f:
        json.dump(train_config(sharded, train_data, work), f)
    summary_path = os.path.join(work, "summary.json")
    run(["train", "--config", cfg_path, "--summary-json", summary_path])
    with open(summary_path) as f:
        first = json.load(f)["first_loss"]
    check(any(close(first, c) for c in candidates),
          f"{name}: first training loss {first:.9f} vs transformers {candidates[0]:.9f} / {candidates[1]:.9f}")

    for label, extra in (("sharded", ["--max-shard-size", "30KB"]), ("whole", [])):
        out = os.path.join(work, f"export-{label}")
        run(["ckpt", "export", os.path.join(work, "ck"), out, "--hf"] + extra)
        loaded, info = AutoModelForCausalLM.from_pretrained(out, output_loading_info=True)
        loaded = loaded.float().eval()
        check(not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"],
              f"{name}: export {label} loads with no missing, unexpected or mismatched keys ({info})")
        check(os.path.exists(os.path.join(out, "model.safetensors.index.json")) == (label == "sharded"),
              f"{name}: export {label} is {'sharded' if label == 'sharded' else 'one file'}")
        hf_loss = ref_loss(loaded, tokens, WINDOWS)
        got = json.loads(run(["eval", "--model", out, "--data", data, "--seq-len", str(SEQ), "--json",
                              "--device", "sim"]).stdout)["loss"]
        check(close(got, hf_loss), f"{name}: export {label}: strata eval {got:.9f} vs transformers {hf_loss:.9f}")
        moved = any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
        check(moved, f"{name}: export {label} holds trained weights, not the start's")
        if tokenizer is not None:
            t = AutoTokenizer.from_pretrained(out)
            text = "the lazy fox trains larger models"
            check(t(text)["input_ids"] == tokenizer(text)["input_ids"], f"{name}: export {label}'s tokenizer loads")
    return sharded, data


def import_under_budget(rng):
    """A bf16 model larger than the host budget imports into NVMe homes holding one group at a time."""
    work = os.path.join(WORK, "import-budget")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    config = LlamaConfig(vocab_size=4000, hidden_size=128, intermediate_size=512, num_hidden_layers=24,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    torch.manual_seed(5)
    folder = os.path.join(work, "hf")
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(folder, safe_serialization=True,
                                                                                 max_shard_size="2MB")
    tokens = [rng.randrange(config.vocab_size) for _ in range(SEQ + 2)]
    data = os.path.join(work, "train.bin")
    write_llmc(data, tokens)
    budget = 12 << 20
    cfg = train_config(folder, data, work)
    cfg["strata"]["steps"] = 1
    cfg["strata"]["offload"] = {"host_budget": budget, "pinned_buffer": "2MiB"}
    cfg["zero_optimization"]["offload_param"].update({"buffer_count": 2, "buffer_size": 6e5})
    cfg["zero_optimization"]["offload_optimizer"]["buffer_count"] = 2
    del cfg["strata"]["checkpoint"]
    with open(os.path.join(work, "train.json"), "w") as f:
        json.dump(cfg, f)
    summary_path = os.path.join(work, "summary.json")
    run(["train", "--config", os.path.join(work, "train.json"), "--summary-json", summary_path])
    with open(summary_path) as f:
        summary = json.load(f)
    peak, size = summary["import_peak_host_bytes"], summary["import_bytes"]
    check(0 < peak < budget < size,
          f"import of {size / 2**20:.2f} MiB of bf16 weights under a {budget / 2**20:.0f} MiB host budget: peak host "
          f"memory of the import {peak / 2**20:.2f} MiB")
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32).eval()
    candidates = [ref_loss(model, tokens[o:], 1) for o in (0, 1)]
    check(any(close(summary["first_loss"], c) for c in candidates),
          f"bf16 import: first loss {summary['first_loss']:.9f} vs transformers fp32 {candidates[0]:.9f} / "
          f"{candidates[1]:.9f}")


def shipped_finetune_config(folder, rng):
    """configs/finetune.json (the README's walk-through) runs as shipped on a folder, shortened."""
    work = os.path.join(WORK, "finetune-config")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.join(work, "data"))
    for name in ("train", "val"):
        write_llmc(os.path.join(work, "data", f"{name}.tok"), [rng.randrange(300) for _ in range(40 * SEQ)])
    config = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs", "finetune.json")
    summary_path = os.path.join(work, "summary.json")
    p = subprocess.run([STRATA, "--log-level", "warn", "train", "--config", config, "--summary-json", summary_path,
                        "--set", f'strata.model="{folder}"', "--set", f"strata.data.seq_len={SEQ}",
                        "--set", "strata.steps=4", "--set", "strata.data.validation_interval_steps=2",
                        "--set", "scheduler.params.warmup_num_steps=1", "--set", "gradient_accumulation_steps=2",
                        "--set", "strata.device.kind=\"sim\""], cwd=work, capture_output=True, text=True)
    ok = p.returncode == 0
    if ok:
        with open(summary_path) as f:
            summary = json.load(f)
        ok = summary["steps"] == 4 and summary["validation_step"] == 4 and summary["validation_tokens"] > 0
    check(ok, f"configs/finetune.json trains a folder with validation, offloaded to NVMe{'' if ok else ': ' + p.stderr}")


def data_for_the_model(folder):
    """Token files carry their tokenizer: data prepared with the folder's trains, data of another
    tokenizer and raw text for a model whose vocabulary is not bytes are refused, naming the fix."""
    work = os.path.join(WORK, "data-match")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    text = os.path.join(work, "corpus.txt")
    with open(text, "w") as f:
        f.write("the quick brown fox jumps over the lazy dog.\n\n" * 200)
    run(["data", "prepare", "--tokenizer", folder, "--input", text, "--out", os.path.join(work, "data")])
    train = os.path.join(work, "data", "train.tok")
    base = ["train", "--config", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "configs",
                                              "tiny.json"), "--steps", "1", "--set", f"strata.data.seq_len={SEQ}"]
    p = run(base + ["--set", f'strata.model="{folder}"', "--set", f'strata.data.train="{train}"'], expect_ok=False)
    check(p.returncode == 0, f"data prepared with the folder's tokenizer trains (exit {p.returncode}) {p.stderr[-300:]}")
    other = os.path.join(work, "other-tokenizer")
    shutil.copytree(folder, other)
    with open(os.path.join(other, "tokenizer.json")) as f:
        tok = json.load(f)
    with open(os.path.join(other, "tokenizer.json"), "w") as f:
        json.dump(tok, f, indent=1)  # the same tokens, other bytes: a tokenizer Strata cannot tell from another
    p = run(base + ["--set", f'strata.model="{other}"', "--set", f'strata.data.train="{train}"'], expect_ok=False)
    check(p.returncode == 1 and "was tokenized by a tokenizer of hash" in p.stderr,
          f"data of another tokenizer is refused: {p.stderr.strip()[:300]}")
    p = run(["eval", "--model", other, "--data", train, "--seq-len", str(SEQ)], expect_ok=False)
    check(p.returncode == 1 and "was tokenized by a tokenizer of hash" in p.stderr,
          f"eval of data of another tokenizer is refused: {p.stderr.strip()[-300:]}")
    p = run(base + ["--set", f'strata.model="{folder}"', "--set", f'strata.data.train="{text}"'], expect_ok=False)
    check(p.returncode == 1 and "strata data prepare --tokenizer" in p.stderr,
          f"raw text for a vocabulary of 300 is refused with the command that prepares it: {p.stderr.strip()[:300]}")


def expect_refusal(what, folder, data, needle):
    p = run(["eval", "--model", folder, "--data", data, "--seq-len", str(SEQ), "--device", "sim"], expect_ok=False)
    errors = [line for line in p.stderr.splitlines() if "error" in line]
    ok = p.returncode == 1 and len(errors) == 1 and needle in p.stderr
    check(ok, f"refused: {what} (exit {p.returncode}): {p.stderr.strip()[:400]}")


def bad_inputs(sharded, data):
    def copy(tag):
        d = os.path.join(WORK, "bad", tag)
        shutil.rmtree(d, ignore_errors=True)
        shutil.copytree(sharded, d)
        return d

    def edit_json(path, fn):
        with open(path) as f:
            j = json.load(f)
        fn(j)
        with open(path, "w") as f:
            json.dump(j, f)

    d = copy("missing-shard")
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        shard = sorted(set(json.load(f)["weight_map"].values()))[-1]
    os.remove(os.path.join(d, shard))
    expect_refusal("a missing shard", d, data, shard)

    d = copy("index-names-missing-tensor")
    edit_json(os.path.join(d, "model.safetensors.index.json"),
              lambda j: j["weight_map"].update({"model.layers.7.mlp.up_proj.weight": sorted(j["weight_map"].values())[0]}))
    expect_refusal("an index naming a tensor its shard lacks", d, data, "model.layers.7.mlp.up_proj.weight")

    d = copy("unknown-family")
    edit_json(os.path.join(d, "config.json"), lambda j: j.update({"model_type": "bert"}))
    expect_refusal("an unknown model_type", d, data, "bert")

    d = copy("unsupported-field")
    edit_json(os.path.join(d, "config.json"), lambda j: j.update({"hidden_act": "gelu"}))
    expect_refusal("a field Strata cannot honour", d, data, "hidden_act")

    d = copy("shape-mismatch")
    edit_json(os.path.join(d, "config.json"), lambda j: j.update({"intermediate_size": 48}))
    expect_refusal("shapes that disagree with config.json", d, data, "48")

    d = copy("no-config")
    os.remove(os.path.join(d, "config.json"))
    expect_refusal("a folder without config.json", d, data, "is a directory without config.json")

    d = copy("single-and-index")  # transformers reads model.safetensors first; so does Strata
    shutil.copy(os.path.join(WORK, "gpt2", "hf", "model.safetensors"), d)
    expect_refusal("model.safetensors beside an index is the one read", d, data, "'transformer.h.0.")

    d = copy("pytorch-bin")
    for f in os.listdir(d):
        if f.startswith("model") and (f.endswith(".safetensors") or f.endswith(".json")):
            os.remove(os.path.join(d, f))
    open(os.path.join(d, "pytorch_model.bin"), "wb").close()
    expect_refusal("a folder with pytorch_model.bin only", d, data, "pytorch_model.bin")


def main():
    import random
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    torch.set_num_threads(1)
    rng = random.Random(20261128)
    llama_folder = None
    for name, config in families():
        folder, data = family_test(name, config, rng)
        if name == "llama-gqa-tied":
            llama_folder, llama_data = folder, data
        if name == "gpt2":
            shipped_finetune_config(folder, rng)
            data_for_the_model(folder)
    import_under_budget(rng)
    bad_inputs(llama_folder, llama_data)
    if failures:
        print(f"{len(failures)} check(s) failed")
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
