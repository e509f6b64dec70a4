"""A real Slurm cluster of several virtual nodes on this machine, for tests and benchmarks.

``SlurmCluster(base_dir).start()`` first calls ``ensure_installed()`` (``apt-get install
slurm-wlm munge`` when a daemon or client is missing) and starts munged. The cluster is one
``slurmctld`` and one ``slurmd -N <node>`` per virtual node, all on 127.0.0.1 with private
ports picked at start, so two clusters (or a rerun) never clash. Every client command needs
``SLURM_CONF``: pass ``cluster.env()`` to subprocesses.

A node's loss is ``kill_node(name)``: SIGKILL its ``slurmd`` and the step daemons
(``slurmstepd``) it started, with their tasks. ``restart_node`` starts its ``slurmd`` again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType

import psutil

from trainguard.node import ports

DAEMONS = ("slurmctld", "slurmd", "munged", "srun", "sinfo", "scontrol", "salloc")
MUNGE_DIRS = {"/etc/munge": 0o700, "/run/munge": 0o755, "/var/log/munge": 0o700,
              "/var/lib/munge": 0o711}
MUNGE_KEY = Path("/etc/munge/munge.key")

_apt_updated = False


class ClusterError(RuntimeError):
    """The test cluster could not be installed, started or driven."""


def _missing() -> list[str]:
    return [d for d in DAEMONS if shutil.which(d) is None
            and not Path("/usr/sbin", d).exists()]


def ensure_installed(timeout_s: float = 600) -> None:
    """Install slurm-wlm and munge with apt-get when any daemon or client is missing."""
    global _apt_updated
    missing = _missing()
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise ClusterError(f"Slurm is not installed ({', '.join(missing)} missing) and there is "
                           "no apt-get; install slurm-wlm and munge by hand")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    steps = [["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"]]
    if not _apt_updated:
        steps.insert(0, ["apt-get", "update", "-q"])
    for argv in steps:
        try:
            r = subprocess.run(argv, env=env, capture_output=True, text=True,
                               timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as e:
            raise ClusterError(f"`{' '.join(argv)}` took over {timeout_s:.0f} s") from e
        if r.returncode != 0:
            raise ClusterError(
                f"`{' '.join(argv)}` failed (exit {r.returncode}); Slurm is needed for the "
                f"multi-node tests (run as root with package mirrors reachable, or install "
                f"slurm-wlm and munge by hand):\n{_tail(r.stdout + r.stderr, 30)}")
        if argv[1] == "update":
            _apt_updated = True
    still = _missing()
    if still:
        raise ClusterError(f"after apt-get install, still missing: {', '.join(still)}")


def _tail(text: str, n: int = 20) -> str:
    return "\n".join(text.rstrip().splitlines()[-n:])


def _free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports outside the ephemeral range (trainguard.node.ports:
    slurmd binds its port a moment after it is picked)."""
    got: list[int] = []
    while len(got) < n:
        port = ports.free_port("127.0.0.1")
        if port not in got:
            got.append(port)
    return got


def _munge_works() -> bool:
    try:
        enc = subprocess.run(["munge", "-n"], capture_output=True, timeout=10, check=False)
        if enc.returncode != 0:
            return False
        dec = subprocess.run(["unmunge"], input=enc.stdout, capture_output=True, timeout=10,
                             check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return dec.returncode == 0 and b"Success" in dec.stdout


def ensure_munge(timeout_s: float = 15) -> None:
    """Make munged (the authentication daemon Slurm uses) run, as the munge user."""
    if _munge_works():
        return
    for d, mode in MUNGE_DIRS.items():
        Path(d).mkdir(parents=True, exist_ok=True)
        shutil.chown(d, "munge", "munge")
        Path(d).chmod(mode)
    if not MUNGE_KEY.exists():
        subprocess.run(["mungekey", "-c", "-k", str(MUNGE_KEY)], check=True,
                       capture_output=True, timeout=30)
    shutil.chown(MUNGE_KEY, "munge", "munge")
    MUNGE_KEY.chmod(0o600)
    r = subprocess.run(["runuser", "-u", "munge", "--", "munged"], capture_output=True,
                       text=True, timeout=30, check=False)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _munge_works():
            return
        time.sleep(0.1)
    log = Path("/var/log/munge/munged.log")
    raise ClusterError(f"munged did not start (exit {r.returncode}): {r.stderr.strip()}\n"
                       f"{_tail(log.read_text(errors='replace')) if log.exists() else ''}")


def _kill_pid(pid: int, sig: int = signal.SIGKILL) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout_s: float = 5) -> None:
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.02)


class SlurmCluster:
    """One slurmctld and one slurmd per virtual node, all on localhost, files under base_dir."""

    def __init__(self, base_dir: Path, nodes: list[str] | None = None, cpus: int = 2,
                 slurmd_timeout_s: int = 10) -> None:
        self.base_dir = Path(base_dir).resolve()
        self.nodes = list(nodes) if nodes is not None else ["n1", "n2", "n3"]
        self.cpus = cpus
        self.slurmd_timeout_s = slurmd_timeout_s
        self.conf = self.base_dir / "slurm.conf"
        self.partition = "debug"
        self.cluster_id = uuid.uuid4().hex[:8]
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self.ctld_port = 0
        self.node_ports: dict[str, int] = {}
        self.start_s = 0.0  # how long the last start() took

    # --- files ------------------------------------------------------------------------------
    def _pidfile(self, daemon: str) -> Path:
        name = "slurmctld" if daemon == "slurmctld" else f"slurmd-{daemon}"
        return self.base_dir / "run" / f"{name}.pid"

    def _logfile(self, daemon: str) -> Path:
        name = "slurmctld" if daemon == "slurmctld" else f"slurmd-{daemon}"
        return self.base_dir / "log" / f"{name}.log"

    def _write_conf(self) -> None:
        b = self.base_dir
        ports = _free_ports(1 + len(self.nodes))
        self.ctld_port = ports[0]
        self.node_ports = dict(zip(self.nodes, ports[1:], strict=True))
        lines = [
            f"ClusterName=tg{self.cluster_id}",
            "SlurmctldHost=localhost",
            f"SlurmctldPort={self.ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            f"StateSaveLocation={b}/state",
            f"SlurmdSpoolDir={b}/spool/%n",
            f"SlurmctldPidFile={b}/run/slurmctld.pid",
            f"SlurmdPidFile={b}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={b}/log/slurmctld.log",
            f"SlurmdLogFile={b}/log/slurmd-%n.log",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            # the config, not this machine's hardware, says what a virtual node has
            "SlurmdParameters=config_overrides",
            "ReturnToService=2",
            "MpiDefault=none",
            f"SlurmdTimeout={self.slurmd_timeout_s}",
            "SlurmctldTimeout=10",
            "InactiveLimit=0",
            "KillWait=2",
            "MinJobAge=30",
            "MessageTimeout=5",
            "SchedulerParameters=sched_interval=2",
        ]
        for node, port in self.node_ports.items():
            lines.append(f"NodeName={node} NodeHostname=localhost NodeAddr=127.0.0.1 "
                         f"Port={port} CPUs={self.cpus} RealMemory=4000 State=UNKNOWN")
        lines.append(f"PartitionName={self.partition} Nodes={','.join(self.nodes)} Default=YES "
                     "MaxTime=INFINITE State=UP OverSubscribe=FORCE:4")
        self.conf.write_text("\n".join(lines) + "\n")

    # --- processes --------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """os.environ with SLURM_CONF set (and no inherited job variables): for clients."""
        e = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SALLOC_",
                                                                        "SBATCH_", "SRUN_"))}
        e["SLURM_CONF"] = str(self.conf)
        return e

    def _read_pid(self, daemon: str) -> int | None:
        try:
            return int(self._pidfile(daemon).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def _is_ours(self, pid: int) -> bool:
        try:
            cmd = psutil.Process(pid).cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return False
        return any("slurm" in c for c in cmd[:1]) and str(self.conf) in cmd

    def _kill_stale(self) -> None:
        pids: list[int] = []
        for d in ["slurmctld", *self.nodes]:
            pid = self._read_pid(d)
            if pid is not None and self._is_ours(pid):
                _kill_pid(pid)
                pids.append(pid)
        # daemons of an earlier run whose pid file is gone, found by their -f <conf>
        for p in psutil.process_iter(["pid", "cmdline"]):
            cmd = p.info["cmdline"] or []
            if cmd and "slurm" in cmd[0] and str(self.conf) in cmd and p.pid not in pids:
                _kill_pid(p.pid)
                pids.append(p.pid)
        _wait_gone(pids)

    def _spawn(self, daemon: str) -> None:
        if daemon == "slurmctld":
            # -c: no job state from an earlier run of this base_dir
            argv = ["slurmctld", "-D", "-c", "-i", "-f", str(self.conf)]
        else:
            argv = ["slurmd", "-D", "-f", str(self.conf), "-N", daemon]
            (self.base_dir / "spool" / daemon).mkdir(parents=True, exist_ok=True)
        out = (self.base_dir / "log" / f"{argv[0]}-{daemon}.out").open("ab")
        with out:
            self._procs[daemon] = subprocess.Popen(
                argv, env=self.env(), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True)

    def start(self, timeout_s: float = 60) -> SlurmCluster:
        """Start (or restart from scratch) the cluster; return once every node is idle."""
        t0 = time.monotonic()
        ensure_installed()
        for sub in ("state", "spool", "run", "log"):
            (self.base_dir / sub).mkdir(parents=True, exist_ok=True)
        if self.conf.exists():
            self._kill_stale()
        self.stop()
        for sub in ("state", "spool"):
            shutil.rmtree(self.base_dir / sub, ignore_errors=True)
            (self.base_dir / sub).mkdir(parents=True)
        ensure_munge()
        self._write_conf()
        self._spawn("slurmctld")
        for n in self.nodes:
            self._spawn(n)
        self.wait_idle(timeout_s=max(1.0, timeout_s - (time.monotonic() - t0)))
        self.start_s = time.monotonic() - t0
        return self

    def wait_idle(self, nodes: Iterable[str] | None = None, timeout_s: float = 60) -> None:
        want = list(nodes) if nodes is not None else self.nodes
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            for d, p in self._procs.items():
                if p.poll() is not None and (d == "slurmctld" or d in want):
                    raise ClusterError(f"{d} exited with {p.returncode} during start-up\n"
                                       + self.daemon_logs())
            states = self.node_states()
            if all(states.get(n) == "idle" for n in want):
                return
            time.sleep(0.2)
        raise ClusterError(f"nodes not idle after {timeout_s:.0f} s: {states}\n"
                           + self.daemon_logs())

    def daemon_logs(self, lines: int = 15) -> str:
        parts = []
        for f in sorted((self.base_dir / "log").glob("*")):
            text = f.read_text(errors="replace") if f.is_file() else ""
            if text.strip():
                parts.append(f"--- {f.name} (last {lines} lines)\n{_tail(text, lines)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Stop every daemon this cluster started, and their job steps (munged stays up)."""
        procs = list(self._procs.values())
        self._procs.clear()
        pids = {p.pid for p in procs if p.poll() is None}
        for d in ["slurmctld", *self.nodes]:
            pid = self._read_pid(d)
            if pid is not None and self._is_ours(pid):
                pids.add(pid)
        for pid in pids:
            _kill_pid(pid, signal.SIGTERM)
        _wait_gone(pids, timeout_s=2)
        for pid in pids:
            _kill_pid(pid)
        self._kill_steps(None)
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(2)

    def __enter__(self) -> SlurmCluster:
        return self.start()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    # --- faults -----------------------------------------------------------------------------
    def _kill_steps(self, node: str | None) -> list[int]:
        """SIGKILL the step daemons (slurmstepd) a node's slurmd started, with their tasks.

        slurmstepd overwrites its environment (for its process title), so it is found by the
        node's log file, which it keeps open. node None: every node of this cluster.
        """
        logs = {str(self._logfile(n)) for n in ([node] if node else self.nodes)}
        victims: list[psutil.Process] = []
        for p in psutil.process_iter(["name"]):
            if not (p.info["name"] or "").startswith("slurmstepd"):
                continue
            try:
                fds = os.listdir(f"/proc/{p.pid}/fd")
                paths = {os.readlink(f"/proc/{p.pid}/fd/{fd}") for fd in fds}
                if paths & logs:
                    victims += [p, *p.children(recursive=True)]
            except (OSError, psutil.Error):
                continue
        for v in victims:
            _kill_pid(v.pid)
        _wait_gone([v.pid for v in victims])
        return [v.pid for v in victims]

    def kill_node(self, name: str, *, steps: bool = True) -> None:
        """Lose a node: SIGKILL its slurmd (by pid file) and, with steps, what it started."""
        pid = self._read_pid(name)
        proc = self._procs.pop(name, None)
        if pid is None and proc is not None:
            pid = proc.pid
        if pid is None:
            raise ClusterError(f"no slurmd pid for node {name} ({self._pidfile(name)})")
        _kill_pid(pid)
        if proc is not None:
            proc.wait(5)
        else:
            _wait_gone([pid])
        if steps:
            self._kill_steps(name)

    def restart_node(self, name: str) -> None:
        """Start a node's slurmd again (after kill_node)."""
        old = self._procs.get(name)
        if old is not None and old.poll() is None:
            raise ClusterError(f"slurmd of {name} is still running (pid {old.pid})")
        self._spawn(name)

    def scontrol(self, *args: str, timeout_s: float = 20) -> str:
        r = subprocess.run(["scontrol", *args], env=self.env(), capture_output=True, text=True,
                           timeout=timeout_s, check=False)
        if r.returncode != 0:
            raise ClusterError(f"scontrol {' '.join(args)} failed: {r.stderr.strip()}")
        return r.stdout

    def resume(self, name: str) -> None:
        """Return a drained or down node to service (one already in service: no-op)."""
        try:
            self.scontrol("update", f"NodeName={name}", "State=RESUME")
        except ClusterError as e:
            if "Invalid node state specified" not in str(e):
                raise

    def node_states(self) -> dict[str, str]:
        r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=self.env(),
                           capture_output=True, text=True, timeout=20, check=False)
        states: dict[str, str] = {}
        for line in r.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1].lower()
        return states

    def node_state(self, name: str) -> str:
        """Slurm's long state name of a node: idle, allocated, mixed, drained, down*..."""
        return self.node_states().get(name, "unknown")

    def sinfo_text(self) -> str:
        """sinfo's node table: name, partition, state, CPUs, memory, drain reason (whole)."""
        r = subprocess.run(["sinfo", "-N", "-o", "%12N %10P %14T %5c %8m %E"], env=self.env(),
                           capture_output=True, text=True, timeout=20, check=False)
        return r.stdout + r.stderr

    def wait_state(self, name: str, want: Iterable[str], timeout_s: float = 30) -> str:
        """Wait until a node's state is one of want; return it (or raise with sinfo)."""
        wanted = set(want)
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.node_state(name)
            if state in wanted:
                return state
            time.sleep(0.25)
        raise ClusterError(f"node {name} is {state!r}, not one of {sorted(wanted)} after "
                           f"{timeout_s:.0f} s\n{self.sinfo_text()}")

