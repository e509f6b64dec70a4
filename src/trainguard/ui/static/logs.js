// Per-rank log tails: pick an attempt and a rank; the server reads the tail backwards from
// the end (never the whole file) and marks the diagnosis' deciding line and symptoms.
"use strict";

TG.Logs = class {
  constructor(jobId) {
    this.jobId = jobId;
    this.logs = [];
    this.pinned = null;  // {attempt, rank, line}: show the lines around a line, not the tail
    this.attempt = document.getElementById("log-attempt");
    this.rank = document.getElementById("log-rank");
    this.lines = document.getElementById("log-lines");
    this.pre = document.getElementById("log");
    this.info = document.getElementById("log-info");
    this.listTicket = 0;
    this.loadTicket = 0;
    this.attempt.addEventListener("change", () => { this.pinned = null; this.fillRanks(); this.load(); });
    this.rank.addEventListener("change", () => { this.pinned = null; this.load(); });
    this.lines.addEventListener("change", () => { this.pinned = null; this.load(); });
  }

  async refreshList(prefer) {
    const ticket = ++this.listTicket;  // two refreshes in flight: only the newest one's answer counts
    const logs = await TG.getJSON(`/api/jobs/${this.jobId}/logs`);
    if (ticket !== this.listTicket) return;
    this.logs = logs;
    const attempts = [...new Set(this.logs.map((l) => l.attempt))];
    const keep = this.attempt.value;
    this.attempt.replaceChildren(...attempts.map((a) => TG.el("option", { value: a, text: a })));
    const want = prefer ? String(prefer.attempt) : keep || String(attempts[attempts.length - 1] ?? "");
    if (attempts.map(String).includes(want)) this.attempt.value = want;
    else if (attempts.length) this.attempt.value = String(attempts[attempts.length - 1]);
    this.fillRanks(prefer);
  }

  fillRanks(prefer) {
    const keep = this.rank.value;
    const ranks = this.logs.filter((l) => String(l.attempt) === this.attempt.value);
    this.rank.replaceChildren(...ranks.map((l) => TG.el("option", { value: l.rank, text: `${l.rank} (${TG.bytes(l.size)})` })));
    const want = prefer && prefer.rank !== undefined && prefer.rank !== null ? String(prefer.rank) : keep;
    if (ranks.map((l) => String(l.rank)).includes(want)) this.rank.value = want;
  }

  async show(attempt, rank, line) {
    this.pinned = line ? { attempt, rank, line } : null;
    await this.refreshList({ attempt, rank });
    await this.load();
    this.pre.scrollIntoView({ block: "nearest" });
  }

  async load() {
    if (this.attempt.value === "" || this.rank.value === "") {
      this.pre.replaceChildren(TG.el("span", { class: "muted", text: "No rank log yet." }));
      return;
    }
    const base = `/api/jobs/${this.jobId}/logs/${this.attempt.value}/${this.rank.value}`;
    const url = this.pinned ? `${base}?line=${this.pinned.line}&context=20` : `${base}?tail=${this.lines.value}`;
    const ticket = ++this.loadTicket;  // an older request answered late must not replace a newer one's lines
    let doc;
    try {
      doc = await TG.getJSON(url);
    } catch (e) {
      if (ticket === this.loadTicket) this.pre.replaceChildren(TG.el("span", { class: "error", text: e.message }));
      return;
    }
    if (ticket !== this.loadTicket) return;
    const atBottom = this.pre.scrollTop + this.pre.clientHeight >= this.pre.scrollHeight - 4;
    this.pre.replaceChildren(...doc.lines.map((ln) => TG.el("div", {
      class: `ln${ln.stream === "err" ? " err" : ""}${ln.mark ? " mark-" + ln.mark : ""}`, "data-n": ln.n ?? "" },
      TG.el("span", { class: "n", text: ln.n ?? "" }),
      TG.el("span", { class: "t", text: ln.time ? TG.clock(ln.time) : "" }),
      TG.el("span", { class: "x", text: ln.text }))));
    const decisive = this.pre.querySelector(".mark-decisive");
    if (decisive && (this.pinned || !this.scrolled)) {
      this.pre.scrollTop = decisive.offsetTop - this.pre.clientHeight / 2;
      this.scrolled = true;
    } else if (atBottom) {
      this.pre.scrollTop = this.pre.scrollHeight;
    }
    const marked = doc.marks.length ? ` · ${doc.marks.length} diagnosed line(s) in this log` : "";
    this.info.textContent = `${doc.path} · ${TG.bytes(doc.size)} · ${doc.lines.length} lines` +
      (this.pinned ? ` around line ${this.pinned.line}` : " from the end") + (doc.complete ? "" : " (cut)") + marked;
  }
};
