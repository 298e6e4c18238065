#!/usr/bin/env python3
"""Independent plain-PyTorch reference for the Llama-family decoder.

The C++ conformance tests compare trainstep against this script. It covers
Llama, Mistral, Qwen2 and SmolLM style checkpoints. It is written from
scratch against Hugging Face transformers' modeling_llama.py / modeling_qwen2.py
and does not import anything from the project or from transformers/safetensors,
so a shared bug cannot hide on both sides.

Subcommands:
  make DIR --config JSON --seed S [--dtype float32|bfloat16|float16] [--shard-bytes N]
      Write DIR/config.json and random weights (model.safetensors, or shards
      model-0000i-of-0000K.safetensors plus model.safetensors.index.json).
  logits DIR --ids JSON --out FILE
      Run the model in float32 on a batch of equal-length id lists and write
      FILE (safetensors) holding one F32 tensor "logits" [B, T, V].
  step DIR --data FILE.jsonl --lr LR --out FILE
      One full-batch SGD step: token-mean next-token cross entropy over all
      samples (each run alone, batch of one), backward, w -= lr * grad.
      Writes the updated F32 parameters to FILE and prints
      {"loss": ..., "tokens": ..., "grad_norm": ...} on stdout.

--config and --ids take JSON text or the path of a file holding it.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------- safetensors
DTYPE_TAGS = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16}
TAG_OF = {v: k for k, v in DTYPE_TAGS.items()}
ITEM_SIZE = {"F32": 4, "BF16": 2, "F16": 2}


def tensor_bytes(t):
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().astype("<i2").tobytes()
    if t.dtype == torch.float16:
        return t.numpy().astype("<f2").tobytes()
    if t.dtype == torch.float32:
        return t.numpy().astype("<f4").tobytes()
    raise ValueError(f"unsupported dtype {t.dtype}")


def write_safetensors(path, tensors):
    """tensors: list of (name, tensor) in file order."""
    header, blobs, offset = {}, [], 0
    for name, t in tensors:
        data = tensor_bytes(t)
        header[name] = {"dtype": TAG_OF[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for data in blobs:
            f.write(data)


def read_safetensors(path):
    """Returns {name: float32 tensor}."""
    with open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", raw[:8])
    if 8 + n > len(raw):
        raise ValueError(f"{path}: header length {n} exceeds file size")
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    body = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        tag, shape = info["dtype"], list(info["shape"])
        begin, end = info["data_offsets"]
        if tag not in DTYPE_TAGS:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {tag}")
        count = math.prod(shape)
        if end - begin != count * ITEM_SIZE[tag] or end > len(body) or begin < 0:
            raise ValueError(f"{path}: tensor {name}: bad data_offsets {begin},{end} "
                             f"for {tag} {shape}")
        chunk = body[begin:end]
        if tag == "F32":
            arr = torch.from_numpy(np.frombuffer(chunk, dtype="<f4").copy())
        elif tag == "F16":
            arr = torch.from_numpy(np.frombuffer(chunk, dtype="<f2").astype(np.float32))
        else:
            bits = torch.from_numpy(np.frombuffer(chunk, dtype="<i2").copy())
            arr = bits.view(torch.bfloat16).float()
        out[name] = arr.reshape(shape)
    return out


# ---------------------------------------------------------------------- config
def load_json_arg(text):
    if os.path.isfile(text):
        with open(text) as f:
            return json.load(f)
    return json.loads(text)


def dims(cfg):
    H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    nkv = cfg.get("num_key_value_heads") or nh
    if cfg.get("rope_scaling"):
        raise NotImplementedError("rope_scaling is not supported by the reference")
    if cfg.get("hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act {cfg['hidden_act']} is not supported")
    if nh % nkv:
        raise ValueError(f"num_attention_heads {nh} not divisible by num_key_value_heads {nkv}")
    return dict(
        H=H, I=cfg["intermediate_size"], V=cfg["vocab_size"], L=cfg["num_hidden_layers"],
        nh=nh, nkv=nkv, hd=cfg.get("head_dim") or H // nh,
        eps=cfg.get("rms_norm_eps", 1e-6), theta=cfg.get("rope_theta", 10000.0),
        tied=bool(cfg.get("tie_word_embeddings", False)))


def bias_flags(cfg):
    """(q/k/v have bias, o_proj has bias), as transformers decides them."""
    if cfg.get("model_type") == "qwen2":
        return True, False
    ab = bool(cfg.get("attention_bias", False))
    return ab, ab


def param_specs(cfg):
    """[(name, shape, kind)] in canonical file order; kind picks the init."""
    d = dims(cfg)
    H, I, V, nh, nkv, hd = d["H"], d["I"], d["V"], d["nh"], d["nkv"], d["hd"]
    qkv_b, o_b = bias_flags(cfg)
    specs = [("model.embed_tokens.weight", [V, H], "embed")]
    for i in range(d["L"]):
        p = f"model.layers.{i}."
        specs.append((p + "input_layernorm.weight", [H], "norm"))
        for proj, rows in (("q_proj", nh * hd), ("k_proj", nkv * hd), ("v_proj", nkv * hd)):
            specs.append((p + f"self_attn.{proj}.weight", [rows, H], "matrix"))
            if qkv_b:
                specs.append((p + f"self_attn.{proj}.bias", [rows], "bias"))
        specs.append((p + "self_attn.o_proj.weight", [H, nh * hd], "matrix"))
        if o_b:
            specs.append((p + "self_attn.o_proj.bias", [H], "bias"))
        specs.append((p + "post_attention_layernorm.weight", [H], "norm"))
        specs.append((p + "mlp.gate_proj.weight", [I, H], "matrix"))
        specs.append((p + "mlp.up_proj.weight", [I, H], "matrix"))
        specs.append((p + "mlp.down_proj.weight", [H, I], "matrix"))
    specs.append(("model.norm.weight", [H], "norm"))
    if not d["tied"]:
        specs.append(("lm_head.weight", [V, H], "matrix"))
    return specs


def load_model(model_dir):
    """Returns (config, {name: float32 tensor}) checked against the config."""
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    single = os.path.join(model_dir, "model.safetensors")
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        raw = read_safetensors(single)
    elif os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        raw = {}
        for shard in sorted(set(weight_map.values())):
            for name, t in read_safetensors(os.path.join(model_dir, shard)).items():
                if weight_map.get(name) != shard:
                    raise ValueError(f"tensor {name} found in {shard} but index says "
                                     f"{weight_map.get(name)}")
                raw[name] = t
    else:
        raise FileNotFoundError(f"{model_dir}: no model.safetensors or index")
    specs = param_specs(cfg)
    expected = {name for name, _, _ in specs}
    params = {}
    for name, shape, _ in specs:
        if name not in raw:
            raise KeyError(f"missing tensor {name}")
        if list(raw[name].shape) != shape:
            raise ValueError(f"tensor {name}: shape {list(raw[name].shape)}, expected {shape}")
        params[name] = raw[name]
    for name in raw:
        tied_head = name == "lm_head.weight" and dims(cfg)["tied"]  # HF ignores it
        if name not in expected and not tied_head and not name.endswith("rotary_emb.inv_freq"):
            raise KeyError(f"unexpected tensor {name}")
    return cfg, params


# ----------------------------------------------------------------------- model
def rms_norm(x, weight, eps):
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(T, hd, theta):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    pos = torch.arange(T, dtype=torch.int64).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()  # [T, hd] float32


def forward(cfg, p, ids):
    """ids: LongTensor [B, T] -> float32 logits [B, T, V]."""
    d = dims(cfg)
    nh, nkv, hd, eps = d["nh"], d["nkv"], d["hd"], d["eps"]
    B, T = ids.shape
    x = F.embedding(ids, p["model.embed_tokens.weight"])
    cos, sin = rope_cos_sin(T, hd, d["theta"])
    mask = torch.full((T, T), float("-inf")).triu(1)
    group = nh // nkv
    for i in range(d["L"]):
        pre = f"model.layers.{i}."
        lin = lambda h, n: F.linear(h, p[pre + n + ".weight"], p.get(pre + n + ".bias"))
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)
        q = lin(h, "self_attn.q_proj").view(B, T, nh, hd).transpose(1, 2)
        k = lin(h, "self_attn.k_proj").view(B, T, nkv, hd).transpose(1, 2)
        v = lin(h, "self_attn.v_proj").view(B, T, nkv, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        attn = (probs @ v).transpose(1, 2).reshape(B, T, nh * hd)
        x = x + lin(attn, "self_attn.o_proj")
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        x = x + lin(F.silu(lin(h, "mlp.gate_proj")) * lin(h, "mlp.up_proj"), "mlp.down_proj")
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if d["tied"] else p["lm_head.weight"]
    return F.linear(x, head).float()


# ---------------------------------------------------------------- subcommands
def cmd_make(args):
    cfg = load_json_arg(args.config)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16,
             "float16": torch.float16}[args.dtype]
    torch.manual_seed(args.seed)
    tensors = []
    for name, shape, kind in param_specs(cfg):
        scale, shift = {"embed": (0.5, 0.0), "matrix": (0.05, 0.0),
                        "norm": (0.1, 1.0), "bias": (0.1, 0.0)}[kind]
        tensors.append((name, (shift + scale * torch.randn(shape)).to(dtype)))
    os.makedirs(args.dir, exist_ok=True)
    with open(os.path.join(args.dir, "config.json"), "w") as f:
        json.dump(dict(cfg, torch_dtype=args.dtype), f, indent=2)
    if args.shard_bytes is None:
        write_safetensors(os.path.join(args.dir, "model.safetensors"), tensors)
        return
    shards, size = [], 0
    for name, t in tensors:
        nbytes = t.numel() * t.element_size()
        if not shards or size + nbytes > args.shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append((name, t))
        size += nbytes
    weight_map, total = {}, 0
    for k, shard in enumerate(shards):
        fname = f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"
        write_safetensors(os.path.join(args.dir, fname), shard)
        for name, t in shard:
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    with open(os.path.join(args.dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)


def cmd_logits(args):
    cfg, params = load_model(args.dir)
    ids = load_json_arg(args.ids)
    if not ids or len({len(row) for row in ids}) != 1 or not ids[0]:
        raise ValueError("--ids must be a non-empty list of equal-length non-empty lists")
    with torch.no_grad():
        logits = forward(cfg, params, torch.tensor(ids, dtype=torch.long))
    write_safetensors(args.out, [("logits", logits.contiguous())])


def cmd_step(args):
    cfg, params = load_model(args.dir)
    for t in params.values():
        t.requires_grad_(True)
    samples = []
    with open(args.data) as f:
        for line in f:
            if line.strip():
                rec = json.loads(line)
                ids = rec["input_ids"]
                labels = rec.get("labels", ids)
                if len(labels) != len(ids):
                    raise ValueError("labels and input_ids differ in length")
                samples.append((ids, labels))
    loss_sum, tokens = torch.zeros(()), 0
    for ids, labels in samples:
        logits = forward(cfg, params, torch.tensor([ids], dtype=torch.long))
        target = torch.tensor(labels[1:], dtype=torch.long)
        loss_sum = loss_sum + F.cross_entropy(logits[0, :-1], target,
                                              ignore_index=-100, reduction="sum")
        tokens += int((target != -100).sum())
    if tokens == 0:
        raise ValueError("no trained tokens in --data")
    loss = loss_sum / tokens
    loss.backward()
    grads = [t.grad if t.grad is not None else torch.zeros_like(t) for t in params.values()]
    grad_norm = torch.sqrt(sum((g * g).sum() for g in grads))
    updated = []
    with torch.no_grad():
        for (name, t), g in zip(params.items(), grads):
            updated.append((name, (t - args.lr * g).contiguous()))
    write_safetensors(args.out, updated)
    print(json.dumps({"loss": float(loss), "tokens": tokens, "grad_norm": float(grad_norm)}))


def main(argv=None):
    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make", help="write a random checkpoint")
    m.add_argument("--config", required=True)
    m.add_argument("--seed", type=int, required=True)
    m.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    m.add_argument("--shard-bytes", type=int, default=None)
    lg = sub.add_parser("logits", help="float32 forward pass")
    lg.add_argument("--ids", required=True)
    st = sub.add_parser("step", help="one SGD step")
    st.add_argument("--data", required=True)
    st.add_argument("--lr", type=float, required=True)
    for sp in (lg, st):
        sp.add_argument("--out", required=True)
    for sp in (m, lg, st):
        sp.add_argument("dir")
    args = ap.parse_args(argv)
    {"make": cmd_make, "logits": cmd_logits, "step": cmd_step}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
