#!/usr/bin/python3
"""GPT-2 evaluation in float64 and float32 with PyTorch, beside `strata eval`, on random weights.

Writes random GPT-2 weights (Hugging Face names, safetensors) and random tokens (flat uint16),
evaluates the mean cross-entropy over consecutive windows as `strata eval` does, in float64 (the
reference) and float32 (PyTorch's own fp32 distance to it), runs `strata eval` on the same files,
and prints the three losses and the relative distances to float64. Needs Debian's python3-torch
(run with /usr/bin/python3). Used for issue 19's numerics check; see docs/MEASUREMENTS.md.

  tools/numerics/gpt2_reference.py --strata build/bin/strata [--model gpt2-124m] [--windows 4]
"""
import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile

import torch

SHAPES = {"gpt2-124m": (12, 768, 12), "gpt2-1.5b": (48, 1600, 25)}  # layers, d_model, heads


def random_weights(layers, d, vocab, ctx, seed, scale):
    g = torch.Generator().manual_seed(seed)
    w = {}

    def normal(*shape, std=0.02):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std * scale

    w["wte.weight"] = normal(vocab, d)
    w["wpe.weight"] = normal(ctx, d, std=0.01)
    for l in range(layers):
        p = f"h.{l}."
        w[p + "ln_1.weight"] = 1 + normal(d, std=0.1)
        w[p + "ln_1.bias"] = normal(d)
        w[p + "attn.c_attn.weight"] = normal(d, 3 * d)  # Conv1D: [in, out]
        w[p + "attn.c_attn.bias"] = normal(3 * d)
        w[p + "attn.c_proj.weight"] = normal(d, d)
        w[p + "attn.c_proj.bias"] = normal(d)
        w[p + "ln_2.weight"] = 1 + normal(d, std=0.1)
        w[p + "ln_2.bias"] = normal(d)
        w[p + "mlp.c_fc.weight"] = normal(d, 4 * d)
        w[p + "mlp.c_fc.bias"] = normal(4 * d)
        w[p + "mlp.c_proj.weight"] = normal(4 * d, d)
        w[p + "mlp.c_proj.bias"] = normal(d)
    w["ln_f.weight"] = 1 + normal(d, std=0.1)
    w["ln_f.bias"] = normal(d)
    # What Strata reads is fp32: both evaluations start from the fp32-rounded values.
    return {k: v.float().double() for k, v in w.items()}


def tensor_bytes(t):
    return t.float().contiguous().numpy().astype("<f4").tobytes()


def write_safetensors_raw(path, tensors):
    header, offset, blobs = {}, 0, []
    for name, t in tensors.items():
        data = tensor_bytes(t)
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)


def layer_norm(x, w, b, eps=1e-5):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def forward_loss(w, layers, heads, tokens, targets, dtype):
    p = {k: v.to(dtype) for k, v in w.items()}
    b, t = tokens.shape
    d = p["wte.weight"].shape[1]
    hd = d // heads
    x = p["wte.weight"][tokens] + p["wpe.weight"][:t]
    mask = torch.full((t, t), float("-inf"), dtype=dtype).triu(1)
    for l in range(layers):
        q = f"h.{l}."
        h = layer_norm(x, p[q + "ln_1.weight"], p[q + "ln_1.bias"])
        qkv = h @ p[q + "attn.c_attn.weight"] + p[q + "attn.c_attn.bias"]
        qq, kk, vv = qkv.split(d, dim=-1)
        qq = qq.view(b, t, heads, hd).transpose(1, 2)
        kk = kk.view(b, t, heads, hd).transpose(1, 2)
        vv = vv.view(b, t, heads, hd).transpose(1, 2)
        att = torch.softmax(qq @ kk.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        y = (att @ vv).transpose(1, 2).reshape(b, t, d)
        x = x + y @ p[q + "attn.c_proj.weight"] + p[q + "attn.c_proj.bias"]
        h = layer_norm(x, p[q + "ln_2.weight"], p[q + "ln_2.bias"])
        m = gelu_new(h @ p[q + "mlp.c_fc.weight"] + p[q + "mlp.c_fc.bias"])
        x = x + m @ p[q + "mlp.c_proj.weight"] + p[q + "mlp.c_proj.bias"]
    x = layer_norm(x, p["ln_f.weight"], p["ln_f.bias"])
    logits = x @ p["wte.weight"].T
    losses = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), reduction="none")
    return losses.double().sum().item(), losses.numel()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--strata", required=True)
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(SHAPES))
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every random weight's spread")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    layers, d, heads = SHAPES[a.model]
    vocab, ctx = 50257, 1024
    torch.set_num_threads(os.cpu_count() or 1)
    w = random_weights(layers, d, vocab, ctx, a.seed, a.scale)
    g = torch.Generator().manual_seed(a.seed + 1)
    n = a.windows * a.seq_len + 1
    stream = torch.randint(0, vocab, (n,), generator=g)
    with tempfile.TemporaryDirectory() as tmp:
        wpath, tpath = os.path.join(tmp, "w.safetensors"), os.path.join(tmp, "tokens.u16")
        write_safetensors_raw(wpath, w)
        with open(tpath, "wb") as f:
            f.write(struct.pack(f"<{n}H", *stream.tolist()))
        out = subprocess.run([a.strata, "--log-level", "warn", "eval", "--model", a.model, "--weights", wpath, "--data",
                              tpath, "--seq-len", str(a.seq_len), "--batch-size", "1", "--json"],
                             check=True, capture_output=True, text=True).stdout
        strata_loss = json.loads(out)["loss"]
    tokens = torch.stack([stream[i * a.seq_len:(i + 1) * a.seq_len] for i in range(a.windows)])
    targets = torch.stack([stream[i * a.seq_len + 1:(i + 1) * a.seq_len + 1] for i in range(a.windows)])
    with torch.no_grad():
        s64, c = forward_loss(w, layers, heads, tokens, targets, torch.float64)
        s32, _ = forward_loss(w, layers, heads, tokens, targets, torch.float32)
    l64, l32 = s64 / c, s32 / c
    r = {"model": a.model, "tokens": c, "loss_f64": l64, "loss_torch_f32": l32, "loss_strata": strata_loss,
         "torch_f32_rel": abs(l32 - l64) / abs(l64), "strata_rel": abs(strata_loss - l64) / abs(l64)}
    r["strata_over_torch"] = r["strata_rel"] / r["torch_f32_rel"] if r["torch_f32_rel"] > 0 else float("inf")
    if a.json:
        print(json.dumps(r))
    else:
        for k, v in r.items():
            print(f"{k:18s} {v}")


if __name__ == "__main__":
    sys.exit(main())
