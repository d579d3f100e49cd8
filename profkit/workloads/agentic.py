"""The study's agentic workload as a deterministic synthetic generator.

Per conversation: a first prompt of `isl` tokens, then `turns` turns; each later turn appends the
previous reply and `turn_tokens` new tokens (tool output, user message), and asks for
`output_tokens` tokens with ignore_eos. With the study's numbers (80K, 13 turns, 800 new, 220 out)
the aggregate prefix-cache hit is ~92%: every turn re-sends the whole history.
Or replay a JSONL file: one line per conversation, {"turns": [[token ids of turn 1], ...], "output_tokens": N}.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from profkit.errors import UsageError


@dataclass(frozen=True)
class Workload:
    isl: int
    turns: int = 13
    turn_tokens: int = 800
    output_tokens: int = 220
    seed: int = 0
    vocab: int = 1000
    replay: tuple[tuple[tuple[int, ...], ...], ...] | None = None  # from --workload-file

    def new_tokens(self, conversation: int, turn: int) -> list[int]:
        """The tokens the client adds at this turn (the first turn: the whole first prompt)."""
        if self.replay is not None:
            conv = self.replay[conversation % len(self.replay)]
            return list(conv[turn]) if turn < len(conv) else []
        rng = random.Random((self.seed * 1_000_003 + conversation) * 1009 + turn)
        n = self.isl if turn == 0 else self.turn_tokens
        # keep ids clear of 0 (often a special token)
        return [rng.randrange(1, self.vocab) for _ in range(n)]

    def n_turns(self, conversation: int) -> int:
        if self.replay is not None:
            return len(self.replay[conversation % len(self.replay)])
        return self.turns

    def expected_hit_rate(self) -> float:
        """The aggregate prefix-cache hit the construction implies (every turn re-sends the history)."""
        prompt = cached = 0
        hist = 0
        for t in range(self.turns):
            p = hist + (self.isl if t == 0 else self.turn_tokens)
            prompt += p
            cached += hist
            hist = p + self.output_tokens
        return cached / prompt if prompt else 0.0

    def describe(self) -> dict[str, object]:
        return {"isl": self.isl, "turns": self.turns, "turn_tokens": self.turn_tokens, "output_tokens": self.output_tokens,
                "seed": self.seed, "replay": self.replay is not None, "expected_cache_hit": round(self.expected_hit_rate(), 4)}


def load_workload_file(path: Path, *, output_tokens: int) -> Workload:
    convs = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as e:
        raise UsageError(f"{path}: cannot read the workload file ({e.strerror})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            turns = tuple(tuple(int(t) for t in turn) for turn in obj["turns"])
        except (ValueError, KeyError, TypeError) as e:
            raise UsageError(f"{path}:{i}: not a conversation line ({e})", hint='each line: {"turns": [[ids...], [ids...]]}') from None
        if not turns:
            raise UsageError(f"{path}:{i}: a conversation with no turns")
        convs.append(turns)
    if not convs:
        raise UsageError(f"{path}: no conversations")
    return Workload(isl=len(convs[0][0]), turns=max(len(c) for c in convs), turn_tokens=0, output_tokens=output_tokens, replay=tuple(convs))
