#!/usr/bin/env python3
"""Writes a Strata token file of prompt/completion pairs with the prompts masked from the loss, as
`strata data prepare` would (format version 2 with a loss mask, models/token_data.h), for the
exact-mode layout tests: byte tokens (vocabulary 256) from a seeded generator, prompts of 2-24
tokens, every 9th prompt 80 tokens long (longer than a 32-token window, so some windows count no
target), completions of 2-16 tokens. Standard library only.
Usage: masked_tokens.py OUT.tok [SEED]
"""
import random
import struct
import sys

out = sys.argv[1]
rng = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 35)
tokens, mask = [], []
for d in range(400):
    prompt = 80 if d % 9 == 4 else rng.randint(2, 24)
    completion = rng.randint(2, 16)
    tokens += [rng.randrange(256) for _ in range(prompt + completion)]
    mask += [0] * prompt + [1] * completion
n = len(tokens)
bits = bytearray((n + 7) // 8)
for i, m in enumerate(mask):
    if m:
        bits[i // 8] |= 1 << (i % 8)
# magic, version 2, 2-byte tokens, count, vocabulary, tokenizer hash 0 (bytes), sources 0, flags
# (bit 0: loss mask), tokenizer kind 0, 8 reserved bytes.
header = b"STRATOK1" + struct.pack("<IIQQQQII8x", 2, 2, n, 256, 0, 0, 1, 0)
with open(out, "wb") as f:
    f.write(header + struct.pack(f"<{n}H", *tokens) + bytes(bits))
