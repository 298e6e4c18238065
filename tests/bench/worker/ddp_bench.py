#!/usr/bin/python3
"""Baseline (b) of the worker benchmark: PyTorch DDP on the same job (Gloo on CPU; NCCL with
--device cuda, rank r on cuda:r, as gpu_bench.py runs it).

Same spec file trainstep runs (every field written out; see worker_bench.py): the same
tiny_gpt architecture written in Python (same shapes and op sequence; init differs), the
same windows (text data cut exactly as trainstep's Dataset does, window position j to rank
j % W, micro-batches of micro_batch_size), K micro-batches per rank per window with
`no_sync()` for 1..K-1, loss Σ CE / N (× W, because DDP averages gradients), AdamW, and
bf16 through torch.autocast. W processes on 127.0.0.1, one torch thread each.

Rank 0 writes one JSON line per window to --out:
  {"window": w, "end_time_ms": t, "tokens": N}

Needs Debian's python3-torch (/usr/bin/python3), not a pyenv python.
"""
import argparse
import contextlib
import json
import math
import os
import socket
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
# OpenBLAS's pthread build sizes its own pool at load: one thread, as every system gets.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


class Attention(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.n_head, self.d_head = n_head, d_model // n_head
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=2)
        q, k, v = (y.view(b, t, self.n_head, self.d_head).transpose(1, 2) for y in (q, k, v))
        att = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.d_head)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
        y = torch.matmul(att, v).transpose(1, 2).contiguous().view(b, t, d)
        return self.proj(y)


class Block(nn.Module):
    def __init__(self, d_model, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_head)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.out = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class TinyGpt(nn.Module):
    def __init__(self, n_layer, n_head, d_model, seq_len, vocab=256):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids):
        pos = torch.arange(ids.size(1), dtype=torch.long, device=ids.device)
        x = self.tok_emb(ids) + self.pos_emb(pos).unsqueeze(0)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def load_text(paths, seq_len):
    """trainstep's text Dataset: regular files (links to files count), sorted, one stream."""
    files = []
    for p in paths:
        if os.path.isfile(p):
            files.append(p)
            continue
        for root, _dirs, names in os.walk(p):
            files.extend(os.path.join(root, n) for n in names if os.path.isfile(os.path.join(root, n)))
    stream = b"".join(open(f, "rb").read() for f in sorted(set(files)))
    samples = []
    for begin in range(0, len(stream), seq_len):
        chunk = stream[begin:begin + seq_len]
        if len(chunk) < 2:
            break
        samples.append(list(chunk))
    return samples


def window_samples(n_samples, global_batch, window):
    """Window w (1-based) of a non-shuffled epoch: positions [i·B, (i+1)·B)."""
    per_epoch = (n_samples + global_batch - 1) // global_batch
    i = (window - 1) % per_epoch
    return list(range(i * global_batch, min((i + 1) * global_batch, n_samples)))


def collate(samples, indices):
    length = max(len(samples[i]) for i in indices)
    ids = torch.zeros(len(indices), length, dtype=torch.long)
    labels = torch.full((len(indices), length), -100, dtype=torch.long)
    for r, i in enumerate(indices):
        ids[r, :len(samples[i])] = torch.tensor(samples[i])
        labels[r, :len(samples[i])] = torch.tensor(samples[i])
    return ids, labels


def worker(rank, args, spec, port):
    cuda = args.device == "cuda"
    if not cuda:
        torch.set_num_threads(1)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    world = spec["workers"]["count"]
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    g = spec["model"]["tiny_gpt"]
    torch.manual_seed(spec.get("seed", 0))
    model = TinyGpt(g["n_layer"], g["n_head"], g["d_model"], g["seq_len"]).to(device)
    model = DDP(model, device_ids=[rank] if cuda else None)
    a = spec["optimizer"]["adamw"]
    opt = torch.optim.AdamW(model.parameters(), lr=a["lr"], betas=(a["beta1"], a["beta2"]),
                            eps=a["eps"], weight_decay=a["weight_decay"])
    samples = load_text(spec["data"]["text"]["paths"], spec["data"]["text"]["seq_len"])
    mbs = spec["batch"]["micro_batch_size"]
    k_steps = spec["batch"]["accumulation_steps"]
    bf16 = spec.get("precision", "fp32") == "bf16"
    out = open(args.out, "w") if rank == 0 else None
    for w in range(1, args.windows + 1):
        window = window_samples(len(samples), mbs * k_steps * world, w)
        # Every rank knows the whole window, so N needs no collective (labels == ids here).
        n = sum(len(samples[i]) - 1 for i in window)
        mine = window[rank::world]
        micro = [mine[i:i + mbs] for i in range(0, len(mine), mbs)]
        loss_total = 0.0
        for k, indices in enumerate(micro):
            ids, labels = collate(samples, indices)
            ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            sync = contextlib.nullcontext() if k == len(micro) - 1 else model.no_sync()
            with sync:
                amp = (torch.autocast(device.type, dtype=torch.bfloat16) if bf16
                       else contextlib.nullcontext())
                with amp:
                    logits = model(ids)
                v = logits.size(2)
                loss = F.cross_entropy(logits[:, :-1].reshape(-1, v).float(),
                                       labels[:, 1:].reshape(-1), reduction="sum",
                                       ignore_index=-100)
                (loss * (world / n)).backward()
            loss_total += loss.item()
        opt.step()
        opt.zero_grad()
        if cuda:
            torch.cuda.synchronize(device)  # a window ends when its update is done
        if out is not None:
            out.write(json.dumps({"window": w, "end_time_ms": int(time.time() * 1000),
                                  "tokens": n}) + "\n")
            out.flush()
    if rank == 0:
        print(f"ddp_bench: {args.windows} windows, world {world}, {'bf16' if bf16 else 'fp32'}, "
              f"torch {torch.__version__}, threads {torch.get_num_threads()}; "
              f"blas: {loaded_blas()}", file=sys.stderr)
    dist.destroy_process_group()


def loaded_blas():
    """The BLAS library this process mapped, found as trainstep-worker finds it
    (worker/host/cpu_info.cc FindBlas): an OpenBLAS library, else the libblas.so it loaded."""
    paths = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(None, 5)
            if len(fields) == 6 and fields[5].startswith("/") and fields[5].strip() not in paths:
                paths.append(fields[5].strip())
    names = [(p, os.path.basename(p)) for p in paths]
    return next((p for p, b in names if "openblas" in b), None) or \
        next((p for p, b in names if b.startswith("libblas.so")), "none")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec", required=True)
    p.add_argument("--windows", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = p.parse_args()
    spec = json.load(open(args.spec))
    if spec["data"].get("shuffle", False):
        sys.exit("ddp_bench: shuffle is not implemented; use shuffle false")
    mp.spawn(worker, args=(args, spec, free_port()), nprocs=spec["workers"]["count"], join=True)


if __name__ == "__main__":
    main()
