"""A masked SFT run of Strata against transformers' loss with labels -100 (issue 35, item 3).

Builds a tiny GPT-2 with transformers (random init, dropout 0) and saves it as a Hugging Face model
folder (config.json, model.safetensors); writes a Strata token file of prompt/completion pairs whose
prompt tokens are masked (format v2, models/token_data.h), with one document longer than a window
that is masked whole; then:

 1. `strata train` in exact mode (fp32), 2 micro-batches of 2 windows per step, SGD, 3 steps, from
    the folder. The windows each step draws are the sampler's (models/token_data.cc, reimplemented
    below); transformers computes GPT2LMHeadModel's loss with labels -100 on every masked target
    over the step's 4 windows as one batch, takes the same SGD step, and so on. Each step's loss
    must equal Strata's within 1e-6 relative (step 1: the forward alone; later steps: after updates
    made from the masked gradients, so a wrong gradient shows).
 2. `strata eval` of the folder's weights on the file: the mean over the counted targets of the
    consecutive windows, against transformers' cross-entropy with ignore_index -100, within 1e-6.
 3. The comparison can fail: the loss without the mask, and the mean of the micro-batches' means
    (each micro-batch normalized alone), must both be farther from Strata's than 100x the tolerance.

Exits 77 (skip) when torch or transformers is missing.
Usage: sft_reference.py STRATA_BINARY WORKDIR
"""
import json
import os
import random
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenizer_reference import splitmix64  # noqa: E402  (Strata's seeded index hash)

try:
    import torch
    import transformers
except ImportError as e:  # the test's skip, with the reason
    print(f"skipped: {e} (bash tools/setup-python.sh makes .venv with torch and transformers)")
    sys.exit(77)

REL_TOL = 1e-6
SEQ, MICRO, ACCUMULATION, STEPS, SEED, LR = 32, 2, 2, 3, 1234, 0.5
VOCAB = 256


def documents(rng):
    """Prompt/completion pairs of random tokens (the prompt masked), and one prompt longer than a window."""
    tokens, mask = [], []
    for d in range(120):
        prompt = rng.randint(2, 24) if d != 40 else 3 * SEQ  # document 40: a window's worth of masked targets
        completion = rng.randint(2, 16)
        tokens += [rng.randrange(VOCAB) for _ in range(prompt + completion)]
        mask += [0] * prompt + [1] * completion
    return tokens, mask


def write_token_file(path, tokens, mask):
    """A Strata token file, version 2, uint16 tokens, with a loss mask (models/token_data.h)."""
    n = len(tokens)
    header = b"STRATOK1" + struct.pack("<IIQQQQII8x", 2, 2, n, VOCAB, 0, 0, 1, 0)
    assert len(header) == 64
    bits = bytearray((n + 7) // 8)
    for i, m in enumerate(mask):
        if m:
            bits[i // 8] |= 1 << (i % 8)
    with open(path, "wb") as f:
        f.write(header + struct.pack(f"<{n}H", *tokens) + bytes(bits))


def window_starts(step, n_tokens):
    """The starts of step `step`'s windows in unit order, as the trainer draws them (world 1)."""
    units = ACCUMULATION
    starts = []
    for unit in range(units):
        for b in range(MICRO):
            position = (step * units + unit) * MICRO + b
            starts.append(splitmix64(SEED ^ splitmix64(position)) % (n_tokens - SEQ))
    return starts


def batch(starts, tokens, mask):
    """input_ids [windows, SEQ + 1] and labels with -100 where the target is masked (HF shifts labels)."""
    ids = torch.tensor([tokens[s:s + SEQ + 1] for s in starts], dtype=torch.long)
    labels = ids.clone()
    for w, s in enumerate(starts):
        for t in range(SEQ + 1):
            if not mask[s + t]:
                labels[w, t] = -100
    return ids, labels


def rel(a, b):
    return abs(a - b) / abs(b)


def main():
    strata, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=128,
                                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, activation_function="gelu_new",
                                     layer_norm_epsilon=1e-5)
    model = transformers.GPT2LMHeadModel(config).float()
    # Wider weights than the default init (std 0.02) give logits that differ by position and token,
    # so the masked and unmasked means are far apart.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    folder = os.path.join(work, "model")
    model.save_pretrained(folder, safe_serialization=True)

    tokens, mask = documents(random.Random(7))
    data = os.path.join(work, "sft.tok")
    write_token_file(data, tokens, mask)

    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    strata_config = {
        "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUMULATION,
        "gradient_clipping": 0, "zero_optimization": {"stage": 0},
        "optimizer": {"type": "SGD", "params": {"lr": LR, "momentum": 0, "weight_decay": 0}},
        "strata": {"exact": True, "seed": SEED, "model": folder, "steps": STEPS, "metrics": metrics,
                   "data": {"train": data, "seq_len": SEQ},
                   "device": {"kind": "sim", "memory": "256MiB"},
                   "checkpoint": {"dir": os.path.join(work, "ckpt")}},
    }
    config_path = os.path.join(work, "sft.json")
    with open(config_path, "w") as f:
        json.dump(strata_config, f)
    subprocess.run([strata, "--log-level", "warn", "train", "--config", config_path], check=True)
    with open(metrics) as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == STEPS, rows

    fail = False
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    model.train()
    for step in range(STEPS):
        ids, labels = batch(window_starts(step, len(tokens)), tokens, mask)
        counted = int((labels[:, 1:] != -100).sum())
        optimizer.zero_grad()
        out = model(input_ids=ids, labels=labels)
        hf, ours = float(out.loss), rows[step]["loss"]
        print(f"step {step + 1}: strata {ours:.9f}, transformers {hf:.9f} (labels -100 on {labels[:, 1:].numel() - counted} "
              f"of {labels[:, 1:].numel()} targets), relative {rel(ours, hf):.2e}; loss_tokens {rows[step]['loss_tokens']}")
        if rel(ours, hf) > REL_TOL or rows[step]["loss_tokens"] != counted:
            print(f"FAILED: step {step + 1}: Strata's loss or counted targets differ from transformers'")
            fail = True
        if step == 0:
            # 3. The mask and the normalization are visible at this tolerance.
            with torch.no_grad():
                unmasked = float(model(input_ids=ids, labels=ids).loss)
                per_micro = [float(model(input_ids=ids[m * MICRO:(m + 1) * MICRO], labels=labels[m * MICRO:(m + 1) * MICRO]).loss)
                             for m in range(ACCUMULATION)]
            for name, other in (("the unmasked loss", unmasked), ("the mean of micro-batch means", sum(per_micro) / len(per_micro))):
                print(f"  {name}: {other:.9f}, relative {rel(other, ours):.2e}")
                if rel(other, ours) < 100 * REL_TOL:
                    print(f"FAILED: {name} is within 100x the tolerance of Strata's loss: the check proves nothing")
                    fail = True
        out.loss.backward()
        optimizer.step()

    # 2. strata eval on the initial weights (the folder) over consecutive windows.
    model = transformers.GPT2LMHeadModel.from_pretrained(folder).float().eval()
    windows = (len(tokens) - 1) // SEQ
    ev = subprocess.run([strata, "--log-level", "warn", "eval", "--model", folder, "--data", data, "--seq-len", str(SEQ),
                         "--device", "sim", "--json"], check=True, capture_output=True, text=True)
    result = json.loads(ev.stdout)
    ids, labels = batch([w * SEQ for w in range(windows)], tokens, mask)
    with torch.no_grad():
        logits = model(input_ids=ids[:, :SEQ]).logits
        total = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels[:, 1:].reshape(-1), ignore_index=-100,
                                                  reduction="sum")
    counted = int((labels[:, 1:] != -100).sum())
    hf = float(total) / counted
    print(f"eval: strata {result['loss']:.9f} over {result['tokens']} targets ({result['masked_targets']} masked), "
          f"transformers {hf:.9f} over {counted}, relative {rel(result['loss'], hf):.2e}")
    if rel(result["loss"], hf) > REL_TOL or result["tokens"] != counted:
        print("FAILED: strata eval differs from transformers' masked loss")
        fail = True
    sys.exit(1 if fail else 0)


if __name__ == "__main__":
    main()
