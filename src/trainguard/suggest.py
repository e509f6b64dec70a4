"""`did you mean ...?`: the known name closest to one that is not known. Pure.

A name is matched by its words (split at `_`, `-`, `/`) against the words of every known name
and its other spellings (a job-file key and its flag: `hang_startup_s` is also
`--hang-startup-timeout`), a word counting when it is nearly the same (`restart` and
`restarts`); most words in common wins, then the closer spelling. With no word in common the
spelling alone decides (difflib), or nothing is close. A name that another tool gives (a
torchrun flag trainguard does not take, the docs' word `preset`) gets what to use instead
(INSTEAD), not the nearest spelling.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

WORD_CUTOFF = 0.8  # `restart` ~ `restarts`, `nod` ~ `node`; `dir` is not `directory`
SPELLING_CUTOFF = 0.6  # difflib's default, for names with no word in common


def words(name: str) -> list[str]:
    return [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w]


def _same_word(a: str, b: str) -> bool:
    return a == b or difflib.SequenceMatcher(None, a, b).ratio() >= WORD_CUTOFF


def _shared(wanted: list[str], have: set[str]) -> int:
    """How many of `wanted` are (nearly) one of `have`."""
    return sum(1 for w in wanted if any(_same_word(w, h) for h in have))


def closest(name: str, known: Mapping[str, Iterable[str]]) -> str | None:
    """The key of `known` (key -> its other spellings) that `name` most likely meant, or None.

    At least half of `name`'s words must be shared, so that one common word (`max`) alone
    suggests nothing for a long name."""
    wanted = words(name)
    spelled = {key: {w for s in (key, *others) for w in words(s)} for key, others in known.items()}
    scored = [(_shared(wanted, have), difflib.SequenceMatcher(None, name, key).ratio(), key)
              for key, have in spelled.items()]
    shared, _, best = max(scored, default=(0, 0.0, ""))
    if shared and 2 * shared >= len(wanted):
        return best
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=SPELLING_CUTOFF)
    return close[0] if close else None


# names other tools (torchrun 2.x) or the docs use that trainguard does not take, by their
# words joined with `-`: what to do instead (a sentence without its final period)
INSTEAD = {
    "preset": "the presets are scenarios: --scenario single-node | multi-node | llm "
              "(`scenario:` in a job file)",
    "shutdown-timeout": "torchrun's --shutdown-timeout is trainguard's --grace-period (the "
                        "wait between SIGTERM and SIGKILL)",
    "start-method": "leave it out: every rank is a process of its own (torchrun's default)",
    "role": "leave it out: every worker of a job has the same role",
    "local-addr": "leave it out: use --master-addr for rank 0's store, --controller-host for "
                  "the address node agents reach the launcher at",
    "run-path": "leave it out: the script always runs in a fresh interpreter (python SCRIPT, "
                "or -m MODULE)",
    "logs-specs": "leave it out: every rank's log is written under the job dir (--log-dir "
                  "moves it; --redirects and --local-ranks-filter choose what the console "
                  "shows)",
    "virtual-local-rank": "not supported: LOCAL_RANK is the rank's index on its node",
    "numa-binding": "not supported: bind in the script, or wrap it (numactl ... python)",
    "signals-to-handle": "leave it out: SIGINT, SIGTERM and SIGHUP stop the job (a second one "
                         "ends the grace period)",
    "event-log-handler": "leave it out: events go to the job dir (`trainguard events`)",
    "duplicate-stdout-filters": "leave it out: every rank's log is written under the job dir",
    "duplicate-stderr-filters": "leave it out: every rank's log is written under the job dir",
}


def instead(name: str) -> str | None:
    """What to use instead of another tool's `name` (`--shutdown_timeout`), or None."""
    return INSTEAD.get("-".join(words(name)))
