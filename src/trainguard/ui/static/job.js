// The job view: the job's JSON once, then one event stream (server-sent events) that brings
// every new event (with its id, so a reconnect resumes after the last one seen) and the
// job's live parts (state, attempts, recover records, ranks, nodes) whenever they change.
"use strict";

const JOB_ID = decodeURIComponent(location.pathname.split("/").filter(Boolean).pop());
const DETAIL_REASONS = new Set(["CheckpointSaved", "FailureDiagnosed", "HangConfirmed", "HangCleared",
  "JobSucceeded", "JobFailed", "JobStopped", "Resumed", "WorkersRestarted"]);
const job = { doc: null, records: [], ended: false };
const logs = new TG.Logs(encodeURIComponent(JOB_ID));
const $ = (id) => document.getElementById(id);
let detailTimer = null, eventCount = 0, lastId = null, watching = null;
const RELAUNCH_POLL_MS = 5000;  // an ended job's page looks this often for a relaunch

function showError(e) {
  $("error").textContent = e ? String(e.message || e) : "";
  $("error").hidden = !e;
}

function drawTimeline() {
  TG.renderTimeline($("timeline"), $("recoveries"), job.records);
  TG.paintSwatches($("timeline"));
}

function applyLive(parts, first = false) {
  const newAttempt = !first && parts.attempts !== job.records.length;  // the first load picks its own log
  Object.assign(job.doc, parts);
  job.records = parts.records;
  job.ended = parts.ended;
  $("state").replaceChildren(TG.stateBadge(parts.state, parts.hang, parts.stopping));
  document.body.dataset.state = parts.state || "";
  document.body.dataset.attempts = String(parts.attempts);
  TG.renderSummary($("summary"), job.doc);
  TG.renderNodes($("nodes"), $("workers"), job.doc);
  drawTimeline();
  if (newAttempt) logs.refreshList().then(() => logs.load()).catch(showError);
}

async function loadDetail() {
  const doc = await TG.getJSON(`/api/jobs/${encodeURIComponent(JOB_ID)}`);
  const first = job.doc === null;
  job.doc = doc;
  document.title = `trainguard · ${doc.run_id || doc.id}`;
  $("title").textContent = doc.run_id || doc.id;
  applyLive(doc, first);
  TG.renderGoodput($("goodput"), doc.goodput_detail);
  TG.renderSteps($("steps"), doc.goodput_detail);
  TG.renderDiagnoses($("diagnoses"), doc.diagnoses, (a, r, line) => logs.show(a, r, line).catch(showError));
  TG.renderCheckpoints($("checkpoints"), $("ckpt-count"), doc.checkpoints);
  if (doc.hangs.length) TG.renderHangs($("hangs"), await TG.getJSON(`/api/jobs/${encodeURIComponent(JOB_ID)}/hangs`));
  if (first) {
    const d = doc.diagnoses[doc.diagnoses.length - 1];
    const ev = d && d.diagnosis.evidence;
    const prefer = ev && ev.file ? { attempt: d.attempt, rank: ev.rank ?? d.diagnosis.culprit.rank } : null;
    await logs.refreshList(prefer);
    await logs.load();
  }
}

function scheduleDetail() {  // new checkpoints, diagnoses, hangs, goodput: one fetch for a burst
  if (detailTimer) return;
  detailTimer = setTimeout(() => { detailTimer = null; loadDetail().catch(showError); }, 300);
}

function connect() {  // (again after a relaunch: from the last event shown, none twice)
  const after = lastId === null ? "" : `?after=${encodeURIComponent(lastId)}`;
  const es = new EventSource(`/api/jobs/${encodeURIComponent(JOB_ID)}/stream${after}`);
  const live = $("live");
  es.addEventListener("open", () => {  // an ended job's stream only replays, then ends
    live.textContent = job.ended ? "ended" : "live";
    live.className = job.ended ? "live ended" : "live on";
  });
  es.addEventListener("error", () => {
    if (es.readyState !== EventSource.CLOSED) { live.textContent = "reconnecting"; live.className = "live off"; }
  });
  es.addEventListener("event", (m) => {
    const ev = JSON.parse(m.data);
    TG.addEvents(document.querySelector("#events tbody"), [ev]);
    eventCount += 1;
    $("event-count").textContent = `(${job.doc ? Math.max(job.doc.events_total, ev.id) : eventCount})`;
    document.body.dataset.lastEventId = m.lastEventId;
    lastId = m.lastEventId;
    if (DETAIL_REASONS.has(ev.reason)) scheduleDetail();
  });
  es.addEventListener("job", (m) => { if (job.doc) applyLive(JSON.parse(m.data)); });
  es.addEventListener("end", () => {
    es.close();
    live.textContent = "ended";
    live.className = "live ended";
    scheduleDetail();
    watchRelaunch();
  });
}

// an ended job is launched again by the same command (a requeue, `status`'s "continue it"):
// its open page asks now and then for an event after the last one it showed (one indexed
// read; none while the tab is hidden), and follows the job again once one comes
// (walk-through 38 #5: a page left open said "stopped" through a whole relaunch; review 45
// #2: reloading every panel each time closed what the reader had opened)
function watchRelaunch() {
  if (watching) return;
  watching = setInterval(() => {
    if (document.hidden) return;
    const d = job.doc;  // a lost job's agents end (their orphan timeout) or Slurm answers
    if (d && d.state === "lost" && (d.agents_unknown || (d.agents_without_controller || []).length)) {
      TG.getJSON(`/api/jobs/${encodeURIComponent(JOB_ID)}`).then((doc) => {  // (review 55 #8)
        for (const k of ["agents_unknown", "agents_without_controller", "nodes", "workers"]) d[k] = doc[k];
        TG.renderNodes($("nodes"), $("workers"), d);
      }).catch(showError);
    }
    const after = lastId === null ? 0 : lastId;
    TG.getJSON(`/api/jobs/${encodeURIComponent(JOB_ID)}/events?after=${encodeURIComponent(after)}&limit=1`)
      .then((page) => {
        if (!page.events.length || !watching) return;
        clearInterval(watching);
        watching = null;
        loadDetail().then(connect).catch(showError);
      }).catch(showError);
  }, RELAUNCH_POLL_MS);
}

// a running attempt's bar grows with the clock; the open log follows the file
setInterval(() => { if (job.doc && !job.ended) drawTimeline(); }, 1000);
setInterval(() => {
  if (job.doc && !job.ended && !logs.pinned && String(job.records.length - 1) === logs.attempt.value) logs.load().catch(showError);
}, 2000);
setInterval(() => { if (job.doc && !job.ended) scheduleDetail(); }, 10000);  // goodput moves with time

loadDetail().then(connect).catch(showError);
