"""The recovery ladder (pure): one decide() for every incident, driven through a table of
incidents and histories, with the downgrade and quotaExceeded paths; then the node rules."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timezone

import pytest

from trainguard.diagnosis.taxonomy import Category, Culprit, Diagnosis, FaultDomain, RestartHelps
from trainguard.exitcodes import ExitCode
from trainguard.policy.decision import (
    Action,
    HAPolicy,
    History,
    Incident,
    IncidentKind,
    InProcessCase,
    Rung,
)
from trainguard.policy.ladder import decide
from trainguard.policy.nodes import implicate, is_repeat_offender, recent_implications
from trainguard.policy.precheck import CHECK_ACCELERATORS, CHECK_AGENT, CheckResult, PrecheckReport
from trainguard.records import Reason, RecoverResult, StartType
from trainguard.spec import RestartPolicy

POL = HAPolicy(restart=RestartPolicy(max_restarts=3, backoff_s=1.0, backoff_max_s=8.0),
               max_hang_restarts=3, max_pod_reschedules=2, max_job_reschedules=2,
               repeat_offender_count=3, repeat_window_s=100, operator_reexecution=True,
               step_retries=1, max_step_retries=5)
PLACED = ("a", "b")


def diag(category: str = "host_oom", domain: FaultDomain = FaultDomain.INFRASTRUCTURE,
         helps: RestartHelps = RestartHelps.YES, isolate: bool = False) -> Diagnosis:
    return Diagnosis(Category(category), domain, helps, f"rank 0: {category}", "advice",
                     Culprit(0), isolate_node=isolate)


OOM = diag()
USER_BUG = diag("user_code_error", FaultDomain.USER_CODE, RestartHelps.NO)
GPU = diag("gpu_hardware", FaultDomain.HARDWARE, isolate=True)


def crash(d: Diagnosis = OOM, node: str | None = None, spares: tuple[str, ...] = (),
          progress: bool = True, now: float = 0.0) -> Incident:
    return Incident(IncidentKind.CRASH, made_progress=progress, diagnosis=d, node=node,
                    placement=PLACED if node else (), spares=spares, now_s=now)


def lost(node: str = "b", spares: tuple[str, ...] = ("c",)) -> Incident:
    return Incident(IncidentKind.NODE_LOST, node=node, why="silent for 30s",
                    placement=PLACED, spares=spares)


def hang(progress: bool = False) -> Incident:
    return Incident(IncidentKind.HANG, made_progress=progress)


def precheck(*failing: str, checked: int = 3, check: str = "") -> Incident:
    """`failing` nodes failed `check` (default: a check of their own, disk:/n)."""
    def report(n: str) -> PrecheckReport:
        return PrecheckReport(node=n, host="h", at=datetime.now(timezone.utc), checks=[
            CheckResult(name="nofile", ok=True, detail="ok"),
            CheckResult(name=check or f"disk:/{n}", ok=False, detail="0 free", fix="free it")])

    return Incident(IncidentKind.PRECHECK_FAILED, failing=tuple(map(report, failing)),
                    checked=checked, placement=PLACED, spares=("c",))


ONE_DEAD = InProcessCase(ranks=(1,), survivors=(0,))


def in_process(incident: Incident, case: InProcessCase = ONE_DEAD) -> Incident:
    """`incident` where every surviving rank runs run_resilient (in-process restart on)."""
    return replace(incident, in_process=case)


def group_failed(progress: bool = True) -> Incident:
    return Incident(IncidentKind.GROUP_FAILED, made_progress=progress,
                    why="Connection closed by peer")


def step_failed(step: int = 7) -> Incident:
    return Incident(IncidentKind.STEP_FAILED, step=step, why="Connection closed by peer")


@dataclass(frozen=True)
class Want:
    action: Action
    rung: Rung | None = None
    start_type: StartType | None = None
    tried: tuple[tuple[Rung, RecoverResult], ...] = ()
    result: RecoverResult = RecoverResult.RECOVERING
    exit_code: ExitCode | None = None
    limit: Reason | None = None


RESTART_IN_PLACE = Want(Action.RESTART, Rung.PROCESS_RESTART, StartType.AUTO_RESTART)
IN_PROCESS = Want(Action.RESTART_RANKS, Rung.IN_PROCESS_RESTART, StartType.AUTO_RESTART)
IN_PROCESS_DOWN = ((Rung.IN_PROCESS_RESTART, RecoverResult.DOWNGRADE),)
POD = Want(Action.RESCHEDULE, Rung.POD_RESCHEDULE, StartType.POD_RESCHEDULE)
JOB = Want(Action.RESCHEDULE, Rung.JOB_RESCHEDULE, StartType.JOB_RESCHEDULE)

TABLE: list[tuple[str, Incident, History, Want]] = [
    ("a crash that a restart can fix restarts the processes in place",
     crash(), History(), RESTART_IN_PLACE),
    ("a user bug is not restarted (conditional restart)",
     crash(USER_BUG), History(), Want(Action.GIVE_UP, exit_code=ExitCode.FAILED,
                                      result=RecoverResult.FAILED)),
    ("a spent restart budget is quotaExceeded and says RestartLimitReached",
     crash(), History(restarts_used=3),
     Want(Action.GIVE_UP, result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.FAILED,
          limit=Reason.RESTART_LIMIT_REACHED)),
    ("attempts without progress give up with the do-not-requeue code",
     crash(progress=False), History(attempts_without_progress=2),
     Want(Action.GIVE_UP, result=RecoverResult.FAILED, exit_code=ExitCode.NO_PROGRESS,
          limit=Reason.NO_PROGRESS)),
    ("a hang restarts in place outside the restart budget",
     hang(), History(restarts_used=3, hang_restarts=2),
     Want(Action.RESTART, Rung.PROCESS_RESTART, StartType.SUSPENSION_RESTART)),
    ("the fourth hang in a row without progress gives up",
     hang(), History(hang_restarts=3),
     Want(Action.GIVE_UP, result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.NO_PROGRESS,
          limit=Reason.HANG_RESTART_LIMIT_REACHED)),
    ("a hang after progress starts the count again",
     hang(progress=True), History(hang_restarts=3),
     Want(Action.RESTART, Rung.PROCESS_RESTART, StartType.SUSPENSION_RESTART)),
    ("a lost node with a spare: pod-level",
     lost(), History(), POD),
    ("a lost node without a spare: pod-level downgrades to job-level",
     lost(spares=()), History(),
     replace(JOB, tried=((Rung.POD_RESCHEDULE, RecoverResult.DOWNGRADE),))),
    ("a lost node with the pod budget spent: quotaExceeded, then job-level",
     lost(), History(pod_used=2),
     replace(JOB, tried=((Rung.POD_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED),))),
    ("a lost node with every budget spent: give up, both rungs quotaExceeded",
     lost(), History(pod_used=2, job_used=2),
     Want(Action.GIVE_UP, tried=((Rung.POD_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED),
                                 (Rung.JOB_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED)),
          result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.FAILED)),
    ("a node the diagnosis isolates: straight to isolated job-level",
     crash(GPU, node="a", spares=("c",)), History(), JOB),
    ("a user bug on a node implicates no node: process restart is not possible, give up",
     crash(USER_BUG, node="a", spares=("c",)), History(),
     Want(Action.GIVE_UP, exit_code=ExitCode.FAILED, result=RecoverResult.FAILED)),
    ("an infrastructure crash implicates its node but restarts in place the first time",
     crash(node="a", spares=("c",)), History(), RESTART_IN_PLACE),
    ("the third implication within the window isolates a repeat offender",
     crash(node="a", spares=("c",), now=20.0),
     History(implicated=(("a", 0.0), ("a", 10.0))), JOB),
    ("an isolating crash with the job budget spent gives up (quotaExceeded)",
     crash(GPU, node="a", spares=("c",)), History(job_used=2),
     Want(Action.GIVE_UP, tried=((Rung.JOB_RESCHEDULE, RecoverResult.QUOTA_EXCEEDED),),
          result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.FAILED)),
    ("a placed node failing the pre-check: spares take its slot",
     precheck("a"), History(), Want(Action.REPLACE)),
    ("a failed step is re-executed in place (rung 0)",
     step_failed(), History(), Want(Action.REEXECUTE, Rung.STEP_REEXECUTION)),
    ("a step re-executed once that fails again downgrades (quotaExceeded)",
     step_failed(7), History(step_retries=1, retried_step=7, retried_step_count=1),
     Want(Action.DOWNGRADE, tried=((Rung.STEP_REEXECUTION, RecoverResult.QUOTA_EXCEEDED),),
          result=RecoverResult.QUOTA_EXCEEDED)),
    ("another step after a re-executed one has its own per-step budget",
     step_failed(9), History(step_retries=1, retried_step=7, retried_step_count=1),
     Want(Action.REEXECUTE, Rung.STEP_REEXECUTION)),
    ("the job's re-execution budget spent downgrades (quotaExceeded)",
     step_failed(), History(step_retries=5),
     Want(Action.DOWNGRADE, tried=((Rung.STEP_REEXECUTION, RecoverResult.QUOTA_EXCEEDED),),
          result=RecoverResult.QUOTA_EXCEEDED)),
    ("a crash with resilient survivors restarts only the dead rank in-process (rung 1a)",
     in_process(crash()), History(), IN_PROCESS),
    ("an in-process restart that made no new progress downgrades to a process restart",
     in_process(crash(progress=False)), History(in_process_in_a_row=1),
     replace(RESTART_IN_PLACE, tried=IN_PROCESS_DOWN)),
    ("after progress an in-process restart is tried again",
     in_process(crash()), History(in_process_in_a_row=1), IN_PROCESS),
    ("no survivor: nothing to re-enter, a process restart (downgrade)",
     in_process(crash(), InProcessCase(ranks=(0, 1), survivors=())), History(),
     replace(RESTART_IN_PLACE, tried=IN_PROCESS_DOWN)),
    ("a user bug is not restarted in-process either",
     in_process(crash(USER_BUG)), History(),
     Want(Action.GIVE_UP, exit_code=ExitCode.FAILED, result=RecoverResult.FAILED)),
    ("the restart budget spent: no in-process restart either",
     in_process(crash()), History(restarts_used=3),
     Want(Action.GIVE_UP, result=RecoverResult.QUOTA_EXCEEDED, exit_code=ExitCode.FAILED,
          limit=Reason.RESTART_LIMIT_REACHED)),
    ("a hang with a culprit: only the culprit is killed and started again",
     in_process(hang()), History(),
     Want(Action.RESTART_RANKS, Rung.IN_PROCESS_RESTART, StartType.SUSPENSION_RESTART)),
    ("a hang without one culprit restarts as processes (downgrade)",
     in_process(hang(), InProcessCase(ranks=(), survivors=(0, 1))), History(),
     Want(Action.RESTART, Rung.PROCESS_RESTART, StartType.SUSPENSION_RESTART,
          tried=IN_PROCESS_DOWN)),
    ("a group broken under every live rank: all re-enter, none is replaced",
     in_process(group_failed(), InProcessCase(ranks=(), survivors=(0, 1))), History(),
     IN_PROCESS),
]


@pytest.mark.parametrize(("name", "incident", "hist", "want"), TABLE, ids=[t[0] for t in TABLE])
def test_decide(name: str, incident: Incident, hist: History, want: Want) -> None:
    d = decide(incident, hist, POL)
    got = Want(d.action, d.rung, d.start_type, tuple((t.rung, t.result) for t in d.tried),
               d.result, d.exit_code, d.limit)
    assert got == want
    assert d.reason  # every decision says why


def budgets(h: History) -> tuple[int, int, int, int]:
    return h.restarts_used, h.hang_restarts, h.pod_used, h.job_used


def test_each_rung_spends_only_its_own_budget() -> None:
    assert budgets(decide(crash(), History(), POL).history) == (1, 0, 0, 0)
    assert budgets(decide(hang(), History(), POL).history) == (0, 1, 0, 0)
    assert budgets(decide(lost(), History(), POL).history) == (0, 0, 1, 0)
    assert budgets(decide(lost(spares=()), History(), POL).history) == (0, 0, 0, 1)
    assert budgets(decide(crash(GPU, node="a"), History(), POL).history) == (0, 0, 0, 1)
    assert budgets(decide(precheck("a"), History(), POL).history) == (0, 0, 0, 0)


def test_an_in_process_restart_spends_what_the_process_restart_would_and_waits_no_backoff(
        ) -> None:
    d = decide(in_process(crash(progress=False)), History(consecutive_failures=3), POL)
    assert (d.ranks, d.delay_s, d.history.restarts_used, d.history.in_process_in_a_row) == (
        (1,), 0.0, 1, 1)
    assert "only rank 1 starts again; rank 0 re-enters its training function in place" \
        in d.reason, d.reason
    h = decide(in_process(hang()), History(), POL).history
    assert (h.restarts_used, h.hang_restarts) == (0, 1)
    down = decide(in_process(crash(progress=False)), History(in_process_in_a_row=1), POL)
    assert down.history.in_process_in_a_row == 0 and down.delay_s > 0  # the next may try again
    assert "no new progress" in down.tried[0].why


def test_without_the_case_a_crash_is_a_plain_process_restart() -> None:
    d = decide(crash(), History(in_process_in_a_row=1), POL)
    assert d.action == Action.RESTART and not d.tried


def test_step_reexecution_off_downgrades_at_once() -> None:
    d = decide(step_failed(), History(), replace(POL, operator_reexecution=False))
    assert d.action == Action.DOWNGRADE and "--operator-reexecution" in d.reason
    assert [(t.rung, t.result) for t in d.tried] == [(Rung.STEP_REEXECUTION,
                                                      RecoverResult.DOWNGRADE)]


def test_a_step_failure_with_a_dead_rank_downgrades_at_once() -> None:
    d = decide(replace(step_failed(), ended_ranks=(1,)), History(), POL)
    assert d.action == Action.DOWNGRADE and "rank(s) 1 ended" in d.reason
    assert d.history.step_retries == 0


def test_a_report_on_an_older_group_means_the_ranks_disagree_and_downgrades() -> None:
    d = decide(replace(step_failed(9), stale_group=True), History(), POL)
    assert d.action == Action.DOWNGRADE and "disagree" in d.reason
    assert d.history.step_retries == 0


def test_a_step_reexecution_spends_only_the_step_budgets() -> None:
    h = decide(step_failed(7), History(), POL).history
    assert (h.step_retries, h.retried_step, h.retried_step_count) == (1, 7, 1)
    assert budgets(h) == (0, 0, 0, 0)
    assert History.from_meta(h.to_meta()).step_retries == 1  # persisted


def test_a_giving_up_decision_spends_nothing() -> None:
    spent = History(restarts_used=3, pod_used=2, job_used=2, hang_restarts=3)
    for incident in (crash(), hang(), lost()):
        assert budgets(decide(incident, spent, POL).history) == budgets(spent)


def test_a_lost_node_is_replaced_by_a_spare_in_its_own_slot_only() -> None:
    d = decide(lost("b", ("c",)), History(), POL)
    assert d.placement == ("a", "c") and d.moved_slots == (1,) and d.missing == 0
    assert d.node == "b" and "spare c" in d.reason


def test_job_level_without_enough_nodes_waits_for_the_missing_ones() -> None:
    d = decide(lost("b", ()), History(), POL)
    assert d.placement == ("a",) and d.missing == 1 and "waiting" in d.reason


def test_job_level_places_every_rank_again_on_healthy_and_spare_nodes() -> None:
    d = decide(lost("a", ("c",)), History(pod_used=2), POL)
    assert d.placement == ("b", "c") and d.moved_slots == (0, 1)


def test_an_isolating_crash_isolates_and_drains_the_culprit_node() -> None:
    d = decide(crash(GPU, node="a", spares=("c", "d")), History(), POL)
    assert [(i.node, i.drain) for i in d.isolate] == [("a", True)]
    assert d.placement == ("b", "c") and d.tried == ()
    assert d.history.implicated == (("a", 0.0),)


def test_a_user_bug_implicates_no_node_and_an_infrastructure_fault_does() -> None:
    assert decide(crash(USER_BUG, node="a"), History(), POL).history.implicated == ()
    d = decide(crash(node="a"), History(), POL)
    assert d.history.implicated == (("a", 0.0),) and d.node == "a" and d.isolate == ()


def test_a_crash_on_an_unplaced_node_implicates_nothing() -> None:
    d = decide(replace(crash(node="a"), placement=("x", "y")), History(), POL)
    assert d.history.implicated == () and d.node is None


def test_a_precheck_failure_drains_only_when_it_is_the_nodes_own() -> None:
    own = decide(precheck("a", "c", checked=3), History(), POL)
    assert [(i.node, i.drain) for i in own.isolate] == [("a", True), ("c", True)]
    assert own.missing == 1  # c is a spare: only a's slot needs a replacement
    everywhere = decide(precheck("a", "b", "c", checked=3), History(), POL)
    assert all(not i.drain for i in everywhere.isolate) and everywhere.missing == 2


def test_the_same_check_failing_on_every_node_fails_the_job_at_once_naming_the_setting() -> None:
    # walk-through 36 #6: it queued the whole --queue-timeout, then named neither
    d = decide(precheck("a", "b", "c", check=CHECK_ACCELERATORS), History(), POL)
    assert (d.action, d.exit_code, d.isolate, d.missing) == (Action.GIVE_UP, ExitCode.USAGE,
                                                              (), 0)
    assert "accelerators: 0 free" in d.reason and "--expect-accelerators" in d.reason
    assert "(a, b, c)" in d.reason
    # one node passed, or only an unanswered pre-check is common: the nodes' own fault
    assert decide(precheck("a", "b", check="shm"), History(), POL).action == Action.REPLACE
    assert decide(precheck("a", "b", "c", check=CHECK_AGENT), History(),
                  POL).action == Action.REPLACE


def test_a_crash_incident_without_a_diagnosis_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="diagnosis"):
        decide(Incident(IncidentKind.CRASH), History(), POL)


def test_the_persisted_history_round_trips_and_tolerates_damage() -> None:
    h = History(restarts_used=2, hang_restarts=1, pod_used=1, job_used=1,
                implicated=(("a", 5.0),), consecutive_failures=4)
    back = History.from_meta(h.to_meta())
    assert back == replace(h, consecutive_failures=0)  # consecutive counters are per launcher
    assert History.from_meta({"restarts_used": "x", "implicated": "{bad"}) == History()


def test_a_node_implicated_k_times_within_the_window_is_a_repeat_offender() -> None:
    h = History()
    counts = []
    for t in (0.0, 10.0, 20.0):
        h, n = implicate(h, "a", t, POL)
        counts.append(n)
    assert counts == [1, 2, 3] and is_repeat_offender(3, POL)
    h, n = implicate(h, "b", 25.0, POL)
    assert n == 1 and not is_repeat_offender(n, POL)


def test_implications_older_than_the_window_are_forgotten() -> None:
    h = History()
    for t in (0.0, 10.0):
        h, _ = implicate(h, "a", t, POL)
    h, n = implicate(h, "a", 150.0, POL)
    assert n == 1 and len(h.implicated) == 1


def test_repeat_offender_zero_turns_the_rule_off() -> None:
    assert not is_repeat_offender(99, HAPolicy(repeat_offender_count=0))


def test_a_relaunch_s_nodes_start_with_the_implications_the_next_one_is_counted_with() -> None:
    """Walk-through 26: after a relaunch status showed `0` times implicated for a node that
    one more fault isolated as 'implicated 3 times within 1 h'."""
    hist = History(implicated=(("a", 0.0), ("b", 100.0), ("a", 130.0), ("a", 150.0)))
    now = 190.0  # POL's window: 100 s
    recent = recent_implications(hist, now, POL)
    assert recent == {"a": 2, "b": 1}  # a's first, 190 s ago, is out of the window
    _, count = implicate(hist, "a", now, POL)
    assert count == recent["a"] + 1  # the count the repeat-offender rule reads next
