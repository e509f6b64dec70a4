// The attempts timeline: one bar per running record (coloured by start type), and for each
// recover record its recovery drawn over the time it took (one band per phase), a marker
// at the fault, and a line of text: fault scenario -> recovery -> result, phase durations.
"use strict";

TG.PHASES = ["detect", "stop", "decide", "start", "resume"];
TG.PHASE_COLOURS = { detect: "#e45756", stop: "#f58518", decide: "#eeca3b",
                     start: "#72b7b2", resume: "#54a24b" };
const PHASE_BOUNDS = {  // each phase runs from the first time to the second
  detect: ["fault_at", "detected_at"], stop: ["detected_at", "workers_stopped_at"],
  decide: ["workers_stopped_at", "decided_at"], start: ["decided_at", "workers_started_at"],
  resume: ["workers_started_at", "first_progress_at"],
};

TG.renderTimeline = function (box, list, records, nowIso) {
  const now = new Date(nowIso || Date.now()).getTime();
  const t = (iso) => (iso ? new Date(iso).getTime() : null);
  if (!records.length) {
    box.replaceChildren(TG.el("p", { class: "muted", text: "No attempt started yet." }));
    list.replaceChildren();
    return;
  }
  let lo = Infinity, hi = -Infinity;
  for (const r of records) {
    lo = Math.min(lo, t(r.start_at));
    hi = Math.max(hi, t(r.end_at) ?? now);
    for (const rr of r.recover_records) hi = Math.max(hi, t(rr.first_progress_at) ?? t(rr.recover_start_at));
  }
  if (!(hi > lo)) hi = lo + 1000;
  const width = Math.max(box.clientWidth || 900, 400), label = 150, right = 16, rowH = 26;
  const x = (ms) => label + ((ms - lo) / (hi - lo)) * (width - label - right);
  const height = records.length * rowH + 30;
  const svg = TG.svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "timeline-svg",
                              role: "img", "aria-label": "attempts timeline" });
  records.forEach((r, i) => {
    const y = 6 + i * rowH;
    const end = t(r.end_at) ?? now;
    const colour = TG.colourOf(r.start_type, TG.START_COLOURS);
    svg.append(TG.svg("text", { x: 4, y: y + 15, class: "tl-label", text: `#${r.attempt} ${r.start_type}` }));
    const bar = TG.svg("rect", { x: x(t(r.start_at)), y, width: Math.max(x(end) - x(t(r.start_at)), 2),
                                 height: rowH - 8, rx: 3, fill: colour, class: "attempt-bar",
                                 "data-attempt": r.attempt, "data-start-type": r.start_type,
                                 "data-running": r.end_at ? "no" : "yes" });
    bar.append(TG.svg("title", { text: `attempt ${r.attempt} (${r.start_type}) ${TG.time(r.start_at)} → ` +
      `${r.end_at ? TG.time(r.end_at) : "running"}; steps ${r.first_step ?? "-"}–${r.last_step ?? "-"}` +
      (r.end_reason ? `; ended: ${r.end_reason}` : "") }));
    svg.append(bar);
    for (const rr of r.recover_records) svg.append(recoveryMarks(rr, y, rowH, x, t, now));
  });
  const axisY = records.length * rowH + 14;
  for (const frac of [0, 0.25, 0.5, 0.75, 1]) {
    const ms = lo + frac * (hi - lo);
    svg.append(TG.svg("text", { x: x(ms), y: axisY + 10, class: "tl-axis",
      "text-anchor": frac === 0 ? "start" : frac === 1 ? "end" : "middle", text: TG.clock(new Date(ms).toISOString()) }));
  }
  box.replaceChildren(svg, legend(records));
  list.replaceChildren(...records.flatMap((r) => r.recover_records.map((rr) => recoveryItem(rr))));
};

function recoveryMarks(rr, y, rowH, x, t, now) {
  const g = TG.svg("g", { class: "recovery", "data-attempt": rr.attempt });
  for (const phase of TG.PHASES) {
    const [a, b] = PHASE_BOUNDS[phase];
    const from = t(rr[a]), to = t(rr[b]) ?? (rr.recover_result === "recovering" && from ? now : null);
    if (from === null || to === null) continue;
    g.append(TG.svg("rect", { x: x(from), y: y + rowH - 11, width: Math.max(x(to) - x(from), 1), height: 5,
                              fill: TG.PHASE_COLOURS[phase], class: `phase phase-${phase}` }));
  }
  const at = t(rr.fault_at) ?? t(rr.recover_start_at);
  const mx = x(at);
  const marker = TG.svg("path", { d: `M${mx - 6},${y - 3} L${mx + 6},${y - 3} L${mx},${y + 7} Z`,
                                  class: `fault-marker result-${rr.recover_result}` });
  marker.append(TG.svg("title", { text: recoveryText(rr) }));
  g.append(marker);
  return g;
}

function recoveryText(rr) {
  const d = rr.durations_s || {};
  const phases = TG.PHASES.map((p) => `${p} ${TG.secs(d[p])}`).join("  ");
  return `attempt ${rr.attempt}: ${rr.fault_scenario} → ${rr.recover} → ${rr.recover_result}` +
    ` · ${phases}  total ${TG.secs(d.total)}` +
    (rr.steps_lost !== null && rr.steps_lost !== undefined ? ` · steps lost ${rr.steps_lost}` : "");
}

function recoveryItem(rr) {
  const d = rr.durations_s || {};
  return TG.el("li", { class: "recovery-item", "data-attempt": rr.attempt },
    TG.el("span", { class: "fault", text: `attempt ${rr.attempt}` }), " ",
    TG.el("b", { text: rr.fault_scenario }), " → ", TG.el("b", { text: rr.recover }), " → ",
    TG.el("span", { class: `result result-${rr.recover_result}`, text: rr.recover_result }),
    TG.el("span", { class: "phases" }, ...TG.PHASES.map((p) => TG.el("span", { class: `phase-chip phase-${p}`, text: `${p} ${TG.secs(d[p])}` })),
      TG.el("span", { class: "phase-chip", text: `total ${TG.secs(d.total)}` })),
    TG.el("div", { class: "muted reason", text: rr.reason }));
}

function legend(records) {
  const types = [...new Set(records.map((r) => r.start_type))];
  return TG.el("div", { class: "legend" },
    ...types.map((s) => TG.el("span", { class: "legend-item" },
      TG.el("span", { class: "swatch", "data-colour": TG.colourOf(s, TG.START_COLOURS) }), s)),
    ...TG.PHASES.map((p) => TG.el("span", { class: "legend-item" }, TG.el("span", { class: `swatch phase-${p}` }), p)));
}

// swatches get their colour from data-colour (no inline style: the page's CSP forbids it)
TG.paintSwatches = function (root) {
  for (const s of root.querySelectorAll("[data-colour]")) s.style.background = s.dataset.colour;
};
