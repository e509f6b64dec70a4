"""The culprit's frame is the user's call into trainguard's fault injection
(trainguard.testing.faults), never a frame inside it, also where trainguard runs from a
source tree (not site-packages): for a crash's traceback and for a hung rank's stack."""

from __future__ import annotations

from trainguard.diagnosis.rules import load_rules
from trainguard.diagnosis.scan import compile_trigger, scan_bytes
from trainguard.diagnosis.verdict import diagnose
from trainguard.hang.classify import Frame, ThreadStack, culprit_frame

RULES = load_rules()
FAULTS = "/work/src/trainguard/testing/faults.py"

CRASH = [
    "Traceback (most recent call last):",
    '  File "/home/me/train.py", line 269, in <module>',
    "    main()",
    '  File "/home/me/train.py", line 247, in main',
    "    faults.inject(step)",
    f'  File "{FAULTS}", line 118, in inject',
    "    _inject(step)",
    f'  File "{FAULTS}", line 174, in _fire',
    '    raise RuntimeError(f"injected crash at step {step}")',
    "RuntimeError: injected crash at step 3",
]


def test_an_injected_crash_is_blamed_on_the_line_of_the_script_that_called_the_injector(
) -> None:
    data = "".join(f"{ln}\n" for ln in CRASH).encode()
    findings = scan_bytes(RULES, compile_trigger(RULES),
                          "rank-0.log", [data])
    d = diagnose(findings, [], RULES)
    assert d is not None
    assert (d.culprit.frame or "").endswith("train.py:247 in main")
    assert "faults.py" not in (d.culprit.frame or "") and "faults.py" not in d.advice


def test_a_rank_hung_in_an_injected_sleep_is_blamed_on_the_scripts_call() -> None:
    thread = ThreadStack(1, "MainThread", True, True, (
        Frame("sleep", "<built-in>", 0, None, True),
        Frame("_fire", FAULTS, 137),
        Frame("inject", FAULTS, 118),
        Frame("main", "/home/me/train.py", 191),
        Frame("<module>", "/home/me/train.py", 269),
    ))
    assert culprit_frame(thread) == "/home/me/train.py:191 in main"  # the full path
