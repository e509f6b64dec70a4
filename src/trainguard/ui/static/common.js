// Shared helpers of the dashboard's pages: DOM building (text only, never HTML from data),
// JSON fetches, and how times and durations read.
"use strict";

const TG = {};

TG.el = function (tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
};

TG.svg = function (tag, attrs, ...children) {
  const node = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "text") node.textContent = v;
    else node.setAttribute(k, String(v));
  }
  for (const c of children.flat()) if (c) node.append(c);
  return node;
};

TG.getJSON = async function (url) {
  const r = await fetch(url, { headers: { accept: "application/json" }, cache: "no-store" });
  const body = await r.json().catch(() => ({ error: r.statusText }));
  if (!r.ok) throw new Error(body.error || `${r.status} ${r.statusText}`);
  return body;
};

TG.time = function (iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toLocaleString(undefined, { hour12: false });
};

TG.clock = function (iso) {
  if (!iso) return "-";
  const d = new Date(iso);
  if (isNaN(d)) return iso;
  const ms = String(d.getMilliseconds()).padStart(3, "0");
  return d.toLocaleTimeString(undefined, { hour12: false }) + "." + ms;
};

TG.secs = function (s) {
  if (s === null || s === undefined || isNaN(s)) return "-";
  if (s < 60) return s.toFixed(s < 10 ? 3 : 1) + "s";
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m${String(Math.round(s - m * 60)).padStart(2, "0")}s`;
  return `${Math.floor(m / 60)}h${String(m % 60).padStart(2, "0")}m`;
};

TG.pct = function (ratio) {
  return ratio === null || ratio === undefined ? "-" : (100 * ratio).toFixed(1) + "%";
};

TG.ago = function (iso) {
  if (!iso) return "-";
  const s = (Date.now() - new Date(iso).getTime()) / 1000;
  return s < 0 ? TG.time(iso) : TG.secs(s) + " ago";
};

// the last step, labelled when it is the last committed checkpoint's (as `status` and `ls`)
TG.stepText = function (job) {
  if (job.last_step === null || job.last_step === undefined) return "-";
  return job.progress_source === "checkpoint" ? `${job.last_step} (checkpoint)` : String(job.last_step);
};

// `hang`: a confirmed hang left running in the current attempt (as `status` says HUNG);
// `stopping`: a stop under way, its grace period running (as `status` says STOPPING)
TG.stateBadge = function (state, hang = null, stopping = null) {
  const badge = TG.el("span", { class: `state state-${state || "unknown"}`, text: state || "unknown" });
  const extra = [];
  if (hang) {
    extra.push(" ", TG.el("span", {
      class: "state state-hung", text: "HUNG",
      title: `confirmed at ${hang.confirmed_at}, left running; culprit: ${hang.culprit}`,
    }));
  }
  if (stopping) {
    extra.push(" ", TG.el("span", {
      class: "state state-stopping", text: "STOPPING",
      title: `requested at ${stopping.requested_at} (${stopping.signal}); the ranks have ` +
        `${stopping.grace_s}s to exit, then SIGKILL`,
    }));
  }
  return extra.length ? TG.el("span", {}, badge, ...extra) : badge;
};

TG.bytes = function (n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : String(n)) + " " + units[i];
};

// colours by start type, by badput cause, by attempt (charts)
TG.START_COLOURS = {
  first_start: "#4c78a8", relaunch: "#72b7b2", auto_restart: "#f58518",
  unconditional_restart: "#e45756", suspension_restart: "#b279a2",
  pod_reschedule: "#54a24b", job_reschedule: "#eeca3b",
};
TG.PALETTE = ["#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2",
              "#eeca3b", "#ff9da6", "#9d755d", "#bab0ac"];
TG.colourOf = function (key, table) {
  if (table && table[key]) return table[key];
  let h = 0;
  for (const ch of String(key)) h = (h * 31 + ch.charCodeAt(0)) >>> 0;
  return TG.PALETTE[h % TG.PALETTE.length];
};
