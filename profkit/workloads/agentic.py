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
from dataclasses import dataclass, replace
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

    def prompt_lengths(self, conversation: int) -> list[int]:
        """The input length of each turn's request: the whole history so far (every earlier turn's
        new tokens and `output_tokens` per earlier reply) plus this turn's new tokens."""
        out, hist = [], 0
        for t in range(self.n_turns(conversation)):
            n = len(self.replay[conversation % len(self.replay)][t]) if self.replay is not None else (self.isl if t == 0 else self.turn_tokens)
            out.append(hist + n)
            hist += n + self.output_tokens
        return out

    def overflow(self, context_length: int, reserved: int = 0) -> tuple[int, int, int] | None:
        """The first (conversation, turn, tokens needed) whose request does not fit, or None.

        SGLang's tokenizer (tokenizer_manager._validate_one_request) refuses a request when
        input + reserved >= context, or input + reserved + max_new_tokens > context."""
        for c in self._distinct_conversations():
            for t, n in enumerate(self.prompt_lengths(c)):
                need = n + reserved + self.output_tokens
                if n + reserved >= context_length or need > context_length:
                    return c, t, need
        return None

    def _distinct_conversations(self) -> range:
        # synthetic conversations all have the same lengths; a replay has its own per line
        return range(len(self.replay)) if self.replay is not None else range(1)

    def fit(self, context_length: int, reserved: int = 0) -> tuple["Workload", str | None]:
        """The workload trimmed so that every turn fits, and a sentence saying what was trimmed.

        The oldest history goes: the first prompt is shortened by the overflow of the longest
        turn, the same for every turn of a conversation, so later turns still hit the prefix cache."""
        budget = context_length - reserved - self.output_tokens
        if self.replay is None:
            longest = self.prompt_lengths(0)[-1] if self.turns else 0
            cut = max(0, longest - min(budget, context_length - reserved - 1))
            if cut == 0:
                return self, None
            if cut >= self.isl:
                raise UsageError(f"--fit-context: {self.turns} turns of {self.turn_tokens}+{self.output_tokens} tokens do not fit in a context of {context_length} even with an empty first prompt",
                                 hint="lower --turns, --turn-tokens or --output-tokens")
            return replace(self, isl=self.isl - cut), f"--fit-context: first prompt trimmed from {self.isl} to {self.isl - cut} tokens so that turn {self.turns - 1} fits the context of {context_length} tokens"
        convs = []
        trimmed = 0
        for c, conv in enumerate(self.replay):
            longest = self.prompt_lengths(c)[-1]
            cut = max(0, longest - min(budget, context_length - reserved - 1))
            if cut >= len(conv[0]):
                raise UsageError(f"--fit-context: conversation {c} of the workload file does not fit in a context of {context_length} even with its first turn dropped",
                                 hint="shorten the conversation or raise the context length")
            trimmed += cut > 0
            convs.append((conv[0][cut:], *conv[1:]) if cut else conv)
        if not trimmed:
            return self, None
        wl = replace(self, replay=tuple(convs), isl=len(convs[0][0]))
        return wl, f"--fit-context: the oldest tokens of {trimmed} conversation(s) of the workload file trimmed so that every turn fits the context of {context_length} tokens"

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
