// The job list: one row per job, refreshed every few seconds (new jobs under --root appear).
"use strict";

const REFRESH_MS = 3000;

function jobRow(j) {
  const link = TG.el("a", { href: `/jobs/${encodeURIComponent(j.id)}`, text: j.run_id || j.id });
  if (j.error) {
    return TG.el("tr", { class: "job-row", "data-job": j.id },
      TG.el("td", {}, link), TG.el("td", {}, TG.stateBadge("unreadable")),
      TG.el("td", { colspan: 6, class: "error", text: j.error }),
      TG.el("td", { class: "path", text: j.job_dir }));
  }
  return TG.el("tr", { class: "job-row", "data-job": j.id, "data-state": j.state,
                       "data-hung": j.hang ? "1" : "0" },
    TG.el("td", {}, link),
    TG.el("td", {}, TG.stateBadge(j.state, j.hang, j.stopping)),
    TG.el("td", { class: "num", text: j.attempts }),
    TG.el("td", { class: "num", text: j.incidents }),
    TG.el("td", { class: "num goodput", text: TG.pct(j.goodput) }),
    TG.el("td", { class: "num", text: TG.stepText(j) }),
    TG.el("td", { title: j.last_progress_at || "", text: TG.ago(j.last_progress_at) }),
    TG.el("td", { text: TG.time(j.created_at) }),
    TG.el("td", { class: "path", text: j.job_dir }));
}

async function refresh() {
  const error = document.getElementById("error");
  try {
    const jobs = await TG.getJSON("/api/jobs");
    const body = document.querySelector("#jobs tbody");
    body.replaceChildren(...jobs.map(jobRow));
    document.getElementById("empty").hidden = jobs.length > 0;
    document.getElementById("refreshed").textContent = "updated " + TG.clock(new Date().toISOString());
    error.hidden = true;
  } catch (e) {
    error.textContent = "cannot read the job list: " + e.message;
    error.hidden = false;
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
