#!/usr/bin/python3
"""The OpenAI-compatible HTTP API of strata-router (`strata up --http-port`) against a real CPU
cluster on models/strata-demo, with the official `openai` client, raw HTTP for the error cases,
and prometheus_client's parser for /metrics.

The packages come from PyPI through scripts/setup_python.sh (a venv under the build directory);
without them the test says so and exits 77 (CTest's skip). Environment (CTest sets both):
  STRATA_BIN_DIR     where strata, strata-router, ... are (default: build/bin)
  STRATA_SOURCE_DIR  the repository root (default: two levels above this file)
"""

import http.client
import json
import os
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
    import openai
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import openai/prometheus_client ({e}); "
          "run scripts/setup_python.sh BUILD_DIR/venv", file=sys.stderr)
    sys.exit(SKIP)

SOURCE_DIR = os.environ.get("STRATA_SOURCE_DIR") or os.path.abspath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BIN_DIR = os.environ.get("STRATA_BIN_DIR") or os.path.join(SOURCE_DIR, "build", "bin")
DEMO_MODEL = os.path.join(SOURCE_DIR, "models", "strata-demo")
MODEL = "strata-demo"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """`strata up` with the HTTP API on a free port; stop() sends SIGTERM."""

    def __init__(self, extra=(), env=None):
        self.http_port = free_port()
        self.log = tempfile.TemporaryFile()
        argv = [os.path.join(BIN_DIR, "strata"), "up", "--model", DEMO_MODEL, "--workers", "2",
                "--threads", "1", "--http-port", str(self.http_port), *extra]
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     start_new_session=True, text=True,
                                     env=None if env is None else {**os.environ, **env})
        ready = threading.Event()

        def watch():
            for line in self.proc.stdout:
                if line.startswith("READY "):
                    ready.set()
        threading.Thread(target=watch, daemon=True).start()
        if not ready.wait(180):
            self.stop()
            raise RuntimeError("the cluster did not become ready:\n" + self.stderr())

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self):
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def client(self, api_key="none"):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.http_port}/v1", api_key=api_key,
                             timeout=120, max_retries=0)

    def raw(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.http_port, timeout=120)
        data = body if isinstance(body, (bytes, str)) or body is None else json.dumps(body)
        conn.request(method, path, body=data,
                     headers=headers or {"Content-Type": "application/json"})
        response = conn.getresponse()
        payload = response.read()
        conn.close()
        return response.status, payload


class OpenAiApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster()
        cls.client = cls.cluster.client()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def assertApiError(self, status, payload, code=None, param=None):
        body = json.loads(payload)
        self.assertEqual(set(body["error"]), {"message", "type", "param", "code"}, body)
        self.assertTrue(body["error"]["message"])
        if code is not None:
            self.assertEqual(body["error"]["code"], code, body)
        if param is not None:
            self.assertEqual(body["error"]["param"], param, body)
        return body

    def test_models(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], [MODEL])

    def test_completion_greedy_and_usage(self):
        c = self.client.completions.create(model=MODEL, prompt="In the beginning", max_tokens=8,
                                           temperature=0)
        self.assertEqual(c.object, "text_completion")
        self.assertEqual(len(c.choices), 1)
        self.assertTrue(c.choices[0].text)
        self.assertEqual(c.choices[0].finish_reason, "length")
        self.assertEqual(c.usage.completion_tokens, 8)
        self.assertGreater(c.usage.prompt_tokens, 0)
        self.assertEqual(c.usage.total_tokens, c.usage.prompt_tokens + 8)
        again = self.client.completions.create(model=MODEL, prompt="In the beginning",
                                               max_tokens=8, temperature=0)
        self.assertEqual(again.choices[0].text, c.choices[0].text)

    def test_streaming_matches_whole(self):
        whole = self.client.completions.create(model=MODEL, prompt="The king said", max_tokens=12,
                                               temperature=0)
        chunks = list(self.client.completions.create(
            model=MODEL, prompt="The king said", max_tokens=12, temperature=0, stream=True,
            stream_options={"include_usage": True}))
        text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
        self.assertEqual(text, whole.choices[0].text)
        finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
        self.assertEqual(finishes[-1], "length")
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)

    def test_chat_and_chat_streaming(self):
        messages = [{"role": "system", "content": "You tell stories."},
                    {"role": "user", "content": "Tell me about the sea."}]
        c = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10,
                                                temperature=0)
        self.assertEqual(c.object, "chat.completion")
        self.assertEqual(c.choices[0].message.role, "assistant")
        self.assertTrue(c.choices[0].message.content)
        self.assertEqual(c.usage.completion_tokens, 10)
        stream = self.client.chat.completions.create(model=MODEL, messages=messages,
                                                     max_tokens=10, temperature=0, stream=True)
        parts = [ch.choices[0].delta.content or "" for ch in stream]
        self.assertEqual("".join(parts), c.choices[0].message.content)

    def test_stop(self):
        base = self.client.completions.create(model=MODEL, prompt="Once upon a time",
                                              max_tokens=24, temperature=0).choices[0].text
        stop = base[len(base) // 2:len(base) // 2 + 3]
        self.assertTrue(stop.strip(), base)
        c = self.client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=24,
                                           temperature=0, stop=[stop, "\u2603"])
        self.assertEqual(c.choices[0].finish_reason, "stop")
        self.assertEqual(c.choices[0].text, base[:base.index(stop)])

    def test_seed_reproducible(self):
        def sample(seed):
            return self.client.completions.create(
                model=MODEL, prompt="The old man", max_tokens=16, temperature=1.0, top_p=0.95,
                seed=seed, extra_body={"top_k": 50}).choices[0].text
        first = sample(42)
        self.assertEqual(sample(42), first)
        self.assertNotEqual({sample(s) for s in (1, 2, 3)}, {first})

    def test_n_choices(self):
        # Four samples of one prefill: different at temperature 1, choice i the request of one
        # sample with seed 7 + i.
        prompt = "The old sailor looked at the sea"
        c = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=10,
                                           temperature=1.0, seed=7, n=4,
                                           extra_body={"ignore_eos": True})
        self.assertEqual([ch.index for ch in c.choices], [0, 1, 2, 3])
        texts = [ch.text for ch in c.choices]
        self.assertGreaterEqual(len(set(texts)), 3, texts)
        self.assertEqual(c.usage.completion_tokens, 40)
        alone = self.client.completions.create(model=MODEL, prompt=prompt, max_tokens=10,
                                               temperature=1.0, seed=9,
                                               extra_body={"ignore_eos": True})
        self.assertEqual(alone.usage.prompt_tokens, c.usage.prompt_tokens)
        self.assertEqual(alone.choices[0].text, texts[2])
        # Streamed chat: each chunk is one choice's, by index.
        messages = [{"role": "user", "content": "Tell me about the sea."}]
        whole = self.client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8,
                                                    temperature=1.0, seed=3, n=2)
        parts = {0: "", 1: ""}
        finishes = {}
        for chunk in self.client.chat.completions.create(model=MODEL, messages=messages,
                                                         max_tokens=8, temperature=1.0, seed=3,
                                                         n=2, stream=True):
            for ch in chunk.choices:
                parts[ch.index] += ch.delta.content or ""
                if ch.finish_reason:
                    finishes[ch.index] = ch.finish_reason
        self.assertEqual(finishes, {0: "length", 1: "length"})
        self.assertEqual([parts[0], parts[1]], [ch.message.content for ch in whole.choices])

    def test_logprobs(self):
        c = self.client.completions.create(model=MODEL, prompt="In the beginning", max_tokens=5,
                                           temperature=0, logprobs=0)
        lp = c.choices[0].logprobs
        self.assertEqual(len(lp.token_logprobs), 5)
        self.assertEqual(len(lp.tokens), 5)
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs))
        self.assertEqual("".join(lp.tokens), c.choices[0].text)
        chat = self.client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hello"}], max_tokens=4,
            temperature=0.7, seed=3, logprobs=True)
        content = chat.choices[0].logprobs.content
        self.assertEqual(len(content), 4)
        self.assertTrue(all(t.logprob <= 0 for t in content))

    def test_errors(self):
        with self.assertRaises(openai.NotFoundError) as caught:
            self.client.completions.create(model="no-such-model", prompt="x", max_tokens=2)
        self.assertEqual(caught.exception.body["code"], "model_not_found")
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model=MODEL, prompt="x", max_tokens=2, n=17)
        status, payload = self.cluster.raw("POST", "/v1/completions", b"{not json")
        self.assertEqual(status, 400)
        self.assertApiError(status, payload)
        status, payload = self.cluster.raw("POST", "/v1/chat/completions", {"model": MODEL})
        self.assertEqual(status, 400)
        self.assertApiError(status, payload, param="messages")
        status, payload = self.cluster.raw("POST", "/v1/completions",
                                           {"model": MODEL, "prompt": [1] * 5000})
        self.assertEqual(status, 400)
        self.assertApiError(status, payload, code="context_length_exceeded")
        status, payload = self.cluster.raw("POST", "/v1/completions",
                                           b"{" + b" " * (9 << 20) + b"}")
        self.assertEqual(status, 413)
        self.assertApiError(status, payload)
        status, payload = self.cluster.raw("GET", "/v1/nowhere")
        self.assertEqual(status, 404)
        self.assertApiError(status, payload)
        status, payload = self.cluster.raw("GET", "/v1/completions")
        self.assertEqual(status, 405)
        self.assertApiError(status, payload)

    def test_response_format(self):
        schema = {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                  "properties": {"name": {"type": "string", "maxLength": 16},
                                 "age": {"type": "integer", "minimum": 0, "maximum": 120}}}
        response_format = {"type": "json_schema",
                           "json_schema": {"name": "person", "schema": schema, "strict": True}}
        try:
            first = self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "A person, as JSON"}],
                max_tokens=200, temperature=1.0, seed=11, response_format=response_format)
        except openai.BadRequestError as e:
            if "without its grammar engine" in str(e):
                self.skipTest("the server was built without xgrammar")
            raise
        try:
            import jsonschema
        except ImportError:
            jsonschema = None
        for seed in range(11, 15):
            c = first if seed == 11 else self.client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "A person, as JSON"}],
                max_tokens=200, temperature=1.0, seed=seed, response_format=response_format)
            value = json.loads(c.choices[0].message.content)
            self.assertEqual(c.choices[0].finish_reason, "stop")
            if jsonschema is not None:
                jsonschema.validate(value, schema)
            self.assertEqual(set(value), {"name", "age"})
            self.assertTrue(0 <= value["age"] <= 120)
        obj = self.client.completions.create(
            model=MODEL, prompt="{", max_tokens=64, seed=3,
            extra_body={"response_format": {"type": "json_object"}})
        self.assertTrue(obj.choices[0].text.startswith("{"), obj.choices[0].text)
        choice = self.client.completions.create(model=MODEL, prompt="Yes or no?", max_tokens=8,
                                                extra_body={"guided_choice": ["yes", "no"]})
        self.assertIn(choice.choices[0].text, ("yes", "no"))
        with self.assertRaises(openai.BadRequestError) as caught:
            self.client.completions.create(
                model=MODEL, prompt="x", max_tokens=4,
                extra_body={"response_format": {"type": "json_schema", "json_schema": {
                    "name": "bad", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}})
        self.assertEqual(caught.exception.body["param"], "response_format")

    def test_client_disconnect_cancels(self):
        def cancelled():
            families = {f.name: f for f in text_string_to_metric_families(
                self.cluster.raw("GET", "/metrics")[1].decode())}
            return sum(s.value for s in families["strata_requests"].samples
                       if s.labels.get("outcome") == "cancelled")
        before = cancelled()
        conn = http.client.HTTPConnection("127.0.0.1", self.cluster.http_port, timeout=60)
        conn.request("POST", "/v1/completions", body=json.dumps(
            {"model": MODEL, "prompt": "A long tale", "max_tokens": 1000, "stream": True,
             "ignore_eos": True}), headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        self.assertEqual(response.status, 200)
        self.assertTrue(response.fp.readline())  # the first chunk's size line
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        deadline = time.time() + 30
        while cancelled() == before and time.time() < deadline:
            time.sleep(0.1)
        self.assertEqual(cancelled(), before + 1)
        # The server goes on serving.
        c = self.client.completions.create(model=MODEL, prompt="After", max_tokens=3,
                                           temperature=0)
        self.assertEqual(c.usage.completion_tokens, 3)

    def test_metrics(self):
        self.client.completions.create(model=MODEL, prompt="Count me", max_tokens=4,
                                       temperature=0)
        status, payload = self.cluster.raw("GET", "/metrics")
        self.assertEqual(status, 200)
        families = {f.name: f for f in text_string_to_metric_families(payload.decode())}
        for name in ("strata_requests", "strata_prompt_tokens", "strata_generated_tokens",
                     "strata_time_to_first_token_seconds", "strata_inter_token_latency_seconds",
                     "strata_kv_blocks_capacity", "strata_kv_blocks_used", "strata_preemptions",
                     "strata_prefix_cache_hit_tokens", "strata_kv_blocks_borrowed",
                     "strata_worker_restarts", "strata_worker_tier_hits",
                     "strata_worker_tier_misses", "strata_prefetch_predicted",
                     "strata_prefetch_correct"):
            self.assertIn(name, families)
        success = [s.value for s in families["strata_requests"].samples
                   if s.labels.get("outcome") == "success"]
        self.assertGreaterEqual(success[0], 1)
        ttft = families["strata_time_to_first_token_seconds"]
        self.assertEqual(ttft.type, "histogram")
        count = [s.value for s in ttft.samples if s.name.endswith("_count")][0]
        self.assertGreaterEqual(count, 1)
        self.assertGreater(families["strata_kv_blocks_capacity"].samples[0].value, 0)
        workers = {s.labels["worker"] for s in families["strata_worker_tier_hits"].samples}
        self.assertEqual(workers, {"0", "1"})


def command_lines(sid):
    """The command lines of the processes whose sid is `sid`, `strata up` and its children
    (what any local user can read)."""
    lines = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.getsid(int(pid)) != sid:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                lines.append(f.read().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, ProcessLookupError):
            pass
    return lines


class ApiKeyAndServedNameTest(unittest.TestCase):
    """`strata up --api-key --served-model-name`, and $STRATA_API_KEY without the flag."""

    KEY = "sk-strata-test-5f0c1e"

    def check(self, cluster, name):
        status, payload = cluster.raw("GET", "/v1/models")
        self.assertEqual(status, 401)
        self.assertEqual(json.loads(payload)["error"]["code"], "invalid_api_key")
        with self.assertRaises(openai.AuthenticationError):
            cluster.client("sk-wrong").models.list()
        client = cluster.client(self.KEY)
        self.assertEqual([m.id for m in client.models.list().data], [name])
        c = client.completions.create(model=name, prompt="In the beginning", max_tokens=3,
                                      temperature=0)
        self.assertEqual(c.model, name)
        with self.assertRaises(openai.NotFoundError):
            client.completions.create(model=name + "-other", prompt="x", max_tokens=1)
        if name != MODEL:  # the directory's name is no alias of the served one
            with self.assertRaises(openai.NotFoundError):
                client.completions.create(model=MODEL, prompt="x", max_tokens=1)
        auth = {"Content-Type": "application/json", "Authorization": f"Bearer {self.KEY}"}
        status, payload = cluster.raw("POST", "/tokenize", {"prompt": "In the beginning"}, auth)
        self.assertEqual(status, 200, payload)
        self.assertEqual(json.loads(payload)["count"], c.usage.prompt_tokens)
        self.assertEqual(cluster.raw("POST", "/tokenize", {"prompt": "x"})[0], 401)
        for path in ("/health", "/metrics", "/version"):
            self.assertEqual(cluster.raw("GET", path)[0], 200, path)
        # The key is on no process's command line but the one it was typed on.
        daemons = [line for line in command_lines(cluster.proc.pid)
                   if any(d in line for d in ("strata-router", "strata-worker", "strata-expert-store"))]
        self.assertEqual(len(daemons), 4, daemons)
        for line in daemons:
            self.assertNotIn(self.KEY, line)
        self.assertNotIn(self.KEY, cluster.stderr())

    def test_flags(self):
        cluster = Cluster(extra=("--api-key", self.KEY, "--served-model-name", "demo-x"))
        try:
            self.check(cluster, "demo-x")
        finally:
            cluster.stop()

    def test_environment(self):
        cluster = Cluster(env={"STRATA_API_KEY": self.KEY})
        try:
            self.check(cluster, MODEL)
        finally:
            cluster.stop()


class QueueFullTest(unittest.TestCase):
    def test_429(self):
        # One request runs and none may wait: a second one while it runs is refused.
        cluster = Cluster(extra=("--max-queued-requests", "0", "--max-running", "1"))
        try:
            conn = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=120)
            conn.request("POST", "/v1/completions",
                         body=json.dumps({"model": MODEL, "prompt": "x", "max_tokens": 1000,
                                          "stream": True, "ignore_eos": True}),
                         headers={"Content-Type": "application/json"})
            running = conn.getresponse()
            self.assertEqual(running.status, 200)
            running.readline()  # its first event: it is in the running batch now
            status, payload = cluster.raw("POST", "/v1/completions",
                                          {"model": MODEL, "prompt": "x", "max_tokens": 2})
            self.assertEqual(status, 429)
            body = json.loads(payload)
            self.assertEqual(body["error"]["type"], "rate_limit_error")
            conn.close()
        finally:
            cluster.stop()


if __name__ == "__main__":
    unittest.main(verbosity=2)
