#!/usr/bin/env python3
"""Reference test of `strata generate` (cli/generate.cc, models/kv_decoder.h) against Hugging Face
transformers' `generate(do_sample=False)`.

Builds tiny random-weight models with transformers, one per family Strata imports: GPT-2; LLaMA with
grouped-query heads and tied embeddings (saved sharded); Qwen2 (q/k/v biases); LLaMA with
rope_scaling llama3 (original context 32, so the 39 positions cross it); Mistral with an explicit
head_dim (16 where hidden / heads is 8). Weights are drawn wider than the default init (std 0.2) so
that the greedy choice is never a near-tie. For each: Strata's greedy tokens for 32 new tokens after
a 7-token prompt must equal transformers' token for token. Then: an eos_token_id in
generation_config.json stops both at the same place; a GPT-2 folder with a byte-level BPE tokenizer
trained here takes --prompt text and gives transformers' ids and decoded text; sampling with a seed
repeats; and bad input (flags out of range, ids outside the vocabulary, --prompt without a
tokenizer, a prompt too long) ends in one message naming the flag. Prints Strata's decode tokens/s
on the sim device beside transformers' on the CPU, from the same run (never asserted).

Usage: generate_reference.py STRATA_BINARY WORKDIR
Exits 77 (skip) when torch or transformers is missing.
"""
import json
import os
import subprocess
import sys
import time


def skip(reason):
    print(f"skipped: {reason}")
    sys.exit(77)


try:
    import torch
    import transformers
    from transformers import (AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config,
                              PreTrainedTokenizerFast)
except ImportError as e:  # noqa: F841
    skip(f"needs torch and transformers ({e}); bash tools/setup-python.sh makes .venv")

STRATA, WORK = sys.argv[1], sys.argv[2]
PROMPT = [5, 17, 42, 3, 88, 61, 9]
NEW = 32
failures = []


def check(cond, what):
    print(("ok   " if cond else "FAIL ") + what)
    if not cond:
        failures.append(what)


def build(name, config, shard=False):
    torch.manual_seed(1234)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "norm" in pname or "ln_" in pname:
                p.copy_(1 + 0.1 * torch.randn_like(p) if pname.endswith("weight") else 0.1 * torch.randn_like(p))
            else:
                p.normal_(0, 0.2)
    folder = os.path.join(WORK, name)
    model.save_pretrained(folder, safe_serialization=True, **({"max_shard_size": "40KB"} if shard else {}))
    return model, folder


def hf_greedy(model, prompt, eos=None):
    ids = torch.tensor([prompt])
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                             eos_token_id=eos, pad_token_id=0)
    seconds = time.perf_counter() - t0
    return out[0, len(prompt):].tolist(), seconds


def strata(folder, *args, expect_ok=True):
    r = subprocess.run([STRATA, "generate", "--model", folder, *args], capture_output=True, text=True)
    if expect_ok and r.returncode != 0:
        raise SystemExit(f"strata generate failed ({r.returncode}): {r.stderr.strip()}")
    return r


def strata_json(folder, *args):
    return json.loads(strata(folder, *args, "--json").stdout)


def main():
    os.makedirs(WORK, exist_ok=True)
    torch.set_num_threads(2)
    common = dict(vocab_size=128, max_position_embeddings=128, num_hidden_layers=2, hidden_size=32,
                  intermediate_size=64, num_attention_heads=4, bos_token_id=None, eos_token_id=None)
    models = [
        ("gpt2", GPT2Config(vocab_size=128, n_positions=128, n_embd=32, n_layer=2, n_head=4,
                            bos_token_id=None, eos_token_id=None), False),
        ("llama_gqa_tied", LlamaConfig(**common, num_key_value_heads=2, tie_word_embeddings=True), True),
        ("qwen2_bias", Qwen2Config(**common, num_key_value_heads=2, tie_word_embeddings=False,
                                   use_sliding_window=False), False),
        ("llama3_rope", LlamaConfig(**common, num_key_value_heads=4, rope_theta=500000.0,
                                    rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 32}),
         False),
        ("mistral_head_dim", MistralConfig(**common, num_key_value_heads=2, head_dim=16, sliding_window=None), False),
    ]
    timing = []
    built = {}
    for name, config, shard in models:
        model, folder = build(name, config, shard)
        built[name] = (model, folder)
        want, hf_s = hf_greedy(model, PROMPT)
        got = strata_json(folder, "--prompt-ids", ",".join(map(str, PROMPT)), "--max-tokens", str(NEW))
        same = got["ids"] == want
        check(same and len(want) == NEW, f"{name}: greedy generate equals transformers' for {NEW} tokens"
              + ("" if same else f"\n  strata {got['ids']}\n  hf     {want}"))
        # The log-probability Strata reports is the model's: transformers' log-softmax at the first token.
        with torch.no_grad():
            first = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0, -1].double(), -1)[want[0]].item()
        check(abs(got["logprobs"][0] - first) < 1e-4, f"{name}: first token's logprob {got['logprobs'][0]:.6f} "
              f"vs transformers' {first:.6f}")
        steps = len(got["ids"]) - 1
        timing.append((name, got["decode_tokens_per_s"], NEW / hf_s))

    # End of sequence from generation_config.json: both stop after the same token.
    model, folder = built["gpt2"]
    want, _ = hf_greedy(model, PROMPT)
    eos = want[9]
    with open(os.path.join(folder, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos}, f)
    want_eos, _ = hf_greedy(model, PROMPT, eos=eos)
    got = strata_json(folder, "--prompt-ids", ",".join(map(str, PROMPT)))
    check(got["ids"] == want_eos and got["stop"] == "eos", f"gpt2: eos_token_id {eos} stops both after "
          f"{len(want_eos)} tokens (strata {len(got['ids'])}, stop {got['stop']})")
    os.remove(os.path.join(folder, "generation_config.json"))

    # Text in and out through a tokenizer in the folder.
    from tokenizers import Tokenizer, decoders, models as tmodels, pre_tokenizers, trainers
    tok = Tokenizer(tmodels.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|endoftext|>"])
    corpus = ["the quick brown fox jumps over the lazy dog", "hello world, hello strata", "generation with a cache"]
    tok.train_from_iterator(corpus * 50, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok)
    torch.manual_seed(1)
    text_model, text_folder = build("gpt2_text", GPT2Config(vocab_size=len(fast), n_positions=128, n_embd=32,
                                                            n_layer=2, n_head=4, bos_token_id=None,
                                                            eos_token_id=None))
    fast.save_pretrained(text_folder)
    prompt_text = "hello world, the quick"
    prompt_ids = fast(prompt_text, add_special_tokens=False)["input_ids"]
    want, _ = hf_greedy(text_model, prompt_ids)
    got = strata_json(text_folder, "--prompt", prompt_text)
    check(got["prompt_ids"] == prompt_ids, f"gpt2_text: --prompt encodes as the HF tokenizer ({len(prompt_ids)} ids)")
    check(got["ids"] == want and got["text"] == fast.decode(want),
          f"gpt2_text: greedy ids and decoded text equal transformers' ({got['text']!r})")
    plain = strata(text_folder, "--prompt", prompt_text, "--max-tokens", "8")
    check(plain.stdout.rstrip("\n") == fast.decode(want[:8]), "gpt2_text: without --json the text is printed")

    # Sampling: the same seed gives the same tokens; another seed (very likely) others.
    _, folder = built["llama_gqa_tied"]
    args = ["--prompt-ids", "1,2,3", "--temperature", "1.3", "--top-k", "50", "--top-p", "0.95"]
    a = strata_json(folder, *args, "--seed", "7")["ids"]
    b = strata_json(folder, *args, "--seed", "7")["ids"]
    c = strata_json(folder, *args, "--seed", "8")["ids"]
    check(a == b and a != c, "sampling repeats for a seed and changes with it")

    # Bad input: one message naming the flag (exit 1).
    for args, needle in [
        (["--prompt-ids", "1,2", "--top-p", "1.5"], "--top-p 1.5"),
        (["--prompt-ids", "1,2", "--top-p", "0"], "--top-p 0"),
        (["--prompt-ids", "1,2", "--temperature", "-1"], "--temperature -1"),
        (["--prompt-ids", "1,x"], "'x' is not a token id"),
        (["--prompt-ids", "1,128"], "token 128"),
        (["--prompt", "hi"], "--prompt-ids"),
        (["--prompt-ids", ",".join(["1"] * 100), "--max-tokens", "40"], "--max-tokens"),
        (["--prompt-ids", "1", "--max-tokens", "0"], "--max-tokens 0"),
        (["--prompt-ids", "1", "--prompt", "x"], "give the prompt once"),
    ]:
        r = strata(built["gpt2"][1], *args, expect_ok=False)
        lines = [l for l in r.stderr.strip().splitlines() if l.strip()]
        check(r.returncode == 1 and needle in r.stderr and len(lines) == 1,
              f"refused {' '.join(args)[:40]}: {r.stderr.strip()[:160]}")

    print(f"decode tokens/s (2 layers, d 32; same run): strata sim vs transformers {transformers.__version__} "
          f"torch {torch.__version__} CPU (its whole generate, prefill included)")
    for name, s, h in timing:
        print(f"  {name:18s} strata {s:8.0f}   transformers {h:8.0f}")
    if failures:
        print(f"{len(failures)} failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
