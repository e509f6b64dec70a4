"""Lines that count steps in a format --step-pattern does not read. Pure.

A script's own progress print (`it 15 | loss 0.83`, `[15/400] loss=...`) that the step
pattern misses leaves hang detection, --restart-on-hang and the no-progress guard with nothing
to go by: a hang sat out the 30-minute start-up allowance in silence, and a job that got
further each attempt was given up as making no progress (walk-through 28). The agent's log
reader shows each line the pattern did not read to a `CountingLines` of its rank; once lines
of one shape (their numbers aside) have counted up at the same place three times in a row,
that line is what the controller's NoProgressSignal quotes, with a --step-pattern that reads
it (`pattern_at`). And how a line reads under --step-pattern (`step_read`, colour codes off,
a progress bar's count told apart: `bar_groups`), one reader for the agent's log router and a
lost launch's logs (controller/lost_launch.py)."""

from __future__ import annotations

import re

from trainguard.presets import DEFAULT_BAR_GROUPS, DEFAULT_STEP_PATTERN

_NUMBER = re.compile(r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_LABEL = re.compile(r"([A-Za-z_]+)\W{0,3}$")  # the word that names a number (`it 15`)
MAX_LINE = 300  # longer lines are not progress prints
MAX_SHAPES = 32  # per rank: the shapes last seen, the oldest dropped
STREAK = 3  # increases in a row at one place


class CountingLines:
    def __init__(self) -> None:
        # shape -> (its numbers last time, {position: increases in a row there})
        self._shapes: dict[str, tuple[list[str], dict[int, int]]] = {}
        self.seen = 0  # lines observed

    def observe(self, text: str) -> int | None:
        """The place (the index among its numbers) where lines of `text`'s shape counted up
        STREAK times in a row, or None."""
        self.seen += 1
        if len(text) > MAX_LINE:
            return None
        found = list(_NUMBER.finditer(text))
        if not found:
            return None
        numbers = [m.group() for m in found]
        # only a number a word names counts (`it 15`, `iteration=15`): a clock's seconds and
        # a date's day count up too
        named = {i for i, m in enumerate(found) if _LABEL.search(text, 0, m.start())}
        shape = _NUMBER.sub("#", text)
        last = self._shapes.pop(shape, None)
        streaks: dict[int, int] = {}
        if last is not None and len(last[0]) == len(numbers):
            for i, (a, b) in enumerate(zip(last[0], numbers, strict=True)):
                if i in named and a.isdigit() and b.isdigit() and 0 < int(b) - int(a) <= 1000:
                    streaks[i] = last[1].get(i, 0) + 1
        self._shapes[shape] = (numbers, streaks)
        if len(self._shapes) > MAX_SHAPES:
            del self._shapes[next(iter(self._shapes))]
        return next((i for i, n in sorted(streaks.items()) if n >= STREAK), None)


def pattern_at(text: str, index: int) -> str | None:
    """A --step-pattern whose first group reads the `index`-th number of `text` (the word
    before it, then the number), checked against the line; None when it would read another."""
    found = list(_NUMBER.finditer(text))
    if not 0 <= index < len(found):
        return None
    m = found[index]
    word = _LABEL.search(text, 0, m.start())
    if word is None:
        return None
    pattern = rf"\b{re.escape(word.group(1))}\W{{0,3}}(\d+)"
    first = re.search(pattern, text)
    return pattern if first is not None and first.start(1) == m.start() else None


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # colour codes, as torchtitan prints


def bar_groups(step_pattern: str) -> frozenset[int]:
    """The groups of `step_pattern` that read a progress bar (the default pattern's)."""
    return DEFAULT_BAR_GROUPS if step_pattern == DEFAULT_STEP_PATTERN else frozenset()


def step_read(step: re.Pattern[str], bars: frozenset[int], text: str) -> tuple[str, bool] | None:
    """(the step, whether a progress bar's group read it) a line reports under `step` (the
    --step-pattern; `bars`: its groups that read a bar), colour codes taken off first; None
    when it reports none. The node agent reads every line so; a lost launch's logs too."""
    m = step.search(ANSI.sub("", text) if "\x1b" in text else text)
    if m is None:
        return None
    i, n = next(((i, g) for i, g in enumerate(m.groups(), 1) if g is not None), (0, None))
    return (n, i in bars) if n is not None and n.isdigit() else None
