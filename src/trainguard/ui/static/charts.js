// Goodput: one stacked bar (productive time, then each badput cause) and the step-time chart
// (seconds per step, one colour per attempt, the ideal step time as a dashed line). Plain SVG.
"use strict";

TG.BADPUT_COLOURS = {
  productive: "#54a24b", startup: "#4c78a8", checkpoint_blocking: "#b279a2", wasted_progress: "#f58518",
  detection: "#e45756", recovery: "#eeca3b", hang: "#ff9da6", queued: "#9d755d", other: "#bab0ac",
  stopped: "#e6e6e6",  // stopped on purpose: not badput, not in the goodput ratio
};

TG.renderGoodput = function (box, g) {
  if (!g || g.goodput === undefined || g.error) {
    box.replaceChildren(TG.el("p", { class: "muted", text: `Goodput not available${g && g.error ? ": " + g.error : ""}.` }));
    return;
  }
  const wall = g.wall_s || 0;
  const parts = [["productive", g.productive_s || 0],
                 ...Object.entries(g.badput_s || {}).filter(([, s]) => s > 0).sort((a, b) => b[1] - a[1]),
                 ...(g.stopped_s > 0 ? [["stopped", g.stopped_s]] : [])];
  const width = Math.max(box.clientWidth || 900, 400), h = 22;
  const svg = TG.svg("svg", { width, height: h, viewBox: `0 0 ${width} ${h}`, class: "goodput-bar",
                              role: "img", "aria-label": "goodput and badput" });
  let x = 0;
  for (const [cause, s] of parts) {
    const w = wall > 0 ? (s / wall) * width : 0;
    const rect = TG.svg("rect", { x, y: 0, width: Math.max(w, 0), height: h, class: "bp-segment",
                                  "data-cause": cause, fill: TG.colourOf(cause, TG.BADPUT_COLOURS) });
    rect.append(TG.svg("title", { text: `${cause}: ${TG.secs(s)} (${TG.pct(wall ? s / wall : null)})` }));
    svg.append(rect);
    x += w;
  }
  const legend = TG.el("div", { class: "legend" }, ...parts.map(([cause, s]) =>
    TG.el("span", { class: "legend-item", "data-cause": cause },
      TG.el("span", { class: "swatch", "data-colour": TG.colourOf(cause, TG.BADPUT_COLOURS) }),
      `${cause} ${TG.secs(s)}`)));
  const head = TG.el("p", { class: "goodput-head" },
    TG.el("b", { class: "goodput-value", text: TG.pct(g.goodput) }),
    ` productive: ${TG.secs(g.productive_s)} of ${TG.secs(wall)} wall time`,
    g.ideal_step_s ? ` · ideal step ${TG.secs(g.ideal_step_s)}` : "");
  box.replaceChildren(head, svg, segmentStrip(g.segments || [], width), legend);
  TG.paintSwatches(box);
};

// the wall time from start to now, each instant coloured by what it was spent on
function segmentStrip(segments, width) {
  if (!segments.length) return null;
  const lo = segments[0].start, hi = segments[segments.length - 1].end;
  const span = hi > lo ? hi - lo : 1, h = 14;
  const svg = TG.svg("svg", { width, height: h + 14, viewBox: `0 0 ${width} ${h + 14}`, class: "segments-svg",
                              role: "img", "aria-label": "where the wall time went" });
  for (const s of segments) {
    const x = ((s.start - lo) / span) * width, w = ((s.end - s.start) / span) * width;
    const rect = TG.svg("rect", { x, y: 0, width: Math.max(w, 0.5), height: h, class: "segment",
                                  "data-cause": s.cause, fill: TG.colourOf(s.cause, TG.BADPUT_COLOURS) });
    rect.append(TG.svg("title", { text: `attempt ${s.attempt}: ${s.cause} ${TG.secs(s.end - s.start)}` }));
    svg.append(rect);
  }
  svg.append(TG.svg("text", { x: 0, y: h + 12, class: "tl-axis", text: TG.clock(new Date(lo * 1000).toISOString()) }));
  svg.append(TG.svg("text", { x: width, y: h + 12, "text-anchor": "end", class: "tl-axis",
                              text: TG.clock(new Date(hi * 1000).toISOString()) }));
  return svg;
}

TG.renderSteps = function (box, g) {
  const pts = (g && g.step_seconds) || [];
  if (!pts.length) {
    box.replaceChildren(TG.el("p", { class: "muted", text: "No step times yet." }));
    return;
  }
  const width = Math.max(box.clientWidth || 900, 400), height = 180, l = 50, r = 10, t = 10, b = 24;
  let sMin = Infinity, sMax = -Infinity, yMax = 0;
  for (const [, step, s] of pts) { sMin = Math.min(sMin, step); sMax = Math.max(sMax, step); yMax = Math.max(yMax, s); }
  if (g.ideal_step_s) yMax = Math.max(yMax, g.ideal_step_s);
  if (sMax === sMin) sMax = sMin + 1;
  yMax = yMax > 0 ? yMax * 1.1 : 1;
  const x = (step) => l + ((step - sMin) / (sMax - sMin)) * (width - l - r);
  const y = (s) => t + (1 - s / yMax) * (height - t - b);
  const svg = TG.svg("svg", { width, height, viewBox: `0 0 ${width} ${height}`, class: "steps-svg",
                              role: "img", "aria-label": "seconds per step" });
  svg.append(TG.svg("line", { x1: l, y1: y(0), x2: width - r, y2: y(0), class: "axis" }));
  svg.append(TG.svg("line", { x1: l, y1: t, x2: l, y2: y(0), class: "axis" }));
  for (const frac of [0, 0.5, 1]) {
    svg.append(TG.svg("text", { x: l - 4, y: y(frac * yMax) + 4, "text-anchor": "end", class: "tl-axis", text: TG.secs(frac * yMax) }));
  }
  svg.append(TG.svg("text", { x: l, y: height - 6, class: "tl-axis", text: `step ${sMin}` }));
  svg.append(TG.svg("text", { x: width - r, y: height - 6, "text-anchor": "end", class: "tl-axis", text: `step ${sMax}` }));
  const byAttempt = new Map();
  for (const p of pts) { if (!byAttempt.has(p[0])) byAttempt.set(p[0], []); byAttempt.get(p[0]).push(p); }
  for (const [attempt, list] of byAttempt) {
    const colour = TG.PALETTE[attempt % TG.PALETTE.length];
    const d = list.map(([, step, s], i) => `${i ? "L" : "M"}${x(step).toFixed(1)},${y(s).toFixed(1)}`).join(" ");
    svg.append(TG.svg("path", { d, fill: "none", stroke: colour, "stroke-width": 1.5, class: "step-line", "data-attempt": attempt }));
  }
  if (g.ideal_step_s) {
    svg.append(TG.svg("line", { x1: l, x2: width - r, y1: y(g.ideal_step_s), y2: y(g.ideal_step_s), class: "ideal" }));
    svg.append(TG.svg("text", { x: width - r, y: y(g.ideal_step_s) - 4, "text-anchor": "end", class: "tl-axis", text: `ideal ${TG.secs(g.ideal_step_s)}` }));
  }
  const legend = TG.el("div", { class: "legend" }, ...[...byAttempt.keys()].map((a) =>
    TG.el("span", { class: "legend-item" }, TG.el("span", { class: "swatch", "data-colour": TG.PALETTE[a % TG.PALETTE.length] }), `attempt ${a}`)));
  box.replaceChildren(TG.el("p", { class: "muted", text: "seconds per step" }), svg, legend);
  TG.paintSwatches(box);
};
