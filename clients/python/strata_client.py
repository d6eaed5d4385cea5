#!/usr/bin/python3
"""A small typed Python client for a Strata cluster (strata.v1.Generation over gRPC).

Needs Debian's python3-grpcio and python3-protobuf (run it with /usr/bin/python3) and the stubs
that scripts/gen_python_client.sh generates from proto/strata/v1/generation.proto. The stubs are
found, in this order: already importable (on PYTHONPATH); in $STRATA_PYTHON_GENERATED_DIR; in
build/python/ of this checkout (made by the build); else generated into a temporary directory
with scripts/gen_python_client.sh.

    from strata_client import Client
    with Client("127.0.0.1:50051") as client:
        for chunk in client.generate(prompt="Once upon a time", max_new_tokens=32):
            print(chunk.text, end="", flush=True)
        result = client.generate_all(token_ids=[1, 2, 3], max_new_tokens=8, ignore_eos=True)
        print(result.token_ids, result.finish_reason, result.usage)

Command line:
    /usr/bin/python3 clients/python/strata_client.py --server HOST:PORT --prompt "Once upon a time"
    /usr/bin/python3 clients/python/strata_client.py --server HOST:PORT --ids 1,2,3 --json
    /usr/bin/python3 clients/python/strata_client.py --server HOST:PORT --info | --health
"""

from __future__ import annotations

import argparse
import atexit
import dataclasses
import enum
import importlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

import grpc

_REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def _import_stubs():
    """Imports the generated modules, finding or generating them (see the module docstring)."""

    def attempt():
        pb2 = importlib.import_module("strata.v1.generation_pb2")
        pb2_grpc = importlib.import_module("strata.v1.generation_pb2_grpc")
        health_pb2 = importlib.import_module("grpc_health.v1.health_pb2")
        health_pb2_grpc = importlib.import_module("grpc_health.v1.health_pb2_grpc")
        return pb2, pb2_grpc, health_pb2, health_pb2_grpc

    def forget():
        for name in list(sys.modules):
            if name.split(".")[0] in ("strata", "grpc_health"):
                del sys.modules[name]

    try:
        return attempt()
    except ImportError:
        forget()
    candidates = [os.environ.get("STRATA_PYTHON_GENERATED_DIR", ""),
                  os.path.join(_REPO_ROOT, "build", "python")]
    for directory in candidates:
        if directory and os.path.isfile(
                os.path.join(directory, "strata", "v1", "generation_pb2.py")):
            sys.path.insert(0, directory)
            try:
                return attempt()
            except ImportError:
                sys.path.remove(directory)
                forget()
    script = os.path.join(_REPO_ROOT, "scripts", "gen_python_client.sh")
    if not os.path.isfile(script):
        raise ImportError("the Strata Python stubs are not importable and " + script +
                          " is missing; run scripts/gen_python_client.sh OUT_DIR and put OUT_DIR"
                          " on PYTHONPATH or in STRATA_PYTHON_GENERATED_DIR")
    directory = tempfile.mkdtemp(prefix="strata-python-stubs-")
    atexit.register(shutil.rmtree, directory, True)
    done = subprocess.run(["bash", script, directory], capture_output=True, text=True)
    if done.returncode != 0:
        raise ImportError("scripts/gen_python_client.sh failed:\n" + done.stderr)
    sys.path.insert(0, directory)
    return attempt()


generation_pb2, generation_pb2_grpc, health_pb2, health_pb2_grpc = _import_stubs()


class FinishReason(enum.IntEnum):
    """Why a request ended (strata.v1.FinishReason, without the prefix)."""

    UNSPECIFIED = 0  # not finished yet
    LENGTH = 1  # max_new_tokens reached
    STOP = 2  # a stop string or stop token was generated
    EOS = 3  # the model's end-of-sequence token
    CANCELLED = 4  # the client cancelled or its deadline passed
    ERROR = 5  # the server failed the request


if {"FINISH_REASON_" + r.name: r.value for r in FinishReason} != dict(
        generation_pb2.FinishReason.items()):
    raise ImportError("strata_client.FinishReason differs from generation.proto's FinishReason")


class HealthStatus(enum.IntEnum):
    """grpc.health.v1.HealthCheckResponse.ServingStatus."""

    UNKNOWN = 0
    SERVING = 1
    NOT_SERVING = 2
    SERVICE_UNKNOWN = 3


class StrataError(Exception):
    """A failed call: the gRPC status code (grpc.StatusCode) and the server's message."""

    def __init__(self, code: grpc.StatusCode, details: str):
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "StrataError":
        return cls(error.code(), error.details() or "")


@dataclasses.dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    time_to_first_token_ms: float
    decode_tokens_per_second: float


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One GenerateResponse: the tokens (and their text) new since the previous chunk.

    finish_reason and usage are set on the last chunk only (None before).
    """

    token_ids: List[int]
    text: str
    finish_reason: Optional[FinishReason]
    usage: Optional[Usage]
    index: int = 0  # the sample it belongs to (make_request's n)


@dataclasses.dataclass(frozen=True)
class GenerateResult:
    token_ids: List[int]
    text: str
    finish_reason: FinishReason
    usage: Optional[Usage]

    def __iter__(self):  # so that `ids, text, reason, usage = client.generate_all(...)` works
        return iter((self.token_ids, self.text, self.finish_reason, self.usage))


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    model_type: str
    vocab_size: int
    num_layers: int
    num_experts: int
    experts_per_token: int
    max_context_tokens: int
    has_tokenizer: bool
    eos_token_ids: List[int]
    num_workers: int


def _usage(message) -> Optional[Usage]:
    if not message.HasField("usage"):
        return None
    u = message.usage
    return Usage(u.prompt_tokens, u.completion_tokens, u.time_to_first_token_ms,
                 u.decode_tokens_per_second)


class Client:
    """A connection to a Strata router (the address `strata up` prints: HOST:PORT)."""

    def __init__(self, address: str, *, options: Sequence[Tuple[str, object]] = ()):
        self.address = address
        self._channel = grpc.insecure_channel(
            address, options=[("grpc.max_receive_message_length", 64 << 20), *options])
        self._stub = generation_pb2_grpc.GenerationStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def wait_for_connection(self, timeout: Optional[float] = None) -> None:
        """Blocks until the channel is connected; grpc.FutureTimeoutError after `timeout` s."""
        grpc.channel_ready_future(self._channel).result(timeout=timeout)

    @staticmethod
    def make_request(prompt: Optional[str] = None, token_ids: Optional[Sequence[int]] = None,
                     max_new_tokens: int = 16, temperature: Optional[float] = None,
                     top_p: Optional[float] = None, top_k: Optional[int] = None,
                     seed: Optional[int] = None, stop: Sequence[str] = (),
                     ignore_eos: bool = False, request_id: str = "", *,
                     min_p: Optional[float] = None, repetition_penalty: Optional[float] = None,
                     presence_penalty: Optional[float] = None,
                     frequency_penalty: Optional[float] = None,
                     logit_bias: Optional[Dict[int, float]] = None,
                     stop_token_ids: Sequence[int] = (), min_tokens: int = 0,
                     include_stop_str_in_output: bool = False,
                     skip_special_tokens: Optional[bool] = None,
                     logprobs: bool = False, prompt_logprobs: bool = False,
                     top_logprobs: int = 0, n: int = 1,
                     json_schema: Optional[Union[dict, str]] = None,
                     json_object: bool = False, regex: Optional[str] = None,
                     choices: Optional[Sequence[str]] = None):
        """The GenerateRequest message for these arguments (exactly one of prompt, token_ids).
        The sampling parameters are vLLM's (docs/http.md has the table). n: samples sharing
        one prefill (messages carry their sample's `index`). At most one of json_schema (a dict
        or its JSON text), json_object, regex and choices constrains the text
        (docs/structured-output.md)."""
        if (prompt is None) == (token_ids is None):
            raise ValueError("give exactly one of prompt and token_ids")
        if isinstance(stop, str):
            stop = (stop,)
        request = generation_pb2.GenerateRequest(
            request_id=request_id,
            max_new_tokens=max_new_tokens,
            # Only what was given: unset differs from 0 for top_p, seed, repetition_penalty.
            sampling=generation_pb2.SamplingParams(**{
                k: v for k, v in (("temperature", temperature), ("top_p", top_p),
                                  ("top_k", top_k), ("seed", seed), ("min_p", min_p),
                                  ("repetition_penalty", repetition_penalty),
                                  ("presence_penalty", presence_penalty),
                                  ("frequency_penalty", frequency_penalty)) if v is not None}),
            stop=list(stop),
            ignore_eos=ignore_eos,
            stop_token_ids=[int(i) for i in stop_token_ids],
            min_tokens=min_tokens,
            include_stop_str_in_output=include_stop_str_in_output,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs, top_logprobs=top_logprobs, n=n)
        formats = [f for f in (json_schema is not None, json_object, regex is not None,
                               choices is not None) if f]
        if len(formats) > 1:
            raise ValueError("give at most one of json_schema, json_object, regex and choices")
        kind = generation_pb2.ResponseFormat
        if json_schema is not None:
            request.response_format.type = kind.TYPE_JSON_SCHEMA
            request.response_format.json_schema = (
                json_schema if isinstance(json_schema, str) else json.dumps(json_schema))
        elif json_object:
            request.response_format.type = kind.TYPE_JSON_OBJECT
        elif regex is not None:
            request.response_format.type = kind.TYPE_REGEX
            request.response_format.regex = regex
        elif choices is not None:
            request.response_format.type = kind.TYPE_CHOICE
            request.response_format.choices.extend(choices)
        for token, bias in (logit_bias or {}).items():
            request.sampling.logit_bias[int(token)] = float(bias)
        if skip_special_tokens is not None:
            request.skip_special_tokens = skip_special_tokens
        if prompt is not None:
            request.prompt = prompt
        else:
            request.prompt_token_ids.extend(int(i) for i in token_ids)
        return request

    def generate_raw(self, request, timeout: Optional[float] = None) -> Iterator:
        """Streams the GenerateResponse messages of a GenerateRequest, as they arrive."""
        call = self._stub.Generate(request, timeout=timeout)
        try:
            for message in call:
                yield message
        except grpc.RpcError as e:
            raise StrataError.from_rpc_error(e) from None
        finally:
            call.cancel()  # a no-op once the call is over; ends it if the caller stopped early

    def generate(self, prompt: Optional[str] = None, token_ids: Optional[Sequence[int]] = None,
                 max_new_tokens: int = 16, temperature: Optional[float] = None,
                 top_p: Optional[float] = None, top_k: Optional[int] = None,
                 seed: Optional[int] = None, stop: Sequence[str] = (),
                 ignore_eos: bool = False, timeout: Optional[float] = None,
                 request_id: str = "", **sampling) -> Iterator[Chunk]:
        """Streams the new tokens of one request as Chunks. None leaves a parameter to the
        server: greedy, the whole vocabulary, a new seed each request (any seed given, 0 too,
        repeats). Raises StrataError (e.g. INVALID_ARGUMENT,
        DEADLINE_EXCEEDED after `timeout` seconds). Stopping the iteration cancels the request.
        `sampling`: make_request's keyword parameters (min_p, repetition_penalty, logit_bias,
        stop_token_ids, min_tokens, ...)."""
        request = self.make_request(prompt, token_ids, max_new_tokens, temperature, top_p, top_k,
                                    seed, stop, ignore_eos, request_id, **sampling)
        for m in self.generate_raw(request, timeout=timeout):
            reason = FinishReason(m.finish_reason)
            yield Chunk(token_ids=list(m.token_ids), text=m.text,
                        finish_reason=None if reason == FinishReason.UNSPECIFIED else reason,
                        usage=_usage(m), index=m.index)

    def generate_all(self, *args, **kwargs) -> GenerateResult:
        """generate() run to the end: (token_ids, text, finish_reason, usage). One sample: with
        n > 1, group generate()'s chunks by their index."""
        ids: List[int] = []
        text: List[str] = []
        reason = FinishReason.UNSPECIFIED
        usage = None
        for chunk in self.generate(*args, **kwargs):
            ids.extend(chunk.token_ids)
            text.append(chunk.text)
            if chunk.finish_reason is not None:
                reason = chunk.finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
        return GenerateResult(ids, "".join(text), reason, usage)

    def model_info(self, timeout: Optional[float] = None) -> ModelInfo:
        try:
            m = self._stub.ModelInfo(generation_pb2.ModelInfoRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise StrataError.from_rpc_error(e) from None
        return ModelInfo(m.model_type, m.vocab_size, m.num_layers, m.num_experts,
                         m.experts_per_token, m.max_context_tokens, m.has_tokenizer,
                         list(m.eos_token_ids), m.num_workers)

    def tokenize(self, text: str, add_special_tokens: bool = False,
                 timeout: Optional[float] = None) -> List[int]:
        """FAILED_PRECONDITION for a model without a tokenizer."""
        try:
            m = self._stub.Tokenize(
                generation_pb2.TokenizeRequest(text=text, add_special_tokens=add_special_tokens),
                timeout=timeout)
        except grpc.RpcError as e:
            raise StrataError.from_rpc_error(e) from None
        return list(m.token_ids)

    def detokenize(self, token_ids: Sequence[int], skip_special_tokens: bool = False,
                   timeout: Optional[float] = None) -> str:
        try:
            m = self._stub.Detokenize(
                generation_pb2.DetokenizeRequest(token_ids=[int(i) for i in token_ids],
                                                 skip_special_tokens=skip_special_tokens),
                timeout=timeout)
        except grpc.RpcError as e:
            raise StrataError.from_rpc_error(e) from None
        return m.text

    def health(self, service: str = "", timeout: Optional[float] = None) -> HealthStatus:
        """grpc.health.v1 Check: SERVING once every worker is connected. Service "" is the
        server as a whole (the only one the router publishes); NOT_FOUND (StrataError) for a
        service the server does not know."""
        try:
            m = self._health.Check(health_pb2.HealthCheckRequest(service=service),
                                   timeout=timeout)
        except grpc.RpcError as e:
            raise StrataError.from_rpc_error(e) from None
        return HealthStatus(m.status)

    def watch_health(self, service: str = "",
                     timeout: Optional[float] = None) -> Iterator[HealthStatus]:
        """grpc.health.v1 Watch: the status now, then each change, until `timeout` seconds."""
        call = self._health.Watch(health_pb2.HealthCheckRequest(service=service),
                                  timeout=timeout)
        try:
            for m in call:
                yield HealthStatus(m.status)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                raise StrataError.from_rpc_error(e) from None
        finally:
            call.cancel()


def _ids(text: str) -> List[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        description="Talk to a Strata cluster (the HOST:PORT that `strata up` prints).")
    parser.add_argument("--server", required=True, help="HOST:PORT of the router")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="generate from this text (needs a model tokenizer)")
    what.add_argument("--ids", help="generate from these token ids: 1,2,3")
    what.add_argument("--info", action="store_true", help="print ModelInfo as JSON")
    what.add_argument("--health", nargs="?", const="", metavar="SERVICE",
                      help="print the grpc.health.v1 status; exit 0 only if SERVING")
    what.add_argument("--tokenize", metavar="TEXT", help="print the token ids of TEXT")
    what.add_argument("--detokenize", metavar="IDS", help="print the text of 1,2,3")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true")
    parser.add_argument("--timeout", type=float, default=None, help="deadline in seconds")
    parser.add_argument("--json", action="store_true",
                        help="generate: print one JSON object at the end instead of streaming")
    args = parser.parse_args(argv)

    with Client(args.server) as client:
        try:
            if args.info:
                print(json.dumps(dataclasses.asdict(client.model_info(timeout=args.timeout))))
                return 0
            if args.health is not None:
                status = client.health(args.health, timeout=args.timeout)
                print(status.name)
                return 0 if status == HealthStatus.SERVING else 1
            if args.tokenize is not None:
                print(",".join(map(str, client.tokenize(args.tokenize, timeout=args.timeout))))
                return 0
            if args.detokenize is not None:
                print(client.detokenize(_ids(args.detokenize), timeout=args.timeout))
                return 0
            kwargs = dict(prompt=args.prompt,
                          token_ids=None if args.ids is None else _ids(args.ids),
                          max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_p=args.top_p, top_k=args.top_k, seed=args.seed, stop=args.stop,
                          ignore_eos=args.ignore_eos, timeout=args.timeout)
            if args.json:
                r = client.generate_all(**kwargs)
                print(json.dumps({
                    "token_ids": r.token_ids, "text": r.text,
                    "finish_reason": r.finish_reason.name,
                    "usage": dataclasses.asdict(r.usage) if r.usage else None}))
                return 0
            # Streams the text as it comes; the token ids for a model without a tokenizer.
            has_text = client.model_info(timeout=args.timeout).has_tokenizer
            first = True
            for chunk in client.generate(**kwargs):
                if has_text:
                    sys.stdout.write(chunk.text)
                elif chunk.token_ids:
                    sys.stdout.write(("" if first else ",") + ",".join(map(str, chunk.token_ids)))
                    first = False
                sys.stdout.flush()
                if chunk.finish_reason is not None:
                    sys.stdout.write("\n")
                    u = chunk.usage
                    print(f"[{chunk.finish_reason.name}"
                          + (f", {u.prompt_tokens} prompt + {u.completion_tokens} new tokens, "
                             f"first token {u.time_to_first_token_ms:.1f} ms, "
                             f"{u.decode_tokens_per_second:.1f} tokens/s" if u else "") + "]",
                          file=sys.stderr)
            return 0
        except StrataError as e:
            print(f"strata_client: {e}", file=sys.stderr)
            return 1


if __name__ == "__main__":
    sys.exit(main())
