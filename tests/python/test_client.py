#!/usr/bin/python3
"""The Python client (clients/python/strata_client.py) against a real cluster (`strata up`).

Runs with Debian's /usr/bin/python3 and its python3-grpcio and python3-protobuf; exits 77 (CTest
SKIP_RETURN_CODE) when those are missing. Environment (CTest sets all three):
  STRATA_BIN_DIR               where strata, strata-router, ... are (default: build/bin)
  STRATA_SOURCE_DIR            the repository root (default: two levels above this file)
  STRATA_PYTHON_GENERATED_DIR  the stubs of scripts/gen_python_client.sh (default: generated
                               into a temporary directory)
"""

import atexit
import json
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

SKIP = 77

try:
    import grpc  # noqa: F401  (python3-grpcio)
    import google.protobuf  # noqa: F401  (python3-protobuf)
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import grpc/protobuf ({e}); "
          "install Debian's python3-grpcio and python3-protobuf", file=sys.stderr)
    sys.exit(SKIP)

SOURCE_DIR = os.environ.get("STRATA_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN_DIR = os.environ.get("STRATA_BIN_DIR") or os.path.join(SOURCE_DIR, "build", "bin")
ORACLES = os.path.join(SOURCE_DIR, "tests", "data", "oracles")
DEMO_MODEL = os.path.join(SOURCE_DIR, "models", "strata-demo")
RPC_TIMEOUT = 120.0


def _stubs_dir():
    """The generated stubs: STRATA_PYTHON_GENERATED_DIR, or made now into a temporary dir."""
    given = os.environ.get("STRATA_PYTHON_GENERATED_DIR")
    if given and os.path.isfile(os.path.join(given, "strata", "v1", "generation_pb2.py")):
        return given
    directory = tempfile.mkdtemp(prefix="strata-python-stubs-")
    atexit.register(shutil.rmtree, directory, True)
    done = subprocess.run(
        ["bash", os.path.join(SOURCE_DIR, "scripts", "gen_python_client.sh"), directory],
        capture_output=True, text=True)
    if done.returncode != 0:
        print("scripts/gen_python_client.sh failed:\n" + done.stderr, file=sys.stderr)
        sys.exit(1)
    return directory


STUBS_DIR = _stubs_dir()
sys.path.insert(0, STUBS_DIR)
sys.path.insert(0, os.path.join(SOURCE_DIR, "clients", "python"))
import strata_client  # noqa: E402
from strata_client import Client, FinishReason, HealthStatus, StrataError  # noqa: E402

_running = []  # clusters to kill if the interpreter exits without stopping them


class Cluster:
    """`strata up` as a child process: waits for its READY line; stop() sends SIGTERM."""

    def __init__(self, model_dir, workers=2, extra=(), ready_timeout=120.0):
        self.log = tempfile.TemporaryFile()
        argv = [os.path.join(BIN_DIR, "strata"), "up", "--model", model_dir,
                "--workers", str(workers), "--threads", "1", *extra]
        # A session of its own: if the test dies, the whole cluster (our children) can be killed.
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     start_new_session=True)
        _running.append(self)
        self._lines = queue.Queue()
        threading.Thread(target=self._drain, daemon=True).start()
        self.address = self._await_ready(ready_timeout)
        if self.address is None:
            code = self.stop(timeout=10)
            raise RuntimeError(f"`{' '.join(argv)}` did not print READY within {ready_timeout}s"
                               f" (exit {code}); its stderr:\n{self.stderr_tail()}")

    def _drain(self):  # keeps reading stdout so that the cluster never blocks on a full pipe
        for line in self.proc.stdout:
            self._lines.put(line.decode(errors="replace"))
        self._lines.put(None)

    def _await_ready(self, timeout):
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                line = self._lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return None
            if line.startswith("READY "):
                return line.split()[1]

    def child_pids(self):
        """The processes `strata up` started (expert store, workers, router)."""
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            if int(stat[stat.rindex(")") + 2:].split()[1]) == self.proc.pid:
                pids.append(int(entry))
        return pids

    def stop(self, timeout=60.0):
        """SIGTERM and wait; the exit status (negative: killed by that signal)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self in _running:
            _running.remove(self)
        self.proc.stdout.close()
        return self.proc.returncode

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own process group (start_new_session)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def stderr_tail(self, limit=8000):
        """The end of what the cluster wrote to stderr (kept in a temporary file)."""
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-limit:]

    def close(self):
        self.stop()
        self.log.close()


def _kill_leftovers():
    for cluster in list(_running):
        cluster.kill()


atexit.register(_kill_leftovers)


def _load_json(*parts):
    with open(os.path.join(*parts)) as f:
        return json.load(f)


def _is_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


class ClusterTestCase(unittest.TestCase):
    """One cluster per class, shared by its tests; tearDownClass requires a clean exit."""

    MODEL_DIR = None

    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(cls.MODEL_DIR, workers=2)
        cls.client = Client(cls.cluster.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        code = cls.cluster.stop()
        try:
            if code != 0:
                raise AssertionError(f"strata up exited with {code} on SIGTERM; its stderr:\n"
                                     + cls.cluster.stderr_tail())
        finally:
            cls.cluster.close()


class OracleModelTests:
    """Checks every oracle model shares (a mixin: unittest does not collect it on its own)."""

    MODEL = None

    @classmethod
    def setUpClass(cls):
        cls.MODEL_DIR = os.path.join(ORACLES, cls.MODEL)
        cls.oracle = _load_json(cls.MODEL_DIR, "oracle.json")
        cls.config = _load_json(cls.MODEL_DIR, "config.json")
        super().setUpClass()

    def greedy(self, case, **kwargs):
        return self.client.generate_all(token_ids=case["prompt"],
                                        max_new_tokens=len(case["greedy"]), ignore_eos=True,
                                        timeout=RPC_TIMEOUT, **kwargs)

    def test_greedy_matches_the_oracle(self):
        for i, case in enumerate(self.oracle["cases"]):
            with self.subTest(case=i):
                result = self.greedy(case)
                self.assertEqual(result.token_ids, case["greedy"])
                self.assertEqual(result.finish_reason, FinishReason.LENGTH)
                self.assertEqual(result.text, "")  # no tokenizer.json
                self.assertIsNotNone(result.usage)
                self.assertEqual(result.usage.prompt_tokens, len(case["prompt"]))
                self.assertEqual(result.usage.completion_tokens, len(case["greedy"]))

    def test_generate_all_unpacks_as_a_tuple(self):
        case = self.oracle["cases"][0]
        ids, text, reason, usage = self.greedy(case)
        self.assertEqual(ids, case["greedy"])
        self.assertEqual(reason, FinishReason.LENGTH)
        self.assertEqual(usage.completion_tokens, len(ids))

    def test_sampling_extras_reach_the_server(self):
        case = self.oracle["cases"][0]
        request = Client.make_request(token_ids=case["prompt"], max_new_tokens=4,
                                      repetition_penalty=1.5, logit_bias={7: 100.0},
                                      stop_token_ids=[9], min_tokens=2,
                                      include_stop_str_in_output=True,
                                      skip_special_tokens=False)
        self.assertTrue(request.sampling.HasField("repetition_penalty"))
        self.assertFalse(request.sampling.HasField("min_p"))
        self.assertEqual(dict(request.sampling.logit_bias), {7: 100.0})
        self.assertEqual(list(request.stop_token_ids), [9])
        self.assertEqual(request.min_tokens, 2)
        self.assertTrue(request.HasField("skip_special_tokens"))
        # A bias of 100 on token 7 makes greedy pick it every time.
        ids, _, reason, _ = self.client.generate_all(token_ids=case["prompt"], max_new_tokens=3,
                                                     ignore_eos=True, logit_bias={7: 100.0},
                                                     timeout=RPC_TIMEOUT)
        self.assertEqual(ids, [7, 7, 7])
        self.assertEqual(reason, FinishReason.LENGTH)
        with self.assertRaises(StrataError) as refused:
            self.client.generate_all(token_ids=case["prompt"], max_new_tokens=2, min_tokens=3,
                                     timeout=RPC_TIMEOUT)
        self.assertIn("min_tokens", str(refused.exception))

    def test_streaming_chunks_add_up_and_only_the_last_finishes(self):
        case = max(self.oracle["cases"], key=lambda c: len(c["prompt"]))
        request = Client.make_request(token_ids=case["prompt"],
                                      max_new_tokens=len(case["greedy"]), ignore_eos=True)
        messages = list(self.client.generate_raw(request, timeout=RPC_TIMEOUT))
        self.assertGreaterEqual(len(messages), 1)
        for m in messages[:-1]:
            self.assertEqual(m.finish_reason, strata_client.generation_pb2.FINISH_REASON_UNSPECIFIED)
            self.assertFalse(m.HasField("usage"))
        last = messages[-1]
        self.assertEqual(last.finish_reason, strata_client.generation_pb2.FINISH_REASON_LENGTH)
        self.assertTrue(last.HasField("usage"))
        self.assertEqual(last.usage.prompt_tokens, len(case["prompt"]))
        self.assertEqual(last.usage.completion_tokens, len(case["greedy"]))
        self.assertGreater(last.usage.time_to_first_token_ms, 0)
        self.assertEqual([i for m in messages for i in m.token_ids], case["greedy"])

        # The same through the typed chunks, against generate_all.
        chunks = list(self.client.generate(token_ids=case["prompt"],
                                           max_new_tokens=len(case["greedy"]), ignore_eos=True,
                                           timeout=RPC_TIMEOUT))
        for c in chunks[:-1]:
            self.assertIsNone(c.finish_reason)
            self.assertIsNone(c.usage)
        self.assertEqual(chunks[-1].finish_reason, FinishReason.LENGTH)
        self.assertEqual(chunks[-1].usage.completion_tokens, len(case["greedy"]))
        self.assertEqual([i for c in chunks for i in c.token_ids], self.greedy(case).token_ids)

    def test_model_info(self):
        info = self.client.model_info(timeout=RPC_TIMEOUT)
        c = self.config
        self.assertEqual(info.model_type, c["model_type"])
        self.assertEqual(info.vocab_size, c["vocab_size"])
        self.assertEqual(info.num_layers, c["num_hidden_layers"])
        self.assertEqual(info.num_experts, c.get("num_local_experts") or c.get("num_experts"))
        self.assertEqual(info.experts_per_token, c["num_experts_per_tok"])
        self.assertEqual(info.num_workers, 2)
        self.assertFalse(info.has_tokenizer)
        longest = max(len(x["prompt"]) + len(x["greedy"]) for x in self.oracle["cases"])
        self.assertGreaterEqual(info.max_context_tokens, longest)
        # generation_config.json's eos_token_id wins over config.json's, as in transformers.
        eos = _load_json(self.MODEL_DIR, "generation_config.json").get("eos_token_id")
        if eos is None:
            eos = c.get("eos_token_id")
        eos = [] if eos is None else eos if isinstance(eos, list) else [eos]
        self.assertEqual(info.eos_token_ids, eos)

    def test_health_is_serving(self):
        self.assertEqual(self.client.health(timeout=RPC_TIMEOUT), HealthStatus.SERVING)
        # The router publishes the server-wide status ("") only, not one per service.
        with self.assertRaises(StrataError) as e:
            self.client.health("no.such.Service", timeout=RPC_TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.NOT_FOUND)
        watched = next(self.client.watch_health(timeout=RPC_TIMEOUT))
        self.assertEqual(watched, HealthStatus.SERVING)

    def test_out_of_vocabulary_id_is_invalid_argument(self):
        vocab = self.config["vocab_size"]
        with self.assertRaises(StrataError) as e:
            self.client.generate_all(token_ids=[1, vocab], max_new_tokens=4,
                                     timeout=RPC_TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn(str(vocab), e.exception.details)
        # The largest id in the vocabulary is fine.
        ok = self.client.generate_all(token_ids=[1, vocab - 1], max_new_tokens=2,
                                      ignore_eos=True, timeout=RPC_TIMEOUT)
        self.assertEqual(len(ok.token_ids), 2)

    def test_other_bad_requests(self):
        with self.assertRaises(StrataError) as e:  # no tokenizer.json
            self.client.generate_all(prompt="hello", max_new_tokens=4, timeout=RPC_TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(StrataError) as e:
            self.client.generate_all(token_ids=[1, 2], max_new_tokens=0, timeout=RPC_TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        with self.assertRaises(StrataError) as e:
            self.client.tokenize("hello", timeout=RPC_TIMEOUT)
        self.assertEqual(e.exception.code, grpc.StatusCode.FAILED_PRECONDITION)
        with self.assertRaises(ValueError):
            self.client.generate_all(max_new_tokens=4)

    def test_seeded_sampling_repeats(self):
        case = self.oracle["cases"][0]
        args = dict(token_ids=case["prompt"], max_new_tokens=12, temperature=0.9, top_k=50,
                    top_p=0.95, seed=1234, ignore_eos=True, timeout=RPC_TIMEOUT)
        first = self.client.generate_all(**args)
        self.assertEqual(len(first.token_ids), 12)
        self.assertEqual(self.client.generate_all(**args).token_ids, first.token_ids)

    def test_leaving_the_stream_early_cancels_the_request(self):
        case = self.oracle["cases"][0]
        stream = self.client.generate(token_ids=case["prompt"], max_new_tokens=1000,
                                      ignore_eos=True, timeout=RPC_TIMEOUT)
        first = next(stream)
        self.assertIsNone(first.finish_reason)
        stream.close()  # cancels the call; tearDownClass's clean exit shows the server let go
        self.assertEqual(self.greedy(case).token_ids, case["greedy"])

    def test_deadline_exceeded(self):
        case = self.oracle["cases"][0]
        with self.assertRaises(StrataError) as e:
            self.client.generate_all(token_ids=case["prompt"], max_new_tokens=1000,
                                     ignore_eos=True, timeout=0.05)
        self.assertEqual(e.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)


class Qwen3MoeTest(OracleModelTests, ClusterTestCase):
    MODEL = "qwen3_moe"


class MixtralLongTest(OracleModelTests, ClusterTestCase):
    MODEL = "mixtral_long"


class ShutdownTest(unittest.TestCase):
    def test_sigterm_stops_the_whole_cluster_cleanly(self):
        cluster = Cluster(os.path.join(ORACLES, "qwen3_moe"), workers=2)
        try:
            children = cluster.child_pids()
            self.assertGreaterEqual(len(children), 3, "expert store, 2 workers and a router")
            with Client(cluster.address) as client:
                self.assertEqual(len(client.generate_all(token_ids=[1, 2, 3], max_new_tokens=4,
                                                         ignore_eos=True,
                                                         timeout=RPC_TIMEOUT).token_ids), 4)
            code = cluster.stop()
            self.assertEqual(code, 0, cluster.stderr_tail())
            for pid in children:
                self.assertFalse(_is_alive(pid), f"process {pid} outlived `strata up`")
            host, port = cluster.address.rsplit(":", 1)
            with self.assertRaises(OSError):
                socket.create_connection((host, int(port)), timeout=2).close()
        finally:
            cluster.close()


@unittest.skipUnless(os.path.isfile(os.path.join(DEMO_MODEL, "tokenizer.json")),
                     "models/strata-demo is not here")
class DemoTextTest(ClusterTestCase):
    """Text in and out, with the demo model's tokenizer."""

    MODEL_DIR = DEMO_MODEL

    @classmethod
    def setUpClass(cls):
        cls.reference = _load_json(DEMO_MODEL, "reference.json")
        super().setUpClass()

    def test_model_info_has_a_tokenizer(self):
        self.assertTrue(self.client.model_info(timeout=RPC_TIMEOUT).has_tokenizer)

    def test_text_prompt_gives_text(self):
        result = self.client.generate_all(prompt="Once upon a time", max_new_tokens=24,
                                          ignore_eos=True, timeout=RPC_TIMEOUT)
        self.assertEqual(result.finish_reason, FinishReason.LENGTH)
        self.assertEqual(len(result.token_ids), 24)
        self.assertTrue(result.text.strip(), "the generated text is empty")
        eos = self.client.model_info(timeout=RPC_TIMEOUT).eos_token_ids
        if not set(eos) & set(result.token_ids):
            self.assertEqual(result.text,
                             self.client.detokenize(result.token_ids, timeout=RPC_TIMEOUT))
        # Streamed text adds up to the same.
        chunks = list(self.client.generate(prompt="Once upon a time", max_new_tokens=24,
                                           ignore_eos=True, timeout=RPC_TIMEOUT))
        self.assertEqual("".join(c.text for c in chunks), result.text)
        self.assertEqual([i for c in chunks for i in c.token_ids], result.token_ids)

    def test_samples_and_a_constrained_choice(self):
        # n samples from one prefill: chunks carry their sample's index, and sample i is the
        # request of one sample with seed + i.
        args = dict(prompt="Once upon a time", max_new_tokens=6, ignore_eos=True,
                    temperature=1.0, timeout=RPC_TIMEOUT)
        texts = ["", ""]
        for chunk in self.client.generate(seed=11, n=2, **args):
            texts[chunk.index] += chunk.text
        for i in (0, 1):
            self.assertEqual(texts[i], self.client.generate_all(seed=11 + i, **args).text)
        try:
            result = self.client.generate_all(prompt="Once upon a time", max_new_tokens=8,
                                              temperature=1.0, seed=5, choices=["yes", "no"],
                                              timeout=RPC_TIMEOUT)
        except StrataError as e:
            if "grammar engine" in e.details:
                self.skipTest(e.details)
            raise
        self.assertIn(result.text, ("yes", "no"))

    def test_tokenize_detokenize_round_trip(self):
        sentence = "In the beginning God created the heaven and the earth, said Mr. Darcy."
        ids = self.client.tokenize(sentence, timeout=RPC_TIMEOUT)
        self.assertGreater(len(ids), 5)
        self.assertEqual(self.client.detokenize(ids, timeout=RPC_TIMEOUT), sentence)
        # Against the reference made with Hugging Face tokenizers: input_ids = [0] + encode(p).
        for p in self.reference["generation"]["prompts"]:
            with self.subTest(prompt=p["prompt"]):
                self.assertEqual(self.client.tokenize(p["prompt"], timeout=RPC_TIMEOUT),
                                 p["input_ids"][1:])
                self.assertEqual(self.client.detokenize(p["greedy_ids"], timeout=RPC_TIMEOUT),
                                 p["text"])

    def test_stop_string_ends_the_request(self):
        prompt = "Once upon a time"
        full = self.client.generate_all(prompt=prompt, max_new_tokens=32, ignore_eos=True,
                                        timeout=RPC_TIMEOUT)
        # A stop string from the middle of the greedy text: greedy again must end just before
        # its first occurrence.
        middle = len(full.text) // 2
        stop = full.text[middle:middle + 4]
        self.assertEqual(len(stop), 4, full.text)
        expected = full.text[:full.text.index(stop)]
        stopped = self.client.generate_all(prompt=prompt, max_new_tokens=32, ignore_eos=True,
                                           stop=["@@never@@", stop], timeout=RPC_TIMEOUT)
        self.assertEqual(stopped.finish_reason, FinishReason.STOP)
        self.assertNotIn(stop, stopped.text)
        self.assertEqual(stopped.text, expected)
        self.assertLess(len(stopped.token_ids), len(full.token_ids))
        self.assertEqual(stopped.token_ids, full.token_ids[:len(stopped.token_ids)])
        self.assertEqual(stopped.usage.completion_tokens, len(stopped.token_ids))

    def test_command_line(self):
        script = os.path.join(SOURCE_DIR, "clients", "python", "strata_client.py")
        env = dict(os.environ, STRATA_PYTHON_GENERATED_DIR=STUBS_DIR)
        run = lambda *a: subprocess.run([sys.executable, script, "--server",
                                         self.cluster.address, *a],
                                        capture_output=True, text=True, env=env, timeout=120)
        out = run("--prompt", "Once upon a time", "--max-new-tokens", "8", "--ignore-eos",
                  "--json")
        self.assertEqual(out.returncode, 0, out.stderr)
        result = json.loads(out.stdout)
        self.assertEqual(len(result["token_ids"]), 8)
        self.assertEqual(result["finish_reason"], "LENGTH")
        self.assertTrue(result["text"])
        out = run("--health")
        self.assertEqual((out.returncode, out.stdout.strip()), (0, "SERVING"), out.stderr)
        out = run("--ids", "1,2,3", "--max-new-tokens", "4", "--ignore-eos")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("LENGTH", out.stderr)


if __name__ == "__main__":
    if not os.access(os.path.join(BIN_DIR, "strata"), os.X_OK):
        print(f"{BIN_DIR}/strata is missing: build it first (scripts/build.sh)", file=sys.stderr)
        sys.exit(1)
    unittest.main(verbosity=2)
