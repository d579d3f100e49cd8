"""Drive a workload over HTTP: `concurrency` conversations in flight, one thread each.

Each request is SGLang's native POST /generate with input_ids (the whole history) and
ignore_eos (SGLang, the proxy), or vLLM's POST /v1/completions with the ids as the prompt. With streaming the first chunk gives TTFT; the final meta_info gives prompt,
completion and cached tokens and the speculative verify count.

A request fails when SGLang says so inside the stream (HTTP 200 with `data: {"error": ...}`,
http_server.py `stream_results`), answers with an HTTP error, aborts it (finish_reason
`{"type": "abort", ...}`), times out, or returns fewer tokens than asked for (ignore_eos makes
the length exact). A failed request is recorded with the server's text and ends its
conversation (the next turn would need its reply); it never counts in the throughput.
"""

from __future__ import annotations

import json
import socket
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, TypedDict

from profkit.http import HTTPFailure
from profkit.workloads.agentic import Workload


class MetaInfo(TypedDict, total=False):
    """A request's final meta_info (SGLang's /generate; built from the usage chunk for /v1/completions): the parts read."""
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_verify_ct: int | None
    finish_reason: Any  # SGLang: {"type": "length" | "abort", ...}; vLLM: a string


class Choice(TypedDict, total=False):
    """One `choices` entry of a /v1/completions chunk."""
    token_ids: list[int] | None
    finish_reason: str | None


class TokenDetails(TypedDict, total=False):
    cached_tokens: int | None


class Usage(TypedDict, total=False):
    """The `usage` of vLLM's last /v1/completions chunk (stream_options.include_usage)."""
    prompt_tokens: int
    completion_tokens: int
    prompt_tokens_details: TokenDetails | None


class Chunk(TypedDict, total=False):
    """One streamed JSON chunk: SGLang's /generate (output_ids, meta_info) or vLLM's /v1/completions (choices, usage); either may carry `error`."""
    error: Any
    output_ids: list[int] | None
    meta_info: MetaInfo | None
    choices: list[Choice] | None
    usage: Usage | None


class FailedRequest(TypedDict):
    """One failed request as a run manifest lists it (DriveResult.failed_json)."""
    conversation: int
    turn: int
    prompt_tokens: int
    completion_tokens: int
    error: str | None


class Metrics(TypedDict, total=False):
    """Throughput and latency of one pass (DriveResult.metrics), as a manifest's `repeats` entry holds it; a pass
    without a successful request has only its three counts."""
    requests: int
    failed_requests: int
    errors: int
    duration_s: float
    output_tokens: int
    prompt_tokens: int
    cached_tokens: int
    cache_hit_rate: float
    ttft_ms_p50: float | None
    itl_ms_p50: float | None
    tokens_per_s_per_user_p50: float | None
    tokens_per_s: float
    tokens_per_s_per_gpu: float | None
    accept_length: float | None  # a vLLM repeat's: its spec-decode counters over the repeat (capture/run.py)
    e2e_s_p50: float


@dataclass
class RequestRecord:
    conversation: int
    turn: int
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    spec_verify_ct: int | None
    start_s: float
    ttft_s: float | None
    e2e_s: float
    error: str | None = None  # None: the request succeeded

    @property
    def ok(self) -> bool:
        return self.error is None


class RequestFailed(Exception):
    """The server refused or broke off one request; the message is its own text where it gave one."""

    def __init__(self, message: str, *, completion_tokens: int = 0, meta: MetaInfo | None = None) -> None:
        super().__init__(message)
        self.completion_tokens = completion_tokens
        self.meta: MetaInfo = meta or {}


@dataclass
class DriveResult:
    records: list[RequestRecord] = field(default_factory=list)
    duration_s: float = 0.0
    errors: list[str] = field(default_factory=list)  # transport errors: the server stopped answering

    @property
    def failed(self) -> list[RequestRecord]:
        return [r for r in self.records if not r.ok]

    def failed_json(self, limit: int = 100) -> list[FailedRequest]:
        return [{"conversation": r.conversation, "turn": r.turn, "prompt_tokens": r.prompt_tokens,
                 "completion_tokens": r.completion_tokens, "error": r.error} for r in self.failed[:limit]]

    def metrics(self, world_size: int = 1, *, gpu: bool = True) -> Metrics:
        """Throughput and latency of the successful requests. `gpu` False (the engine ran on a
        CPU): no tokens/s per GPU (None), there is no GPU to divide by."""
        r = [x for x in self.records if x.ok]
        failed = len(self.records) - len(r)
        if not r:
            return {"requests": 0, "failed_requests": failed, "errors": len(self.errors)}
        out_tok = sum(x.completion_tokens for x in r)
        prompt = sum(x.prompt_tokens for x in r)
        cached = sum(x.cached_tokens for x in r)
        ttfts = [x.ttft_s for x in r if x.ttft_s is not None]
        itls = [
            (x.e2e_s - x.ttft_s) / (x.completion_tokens - 1)
            for x in r if x.ttft_s is not None and x.completion_tokens > 1 and x.e2e_s > x.ttft_s
        ]
        per_user = [(x.completion_tokens - 1) / (x.e2e_s - x.ttft_s) for x in r
                    if x.ttft_s is not None and x.completion_tokens > 1 and x.e2e_s > x.ttft_s]
        if not per_user:  # no streaming: whole-request rate
            per_user = [x.completion_tokens / x.e2e_s for x in r if x.e2e_s > 0]
        verify = [x.spec_verify_ct for x in r if x.spec_verify_ct]
        total_tps = out_tok / self.duration_s if self.duration_s > 0 else 0.0
        return {
            "requests": len(r),
            "failed_requests": failed,
            "errors": len(self.errors),
            "duration_s": self.duration_s,
            "output_tokens": out_tok,
            "prompt_tokens": prompt,
            "cached_tokens": cached,
            "cache_hit_rate": cached / prompt if prompt else 0.0,
            "ttft_ms_p50": 1000 * statistics.median(ttfts) if ttfts else None,
            "itl_ms_p50": 1000 * statistics.median(itls) if itls else None,
            "tokens_per_s_per_user_p50": statistics.median(per_user) if per_user else None,
            "tokens_per_s": total_tps,
            "tokens_per_s_per_gpu": total_tps / max(world_size, 1) if gpu else None,
            "accept_length": (sum(x.completion_tokens for x in r if x.spec_verify_ct) / sum(verify)) if verify else None,
            "e2e_s_p50": statistics.median(x.e2e_s for x in r),
        }


def _error_text(obj: Any) -> str:
    """SGLang's error bodies: {"error": {"message": ...}} (also in a stream), {"error": "..."}, {"detail": ...}."""
    if isinstance(obj, dict):
        e = obj.get("error", obj.get("detail", obj))
        if isinstance(e, dict):
            return str(e.get("message") or e)
        return str(e)
    return str(obj)


class _Events:
    """The JSON chunks of a server-sent-events response (`data: {...}` lines), up to `data: [DONE]`;
    `done` says whether that end marker came (a stream cut short ends without it). SGLang's /generate
    and vLLM's /v1/completions stream alike."""

    def __init__(self, resp: Any) -> None:
        self.resp = resp
        self.done = False

    def __iter__(self) -> Iterator[Chunk]:
        for raw in self.resp:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                self.done = True
                return
            chunk: Chunk = json.loads(payload)
            yield chunk


def _generate(base_url: str, ids: list[int], max_new: int, timeout: float,
              on_chunk: Callable[[], None] | None = None) -> tuple[list[int], MetaInfo, float | None]:
    """One /generate call, streamed. Returns output ids, final meta_info and TTFT (s from send).
    `on_chunk` is called once per streamed chunk with output ids (one per decode step the server ran).

    Raises RequestFailed for anything the server refused or broke off, HTTPFailure when it does
    not answer at all (connection refused: it may have died)."""
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True, "temperature": 0}, "stream": True}
    req = urllib.request.Request(base_url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    out: list[int] = []
    meta: MetaInfo = {}
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            ctype = resp.headers.get("Content-Type", "")
            if "text/event-stream" not in ctype:
                obj: Chunk = json.loads(resp.read())  # one JSON reply, shaped as one chunk
                if isinstance(obj, dict) and "error" in obj:
                    raise RequestFailed(_error_text(obj))
                out, meta = list(obj.get("output_ids") or []), obj.get("meta_info") or {}
            else:
                events = _Events(resp)
                for chunk in events:
                    if "error" in chunk:  # SGLang: HTTP 200, the error inside the stream
                        raise RequestFailed(_error_text(chunk), completion_tokens=len(out), meta=meta)
                    ids_ = list(chunk.get("output_ids") or [])
                    if ids_ and ttft is None:
                        ttft = time.perf_counter() - t0
                    if ids_ and on_chunk:
                        on_chunk()
                    meta = chunk.get("meta_info") or meta
                    # default: every chunk carries all ids so far; --incremental-streaming-output: only the new ones
                    n = meta.get("completion_tokens")
                    if n is not None and len(out) + len(ids_) == n and len(ids_) != n:
                        out = out + ids_
                    else:
                        out = ids_
                if not events.done:
                    raise RequestFailed("the stream ended without data: [DONE]", completion_tokens=len(out), meta=meta)
    except urllib.error.HTTPError as e:
        text = e.read()[:500]
        try:
            msg = _error_text(json.loads(text))
        except ValueError:
            msg = text.decode(errors="replace").strip()
        raise RequestFailed(f"HTTP {e.code}: {msg}") from None
    except (socket.timeout, TimeoutError):
        raise RequestFailed(f"timed out after {timeout:.0f} s", completion_tokens=len(out), meta=meta) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise RequestFailed(f"timed out after {timeout:.0f} s", completion_tokens=len(out), meta=meta) from None
        raise HTTPFailure(f"{base_url}/generate: {e.reason}") from None
    except (ConnectionError, OSError) as e:
        raise HTTPFailure(f"{base_url}/generate: {e}") from None
    fr = meta.get("finish_reason")
    if isinstance(fr, dict) and fr.get("type") == "abort":
        raise RequestFailed(f"aborted by the server: {fr.get('message') or fr}", completion_tokens=len(out), meta=meta)
    got = int(meta.get("completion_tokens", len(out)))
    if got < max_new:
        raise RequestFailed(f"short reply: {got} of {max_new} tokens (finish_reason {json.dumps(fr)})", completion_tokens=got, meta=meta)
    return out, meta, ttft


def _completions(base_url: str, model: str, ids: list[int], max_new: int, timeout: float,
                 on_chunk: Callable[[], None] | None = None) -> tuple[list[int], MetaInfo, float | None]:
    """One OpenAI-style POST /v1/completions with token ids (vLLM), streamed: the same contract as
    _generate, with meta_info built from the final usage chunk (prompt, completion, cached tokens).

    vLLM 0.32 (entrypoints/openai/completion/serving.py): `"prompt": [ids]`; `return_token_ids`
    puts each chunk's new ids in `choices[0].token_ids`; `stream_options.include_usage` adds a last
    chunk with `usage` (cached tokens under `prompt_tokens_details` with --enable-prompt-tokens-details);
    an error is HTTP 400 `{"error": {"message"}}`, or `data: {"error": ...}` inside the stream."""
    body = {"model": model, "prompt": ids, "max_tokens": max_new, "ignore_eos": True, "temperature": 0, "stream": True,
            "return_token_ids": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    out: list[int] = []
    usage: Usage = {}
    finish: str | None = None
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            events = _Events(resp)
            for chunk in events:
                if "error" in chunk:
                    raise RequestFailed(_error_text(chunk), completion_tokens=len(out))
                for ch in chunk.get("choices") or []:
                    new = list(ch.get("token_ids") or [])
                    if new and ttft is None:
                        ttft = time.perf_counter() - t0
                    out += new
                    finish = ch.get("finish_reason") or finish
                    if new and on_chunk is not None:
                        on_chunk()
                usage = chunk.get("usage") or usage
            if not events.done:
                raise RequestFailed("the stream ended without data: [DONE]", completion_tokens=len(out))
    except urllib.error.HTTPError as e:
        text = e.read()[:500]
        try:
            msg = _error_text(json.loads(text))
        except ValueError:
            msg = text.decode(errors="replace").strip()
        raise RequestFailed(f"HTTP {e.code}: {msg}") from None
    except (socket.timeout, TimeoutError):
        raise RequestFailed(f"timed out after {timeout:.0f} s", completion_tokens=len(out)) from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, (socket.timeout, TimeoutError)):
            raise RequestFailed(f"timed out after {timeout:.0f} s", completion_tokens=len(out)) from None
        raise HTTPFailure(f"{base_url}/v1/completions: {e.reason}") from None
    except (ConnectionError, OSError) as e:
        raise HTTPFailure(f"{base_url}/v1/completions: {e}") from None
    got = int(usage.get("completion_tokens", len(out)))
    if finish == "abort" or got < max_new:
        raise RequestFailed(f"short reply: {got} of {max_new} tokens (finish_reason {json.dumps(finish)})", completion_tokens=got)
    details = usage.get("prompt_tokens_details") or {}
    meta: MetaInfo = {"prompt_tokens": int(usage.get("prompt_tokens", len(ids))), "completion_tokens": got,
            "cached_tokens": int(details.get("cached_tokens") or 0), "finish_reason": finish}
    return out, meta, ttft


def drive(
    base_url: str, workload: Workload, *, concurrency: int, conversations: int | None = None, timeout_s: float = 3600,
    on_submit: Callable[[int, int], None] | None = None, stop: threading.Event | None = None, api: str = "sglang",
    model: str | None = None, on_chunk: Callable[[int], None] | None = None,
) -> DriveResult:
    """Run `conversations` (default: `concurrency`) conversations, `concurrency` at a time.

    `api`: "sglang" (POST /generate with input_ids: SGLang and the proxy) or "openai" (POST
    /v1/completions with token ids and `model`: vLLM). `on_chunk(conversation)` is called for every
    streamed chunk (progress of a profile window)."""
    if api == "openai":
        send: Callable[..., tuple[list[int], MetaInfo, float | None]] = \
            lambda url, ids, n, t, cb=None: _completions(url, model or "", ids, n, t, cb)
    else:
        send = _generate
    n_conv = conversations or concurrency
    result = DriveResult()
    lock = threading.Lock()
    next_conv = iter(range(n_conv))
    stop = stop or threading.Event()

    def worker() -> None:
        while not stop.is_set():
            with lock:
                c = next(next_conv, None)
            if c is None:
                return
            history: list[int] = []
            for t in range(workload.n_turns(c)):
                if stop.is_set():
                    return
                history += workload.new_tokens(c, t)
                if on_submit:
                    on_submit(c, t)
                start = time.perf_counter()
                try:
                    out, meta, ttft = send(base_url, history, workload.output_tokens, timeout_s,
                                           (lambda c=c: on_chunk(c)) if on_chunk else None)
                except RequestFailed as e:
                    with lock:
                        result.records.append(RequestRecord(
                            conversation=c, turn=t, prompt_tokens=int(e.meta.get("prompt_tokens", len(history))),
                            completion_tokens=e.completion_tokens, cached_tokens=int(e.meta.get("cached_tokens", 0)),
                            spec_verify_ct=e.meta.get("spec_verify_ct"), start_s=start, ttft_s=None,
                            e2e_s=time.perf_counter() - start, error=str(e)))
                    break  # the conversation cannot go on without this reply
                except (HTTPFailure, ValueError) as e:
                    with lock:
                        result.errors.append(str(e))
                    stop.set()
                    return
                e2e = time.perf_counter() - start
                with lock:
                    result.records.append(RequestRecord(
                        conversation=c, turn=t, prompt_tokens=int(meta.get("prompt_tokens", len(history))),
                        completion_tokens=int(meta.get("completion_tokens", len(out))), cached_tokens=int(meta.get("cached_tokens", 0)),
                        spec_verify_ct=meta.get("spec_verify_ct"), start_s=start, ttft_s=ttft, e2e_s=e2e,
                    ))
                history += out

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(concurrency, n_conv))]
    for th in threads:
        th.start()
    for th in threads:
        while th.is_alive():
            th.join(timeout=0.2)
    result.duration_s = time.perf_counter() - t0
    return result
