#!/usr/bin/python3
"""The fault suite: what a running cluster does when a worker stops or gets stuck, and when
clients send huge, malformed or slow requests. Not a test (tests/services/cluster/trust_test.cc
checks the same behaviour with bounds); this measures it and keeps the figures.

    /usr/bin/python3 bench/faults/faults.py [--bin build/bin] [--model models/strata-demo]
        [--only NAME,...] [--out FILE.json] [--machine TEXT]

Each scenario starts `strata up` (two CPU workers, one thread each), runs, and reports the
requests it lost (each request must finish OK with every token, and generation requests with the
tokens of an undisturbed run) and its figures. Prints a table; with --out writes one JSON object
(the bench/results fields plus "faults": one object per scenario).

Scenarios:
  sigstop-continue  SIGSTOP worker 1 while 4 requests stream, SIGCONT 2.5 s later
  sigstop-killed    SIGSTOP worker 1 and leave it: the router kills it after worker_kill_after_s
                    and strata up restarts it
  stuck-thread      worker 1's serving thread held with ptrace (the rest of the process runs:
                    a worker stuck in a call, no longer reading its ring), released 2.5 s later
  huge-requests     four 60 MB and four 7 MB prompts at once, small requests meanwhile
  malformed         prompts, stop strings, Tokenize and Score texts that are not UTF-8, and
                    bytes that are no message, to every Generation method
  slow-http         520 idle HTTP connections and 20 that trickle their headers, while real
                    requests are made
  internal-rpcs     Coordinator and Admin called on the client port, and on the internal
                    listener without the cluster token
Needs Debian's python3-grpcio (run it with /usr/bin/python3); stuck-thread needs ptrace rights
over the worker (root, or a kernel.yama.ptrace_scope of at most 1).
"""
import argparse
import ctypes
import datetime
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(REPO, "clients", "python"))
import grpc  # noqa: E402
import strata_client  # noqa: E402


class Cluster:
    """`strata up` with its stderr lines kept with their arrival times."""

    def __init__(self, binary, model, extra=()):
        self.proc = subprocess.Popen([binary, "up", "--model", model, "--workers", "2",
                                      "--threads", "1", *extra],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.address = None
        for line in self.proc.stdout:
            if line.startswith("READY "):
                self.address = line.split()[1]
                break
        if self.address is None:
            raise RuntimeError("the cluster did not start:\n" + "\n".join(l for _, l in self.lines))
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def _read_stderr(self):
        for line in self.proc.stderr:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first_line(self, after, *needles):
        """When the first stderr line after `after` holding every needle came, or None."""
        for t, line in list(self.lines):
            if t >= after and all(n in line for n in needles):
                return t
        return None

    def wait_line(self, after, *needles, timeout=30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            t = self.first_line(after, *needles)
            if t is not None:
                return t
            time.sleep(0.02)
        return None

    def worker(self, index):
        """The pid of the live worker `index` (a child of strata up), or None."""
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = open(f"/proc/{pid}/cmdline").read().split("\0")
                stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if (cmd and cmd[0].endswith("strata-worker") and f"--index={index}" in cmd
                    and int(stat[1]) == self.proc.pid and stat[0] != "Z"):
                return int(pid)
        return None

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def stream(address, ids, n, out, key):
    """One greedy request of `n` new tokens: its tokens, status and the longest gap between
    two messages, into out[key]."""
    times, tokens, status = [], [], "OK"
    try:
        with strata_client.Client(address) as client:
            for chunk in client.generate(token_ids=ids, max_new_tokens=n, ignore_eos=True,
                                         timeout=300):
                times.append(time.monotonic())
                tokens.extend(chunk.token_ids)
    except strata_client.StrataError as e:
        status = f"{e.code.name}: {e.details}"
    gaps = [b - a for a, b in zip(times, times[1:])]
    out[key] = {"tokens": tokens, "status": status, "max_gap_ms": max(gaps, default=0) * 1e3}


def prompts(count):
    return [[3 + (i * 131 + j * 17) % 700 for j in range(10 + 7 * i)] for i in range(count)]


def ms(later, earlier):
    return None if later is None or earlier is None else round((later - earlier) * 1e3, 1)


def run_streams(cluster, fault, count=4, new_tokens=400):
    """`count` requests undisturbed, then again with `fault()` run 0.3 s in; lost requests and
    the longest gap between two tokens of any request."""
    ids = prompts(count)
    base = {}
    for i, p in enumerate(ids):
        stream(cluster.address, p, new_tokens, base, i)
    got = {}
    threads = [threading.Thread(target=stream, args=(cluster.address, p, new_tokens, got, i))
               for i, p in enumerate(ids)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    extra = fault()
    for t in threads:
        t.join()
    lost = sum(1 for i in range(count)
               if got[i]["status"] != "OK" or got[i]["tokens"] != base[i]["tokens"])
    result = {"requests": count, "lost": lost,
              "max_gap_ms": round(max(g["max_gap_ms"] for g in got.values()), 1),
              "undisturbed_max_gap_ms": round(max(g["max_gap_ms"] for g in base.values()), 1)}
    result.update(extra)
    return result


def sigstop(args, resume_after):
    cluster = Cluster(args.bin, args.model, ["--worker-kill-after-s", "3" if resume_after is None
                                             else "30"])
    try:
        pid = cluster.worker(1)
        marks = {}

        def fault():
            marks["stop"] = time.monotonic()
            os.kill(pid, signal.SIGSTOP)
            if resume_after is not None:
                def resume():
                    time.sleep(resume_after)
                    marks["cont"] = time.monotonic()
                    os.kill(pid, signal.SIGCONT)
                threading.Thread(target=resume, daemon=True).start()
            return {}

        r = run_streams(cluster, fault)
        stop = marks["stop"]
        failed = cluster.wait_line(stop, "expert worker 1", "stopped answering", timeout=10)
        r["declared_failed_ms"] = ms(failed, stop)
        if resume_after is not None:
            cluster.wait_line(stop, "expert worker 1 is back", timeout=30)
            r["back_after_cont_ms"] = ms(cluster.first_line(marks.get("cont", stop),
                                                            "expert worker 1 is back"),
                                         marks.get("cont"))
            r["same_process"] = cluster.worker(1) == pid
        else:
            killed = cluster.wait_line(stop, "expert worker 1 (pid", "killing it")
            registered = cluster.wait_line(stop, "strata-worker[1]: registered", timeout=60)
            r["killed_after_ms"] = ms(killed, stop)
            r["replacement_registered_ms"] = ms(registered, stop)
        return r
    finally:
        if resume_after is not None and "pid" in locals():
            try:
                os.kill(pid, signal.SIGCONT)
            except OSError:
                pass
        cluster.stop()


PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 17, 0x4206, 0x4207


def stuck_thread(args):
    """Holds the worker's main thread (which serves its channel) with ptrace: only that thread
    stops, the rest of the process runs, as when it is stuck in a call."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    cluster = Cluster(args.bin, args.model, ["--worker-kill-after-s", "30"])
    try:
        pid = cluster.worker(1)
        marks = {}
        done = threading.Event()

        def hold():
            # ptrace requests come from the tracer's thread: seize, interrupt, wait, detach.
            if libc.ptrace(PTRACE_SEIZE, pid, None, None) != 0:
                marks["error"] = os.strerror(ctypes.get_errno())
                done.set()
                return
            marks["stop"] = time.monotonic()
            libc.ptrace(PTRACE_INTERRUPT, pid, None, None)
            os.waitpid(pid, os.WUNTRACED | 0x40000000)  # __WALL
            done.set()
            time.sleep(2.5)
            marks["cont"] = time.monotonic()
            libc.ptrace(PTRACE_DETACH, pid, None, None)

        def fault():
            threading.Thread(target=hold, daemon=True).start()
            done.wait(10)
            return {"error": marks["error"]} if "error" in marks else {}

        r = run_streams(cluster, fault)
        if "stop" in marks:
            r["declared_failed_ms"] = ms(cluster.wait_line(marks["stop"], "expert worker 1",
                                                           "stopped answering", timeout=10),
                                         marks["stop"])
            cluster.wait_line(marks["stop"], "expert worker 1 is back", timeout=30)
            r["back_after_release_ms"] = ms(cluster.first_line(marks.get("cont", 0),
                                                               "expert worker 1 is back"),
                                            marks.get("cont"))
        return r
    finally:
        cluster.stop()


def raw_unary(channel, method, body, timeout=60):
    try:
        channel.unary_unary(method)(body, timeout=timeout)
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def raw_stream(channel, method, body, timeout=60):
    try:
        for _ in channel.unary_stream(method)(body, timeout=timeout):
            pass
        return "OK", ""
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""


def field(number, data):
    """A length-delimited protobuf field."""
    out, n = bytes([(number << 3) | 2]), len(data)
    while True:
        out += bytes([(n & 0x7F) | (0x80 if n >= 0x80 else 0)])
        if n < 0x80:
            return out + data
        n >>= 7


def huge_requests(args):
    cluster = Cluster(args.bin, args.model)
    try:
        channel = grpc.insecure_channel(cluster.address, options=[
            ("grpc.max_send_message_length", 128 << 20)])
        huge = field(2, b"a" * (60 << 20)) + b"\x20\x04"
        big = field(2, b" " * (7 << 20) + b"word") + b"\x20\x04"
        codes = []

        def flood(body):
            start = time.monotonic()
            codes.append((raw_stream(channel, "/strata.v1.Generation/Generate", body)[0],
                          time.monotonic() - start))

        threads = [threading.Thread(target=flood, args=(huge if i % 2 == 0 else big,))
                   for i in range(8)]
        for t in threads:
            t.start()
        small, lost = [], 0
        with strata_client.Client(cluster.address) as client:
            for _ in range(10):
                start = time.monotonic()
                try:
                    client.generate_all(prompt="In the beginning", max_new_tokens=2, timeout=60)
                except strata_client.StrataError:
                    lost += 1
                small.append(time.monotonic() - start)
        for t in threads:
            t.join()
        return {"requests": 10, "lost": lost,
                "small_p50_ms": round(statistics.median(small) * 1e3, 1),
                "small_max_ms": round(max(small) * 1e3, 1),
                "huge_refused": {c: sum(1 for k, _ in codes if k == c) for c, _ in codes},
                "slowest_refusal_ms": round(max(s for _, s in codes) * 1e3, 1)}
    finally:
        cluster.stop()


def malformed(args):
    cluster = Cluster(args.bin, args.model)
    try:
        channel = grpc.insecure_channel(cluster.address)
        bad = b"caf\xc3 \xff\xfe"
        cases = [("Generate", field(2, bad) + b"\x20\x04", True),
                 ("Generate", field(2, b"hello") + field(6, bad) + b"\x20\x04", True),
                 ("Tokenize", field(1, bad), False),
                 ("Score", field(1, bad), False),
                 ("Generate", b"\xff\xff\xff\xff\x01garbage", True),
                 ("Tokenize", b"\x0a\x7fshort", False),
                 ("Detokenize", b"\xff\xff", False),
                 ("ModelInfo", b"\x0a\x05ab", False)]
        before = len(cluster.lines)
        answered, total = 0, 0
        for _ in range(20):
            for method, body, streaming in cases:
                call = raw_stream if streaming else raw_unary
                code, details = call(channel, "/strata.v1.Generation/" + method, body)
                total += 1
                answered += code == "INVALID_ARGUMENT" and bool(details)
        with strata_client.Client(cluster.address) as client:
            ok = client.generate_all(prompt="In the beginning", max_new_tokens=4).finish_reason
        log_lines = sum(1 for _, l in cluster.lines[before:] if "libprotobuf" in l or "UTF-8" in l)
        return {"requests": total, "lost": 0 if ok else 1, "invalid_argument_with_message": answered,
                "log_lines": log_lines}
    finally:
        cluster.stop()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def http_completion(port, timeout=30):
    body = json.dumps({"model": "strata-demo", "prompt": "In the beginning", "max_tokens": 2})
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
               f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n{body}").encode())
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    s.close()
    return data.startswith(b"HTTP/1.1 200")


def slow_http(args):
    port = free_port()
    cluster = Cluster(args.bin, args.model, ["--http-port", str(port)])
    try:
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(520)]
        trickle = [socket.create_connection(("127.0.0.1", port)) for _ in range(20)]
        stop = threading.Event()
        closed_after = []
        start = time.monotonic()

        def drip(s):
            for c in b"GET /v1/models HTTP/1.1\r\nHost: a\r\nX-Slow: " + b"z" * 200:
                if stop.is_set():
                    return
                try:
                    s.send(bytes([c]))
                except OSError:
                    closed_after.append(time.monotonic() - start)
                    return
                time.sleep(1.0)

        threads = [threading.Thread(target=drip, args=(s,), daemon=True) for s in trickle]
        for t in threads:
            t.start()
        time.sleep(1.5)
        latencies, served = [], 0
        for _ in range(10):
            t0 = time.monotonic()
            served += http_completion(port)
            latencies.append(time.monotonic() - t0)
        time.sleep(13)  # past the header deadline
        stop.set()
        for s in idle + trickle:
            s.close()
        return {"requests": 10, "lost": 10 - served,
                "p50_ms": round(statistics.median(latencies) * 1e3, 1),
                "max_ms": round(max(latencies) * 1e3, 1),
                "trickling_closed": len(closed_after),
                "trickling_closed_after_s": round(max(closed_after), 1) if closed_after else None}
    finally:
        cluster.stop()


def internal_rpcs(args):
    cluster = Cluster(args.bin, args.model)
    try:
        info = None
        runtime = os.environ.get("STRATA_RUNTIME_DIR") or (
            os.path.join(os.environ["XDG_RUNTIME_DIR"], "strata")
            if os.environ.get("XDG_RUNTIME_DIR") else
            "/run/strata" if os.geteuid() == 0 and os.access("/run", os.W_OK)
            else f"/tmp/strata-{os.geteuid()}")
        for d in os.listdir(runtime):
            try:
                j = json.load(open(os.path.join(runtime, d, "cluster.json")))
            except OSError:
                continue
            if j["client"] == cluster.address:
                info = j
        client = grpc.insecure_channel(cluster.address)
        internal = grpc.insecure_channel(info["internal"])
        return {"requests": 0, "lost": 0,
                "register_on_client_port": raw_unary(client, "/strata.v1.Coordinator/RegisterWorker", b"")[0],
                "stats_on_client_port": raw_unary(client, "/strata.v1.Admin/Stats", b"")[0],
                "register_without_token": raw_unary(internal, "/strata.v1.Coordinator/RegisterWorker", b"")[0],
                "stats_without_token": raw_unary(internal, "/strata.v1.Admin/Stats", b"")[0]}
    finally:
        cluster.stop()


SCENARIOS = {
    "sigstop-continue": lambda a: sigstop(a, 2.5),
    "sigstop-killed": lambda a: sigstop(a, None),
    "stuck-thread": stuck_thread,
    "huge-requests": huge_requests,
    "malformed": malformed,
    "slow-http": slow_http,
    "internal-rpcs": internal_rpcs,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    parser.add_argument("--model", default=os.path.join(REPO, "models", "strata-demo"))
    parser.add_argument("--only", default="")
    parser.add_argument("--out", default="")
    parser.add_argument("--machine", default=f"CPU ({os.cpu_count()} cores)")
    args = parser.parse_args()
    args.bin = os.path.join(args.bin, "strata")
    names = [n for n in args.only.split(",") if n] or list(SCENARIOS)
    rows = []
    for name in names:
        started = time.monotonic()
        try:
            row = SCENARIOS[name](args)
        except Exception as e:  # a scenario that cannot run says why and the rest go on
            row = {"requests": 0, "lost": None, "error": f"{type(e).__name__}: {e}"}
        row = {"name": name, **row, "seconds": round(time.monotonic() - started, 1)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print()
    print(f"{'scenario':<18} {'requests':>8} {'lost':>5}  figures")
    for r in rows:
        figures = ", ".join(f"{k} {v}" for k, v in r.items()
                            if k not in ("name", "requests", "lost", "seconds"))
        print(f"{r['name']:<18} {r['requests']:>8} {str(r['lost']):>5}  {figures}")
    if args.out:
        record = {"model": os.path.basename(os.path.normpath(args.model)), "weights": "bf16",
                  "mode": "cluster", "machine": args.machine,
                  "date": datetime.date.today().isoformat(),
                  "command": "/usr/bin/python3 bench/faults/faults.py " + " ".join(sys.argv[1:]),
                  "faults": rows}
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
