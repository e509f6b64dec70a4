"""Whether a restart helps, from the whole story and not the category alone. Pure.

The category gives a default (rules.yaml, families.yaml); the rest of what the attempt
printed can overrule it (docs/diagnosis.md, "Restart verdict", holds this table):

| category | what else the logs show | restart helps |
|---|---|---|
| nccl_timeout_or_hang | ranks wait in different collectives at one SeqNum (a desync) | no |
| nccl_timeout_or_hang | a rank is named as missing from the collective or barrier | no |
| nccl_timeout_or_hang | another rank died of an error that repeats (code, config...) | no |
| nccl_timeout_or_hang | nothing else | yes |
| port_conflict | - | yes (a fresh port) |
| gpu_hardware, npu_hardware_or_driver | the node is isolated (Xid, ECC, device) | yes |
| gpu_hardware | not isolated | maybe |
| npu_hardware_or_driver | not isolated (an operator or driver error) | its rule's |
| network_or_rendezvous | a name that does not resolve, ssh refused | no |
| any other | - | the category's default |
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import replace

from trainguard.diagnosis.findings import Finding
from trainguard.diagnosis.taxonomy import Category, Diagnosis, RestartHelps

_WORK = re.compile(r"SeqNum=(\d+), OpType=(\w+)(?:.*?NumelIn=(\d+))?")
_MISSING = re.compile(
    r"(?:ranks?|processes)\W+[\d, ]+\W+(?:\w+ ){0,3}(?:failed to pass|did not (?:join|reach|"
    r"arrive)|have not (?:joined|arrived)|never (?:joined|arrived)|missing from)"
    r"|not (?:joined|reached) by ranks?|missing ranks?:|ranks? [\d, ]+ (?:is|are) missing",
    re.IGNORECASE)
_DETERMINISTIC = (Category.USER_CODE_ERROR, Category.CONFIG_ERROR,
                  Category.DEPENDENCY_OR_IMPORT_ERROR, Category.CHECKPOINT_LOAD_ERROR,
                  Category.GPU_OOM, Category.NUMERICAL)
_HARDWARE = (Category.GPU_HARDWARE, Category.NPU_HARDWARE_OR_DRIVER)
_BAD_ADDRESS = re.compile(
    r"name or service not known|host not found|could not resolve|nodename nor servname|"
    r"temporary failure in name resolution|no address associated|getaddrinfo|"
    r"\bssh\b.*(?:refused|denied|returned non-zero|exit status 255)|permission denied "
    r"\(publickey", re.IGNORECASE)


def desynced(findings: Sequence[Finding]) -> bool:
    """Ranks' timed-out works differ at one sequence number (op type or size)."""
    seen: dict[str, set[tuple[str, str | None]]] = {}
    for f in findings:
        if f.context:
            continue
        m = _WORK.search(f.text)
        if m is not None:
            seen.setdefault(m.group(1), set()).add((m.group(2), m.group(3)))
    ops = {op for works in seen.values() for op, _ in works}
    return any(len(w) > 1 for w in seen.values()) or len(ops) > 1


def story_restart(d: Diagnosis, findings: Sequence[Finding],
                  deterministic: Sequence[Category] = ()) -> Diagnosis:
    """`d` with the restart verdict the whole story supports. `deterministic`: the
    categories of the causes other ranks died of (final exceptions the rules know)."""
    verdict, why = d.restart_helps, ""
    cat = d.category
    if cat == Category.NCCL_TIMEOUT_OR_HANG:
        if desynced(findings):
            verdict, why = RestartHelps.NO, "the ranks wait in different collectives"
        elif any(_MISSING.search(f.text) for f in findings if not f.context):
            verdict, why = RestartHelps.NO, "a rank never joined the collective"
        elif any(c in _DETERMINISTIC for c in deterministic):
            verdict, why = RestartHelps.NO, "a rank died of an error that repeats"
        else:
            verdict = RestartHelps.YES
    elif cat == Category.PORT_CONFLICT or (d.isolate_node and cat in _HARDWARE):
        verdict = RestartHelps.YES  # a fresh port; the job placed on healthy nodes
    elif cat == Category.GPU_HARDWARE:
        verdict = RestartHelps.MAYBE
    # npu_hardware_or_driver not isolated: an operator or driver error code, whose rule says
    # whether it repeats (the Ascend codes differ: a timeout that passes, an operator that
    # fails the same way every time)
    elif cat == Category.NETWORK_OR_RENDEZVOUS and d.evidence is not None \
            and _BAD_ADDRESS.search(d.evidence.text):
        verdict, why = RestartHelps.NO, "the address itself is wrong"
    if verdict == d.restart_helps:
        return d
    advice = f"{d.advice} Restart helps: {verdict.value}" + (f" ({why})." if why else ".")
    return replace(d, restart_helps=verdict, advice=advice)
