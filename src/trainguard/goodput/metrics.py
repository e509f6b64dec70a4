"""Prometheus metrics of one job, read from its store at each scrape.

One collector (`JobCollector`) serves both `trainguard metrics JOB_DIR` (the text exposition
for a textfile collector or a finished job) and the controller's live `/metrics`
(`--metrics-port`). prometheus-client writes the exposition format, so its own parser reads
what we print. Names follow Prometheus' conventions: the `trainguard_` prefix, base units
(seconds), `_total` on counters, ratios 0-1, labels only from small fixed sets. Times that a
later restart can re-classify (productive, badput) are gauges, not counters.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from trainguard.controller.shown import last_progress, shown_state
from trainguard.controller.store import JobStore
from trainguard.diagnosis.taxonomy import Category
from trainguard.goodput.interval import IntervalAdvice, advise
from trainguard.goodput.ledger import CAUSES, STOPPED, Goodput
from trainguard.goodput.read import Save, job_goodput, saves, snapshot_reports
from trainguard.policy.decision import Rung
from trainguard.protocol import REFUSALS
from trainguard.records import (
    FaultScenario,
    Reason,
    RunningRecord,
    from_iso,
    incidents_of,
    recoveries_by_rung,
)
from trainguard.states import JobState, NodeState

STEP_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
RECOVERY_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
BLOCKING_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
WINDOWS = {"5m": 300.0, "1h": 3600.0}
PHASES = ("detect", "stop", "decide", "start", "resume", "total")


class JobCollector(Collector):
    """Collects one job's metrics from its store (opened read-only per scrape)."""

    def __init__(self, job_dir: Path) -> None:
        self.job_dir = Path(job_dir)

    def collect(self) -> Iterator[Metric]:
        """The metrics, read whole while the store is open: the store is closed before the
        first one is written, whatever the reader does with them."""
        with JobStore.open(self.job_dir) as store:
            metrics = list(job_metrics(store))
        return iter(metrics)


def exposition(job_dir: Path) -> bytes:
    """The text exposition of a job's metrics."""
    from prometheus_client import generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(job_dir))
    return generate_latest(registry)


def serve(job_dir: Path, host: str, port: int) -> tuple[str, Callable[[], None]]:
    """Serve the job's /metrics from a thread of this process (a bounded server:
    goodput/metrics_server.py); returns its URL and a closer."""
    from trainguard.goodput.metrics_server import serve_registry

    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(job_dir))
    url, close, _ = serve_registry(registry, host, port)
    return url, close


def job_metrics(store: JobStore, now: datetime | None = None) -> Iterator[Metric]:
    meta = store.meta()
    records = store.running_records()
    commits = saves(store)
    g = job_goodput(store, now, commits, meta, records)
    yield from _job(meta, store.last_checkpoint())
    yield from _refused(meta.get("connections_refused"), meta.get("worker_messages_refused"))
    hang = store.hang_left_running(meta)
    yield GaugeMetricFamily("trainguard_job_hung", "1 while a confirmed hang is left running "
                            "in the current attempt (--restart-on-hang off, or its budget "
                            "spent), as `trainguard status` says HUNG", value=float(bool(hang)))
    yield from _goodput(g)
    yield from _recoveries(records)
    yield from _steps(g)
    yield from _checkpoints(store, commits)
    yield from _advice(g, records, commits)
    nodes = GaugeMetricFamily("trainguard_nodes", "nodes of the job by state",
                              labels=["state"])
    counts = Counter(n.state.value for n in store.nodes())
    if not counts:  # a single-node job records no node rows: its one node, this machine
        counts[NodeState.HEALTHY.value] = max(1, len(meta.get("node_usage") or {}))
    for state in NodeState:
        nodes.add_metric([state.value], counts.get(state.value, 0))
    yield nodes


def _refused(recorded: object, messages: object) -> Iterator[Metric]:
    got = recorded if isinstance(recorded, dict) else {}
    refused = CounterMetricFamily(
        "trainguard_connections_refused", "connections the controller refused (multi-node): "
        "a handshake that failed, one over the budget of unauthenticated connections, an "
        "authenticated link ended by a forged frame (docs/security.md)", labels=["reason"])
    for reason in REFUSALS:
        n = got.get(reason)
        refused.add_metric([reason], float(n) if isinstance(n, int) else 0.0)
    yield refused
    yield CounterMetricFamily(
        "trainguard_worker_messages_refused", "datagrams the nodes' worker channels refused: "
        "a stranger's (not a process of this job), malformed or out of bounds "
        "(docs/security.md)", value=float(messages) if isinstance(messages, int) else 0.0)


def _job(meta: dict[str, object], checkpoint: tuple[int, str] | None) -> Iterator[Metric]:
    state = GaugeMetricFamily("trainguard_job_state", "1 for the job's current state",
                              labels=["state"])
    now = shown_state(meta)
    for s in JobState:
        state.add_metric([s.value], 1.0 if s.value == now else 0.0)
    yield state
    # a value not known yet (no attempt, no step) is absent, never NaN
    attempt = meta.get("attempt")
    if isinstance(attempt, int):
        yield GaugeMetricFamily("trainguard_attempt", "the current attempt (0: the first)",
                                value=float(attempt))
    progress = last_progress(meta, checkpoint)
    if isinstance(progress["step"], int):
        yield GaugeMetricFamily("trainguard_step", "the last step the workers reported, or "
                                "the last committed checkpoint's when it is further (a job "
                                "that reports no steps, steps trained while no controller "
                                "watched; trainguard_progress_source says which)",
                                value=float(progress["step"]))
        source = GaugeMetricFamily("trainguard_progress_source", "1 for where "
                                   "trainguard_step comes from", labels=["source"])
        for name in ("step", "checkpoint"):
            source.add_metric([name], 1.0 if name == progress["source"] else 0.0)
        yield source
    at = progress["time"]
    last = from_iso(at) if isinstance(at, str) else None
    if last is not None:
        yield GaugeMetricFamily("trainguard_last_progress_timestamp_seconds",
                                "when the job last made progress (Unix time)",
                                value=last.timestamp())
    yield from _train(meta.get("training"))


def _train(recorded: object) -> Iterator[Metric]:
    """The loss and learning rate each reporting rank logged last (trainguard.log_metrics,
    the trainer integrations); NaN for one logged as NaN or infinite."""
    ranks = recorded if isinstance(recorded, dict) else {}
    for name, key, help_text in (
            ("trainguard_train_loss", "loss", "the training loss the rank logged last"),
            ("trainguard_learning_rate", "learning_rate", "the learning rate it logged last"),
            ("trainguard_train_metrics_step", "step", "the step of those values")):
        g = GaugeMetricFamily(name, help_text, labels=["rank"])
        for rank, values in sorted(ranks.items(), key=lambda kv: int(kv[0])):
            if isinstance(values, dict) and (key == "step" or key in values):
                v = values.get(key)
                g.add_metric([str(rank)], float(v) if isinstance(v, (int, float)) else
                             float("nan"))
        yield g


def _goodput(g: Goodput) -> Iterator[Metric]:
    yield GaugeMetricFamily("trainguard_elapsed_seconds", "wall time since the first launch",
                            value=g.wall_s)
    yield GaugeMetricFamily("trainguard_productive_seconds",
                            "time of steps that survive (not done again)", value=g.productive_s)
    badput = GaugeMetricFamily("trainguard_badput_seconds", "wall time lost, by cause",
                               labels=["cause"])
    for cause in CAUSES:
        badput.add_metric([cause], g.seconds(cause))
    yield badput
    yield GaugeMetricFamily("trainguard_stopped_seconds", "wall time the job was stopped on "
                            "purpose until launched again (not badput, not in the ratio)",
                            value=g.seconds(STOPPED))
    ratio = GaugeMetricFamily("trainguard_goodput_ratio",
                              "productive / wall time less the time stopped on purpose, whole "
                              "run and recent windows", labels=["window"])
    for name, seconds in (("all", None), *WINDOWS.items()):
        value = g.ratio(seconds)
        if value is not None:  # a window not known yet is left out, never NaN
            ratio.add_metric([name], value)
    yield ratio
    steps = GaugeMetricFamily("trainguard_steps", "steps completed, by fate (a later "
                              "restart can turn productive steps into wasted ones)",
                              labels=["fate"])
    steps.add_metric(["productive"], g.steps_productive)
    steps.add_metric(["wasted"], g.steps_wasted)
    yield steps


def _recoveries(records: list[RunningRecord]) -> Iterator[Metric]:
    # one per fault, as `recovery`, `report`, `status` and the UI count them: a rung that
    # handed its fault to the next is no incident of its own (every recover record was
    # counted: a downgraded incident twice, its detect and decide twice; walk-through 34 #4)
    incidents = incidents_of(records)
    # the one count of recoveries status, recovery and report show, which never goes down (it
    # counted only success and recovering: a restart whose workers failed again dropped out,
    # and the counter went 1 -> 0; walk-through 30)
    restarts = CounterMetricFamily("trainguard_restarts", "recoveries carried out, by rung of "
                                   "the ladder", labels=["rung"])
    acted = recoveries_by_rung(records)
    for rung in Rung:
        restarts.add_metric([rung.value], acted.get(rung.value, 0))
    yield restarts
    # every incident recorded, a counter; their results now, a gauge (an incident moves from
    # recovering to its result, or from failed to terminated: a counter series by result went
    # down each time; walk-through 30)
    total = CounterMetricFamily("trainguard_incidents", "incidents by fault scenario",
                                labels=["fault_scenario"])
    for scenario, n in sorted(Counter(rr.fault_scenario.value for rr in incidents).items()):
        total.add_metric([scenario], n)
    yield total
    results = GaugeMetricFamily("trainguard_incident_results", "incidents by fault scenario "
                                "and their result now", labels=["fault_scenario", "result"])
    for (scenario, result), n in sorted(Counter(
            (rr.fault_scenario.value, rr.recover_result.value) for rr in incidents).items()):
        results.add_metric([scenario, result], n)
    yield results
    hist = HistogramMetricFamily("trainguard_recovery_duration_seconds",
                                 "recovery time split by phase", labels=["phase"])
    for phase in PHASES:
        values = [v for rr in incidents if (v := rr.durations()[phase]) is not None]
        hist.add_metric([phase], *_buckets([(1, v) for v in values], RECOVERY_BUCKETS))
    yield hist


def _steps(g: Goodput) -> Iterator[Metric]:
    hist = HistogramMetricFamily("trainguard_step_duration_seconds",
                                 "time per training step (between progress reports)")
    hist.add_metric([], *_buckets([(1, d) for _, _, d in g.step_seconds], STEP_BUCKETS))
    yield hist
    ideal = g.ideal_step_s()
    if ideal is not None:  # absent until steps are timed, never NaN
        yield GaugeMetricFamily("trainguard_ideal_step_seconds",
                                "mean step time without outliers (median + 3 MAD)", value=ideal)


def _checkpoints(store: JobStore, commits: list[Save]) -> Iterator[Metric]:
    blocking = [(1, c.blocked_s) for c in commits if c.blocked_s is not None]
    # a report of memory snapshots: as many observations as snapshots, each their mean
    blocking += [(r.snapshots, r.blocked_s / r.snapshots) for r in snapshot_reports(store)
                 if r.snapshots > 0]  # a row of none (a damaged store) observes nothing
    hist = HistogramMetricFamily("trainguard_checkpoint_blocking_seconds",
                                 "training loop blocked per checkpoint save or memory snapshot")
    hist.add_metric([], *_buckets(blocking, BLOCKING_BUCKETS))
    yield hist
    steps = [c.step for c in commits if c.step is not None]
    if steps:  # absent before the first commit, never NaN
        yield GaugeMetricFamily("trainguard_checkpoint_last_committed_step",
                                "the newest committed checkpoint's step", value=float(max(steps)))
    yield CounterMetricFamily("trainguard_checkpoint_failures", "checkpoint saves that failed",
                              value=len(store.event_values(
                                  Reason.CHECKPOINT_SAVE_FAILED.value, ())))
    hangs = len(store.event_values(Reason.HANG_CONFIRMED.value, ()))
    yield CounterMetricFamily("trainguard_hangs", "hangs confirmed", value=hangs)
    diag = CounterMetricFamily("trainguard_diagnoses", "failures diagnosed, by category",
                               labels=["category"])
    counts = Counter(str(v[0] or "other") for _, _, v in store.event_values(
        Reason.FAILURE_DIAGNOSED.value, ("category",)))
    # a confirmed hang's diagnosis, as recovery and diagnose give it (walk-through 40 #8)
    counts[Category.NCCL_TIMEOUT_OR_HANG.value] += hangs
    for category, n in sorted(counts.items()):
        if n:
            diag.add_metric([category], n)
    yield diag


def _advice(g: Goodput, records: list[RunningRecord], commits: list[Save]) -> Iterator[Metric]:
    a = interval_advice(g, records, commits)
    for name, help_text, value in (
            ("trainguard_mtbf_seconds", "observed mean time between failures", a.mtbf_s),
            ("trainguard_checkpoint_interval_seconds", "median time between saves now",
             a.current_s),
            ("trainguard_checkpoint_interval_optimal_seconds",
             "Young/Daly checkpoint interval from the observed MTBF and blocking time",
             a.optimal_s)):
        if value is not None:  # absent until known (failures, saves), never NaN
            yield GaugeMetricFamily(name, help_text, value=value)


def interval_advice(g: Goodput, records: list[RunningRecord],
                    commits: list[Save]) -> IntervalAdvice:
    """The checkpoint interval advice of a job (trainguard.goodput.interval): the loop's own
    saves only (not those on the way out, nor the agent's from memory), timed by the rank
    that saved (a poll's saves are recorded at once; one rank's clock makes no skew)."""
    incidents = incidents_of(records)
    loop = [c for c in commits if c.blocked_s is not None and not c.on_exit
            and not c.by_agent]
    # a hang's fault is its last progress, before that step's save was committed: its stretch
    # ends at the confirmation (walk-through 38 #3: the save of the last step fell after it)
    faults = [(i.attempt, ((i.detected_at if i.fault_scenario == FaultScenario.JOB_HANGED
                            else None) or i.fault_at or i.recover_start_at).timestamp())
              for i in incidents]

    def stretch(attempt: int | None, t: float) -> tuple[int | None, int]:
        """The saves of one stretch of training: one attempt, between two of its incidents
        (an in-process restart or a step re-executed stays in the attempt: walk-through 37
        #8 counted the gap across one, 'every 12.3s now' for saves 1 s apart)."""
        return attempt, sum(1 for a, at in faults if a == attempt and at <= t)

    return advise(g.wall_s - g.seconds("queued"), len(incidents),
                  [(stretch(c.attempt, c.sent_at or c.at), c.sent_at or c.at) for c in loop],
                  [c.blocked_s for c in loop if c.blocked_s is not None])


def _buckets(weighted: list[tuple[int, float]], bounds: tuple[float, ...]
             ) -> tuple[list[tuple[str, float]], float]:
    """Cumulative (le, count) buckets and the sum, for HistogramMetricFamily.add_metric."""
    out = []
    for le in (*bounds, float("inf")):
        out.append(("+Inf" if le == float("inf") else repr(float(le)),
                    float(sum(n for n, v in weighted if v <= le))))
    return out, sum(n * v for n, v in weighted)
