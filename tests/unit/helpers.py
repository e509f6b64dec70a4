"""What the unit tests that run the real command or the real analysis share."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from trainguard.controller.store import JobStore
from trainguard.diagnosis.sources import diagnose_paths
from trainguard.diagnosis.taxonomy import Diagnosis
from trainguard.protocol import Progress

TG = [sys.executable, "-m", "trainguard"]


def a_job(job: Path, ranks: int) -> Path:
    """A succeeded job (run id `run-w`) in `job`, with one log line from each rank."""
    with JobStore.create(job, "run-w") as s:
        s.set_meta(state="succeeded", log_dir=str(job / "logs"))
    for r in range(ranks):
        log = job / "logs" / "attempt-0" / f"rank-{r}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"2026-01-01T00:00:00+00:00 out hello from {r}\n")
    return job


def tg(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m trainguard ARGS`, its output captured, never raising on its exit code."""
    return subprocess.run([*TG, *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=cwd, env=env)


def traceback_of(line: str) -> str:
    """A short Python traceback whose last line is `line` (an exception and its message)."""
    return ("Traceback (most recent call last):\n"
            '  File "train.py", line 40, in <module>\n'
            "    main(args)\n"
            f"{line}\n")


def diagnosis_or_none(tmp_path: Path, text: str) -> Diagnosis | None:
    """`trainguard diagnose` of one log holding `text`, which may give no answer."""
    p = tmp_path / "console.log"
    p.write_text(text, encoding="utf-8")
    return diagnose_paths([p]).diagnosis


def diagnose_text(tmp_path: Path, text: str, name: str = "console.log") -> Diagnosis:
    """`trainguard diagnose` of one log holding `text`: an answer, with its deciding line."""
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    d = diagnose_paths([p]).diagnosis
    assert d is not None, "no diagnosis"
    assert d.evidence is not None and d.evidence.text, "an answer shows its deciding line"
    return d


# a fake report's progress: no step reported yet (what the hang watch's ProgressSignal reads)
NO_STEPS = Progress()


def fake_hang_watch(states: list[Any], said: list[str], agent: Any, log_dir: str,
                    **detector: Any) -> Any:
    """A real controller HangWatch over fakes: a recorder that keeps each event as
    `Reason: message` in `said`, `agent` for the stack dumps, and a detector that answers
    `states` in turn (rank 0 stuck 9 s against an 8 s threshold); `detector` adds to it
    (`seen_working`, `policy`, `hold`, `reads_rose`)."""
    from types import SimpleNamespace

    from trainguard.controller.hang_watch import HangWatch

    spec = SimpleNamespace(hang_detection=True, hang_timeout_s=None, hang_floor_s=8.0,
                           hang_startup_s=1800.0, restart_on_hang=True)
    rec = SimpleNamespace(spec=spec, paths=SimpleNamespace(log_dir=log_dir),
                          event=lambda level, reason, message, **kw: said.append(
                              f"{reason.value}: {message}"))
    w = HangWatch(rec, agent)  # type: ignore[arg-type]
    verdicts = iter(states)
    w.detector = SimpleNamespace(  # type: ignore[assignment]
        observe=lambda liveness, now, ending: SimpleNamespace(
            state=next(verdicts), stuck_ranks=(0,), describe=lambda: "rank 0 stuck",
            last_progress_at=None, idle_s=9.0, threshold_s=8.0, p99_s=None, basis="floor",
            waiting_for=None),
        **{"hold": lambda: None, "reads_rose": lambda rank: None, **detector})
    return w


def metric_samples(job: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """(name, sorted labels) -> value of every sample `trainguard metrics` exposes for `job`."""
    from prometheus_client.parser import text_string_to_metric_families

    from trainguard.goodput.metrics import exposition

    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(exposition(job).decode())
            for s in f.samples}
