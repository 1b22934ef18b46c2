"""PyTorch eager beside Strata on the same GPU: one GPT-2 training step as ../shared/gpu/anchors/torch_train.py
takes it (Hugging Face GPT2LMHeadModel, bf16 autocast over fp32 weights, activation checkpointing, clipping at
1.0, fused AdamW), for any GPT-2 shape. Prints one JSON line: the median step after two warm-up steps, tokens/s
and the peak GPU memory PyTorch allocated (torch.cuda.max_memory_allocated).
Usage: torch_gpt2_step.py --layers 48 --d-model 1600 --heads 25 [--micro-batch 4] [--seq 1024] [--steps 8]"""
import argparse, json, time

import torch
from transformers import GPT2Config, GPT2LMHeadModel

p = argparse.ArgumentParser()
p.add_argument("--layers", type=int, required=True)
p.add_argument("--d-model", type=int, required=True)
p.add_argument("--heads", type=int, required=True)
p.add_argument("--micro-batch", type=int, default=4)
p.add_argument("--seq", type=int, default=1024)
p.add_argument("--steps", type=int, default=8)
a = p.parse_args()
conf = GPT2Config(n_layer=a.layers, n_embd=a.d_model, n_head=a.heads, n_positions=a.seq, vocab_size=50257,
                  use_cache=False)
model = GPT2LMHeadModel(conf).cuda()
model.gradient_checkpointing_enable()
params = sum(p.numel() for p in model.parameters())
opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
times = []
for s in range(a.steps):
    x = torch.randint(0, 50257, (a.micro_batch, a.seq), device="cuda")
    torch.cuda.synchronize()
    t = time.perf_counter()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(input_ids=x, labels=x).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    times.append(time.perf_counter() - t)
m = sorted(times[2:] if len(times) > 2 else times)
med = m[len(m) // 2]
print(json.dumps({"bench": "torch_gpt2_step", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
                  "params": params, "micro_batch": a.micro_batch, "seq": a.seq, "step_s_median": med,
                  "tokens_per_s": a.micro_batch * a.seq / med, "peak_gpu_bytes": torch.cuda.max_memory_allocated(),
                  "last_loss": loss.item()}), flush=True)
