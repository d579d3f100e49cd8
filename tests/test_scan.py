"""The C scanner (profkit/ingest/_scan.c) gives msgspec's tables or declines: never a different answer.

Every chunk the scanner accepts must decode with msgspec (the one fallback of the chunk route,
columnar.decode_chunk_msgspec_tables) to the same tables, unusable counts, t0 and event count;
whatever msgspec rejects, the scanner must decline too (so the tiered decoder still gives its
warnings). Checked on every real trace under tests/data, on hand-picked edge cases, and on random
events (hypothesis).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from profkit.ingest import scan
from profkit.ingest.coded import finish_coded, scan_chunk_tables
from profkit.ingest.columnar import NotFast, decode_chunk_msgspec_tables, decode_chunk_tables
from profkit.ingest.decode import read_bytes
from profkit.ingest.strings import Strings

from support import DATA, public_trace

TRACES = sorted(p for p in (DATA).rglob("*.json*") if p.name.endswith((".json", ".json.gz"))
                and "bad" not in p.parts and "expected" not in p.name and not p.name.endswith(("info.json", "manifest.json")))

needs_scanner = pytest.mark.skipif(scan.lib() is None, reason="no C compiler here: the msgspec decoder is used")


def _finished(got, strings: Strings):
    """A chunk's decode_chunk_tables result -> (its four finished tables and their warnings, the
    unusable counts, min ts, event count)."""
    parts, unusable, tmin, n = got
    w: list[str] = []
    return (finish_coded([parts], strings, w)[0], w), unusable, tmin, n


def _msgspec(chunk: bytes):
    s = Strings()
    try:
        return _finished(decode_chunk_msgspec_tables(chunk, s), s)
    except NotFast:
        return None


def _scanned(chunk: bytes):
    s = Strings()
    got = scan_chunk_tables(chunk, s)
    return None if got is None else _finished(got, s)


def _equal(a, b) -> bool:
    (ta, wa), *rest_a = a
    (tb, wb), *rest_b = b
    return wa == wb and rest_a == rest_b and all(x.equals(y) and x.schema == y.schema for x, y in zip(ta, tb))


def _same(chunk: bytes) -> str:
    """"rejected" (both), "declined" (the scanner; msgspec answers) or "same" (both answered, equal)."""
    got = _scanned(chunk)
    ref = _msgspec(chunk)
    if ref is None:
        assert got is None, "the scanner accepted what msgspec rejects"
        return "rejected"
    if got is None:
        return "declined"  # declining is always allowed (msgspec answers)
    assert _equal(got, ref)
    return "same"


def _events_array(path: Path) -> bytes | None:
    data = read_bytes(path)
    m = re.search(rb'"traceEvents"\s*:\s*\[', data)
    if m is None:
        return None
    doc = json.loads(data)
    return json.dumps(doc["traceEvents"]).encode()


@needs_scanner
@pytest.mark.parametrize("path", TRACES, ids=lambda p: str(p.relative_to(DATA)))
def test_real_traces_scan_exactly(path: Path) -> None:
    """Each real trace's events, as written (compact re-dump) and pretty-printed like Kineto."""
    arr = _events_array(path)
    if arr is None:
        pytest.skip("not a Kineto document")
    got = _scanned(arr)
    assert got is not None, "the scanner should accept a real trace"
    _same(arr)
    pretty = json.dumps(json.loads(arr), indent=2).encode()
    _same(pretty)
    assert _equal(_scanned(pretty), got)


EDGE = [
    '[]',
    '[ ]',
    '[{"ph":"X"}]',
    '[{"ph":"X","name":"a\\u00e9\\n\\"b\\\\","cat":"Kernel","ts":1,"dur":2}]',
    '[{"ph":"X","name":"ünï","ts":1.5e3,"dur":0.0,"pid":"GPU 0","tid":7}]',
    '[{"ph":"X","ts":-0.0,"dur":-1,"pid":-3,"tid":"-3"}]',
    '[{"ph":"X","ts":1,"dur":1,"pid":-0}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"60"}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"6x"}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":""}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"\\u00b2"}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"²"}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":1.5}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":3,"correlation":null}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":3},"args":{"stream":7}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":null}]',
    '[{"ph":"i","ts":1,"args":null}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":12345678901234567890}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":1e3}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":"3"}}]',
    '[{"ph":"X","ts":12345678901234567890,"dur":1}]',
    '[{"ph":"X","ts":1e400,"dur":1}]',
    '[{"ph":"X","ts":"1","dur":1}]',
    '[{"ph":"X","ts":true,"dur":1}]',
    '[{"ph":"X","ts":1,"dur":1,"name":5}]',
    '[{"ph":"X","ts":1,"dur":1,"pid":1.5}]',
    '[{"ph":"X","ts":1,"dur":1,"pid":null}]',
    '[{"ph":"Q","ts":1}]',
    '[{"ph":"","ts":1}]',
    '[{"ph":"XX","ts":1}]',
    '[{"ts":1}]',
    '[{"ph":"X","ts":1,"dur":1,"x":tru}]',
    '[{"ph":"X","ts":1,"dur":1,"x":[1,,2]}]',
    '[{"ph":"X","ts":1,"dur":1,"x":{"a" 1}}]',
    '[{"ph":"X","ts":1,"dur":1,"x":[{"a":[1,{"b":"}]"}]},{}],"y":-1.5E+2}]',
    '[{"ph":"X","ts":1,"dur":1,"x":01}]',
    '[{"ph":"X","ts":01,"dur":1}]',
    '[{"ph":"X","ts":1.,"dur":1}]',
    '[{"ph":"X","ts":1,"dur":1,"name":"tab\there"}]',
    '[{"ph":"X","ts":1,"dur":1,"name":"bad \\x escape"}]',
    '[{"ph":"X","ts":1,"dur":1}] x',
    '[{"ph":"X","ts":1,"dur":1},]',
    '[5]',
    '[{"ph":"X","ts":1,"dur":1}',
    '[{"ph":"X","ts":1,"dur":1,"\\u0070h":"i"}]',
    '[{"ph":"M","name":"process_name","pid":1,"args":{"name":"python"}},{"ph":"X","ts":3,"dur":1},{"ph":"f","ts":0.5,"id":1,"bp":"e"}]',
    # keys told from their first bytes: longer keys sharing a prefix, spaces around the colon, keys near the end
    '[{"phase":"i","ph":"X","tsx":5,"ts":1,"dur":1,"names":"a","name":"n","cats":"d","cat":"c","argsx":1,"pidx":"p","tid2":3}]',
    '[{"ph" : "X", "ts" :1 ,"dur": 1 , "args" : {"stream" : 7}}]',
    '[{"dur":1,"ph":"X","ts":1}]',
    '[{"ph":"X","ts":1,"dur":1,"tid":7}]',
    '[{"ph":"X","ts":1,"dur":1,"p\u0069d":7}]',
    # digit runs ending inside and past an 8-byte word, and a byte above 0x7f right after digits
    '[{"ph":"X","ts":12345678é,"dur":1}]',
    '[{"ph":"X","ts":1,"dur":1,"x":1234567890123456789012345678901234567890}]',
    '[{"ph":"X","ts":1,"dur":1,"x":-98765432109876543210.123456789e-5}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":123456789012345678}}]',
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":1234567890123456789}}]',
]

# JSON numbers of every digit count from 1 to 20, with fractions of 0 to 9 digits, in each numeric
# field (ts and dur are floats, pid/tid ids, args ints) and in a skipped field: the 8-digits-at-a-time
# parsing and skipping against msgspec's
_NUMS = [("-" if (i + f) % 3 == 0 else "") + "9876543210123456789012"[: i].lstrip("0") + ("." + "1357924680"[:f] if f else "")
         for i in range(1, 21) for f in range(0, 10)]


@pytest.mark.parametrize("field", ["ts", "dur", "pid", "args.correlation", "args.External id", "args.bytes", "skipped"])
def test_numbers_of_every_length_scan_like_msgspec(field: str) -> None:
    if scan.lib() is None:
        pytest.skip("no C compiler here: the msgspec decoder is used")
    # a category whose table keeps the field (else the row would be dropped and the number unseen)
    cat = "kernel" if field in ("args.correlation", "args.bytes") else "cpu_op"
    for num in _NUMS:
        if field.startswith("args."):
            ev = f'{{"ph":"X","cat":"{cat}","ts":1,"dur":1,"args":{{"{field[5:]}":{num}}}}}'
        elif field == "skipped":
            ev = f'{{"ph":"X","cat":"{cat}","ts":1,"dur":1,"Python id":{num}}}'
        else:
            ev = f'{{"ph":"X","cat":"{cat}","ts":1,"dur":1,"{field}":{num}}}'
        _same(f"[{ev}]".encode())
        _same(f"[{ev},{ev}]".encode())
        if len(num.strip("-").replace(".", "")) <= 15 and (field in ("ts", "dur", "skipped") or "." not in num):
            assert _scanned(f"[{ev}]".encode()) is not None, f"{field}={num} should be scanned, not declined"


# what msgspec accepts and the scanner declines on purpose (the rest must be scanned, so that a
# scanner declining everything fails here)
DECLINED_OK = {
    '[{"ph":"X","ts":1,"dur":1,"pid":-0}]',  # -0 as an id
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"\\u00b2"}}]',  # a digit string that is not ASCII
    '[{"ph":"X","ts":1,"dur":1,"args":{"bytes":"²"}}]',
    '[{"ph":"X","ts":12345678901234567890,"dur":1}]',  # more digits than the fast number parser takes
    '[{"ph":"X","ts":1,"dur":1,"args":{"correlation":1234567890123456789}}]',
}


@needs_scanner
@pytest.mark.parametrize("text", EDGE)
def test_edge_cases_scan_like_msgspec(text: str) -> None:
    got = _same(text.encode())
    if text not in DECLINED_OK:
        assert got != "declined", "the scanner declined what it should scan"


def test_declined_on_purpose_are_edge_cases() -> None:
    assert DECLINED_OK <= set(EDGE)


def test_invalid_utf8_declined() -> None:
    _same(b'[{"ph":"X","ts":1,"dur":1,"name":"\xff\xfe"}]')


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
_field = st.one_of(_json_values, st.integers(-5, 10**6), st.floats(-1e6, 1e12, allow_nan=False), st.sampled_from(["", "0", "12", "cpu_op", "Kernel"]))
_args = st.dictionaries(st.sampled_from(["correlation", "External id", "stream", "device", "bytes", "Python id", "grid"]), _field, max_size=4)
_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "i", "M", "f", "s", "Z"])},
    optional={"name": _field, "cat": _field, "ts": _field, "dur": _field, "pid": _field, "tid": _field,
              "args": st.one_of(st.none(), _args, _field), "extra": _json_values},
)


@needs_scanner
def test_random_events_scan_like_msgspec() -> None:
    seen = {"rejected": 0, "declined": 0, "same": 0}

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(_event, max_size=6), st.sampled_from([None, 1]))
    def check(events: list, indent: int | None) -> None:
        seen[_same(json.dumps(events, indent=indent, ensure_ascii=False).encode())] += 1

    check()
    # most random documents are rejected by both; of 300, some 20-30 are well typed (measured): the
    # scanner must have answered those, else this test would pass on a scanner that declines all
    assert seen["same"] >= 5, seen


def test_no_scanner_same_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """PROFKIT_NO_SCANNER=1 (or no compiler): msgspec decodes, and the trace is the same."""
    from profkit.ingest import load_trace

    path = public_trace("tracelens_sglang_qwen3-8b_mi300x_extend_step.json.gz")
    with_scan = load_trace(path, cache=False)
    monkeypatch.setattr(scan, "_TRIED", True)
    monkeypatch.setattr(scan, "_LIB", None)
    without = load_trace(path, cache=False)
    for t in ("gpu_ops", "calls", "cpu", "gpu_annotations"):
        assert getattr(with_scan, t).equals(getattr(without, t))
    assert (with_scan.t0_ns, with_scan.n_events, with_scan.warnings) == (without.t0_ns, without.n_events, without.warnings)


_i64 = st.integers(-(10**17), 10**17)
_num = st.one_of(st.none(), st.floats(-1e15, 1e15, allow_nan=False), _i64)
_valid_args = st.fixed_dictionaries({}, optional={
    "correlation": st.one_of(st.none(), _i64), "External id": st.one_of(st.none(), _i64), "stream": st.one_of(st.none(), _i64),
    "device": st.one_of(st.none(), _i64), "bytes": st.one_of(st.none(), _i64, st.text(max_size=4), st.from_regex(r"\A[0-9]{1,12}\Z")),
    "Python id": _i64, "Input Dims": _json_values, "Concrete Inputs": st.lists(st.text(max_size=5), max_size=3),
})
_valid_event = st.fixed_dictionaries(
    {"ph": st.sampled_from(["X", "X", "X", "X", "i", "M", "f", "s", "C"])},
    optional={"name": st.text(max_size=12), "cat": st.sampled_from(["kernel", "cpu_op", "python_function", "Runtime", "", "gpu_memcpy"]),
              "ts": _num, "dur": _num, "pid": st.one_of(_i64, st.text(max_size=5)), "tid": st.one_of(_i64, st.text(max_size=5)),
              "args": _valid_args, "id": _i64, "bp": st.just("e")},
)


@needs_scanner
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_valid_event, min_size=1, max_size=8), st.sampled_from([None, 2]), st.booleans())
@example([{"ph": "X", "args": {"bytes": "\x7f"}}], None, True)  # found by CI: ensure_ascii writes DEL as \u007f
def test_random_valid_events_are_scanned(events: list, indent: int | None, ascii_only: bool) -> None:
    """Well-typed events (the shape real traces have): the scanner accepts them and agrees."""
    chunk = json.dumps(events, indent=indent, ensure_ascii=ascii_only).encode()
    ref = _msgspec(chunk)
    got = _scanned(chunk)
    assert ref is not None
    def escaped_or_unicode(b: object) -> bool:
        """As json.dumps wrote it: an escape (ensure_ascii escapes DEL, 0x7f, too) or non-ASCII text."""
        if not isinstance(b, str):
            return False
        written = json.dumps(b, ensure_ascii=ascii_only)[1:-1]
        return "\\" in written or not written.isascii()

    if any(escaped_or_unicode(e["args"].get("bytes")) for e in events if isinstance(e.get("args"), dict)):
        return  # a "bytes" string with escapes or non-ASCII text: the scanner leaves it to msgspec
    assert got is not None, "the scanner declined well-typed events"
    assert _equal(got, ref)


def test_scanner_never_loaded_from_a_shared_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache folder others can write to is skipped: nothing is built or loaded from it."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(shared))
    monkeypatch.setattr(scan, "_TRIED", False)
    monkeypatch.setattr(scan, "_LIB", None)
    scan.lib()
    assert list(shared.iterdir()) == []
    assert scan._private(tmp_path / "new-private") and (tmp_path / "new-private").stat().st_mode & 0o777 == 0o700


def test_damaged_library_is_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A truncated or foreign file where the scanner should be: no crash, the next folder or msgspec."""
    private = tmp_path / "cache"
    private.mkdir(mode=0o700)
    (private / f"_scan-{scan._tag()}.so").write_bytes(b"not a library")
    monkeypatch.setenv("PROFKIT_CACHE_DIR", str(private))
    monkeypatch.setattr(scan, "_TRIED", False)
    monkeypatch.setattr(scan, "_LIB", None)
    scan.lib()  # must not raise
    chunk = b'[{"ph":"X","cat":"kernel","name":"k","ts":1,"dur":2,"pid":0,"tid":7}]'
    parts, _, tmin, n = decode_chunk_tables(chunk, Strings())
    assert (parts[0].height, tmin, n) == (1, 1.0, 1)
