// The job view's panels drawn from the job's JSON: summary, diagnoses, hangs, events, nodes
// and ranks, checkpoints.
"use strict";

TG.renderSummary = function (box, job) {
  const fact = (k, v, cls) => TG.el("div", { class: "fact" }, TG.el("span", { class: "k", text: k }),
                                    TG.el("span", { class: `v ${cls || ""}`, text: v }));
  const m = job.meta || {};
  box.replaceChildren(
    fact("run", job.run_id || job.id), fact("attempts", job.attempts, "attempts"),
    fact("incidents", job.incidents), fact("goodput", TG.pct(job.goodput), "goodput"),
    fact("last step", TG.stepText(job)), fact("last progress", TG.ago(job.last_progress_at)),
    fact("started", TG.time(job.created_at)), fact("ended", job.ended_at ? TG.time(job.ended_at) : "-"),
    fact("exit code", m.exit_code ?? "-"), fact("job dir", job.job_dir, "path"),
    fact("command", (m.command || []).join(" "), "path"));
};

TG.renderDiagnoses = function (box, items, openLog) {
  if (!items.length) {
    box.replaceChildren(TG.el("p", { class: "muted", text: "No failure diagnosed." }));
    return;
  }
  box.replaceChildren(...items.slice().reverse().map((it) => {
    const d = it.diagnosis || {}, ev = d.evidence, c = d.culprit || {};
    const where = ev && ev.file ? `${ev.file}:${ev.line}` : "exit status";
    return TG.el("div", { class: "diagnosis", "data-attempt": it.attempt },
      TG.el("div", { class: "diag-head" },
        TG.el("span", { class: "cat", text: d.category || "?" }),
        TG.el("span", { class: "muted", text: ` attempt ${it.attempt} · ${TG.clock(it.time)} · ${d.fault_domain || ""}` +
          ` · restart helps: ${d.restart_helps || "?"} · confidence ${d.confidence ?? "?"}` })),
      TG.el("div", { class: "summary", text: d.summary || it.message }),
      c.rank !== null && c.rank !== undefined ? TG.el("div", { class: "culprit", text: `culprit: rank ${c.rank}` + (c.frame ? `, ${c.frame}` : "") }) : null,
      ev ? TG.el("div", { class: "evidence" },
        TG.el("span", { class: "muted", text: `deciding line (${where}): ` }),
        TG.el("code", { class: "mark-decisive", text: ev.text }),
        ev.file && (ev.rank ?? c.rank) !== undefined ? TG.el("button", { class: "link", text: "show in log",
          onclick: () => openLog(it.attempt, ev.rank ?? c.rank, ev.line) }) : null,
        ...(ev.more || []).map((t) => TG.el("div", { class: "more" }, TG.el("code", { text: t })))) : null,
      d.symptoms && d.symptoms.length ? TG.el("details", { class: "symptoms" },
        TG.el("summary", { text: `symptoms it explains (${d.symptoms.length})` }),
        ...d.symptoms.map((s) => TG.el("div", {}, TG.el("span", { class: "muted", text: `${s.file}:${s.line} ` }),
          TG.el("code", { class: "mark-symptom", text: s.text })))) : null,
      d.advice ? TG.el("div", { class: "advice", text: d.advice }) : null);
  }));
};

TG.renderHangs = function (box, items) {
  if (!items.length) {
    box.replaceChildren(TG.el("p", { class: "muted", text: "No hang confirmed." }));
    return;
  }
  box.replaceChildren(...items.slice().reverse().map((h) => {
    const c = h.culprit || {};
    return TG.el("div", { class: "hang", "data-attempt": h.attempt },
      TG.el("div", { class: "diag-head" },
        TG.el("span", { class: "cat", text: "hang" }),
        TG.el("span", { class: "muted", text: ` attempt ${h.attempt} · ${TG.clock(h.time)} · idle ${TG.secs(h.idle_s)} ` +
          `(threshold ${TG.secs(h.threshold_s)}: ${h.basis || "?"})` + (h.cleared_at ? " · cleared" : "") })),
      TG.el("div", { class: "summary culprit", text: c.rank !== null && c.rank !== undefined
        ? `culprit: rank ${c.rank}: ${c.reason || ""}` : `no single culprit: ${c.reason || ""}` }),
      TG.el("div", { class: "stacks" }, ...(h.ranks || []).map((r) =>
        TG.el("div", { class: `stack${r.culprit ? " stack-culprit" : ""}`, "data-rank": r.rank },
          TG.el("div", { class: "stack-head", text: `rank ${r.rank}` + (r.doing ? ` · ${r.doing}` : "") +
            (r.culprit ? " · culprit" : "") + (r.error ? ` · dump failed: ${r.error}` : "") }),
          TG.el("pre", { text: r.text || (r.frames || []).join("\n") || "(no stack)" })))),
      h.stacks_dir ? TG.el("div", { class: "muted", text: `stack dumps: ${h.stacks_dir}` }) : null);
  }));
};

const MAX_EVENT_ROWS = 500;
TG.addEvents = function (tbody, events) {
  for (const ev of events) {
    if (tbody.querySelector(`tr[data-event-id="${ev.id}"]`)) continue;
    const who = Object.entries(ev.involved || {}).filter(([k]) => k !== "job").map(([k, v]) => `${k} ${v}`).join(", ");
    tbody.prepend(TG.el("tr", { class: `event level-${ev.level}`, "data-event-id": ev.id, "data-reason": ev.reason },
      TG.el("td", { class: "num", text: ev.id }), TG.el("td", { text: TG.clock(ev.time) }),
      TG.el("td", { text: ev.level }), TG.el("td", { class: "reason", text: ev.reason }),
      TG.el("td", { text: who }), TG.el("td", { class: "message", text: ev.message })));
  }
  while (tbody.rows.length > MAX_EVENT_ROWS) tbody.deleteRow(tbody.rows.length - 1);
};

TG.renderNodes = function (nodesBox, workersBox, job) {
  const table = (cols, rows) => TG.el("table", { class: "grid small" },
    TG.el("thead", {}, TG.el("tr", {}, ...cols.map((c) => TG.el("th", { text: c })))),
    TG.el("tbody", {}, ...rows));
  // a lost job's agents, as `trainguard status` says them (review 54 #7)
  const agents = job.agents_unknown ? `No controller: the launcher is gone, and of its node agents ${job.agents_unknown}: ` +
    "the nodes and ranks below show their last recorded states." :
    (job.agents_without_controller || []).length ? `No controller: the launcher is gone, but the node agents of ` +
      `${job.agents_without_controller.join(", ")} still run, and their workers train on unrecorded ` +
      "(`trainguard run` with the same --job-dir takes the job over; `trainguard stop` ends them)." : null;
  nodesBox.replaceChildren(...(agents ? [TG.el("p", { class: "agents-note", text: agents })] : []),
    job.nodes.length ? table(["node", "host", "state", "slot", "implicated", "reason"],
      job.nodes.map((n) => TG.el("tr", { class: "node", "data-state": n.state }, ...[n.name, n.host, n.state, n.slot ?? "-",
        n.times_implicated, n.reason || ""].map((v) => TG.el("td", { text: v }))))) :
      TG.el("p", { class: "muted", text: "One node (no node rows)." }));
  workersBox.replaceChildren(job.workers.length ? table(["rank", "node", "pid", "state", "exit", "starts"],
    job.workers.map((w) => TG.el("tr", { class: "worker", "data-state": w.state, "data-rank": w.rank }, ...[w.rank, w.node, w.pid ?? "-", w.state,
      w.signal || (w.exit_code ?? "-"), w.start_count].map((v) => TG.el("td", { text: v }))))) :
    TG.el("p", { class: "muted", text: "No ranks yet." }));
};

TG.renderCheckpoints = function (box, countBox, ck) {
  countBox.textContent = ck.count ? `(${ck.count} committed)` : "";
  if (!ck.items.length) {
    box.replaceChildren(TG.el("p", { class: "muted", text: "No checkpoint committed yet." }));
    return;
  }
  box.replaceChildren(TG.el("table", { class: "grid small" },
    TG.el("thead", {}, TG.el("tr", {}, ...["step", "time", "attempt", "blocked", "written in", "size"].map((c) => TG.el("th", { text: c })))),
    TG.el("tbody", {}, ...ck.items.map((c) => TG.el("tr", { class: "checkpoint", "data-step": c.step, title: c.message },
      ...[c.step, TG.clock(c.time), c.attempt, TG.secs(c.blocked_s), TG.secs(c.write_s),
          c.size ?? (c.mib === null ? "-" : `${c.mib} MiB`)].map((v) => TG.el("td", { text: v })))))));
};
