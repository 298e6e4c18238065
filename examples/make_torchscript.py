#!/usr/bin/env python3
"""Writes a small byte-level language model as TorchScript for trainstep.

trainstep trains any TorchScript module with
    forward(input_ids: int64 [B, T]) -> logits [B, T, V]
as it is: its own initial weights, its own parameter names (checkpoints use them).
Parameters with requires_grad=False stay frozen. The vocabulary V is the model's: its int
attribute vocab_size (set below) or, without one, the last dimension of its logits for one
token; the spec needs no model.torchscript.vocab_size (set, it must equal V). Run with
Debian's Python, which has torch:

    /usr/bin/python3 examples/make_torchscript.py /tmp/lm.pt [--dim 64] [--layers 2]
"""
import argparse

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, context: int):
        super().__init__()
        self.vocab_size = vocab  # scripted as an int attribute: trainstep reads V from it
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=4 * dim,
                                           batch_first=True, dropout=0.0)
        self.body = nn.TransformerEncoder(layer, layers)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        t = input_ids.size(1)
        pos = torch.arange(t, device=input_ids.device)
        x = self.tok(input_ids) + self.pos(pos).unsqueeze(0)
        causal = torch.triu(torch.full((t, t), float("-inf"), device=input_ids.device), 1)
        return self.head(self.body(x, mask=causal))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", help="where to write the .pt file")
    p.add_argument("--vocab", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--context", type=int, default=256, help="longest sample the model accepts")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    torch.manual_seed(a.seed)
    model = torch.jit.script(TinyLM(a.vocab, a.dim, a.layers, a.context))
    model.save(a.out)
    n = sum(p.numel() for p in model.parameters())
    print(f"wrote {a.out}: {n} parameters, forward(input_ids [B,T]) -> logits [B,T,{a.vocab}]")


if __name__ == "__main__":
    main()
