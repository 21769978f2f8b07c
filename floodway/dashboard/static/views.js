// The list views: tasks (filtered and paged), batches with their progress, workers, and the
// per-kind breakdown. Each reads the API as the page's key allows: tasks and batches are the
// key's tenant's; workers need an operator key.

import { ApiError, getJson, request } from "./api.js";
import { $, fmtAgo, fmtDate, fmtInt, fmtMoney, h, pct } from "./format.js";
import { STATUSES } from "./series.js";

export const TERMINAL = new Set(["succeeded", "failed", "dead", "timeout", "cancelled", "deduped"]);
/** What a manual retry takes (the API's 409 otherwise). */
export const RETRYABLE = new Set(["failed", "dead", "timeout", "cancelled"]);

export function badge(node, status) {
  node.textContent = status;
  node.className = `badge status-${status}`;
  return node;
}

function problemText(error) {
  return error instanceof ApiError ? error.message : String(error);
}

function message(id, text, kind = "") {
  $(id).textContent = text;
  $(id).dataset.kind = kind;
}

// -- tasks ---------------------------------------------------------------------------------
/**
 * The task list: filters (state, kind, batch), newest or oldest first, a page size, and
 * keyset paging (each page's `next` cursor; the cursors of the pages before are kept to go
 * back). `onOpen(id)` shows one task; `onChange()` runs after a cancel or a retry.
 */
export class TaskList {
  constructor({ onOpen, onChange, onAuth }) {
    this.onOpen = onOpen;
    this.onChange = onChange;
    this.onAuth = onAuth;
    this.cursors = [null]; // the cursor of each page shown so far; the last is this page's
    this.next = null;
    // Each look asked for takes a ticket; only the newest one's answer is shown, so a click
    // made while another look is out is never dropped, nor undone by the older answer.
    this.ticket = 0;
    this.answered = 0;
    for (const status of STATUSES) $("tasks-status").appendChild(h("option", { text: status, attrs: { value: status } }));
    $("tasks-form").addEventListener("submit", (event) => {
      event.preventDefault();
      this.first();
    });
    for (const id of ["tasks-status", "tasks-kind", "tasks-order", "tasks-limit"]) {
      $(id).addEventListener("change", () => this.first());
    }
    $("tasks-next").addEventListener("click", () => this.page(this.cursors.length));
    $("tasks-prev").addEventListener("click", () => this.page(this.cursors.length - 2));
  }

  /** The kinds the filter offers: those the ledger holds tasks of. */
  kinds(names) {
    const select = $("tasks-kind");
    const have = new Set([...select.options].map((o) => o.value));
    for (const name of [...names].sort()) {
      if (!have.has(name)) select.appendChild(h("option", { text: name, attrs: { value: name } }));
    }
  }

  /** Show one batch's tasks (from the batches view). */
  showBatch(batchId) {
    $("tasks-batch").value = batchId;
    this.first();
    $("tasks-title").scrollIntoView({ behavior: "smooth", block: "start" });
  }

  filters() {
    return {
      status: $("tasks-status").value,
      kind: $("tasks-kind").value,
      batch: $("tasks-batch").value.trim(),
      order: $("tasks-order").value,
      limit: $("tasks-limit").value,
    };
  }

  first() {
    this.cursors = [null];
    message("tasks-message", ""); // a new list: what was said of the last one is done
    return this.page(0);
  }

  /** Page `index` (0: the first); the page after the last shown one takes its `next`. */
  async page(index) {
    if (index < 0) return;
    const after = index < this.cursors.length ? this.cursors[index] : this.next;
    if (index >= this.cursors.length && !after) return;
    const ticket = ++this.ticket;
    try {
      const page = await getJson("v1/tasks", { params: { ...this.filters(), after } });
      if (ticket !== this.ticket) return;
      this.cursors = [...this.cursors.slice(0, index), after];
      this.next = page.next;
      this.render(page.items);
    } catch (error) {
      if (ticket !== this.ticket) return;
      if (error.status === 401) this.onAuth(error);
      message("tasks-message", `Could not list the tasks: ${problemText(error)}`, "error");
    } finally {
      this.answered = Math.max(this.answered, ticket);
    }
  }

  /** The page on show, read again (after an action, or on the poll); not while a look the
   *  user asked for is out: its answer is newer. */
  refresh() {
    if (this.answered < this.ticket) return Promise.resolve();
    return this.page(this.cursors.length - 1);
  }

  render(items) {
    const rows = items.map((task) => {
      const open = h("button", { cls: "linklike mono", text: task.id, attrs: { type: "button", title: "Show this task, its attempts and events" } });
      open.addEventListener("click", () => this.onOpen(task.id));
      const actions = [];
      if (!TERMINAL.has(task.status)) actions.push(this.action("Cancel", task, "DELETE", `v1/tasks/${encodeURIComponent(task.id)}`, "data-cancel"));
      if (RETRYABLE.has(task.status)) actions.push(this.action("Retry", task, "POST", `v1/tasks/${encodeURIComponent(task.id)}/retry`, "data-retry-task"));
      return h("tr", { attrs: { "data-task-id": task.id, "data-status": task.status } }, [
        h("td", {}, [open]),
        h("td", { text: task.kind }),
        h("td", {}, [badge(h("span"), task.status)]),
        h("td", { cls: "num", text: `${task.attempts} / ${task.max_attempts}` }),
        h("td", { text: fmtAgo(task.created_at), title: fmtDate(task.created_at) }),
        h("td", { text: task.finished_at ? fmtAgo(task.finished_at) : "—", title: task.finished_at ? fmtDate(task.finished_at) : "" }),
        h("td", { cls: "action" }, actions),
      ]);
    });
    $("tasks-rows").replaceChildren(...rows);
    $("tasks-empty").hidden = rows.length > 0;
    $("tasks-table").hidden = rows.length === 0;
    $("tasks-prev").disabled = this.cursors.length <= 1;
    $("tasks-next").disabled = !this.next;
    $("tasks-page").textContent = `page ${this.cursors.length}`;
    $("tasks-page").dataset.page = String(this.cursors.length);
  }

  action(label, task, method, path, attr) {
    const button = h("button", { cls: "small secondary", text: label, attrs: { type: "button", [attr]: task.id, "aria-label": `${label} task ${task.id}` } });
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const after = await request(method, path);
        message("tasks-message", `Task ${task.id} is ${after.status}.`, "ok");
      } catch (error) {
        if (error.status === 401) this.onAuth(error);
        const why = error.status === 409 ? error.detail || error.title : problemText(error);
        message("tasks-message", `Could not ${label.toLowerCase()} ${task.id}: ${why}`, "error");
      }
      await this.refresh();
      this.onChange();
    });
    return button;
  }
}

// -- batches -------------------------------------------------------------------------------
export async function refreshBatches(onPick) {
  let answer;
  try {
    answer = await getJson("v1/batches", { params: { limit: 20 } });
  } catch (error) {
    message("batches-message", `Could not list the batches: ${problemText(error)}`, "error");
    return;
  }
  message("batches-message", "");
  const rows = answer.items.map((b) => {
    const ended = [...TERMINAL].reduce((n, s) => n + (b.counts[s] || 0), 0);
    const ok = (b.counts.succeeded || 0) + (b.counts.deduped || 0);
    const share = pct(ended, b.total);
    const fill = h("div", { cls: `meter-fill ${b.done ? "ok" : "full"}` });
    fill.style.width = `${share}%`;
    const open = h("button", { cls: "linklike mono", text: b.id, attrs: { type: "button", title: "List this batch's tasks" } });
    open.addEventListener("click", () => onPick(b.id));
    const waiting = (b.counts.queued || 0) + (b.counts.retrying || 0);
    return h("tr", { attrs: { "data-batch-id": b.id, "data-done": String(b.done) } }, [
      h("td", {}, [open]),
      h("td", {}, [
        h(
          "div",
          {
            cls: "meter",
            attrs: { role: "meter", "aria-label": `Batch ${b.id}: ${ended} of ${b.total} ended`, "aria-valuemin": 0, "aria-valuemax": 100, "aria-valuenow": Math.round(share) },
          },
          [fill],
        ),
      ]),
      h("td", { cls: "num", text: `${fmtInt(ended)} / ${fmtInt(b.total)}` }),
      h("td", { cls: "num", text: fmtInt(ok) }),
      h("td", { cls: "num", text: fmtInt(b.total - ended - waiting) }),
      h("td", { cls: "num", text: fmtInt(waiting) }),
      h("td", { cls: "num", text: fmtInt(ended - ok) }),
      h("td", { text: fmtAgo(b.created_at), title: fmtDate(b.created_at) }),
    ]);
  });
  $("batches-rows").replaceChildren(...rows);
  $("batches-table").hidden = rows.length === 0;
  $("batches-empty").hidden = rows.length > 0;
}

// -- workers -------------------------------------------------------------------------------
export async function refreshWorkers(stats, onOpen) {
  if (stats.tenant !== null && stats.tenant !== undefined) {
    // Workers hold every tenant's tasks: the API shows them to operator keys only.
    $("workers-table").hidden = true;
    message("workers-message", "Workers run every tenant's tasks: an operator key ([api] admin_keys) shows them.");
    return;
  }
  let answer;
  try {
    answer = await getJson("v1/workers");
  } catch (error) {
    message("workers-message", `Could not list the workers: ${problemText(error)}`, "error");
    return;
  }
  const rows = answer.workers.map((w) => {
    const tasks = w.tasks.map((t) => {
      const open = h("button", { cls: "linklike mono", text: t.id, title: `${t.kind} · tenant ${t.tenant} · attempt ${t.attempt}`, attrs: { type: "button" } });
      open.addEventListener("click", () => onOpen(t.id));
      return h("li", {}, [open, h("span", { cls: "muted", text: ` ${t.kind} · ${t.tenant}` })]);
    });
    const beat = h("span", { text: fmtAgo(w.heartbeat_at), title: fmtDate(w.heartbeat_at) });
    return h("tr", { attrs: { "data-worker": w.id, "data-silent": String(w.silent) } }, [
      h("td", { text: w.host }),
      h("td", { cls: "num", text: String(w.pid) }),
      h("td", { cls: "num", text: `${fmtInt(w.tasks.length)} / ${fmtInt(w.concurrency)}` }),
      h("td", {}, [beat, w.silent ? h("span", { cls: "chip bad", text: "silent" }) : null]),
      h("td", { text: fmtAgo(w.started_at), title: fmtDate(w.started_at) }),
      h("td", {}, [tasks.length ? h("ul", { cls: "worker-tasks" }, tasks) : h("span", { cls: "muted", text: "idle" })]),
    ]);
  });
  $("workers-rows").replaceChildren(...rows);
  $("workers-table").hidden = rows.length === 0;
  message("workers-message", rows.length ? "" : "No worker has been heard from in the last 10 minutes.");
}

// -- per kind ------------------------------------------------------------------------------
const KIND_COLUMNS = ["queued", "running", "retrying", "succeeded", "failed", "dead", "timeout", "cancelled", "deduped"];

/** Tasks of each kind by state (the ledger's), with what the kind cost over the range. */
export function renderKinds(stats, spend) {
  if (!stats) return;
  const spent = new Map();
  for (const line of (spend && spend.lines) || []) {
    const kind = spent.get(line.kind) || { cost: 0, saved: 0, calls: 0 };
    kind.cost += line.cost;
    kind.saved += line.saved;
    kind.calls += line.calls;
    spent.set(line.kind, kind);
  }
  const names = [...new Set([...Object.keys(stats.by_kind || {}), ...spent.keys()])].sort();
  const rows = names.map((kind) => {
    const counts = (stats.by_kind || {})[kind] || {};
    const total = Object.values(counts).reduce((a, b) => a + b, 0);
    const money = spent.get(kind) || { cost: 0, saved: 0, calls: 0 };
    return h("tr", { attrs: { "data-kind": kind } }, [
      h("td", { cls: "mono", text: kind }),
      h("td", { cls: "num", text: fmtInt(total) }),
      ...KIND_COLUMNS.map((s) => h("td", { cls: `num${counts[s] ? "" : " zero"}`, text: fmtInt(counts[s] || 0), attrs: { "data-status": s } })),
      h("td", { cls: "num", text: fmtMoney(money.cost), attrs: { "data-cost": String(money.cost) } }),
      h("td", { cls: "num", text: fmtInt(money.calls) }),
    ]);
  });
  $("kinds-rows").replaceChildren(...rows);
  $("kinds-table").hidden = rows.length === 0;
  $("kinds-empty").hidden = rows.length > 0;
}

// -- a task's attempts ---------------------------------------------------------------------
/**
 * A task's events grouped into its attempts: each attempt from the claim that started it to
 * the event that ended it, with how long it ran and how it ended; the waits between them
 * (queued, a retry's backoff) as gaps.
 */
export function attempts(events) {
  const runs = [];
  let current = null;
  let run = 1; // a manual retry starts the count of attempts again: a new run
  for (const e of events) {
    const at = Date.parse(e.at);
    if (e.status === "running" && e.attempt) {
      if (current && e.attempt <= current.attempt) run += 1;
      current = { attempt: e.attempt, run, start: at, end: null, ended: null, detail: "" };
      runs.push(current);
    } else if (current && current.end === null) {
      current.end = at;
      current.ended = e.status;
      current.detail = e.detail || "";
    }
  }
  return runs;
}

export function renderAttempts(events, node) {
  const runs = attempts(events);
  const first = events.length ? Date.parse(events[0].at) : 0;
  const last = events.length ? Math.max(...events.map((e) => Date.parse(e.at))) : 0;
  const now = Date.now();
  const span = Math.max(1, (runs.some((r) => r.end === null) ? now : last) - first);
  node.replaceChildren(
    ...runs.map((r) => {
      const end = r.end ?? now;
      const bar = h("span", { cls: `attempt-bar status-${r.ended || "running"}` });
      bar.style.marginLeft = `${(100 * (r.start - first)) / span}%`;
      bar.style.width = `${Math.max(0.5, (100 * (end - r.start)) / span)}%`;
      const took = (end - r.start) / 1000;
      const ended = r.ended ? `${r.ended}${r.detail ? `: ${r.detail}` : ""}` : "running";
      const label = r.run > 1 ? `Attempt ${r.attempt} · retry ${r.run - 1}` : `Attempt ${r.attempt}`;
      return h("li", { attrs: { "data-attempt": r.attempt, "data-run": r.run, "data-ended": r.ended || "running" } }, [
        h("span", { cls: "attempt-label", text: label, title: r.run > 1 ? "after a manual retry" : "" }),
        h("span", { cls: "attempt-track" }, [bar]),
        h("span", { cls: "attempt-text", text: `${took < 1 ? `${Math.round(took * 1000)} ms` : `${took.toFixed(1)} s`} · ${ended}`, title: ended }),
      ]);
    }),
  );
  node.hidden = runs.length === 0;
}

// -- jobs ----------------------------------------------------------------------------------
/** The key's tenant's newest jobs; picking one shows it as its steps (GET /v1/jobs/{id}). */
export async function refreshJobs(onPick) {
  let page;
  try {
    page = await getJson("v1/jobs", { params: { order: "desc", limit: 20 } });
  } catch (error) {
    message("jobs-message", error.status === 404 ? "This server has no jobs API." : `Could not list the jobs: ${problemText(error)}`, "error");
    return;
  }
  message("jobs-message", "");
  const rows = page.items.map((job) => {
    const open = h("button", { cls: "linklike mono", text: job.id, attrs: { type: "button", title: "Show this job's steps" } });
    open.addEventListener("click", () => onPick(job.id));
    return h("tr", { attrs: { "data-job-id": job.id, "data-status": job.status } }, [
      h("td", {}, [open]),
      h("td", {}, [badge(h("span"), job.status)]),
      h("td", { text: job.steps.join(" → ") }),
      h("td", { text: fmtAgo(job.created_at), title: fmtDate(job.created_at) }),
    ]);
  });
  $("jobs-rows").replaceChildren(...rows);
  $("jobs-table").hidden = rows.length === 0;
  $("jobs-empty").hidden = rows.length > 0;
}

export async function showJob(jobId, onOpenTask) {
  let job;
  try {
    job = await getJson(`v1/jobs/${encodeURIComponent(jobId)}`);
  } catch (error) {
    message("jobs-message", `Could not load job ${jobId}: ${problemText(error)}`, "error");
    return;
  }
  $("job-title").textContent = job.id;
  badge($("job-status"), job.status);
  const p = job.progress;
  $("job-progress").textContent = `${fmtInt(p.steps_done)} of ${fmtInt(p.steps)} steps done · ${fmtInt(p.tasks_done)} of ${fmtInt(p.tasks)} tasks`;
  $("job-steps").replaceChildren(
    ...job.steps.map((step) => {
      const done = step.tasks.filter((t) => TERMINAL.has(t.status)).length;
      const tasks = step.tasks.map((t) => {
        const open = h("button", { cls: `linklike mono task-dot status-${t.status}`, text: t.id, title: `${t.status}${step.fans_out ? ` · item ${t.index}` : ""}`, attrs: { type: "button", "data-task-id": t.id } });
        open.addEventListener("click", () => onOpenTask(t.id));
        return h("li", {}, [badge(h("span"), t.status), open]);
      });
      return h("li", { cls: `job-step status-${step.status}`, attrs: { "data-step": step.name, "data-status": step.status } }, [
        h("div", { cls: "job-step-head" }, [
          h("strong", { text: step.name }),
          badge(h("span"), step.status),
          h("span", { cls: "muted", text: `${step.kind}${step.fans_out ? " · one task per item" : ""}${step.optional ? " · optional" : ""}` }),
          h("span", { cls: "muted", text: step.after.length ? `after ${step.after.join(", ")}` : "first" }),
          h("span", { cls: "muted", text: `${fmtInt(done)} / ${fmtInt(step.tasks.length)} tasks ended` }),
        ]),
        tasks.length ? h("ul", { cls: "job-tasks" }, tasks) : null,
      ]);
    }),
  );
  $("job-view").hidden = false;
}
