#!/usr/bin/env python3
"""Writes a JSONL training file for trainstep: one {"input_ids": [...], "labels": [...]}
per line, byte-level tokens, with the prompt masked (-100: not trained). Samples have
different lengths, the way real instruction data does; trainstep weighs every trained
token equally (a short sample is not up-weighted).

    python3 examples/make_jsonl.py /tmp/train.jsonl [--samples 512]
"""
import argparse
import json
import random

QUESTIONS = [
    ("What does the loss scaler do?", "It multiplies the loss so small fp16 gradients do not underflow."),
    ("When may gradients be clipped?", "Only after they are unscaled."),
    ("How often does the scheduler step?", "Once per committed optimizer update."),
    ("What is a micro-batch?", "One of the K slices of an accumulation window."),
    ("Why sum the losses?", "So the window is normalised once, by its real token count."),
]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = random.Random(a.seed)
    with open(a.out, "w") as f:
        for _ in range(a.samples):
            q, ans = rng.choice(QUESTIONS)
            prompt = f"Q: {q}\nA: ".encode()
            answer = (ans + "\n").encode()
            ids = list(prompt + answer)
            labels = [-100] * len(prompt) + list(answer)
            f.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
    print(f"wrote {a.out}: {a.samples} samples")


if __name__ == "__main__":
    main()
