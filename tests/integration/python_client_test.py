"""The Python client (client/python/trainstep) against real processes: the coordinator
binary, real trainstep-worker processes, and the `trainstep` CLI as the reference. Every
result the client returns is compared with what the CLI prints for the same job, and every
error with the CLI's message and exit code.
"""

import json
import os
import pathlib
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import unittest

import process_cluster
from process_cluster import ProcessCluster

process_cluster.require_runtime()

import trainstep  # noqa: E402  (after the runtime check)
from trainstep.v1 import types_pb2  # noqa: E402

# The same short job the CLI tests run: mlp on synthetic regression, 2 workers, 6 updates.
MLP_SPEC = {
    "name": "py-mlp", "seed": 3,
    "model": {"mlp": {"hidden": 16}},
    "data": {"synthetic_regression": {"samples": 96, "in_features": 4}},
    "batch": {"micro_batch_size": 4, "accumulation_steps": 3},
    "workers": {"count": 2},
    "optimizer": {"sgd": {"lr": 0.05, "momentum": 0.9}},
    "stop": {"max_updates": 6},
    # Held-out loss after updates 2, 4 and 6 (the same generator's samples: a smoke test of
    # the plumbing; tests/conformance/eval_test.cc checks the number).
    "eval": {"data": {"synthetic_regression": {"samples": 20, "in_features": 4}},
             "every_updates": 2, "max_batches": 3},
}


def watch_all(client, job_id, **kwargs):
    """(records, the generator's return value) of a watch that ends normally."""
    records = []
    gen = client.watch(job_id, **kwargs)
    while True:
        try:
            records.append(next(gen))
        except StopIteration as stop:
            return records, stop.value


def dead_address():
    """127.0.0.1:PORT where nothing listens (a port just released)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"127.0.0.1:{port}"


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = ProcessCluster("client")
        cls.client = trainstep.Client(cls.cluster.address, timeout=30)
        cls.tmp = tempfile.mkdtemp(prefix="trainstep-py-client-")

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.cluster.close()
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def cli_json(self, *args):
        r = self.cluster.cli(*args)
        self.assertEqual(r.returncode, 0, r.stderr)
        return json.loads(r.stdout)

    def cli_error(self, *args):
        """(exit code, the message after "error: ") of a CLI call that fails."""
        r = self.cluster.cli(*args)
        self.assertNotEqual(r.returncode, 0, r.stdout)
        self.assertTrue(r.stderr.startswith("error: "), r.stderr)
        return r.returncode, r.stderr[len("error: "):].rstrip("\n")

    def write(self, name, content):
        path = os.path.join(self.tmp, name)
        mode = "wb" if isinstance(content, bytes) else "w"
        with open(path, mode) as f:
            f.write(content)
        return path

    # Catches: records that differ from `job logs -o jsonl` in any key, its order, a value or
    # a type (64-bit integers as strings, non-finite numbers not null), a watch that loses,
    # repeats or reorders records or ends early, get/list/the watch's final job differing from
    # `job get -o json` / `job list -o json`, or workers that do not finish.
    def test_job_end_to_end_matches_the_cli(self):
        job_id = self.client.submit(MLP_SPEC)
        self.assertRegex(job_id, r"^job-\d+$")
        for _ in range(2):
            self.cluster.start_worker(job_id)
        records, final = watch_all(self.client, job_id, no_progress_timeout=120)
        self.assertEqual(self.cluster.wait_for_workers(60), [0, 0], self.cluster.logs())

        self.assertEqual([r["window_id"] for r in records], [1, 2, 3, 4, 5, 6])
        field_order = [f.name for f in types_pb2.UpdateRecord.DESCRIPTOR.fields]
        # The watch yields an evaluated update's record with its eval_loss, like logs.
        self.assertEqual([r["optimizer_update_id"] for r in records if r["eval_loss"] is not None],
                         [2, 4, 6])
        for r in records:
            self.assertEqual(list(r), field_order)
            self.assertEqual(r["outcome"], "commit")
            if r["eval_loss"] is not None:
                self.assertIsInstance(r["eval_loss"], float)
                self.assertEqual(r["eval_valid_tokens"], 12)  # 3 micro-batches of 4 samples
            self.assertEqual(r["micro_steps"], 6)
            self.assertIsInstance(r["cumulative_tokens"], int)
            self.assertIsInstance(r["loss"], float)
        cli_lines = self.cluster.cli("job", "logs", job_id, "-o", "jsonl").stdout.splitlines()
        cli_records = [json.loads(line) for line in cli_lines]
        logs = list(self.client.logs(job_id))
        self.assertEqual([list(r.items()) for r in logs],
                         [list(r.items()) for r in cli_records])
        self.assertEqual(records, logs)
        # A small page size pages through ListUpdates and yields the same records.
        self.assertEqual(list(self.client.logs(job_id, page_size=4)), logs)

        job = self.client.get(job_id)
        self.assertEqual(job, self.cli_json("job", "get", job_id, "-o", "json"))
        self.assertEqual(job["state"], "SUCCEEDED")
        self.assertEqual(job["progress"]["optimizer_update_id"], "6")  # protobuf's JSON mapping
        self.assertEqual(job["spec"]["batch"]["tail"], "dynamic")  # the resolved spec
        self.assertEqual(job["progress"]["last_eval_update_id"], "6")
        self.assertEqual(job["progress"]["last_eval_loss"], records[-1]["eval_loss"])
        # Throughput of an ended job: its last minute, no ETA.
        self.assertGreater(job["throughput"]["updates_per_second"], 0)
        self.assertGreater(job["throughput"]["tokens_per_second"], 0)
        self.assertNotIn("eta_seconds", job["throughput"])
        self.assertEqual(final, job)
        self.assertEqual(self.client.list(), self.cli_json("job", "list", "-o", "json"))
        self.assertIn(job_id, [j["job_id"] for j in self.client.list()])

    # Catches: list() reading only the first page (the probe: a list beyond gRPC's 4 MiB message
    # limit failed outright). Five ~900 KB specs need several pages; list() follows them and
    # returns what `trainstep job list -o json` prints.
    def test_list_follows_pages_beyond_the_message_limit(self):
        with ProcessCluster("paging") as cluster, \
                trainstep.Client(cluster.address, timeout=30) as client:
            # Without eval: its synthetic held-out set would not match text training data.
            base = {k: v for k, v in MLP_SPEC.items() if k != "eval"}
            fat = dict(base, data={"text": {"paths": [
                f"/data/{i}-" + "p" * 990 for i in range(900)]}}, model={"tiny_gpt": {}})
            ids = [client.submit(dict(fat, name=f"fat-{i}")) for i in range(5)]
            listed = client.list()
            self.assertEqual([j["job_id"] for j in listed], ids)
            self.assertGreater(len(json.dumps(listed)), 4 << 20)
            r = cluster.cli("job", "list", "-o", "json")
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(listed, json.loads(r.stdout))

    # Catches: an error class or exit code that differs from the CLI's for the same failure,
    # or a message that is not the coordinator's (the field) / the CLI's (a file, a size).
    def test_errors_match_the_cli(self):
        bad = {"model": {"mlp": {}}, "data": {"synthetic_regression": {}},
               "batch": {"accumulation_steps": 0}}
        bad_path = self.write("bad.json", json.dumps(bad))
        rc, message = self.cli_error("job", "submit", bad_path)
        for spec in (bad, bad_path, pathlib.Path(bad_path)):
            with self.assertRaises(trainstep.InvalidSpec) as e:
                self.client.submit(spec)
            self.assertEqual(str(e.exception), message)
            self.assertEqual(str(e.exception), "batch.accumulation_steps must be ≥ 1, got 0")
            self.assertEqual(e.exception.exit_code, rc)

        missing = os.path.join(self.tmp, "missing.json")
        rc, message = self.cli_error("job", "submit", missing)
        with self.assertRaises(trainstep.InvalidSpec) as e:
            self.client.submit(missing)
        self.assertEqual((e.exception.exit_code, str(e.exception)), (rc, message))

        rc, message = self.cli_error("job", "get", "job-999")
        self.assertEqual(rc, trainstep.NotFound.exit_code)
        for call in (lambda: self.client.get("job-999"),
                     lambda: self.client.cancel("job-999"),
                     lambda: list(self.client.logs("job-999")),
                     lambda: list(self.client.watch("job-999"))):
            with self.assertRaises(trainstep.NotFound) as e:
                call()
            self.assertEqual(str(e.exception), message)

        # The same request id: the same job with the same spec, refused with another.
        spec_a = dict(MLP_SPEC, name="rid-a", workers={"count": 64})
        spec_b = dict(spec_a, name="rid-b")
        first = self.client.submit(spec_a, request_id="py-rid-1")
        self.assertEqual(self.client.submit(spec_a, request_id="py-rid-1"), first)
        with self.assertRaises(trainstep.RequestIdConflict) as e:
            self.client.submit(spec_b, request_id="py-rid-1")
        rc, message = self.cli_error("job", "submit", self.write("b.json", json.dumps(spec_b)),
                                     "--request-id", "py-rid-1")
        self.assertEqual((e.exception.exit_code, str(e.exception)), (rc, message))
        self.assertIn("request_id \"py-rid-1\" was already used for " + first, message)
        self.client.cancel(first)

        dead = dead_address()
        r = subprocess.run([os.path.join(process_cluster.BIN_DIR, "trainstep"), "job", "list",
                            "--coordinator", dead], capture_output=True, text=True, timeout=60)
        with trainstep.Client(dead, timeout=2) as unreachable:
            with self.assertRaises(trainstep.Unavailable) as e:
                unreachable.list()
        self.assertEqual(e.exception.exit_code, r.returncode)
        self.assertIn(f"coordinator at {dead} is not reachable", str(e.exception))

    # Catches: cancel not returning the job as get does, or watch of a cancelled job not
    # raising JobCancelled with the CLI's exit code (6).
    def test_cancel_and_watch_of_a_cancelled_job(self):
        job_id = self.client.submit(dict(MLP_SPEC, name="to-cancel"))  # no worker: PENDING
        self.assertEqual(self.client.get(job_id)["state"], "PENDING")
        cancelled = self.client.cancel(job_id)
        self.assertEqual(cancelled["state"], "CANCELLED")
        self.assertEqual(cancelled, self.cli_json("job", "get", job_id, "-o", "json"))
        with self.assertRaises(trainstep.JobCancelled) as e:
            list(self.client.watch(job_id))
        self.assertEqual(e.exception.job, cancelled)
        self.assertEqual(e.exception.exit_code, self.cluster.cli("job", "watch", job_id).returncode)

    # Item 2 through the client: examples/make_tokens_bin.py as written makes a train.bin that
    # tiny_gpt trains on (the loss falls), and a file with an id beyond the vocabulary fails
    # the job with the file and the offset, raised by watch as JobFailed with the CLI's exit
    # code. Catches: the example rotting, the tokens reader not wired into the worker, a bad
    # id reaching the model, the failure message not reaching the user.
    def test_tokens_file_trains_and_a_bad_id_fails_the_job(self):
        train = os.path.join(self.tmp, "train.bin")
        r = subprocess.run([sys.executable, os.path.join(process_cluster.SOURCE_DIR, "examples",
                                                         "make_tokens_bin.py"),
                            train, "/usr/share/common-licenses/GPL-3"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"wrote {train}: ", r.stdout)
        spec = {
            "name": "py-tokens",
            "model": {"tiny_gpt": {"n_layer": 1, "n_head": 2, "d_model": 32}},
            "data": {"tokens": {"path": train, "dtype": "uint16", "seq_len": 32},
                     "shuffle": True},
            "batch": {"micro_batch_size": 4},
            "optimizer": {"adamw": {"lr": 0.01}},
            "stop": {"max_updates": 10},
        }
        job_id = self.client.submit(spec)
        self.cluster.start_worker(job_id)
        records, final = watch_all(self.client, job_id, no_progress_timeout=120)
        self.assertEqual(final["state"], "SUCCEEDED", self.cluster.logs())
        self.assertEqual(len(records), 10)
        self.assertEqual(final["spec"]["model"]["tiny_gpt"]["seq_len"], 33)
        self.assertEqual({r["global_valid_tokens"] for r in records}, {4 * 32})
        self.assertLess(records[-1]["loss"], records[0]["loss"])

        ids = [7] * 100
        ids[41] = 300
        bad = self.write("bad.bin", struct.pack("<100H", *ids))
        job_id = self.client.submit(dict(spec, name="py-bad-tokens",
                                         data={"tokens": {"path": bad, "dtype": "uint16",
                                                               "seq_len": 32}}))
        self.cluster.start_worker(job_id)
        with self.assertRaises(trainstep.JobFailed) as e:
            list(self.client.watch(job_id, no_progress_timeout=120))
        self.assertIn(f"{bad}: token 41 (byte offset 82) is 300, not a token id in 0..255 "
                      "(model.tiny_gpt.vocab_size 256)", str(e.exception))
        self.assertEqual(e.exception.job["state"], "FAILED")
        self.assertEqual(e.exception.exit_code, self.cluster.cli("job", "watch", job_id).returncode)

    # Catches a client that cannot submit the model users come for, or that loses the config the
    # workers read from the directory (the job records it; the CLI shows the same).
    def test_llama_directory_fine_tunes_and_exports(self):
        try:
            import torch  # noqa: F401  (the reference writes the model directory)
        except ImportError:
            self.skipTest("writing a Llama directory needs torch in " + sys.executable)
        model = os.path.join(self.tmp, "llama")
        config = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
                  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                  "vocab_size": 64, "tie_word_embeddings": True}
        r = subprocess.run([sys.executable, os.path.join(process_cluster.SOURCE_DIR, "tests",
                                                         "conformance", "llama_reference.py"),
                            "make", model, "--seed", "1", "--dtype", "bfloat16",
                            "--config", json.dumps(config)],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = [json.dumps({"input_ids": [(i * 7 + j) % 64 for j in range(5 + i % 4)],
                             "labels": [(i * 7 + j) % 64 for j in range(5 + i % 4)]})
                 for i in range(16)]
        data = self.write("llama.jsonl", "\n".join(lines) + "\n")
        ckpt = os.path.join(self.tmp, "llama-ckpt")
        job_id = self.client.submit({
            "name": "py-llama",
            "model": {"llama": {"path": model}},
            "data": {"jsonl": {"path": data}},
            "batch": {"micro_batch_size": 4, "accumulation_steps": 2},
            "optimizer": {"adamw": {"lr": 0.001}},
            "stop": {"max_updates": 2},
            "checkpoint": {"dir": ckpt, "every_updates": 2},
        })
        self.cluster.start_worker(job_id)
        records, final = watch_all(self.client, job_id, no_progress_timeout=120)
        self.assertEqual(final["state"], "SUCCEEDED", self.cluster.logs())
        self.assertEqual(len(records), 2)
        self.assertEqual(final["model_config"]["hidden_size"], 32)
        self.assertEqual(final["model_config"]["trainstep_source_dtype"], "bfloat16")
        self.assertEqual(self.cli_json("job", "get", job_id, "-o", "json")["model_config"],
                         final["model_config"])

        out = os.path.join(self.tmp, "llama-out")
        latest = max((d for d in os.listdir(ckpt) if d.startswith("ckpt-")),
                     key=lambda d: int(d[len("ckpt-"):]))
        r = self.cluster.cli("checkpoint", "export", os.path.join(ckpt, latest), "--out", out)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(out, "config.json")) as f:
            self.assertEqual(json.load(f)["torch_dtype"], "bfloat16")
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))


if __name__ == "__main__":
    unittest.main()
