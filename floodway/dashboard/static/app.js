// The floodway dashboard: polls GET /v1/stats, keeps a time series of it in the page, and
// offers the task list, batches, workers, the dead-letter list and a task's attempts and
// event history. Everything from the same origin.

import { $, costText, fmtAgo, fmtAmount, fmtAxis, fmtDate, fmtInt, fmtMoney, fmtRate, fmtSeconds, fmtTime, h, pct } from "./format.js";
import { ApiError, getJson, hasKey, loadKey, postJson, request, setKey } from "./api.js";
import { LineChart } from "./chart.js";
import { followEvents } from "./events.js";
import { Poller, backoffDelay } from "./poller.js";
import { History, STATUSES } from "./series.js";
import { RETRYABLE, TERMINAL, TaskList, badge, refreshBatches, refreshJobs, refreshWorkers, renderAttempts, renderKinds, showJob } from "./views.js";

const LISTS_REFRESH_MS = 5000; // the task list, batches and workers are re-read this often
const DEAD_PAGE = 100; // rows shown
const DEAD_REFRESH_MS = 15000; // the list is re-read at least this often (and when counts move)
const RETRY_PARALLEL = 4;
const FOLLOW_ATTEMPTS = 8; // event-stream reconnects without news before giving up
const FOLLOW_DEADLINE_MS = 15 * 60 * 1000;

// -- connection status and the API key -----------------------------------------------------
let lastOk = 0;
let phase = { phase: "starting" };

function showConn() {
  const node = $("conn-status");
  node.dataset.phase = phase.phase;
  let text;
  switch (phase.phase) {
    case "live":
      text = `Live · updated ${lastOk ? fmtAgo(new Date(lastOk).toISOString()) : "…"}`;
      break;
    case "paused":
      text = "Paused while this tab is hidden";
      break;
    case "backoff": {
      const err = phase.error;
      const what = err && err.status ? `API error ${err.status}` : "API unreachable";
      text = `${what} · retrying in ${(phase.delayMs / 1000).toFixed(1)} s (attempt ${phase.failures + 1})`;
      break;
    }
    case "blocked":
      text = "API key needed";
      break;
    case "stopped":
      text = "Stopped";
      break;
    default:
      text = "Connecting…";
  }
  if ($("conn-text").textContent !== text) $("conn-text").textContent = text;
}

let addressNote = ""; // why a key in the address was not used

function showAuthProblem(error) {
  const banner = $("auth-message");
  const refused = hasKey();
  banner.textContent = addressNote + (refused
    ? `The API key was refused (${error.detail || "unauthorized"}). Enter a valid key in the API key field above and press Save.`
    : "This server needs an API key. Enter it in the API key field above and press Save; it is kept in this browser only.");
  banner.hidden = false;
  $("api-key").setAttribute("aria-invalid", "true");
  if (document.activeElement !== $("api-key")) $("api-key").focus();
}

function clearAuthProblem() {
  $("auth-message").hidden = true;
  $("api-key").removeAttribute("aria-invalid");
}

// -- tasks by state ------------------------------------------------------------------------
const stateCells = new Map();

function stateCell(status) {
  let cell = stateCells.get(status);
  if (!cell) {
    const count = h("span", { cls: "state-count", text: "—", attrs: { "data-status": status } });
    const item = h("li", { cls: `state state-${status}` }, [
      h("span", { cls: "state-name" }, [h("span", { cls: "dot", attrs: { "aria-hidden": "true" } }), h("span", { text: status })]),
      count,
    ]);
    $("states").appendChild(item);
    cell = { item, count };
    stateCells.set(status, cell);
  }
  return cell;
}

function renderStates(stats) {
  const tasks = stats.tasks || {};
  const names = [...STATUSES, ...Object.keys(tasks).filter((s) => !STATUSES.includes(s))];
  let total = 0;
  for (const status of names) {
    const n = tasks[status] ?? 0;
    total += n;
    const { item, count } = stateCell(status);
    count.textContent = fmtInt(n);
    count.dataset.value = String(n);
    item.classList.toggle("zero", n === 0);
  }
  // An operator's view (tenant null) counts every tenant; a tenant's key sees its own.
  const whose = stats.tenant === null || stats.tenant === undefined ? "all tenants" : `tenant ${stats.tenant}`;
  $("states-total").textContent = `${fmtInt(total)} tasks in the ledger (${whose})`;
  $("states-total").dataset.value = String(total);
}

// -- charts --------------------------------------------------------------------------------
const history = new History();
let charts = null;

function makeCharts() {
  return {
    throughput: new LineChart($("chart-throughput"), {
      series: [
        { key: "ok", label: "succeeded / s" },
        { key: "bad", label: "failed, dead or timed out / s" },
      ],
      format: fmtAxis,
      minMax: 1,
    }),
    latency: new LineChart($("chart-latency"), {
      series: [
        { key: "mid", label: "p50" },
        { key: "p95", label: "p95" },
        { key: "wait", label: "queue wait p95", dashed: true },
      ],
      format: fmtSeconds,
      minMax: 0.1,
    }),
    errors: new LineChart($("chart-errors"), {
      series: [
        { key: "throttled", label: "429 / min" },
        { key: "server", label: "5xx / min" },
      ],
      format: fmtAxis,
      minMax: 1,
    }),
  };
}

function legend(id, entries) {
  const list = $(id);
  list.replaceChildren(
    ...entries.map(([label, value, index, key]) =>
      h("li", {}, [
        h("span", { cls: `swatch series-${index}`, attrs: { "aria-hidden": "true" } }),
        h("span", { cls: "legend-label", text: label }),
        h("strong", { cls: "legend-value", text: value, attrs: { "data-metric": key } }),
      ]),
    ),
  );
  return entries.map(([label, value]) => `${label} ${value}`).join(", ");
}

function renderCharts(stats, sample) {
  const samples = history.samples;
  const midKey = history.hasP50 ? "p50" : "mean";
  const r = sample.rates;
  charts.throughput.render(samples.map((s) => ({ t: s.t, values: { ok: s.rates.succeededPerS, bad: s.rates.failedPerS } })));
  charts.latency.render(samples.map((s) => ({ t: s.t, values: { mid: s[midKey], p95: s.p95, wait: s.waitP95 } })));
  charts.errors.render(samples.map((s) => ({ t: s.t, values: { throttled: s.rates.throttledPerMin, server: s.rates.serverErrorsPerMin } })));

  let summary = legend("legend-throughput", [
    ["succeeded / s", fmtRate(r.succeededPerS), 0, "succeeded_per_s"],
    ["failed / s", fmtRate(r.failedPerS), 1, "failed_per_s"],
  ]);
  $("chart-throughput").setAttribute("aria-label", `Throughput, recent history: now ${summary}`);

  const completion = stats.completion || {};
  const wait = stats.queue_wait || {};
  summary = legend("legend-latency", [
    [midKey, fmtSeconds(sample[midKey]), 0, `completion_${midKey}`],
    ["p95", fmtSeconds(sample.p95), 1, "completion_p95"],
    ["queue wait p95", fmtSeconds(sample.waitP95), 2, "queue_wait_p95"],
  ]);
  $("chart-latency").setAttribute("aria-label", `Completion latency, recent history: now ${summary}`);
  $("latency-sub").textContent = `submit to success, over the newest ${fmtInt(stats.window ?? 0)} tasks (${fmtInt(completion.count ?? 0)} succeeded, ${fmtInt(wait.count ?? 0)} started)`;

  const withPct = (rate, share) => (Number.isFinite(share) ? `${fmtRate(rate)} (${share.toFixed(1)} % of calls)` : fmtRate(rate));
  summary = legend("legend-errors", [
    ["429 / min", withPct(r.throttledPerMin, r.throttledPct), 0, "throttled_per_min"],
    ["5xx / min", withPct(r.serverErrorsPerMin, r.serverErrorPct), 1, "server_errors_per_min"],
  ]);
  $("chart-errors").setAttribute("aria-label", `Upstream errors, recent history: now ${summary}`);
  const note = $("errors-note");
  const c = sample.counters;
  if (c.throttled === null && c.serverErrors === null) {
    note.textContent = isTenantView(stats)
      ? "Upstream answer counts cover every tenant's calls: an operator key ([api] admin_keys) shows them."
      : "This server reports no upstream answer counts.";
  } else if (c.serverErrors === null) {
    note.textContent = "429s are counted by the limiter of this API process; this server does not report 5xx counts.";
  } else {
    note.textContent = "";
  }
  note.hidden = note.textContent === "";
}

// -- resources -----------------------------------------------------------------------------
function meter(label, used, total, text) {
  const share = pct(used, total);
  // At the cap is the limiter doing its job, not an error: amber, never red.
  const level = share >= 90 ? "full" : "ok";
  const fill = h("div", { cls: `meter-fill ${level}` });
  fill.style.width = `${share}%`; // CSSOM, allowed by the page's style-src 'self'
  return h("div", { cls: "meter-row" }, [
    h("span", { cls: "meter-label", text: label }),
    h(
      "div",
      {
        cls: "meter",
        attrs: {
          role: "meter",
          "aria-label": `${label}: ${text}`,
          "aria-valuemin": 0,
          "aria-valuemax": 100,
          "aria-valuenow": Math.round(share),
        },
      },
      [fill],
    ),
    h("span", { cls: "meter-text", text }),
  ]);
}

function bucketMeter(label, bucket, unit) {
  if (!bucket || !(bucket.capacity > 0)) return null;
  const used = Math.max(0, bucket.capacity - bucket.level);
  const perMin = bucket.refill_per_s * 60;
  return meter(label, used, bucket.capacity, `${fmtAmount(used)} of ${fmtAmount(bucket.capacity)} burst used · ${fmtAmount(perMin)} ${unit}/min`);
}

const DIMENSION_LABELS = { concurrency: "In flight", requests: "Requests/min", tokens: "Tokens/min" };

// Each limit in force and where it comes from: the configuration, the provider's headers, or
// what floodway learned from its 429s (with the figures it was chosen from).
function limitsList(limits) {
  const dims = Object.keys(limits || {});
  if (!dims.length) return null;
  return h(
    "ul",
    { cls: "limits", attrs: { "aria-label": "Limits in force" } },
    dims.map((dim) => {
      const l = limits[dim];
      const others = [];
      if (l.configured != null && l.source !== "configured") others.push(`configured ${fmtAmount(l.configured)}`);
      if (l.published != null && l.source !== "header") others.push(`published ${fmtAmount(l.published)}`);
      const source = l.slow_start ? "learned · slow start" : l.source;
      return h("li", { attrs: { "data-dimension": dim, "data-source": l.source } }, [
        h("span", { cls: "limit-label", text: DIMENSION_LABELS[dim] || dim }),
        h("span", { cls: "limit-value", text: fmtAmount(l.value) }),
        h("span", { cls: `chip source-${l.source}`, text: source }),
        others.length ? h("span", { cls: "muted", text: others.join(" · ") }) : null,
      ]);
    }),
  );
}

const HELD_LABELS = {
  concurrency: "the in-flight limit",
  requests: "the requests rate",
  tokens: "the tokens rate",
  pause: "a pause after a 429",
  "tenant cap": "the tenant cap",
  recovering: "the limiter's recovery",
};

// What holds work back right now: why a batch runs 3 at a time.
function heldBack(held) {
  const reasons = Object.entries(held || {}).filter(([, n]) => n > 0).sort((a, b) => b[1] - a[1]);
  if (!reasons.length) return null;
  const text = reasons.map(([why, n]) => `${HELD_LABELS[why] || why} (${fmtInt(n)})`).join(", ");
  return h("p", { cls: "held-back", text: `Held back by ${text}` });
}

const isTenantView = (stats) => stats.tenant !== null && stats.tenant !== undefined;

const CAP_LABELS = { concurrency: "Tasks in flight", interactive_depth: "Interactive depth", submit_rate: "Submits / s" };

// A tenant's own caps: its share of the fleet, whatever the resources allow.
function renderCaps(stats) {
  const caps = Object.entries(stats.caps || {});
  $("caps").hidden = caps.length === 0;
  $("caps").replaceChildren(
    h("h3", { text: "This tenant's caps" }),
    ...caps.map(([name, cap]) => {
      const label = CAP_LABELS[name] || name;
      const row = cap.use === null || cap.use === undefined
        ? h("div", { cls: "meter-row" }, [
            h("span", { cls: "meter-label", text: label }),
            h("span", { cls: "meter-text", text: `limit ${fmtAmount(cap.limit)} ${cap.unit}` }),
          ])
        : meter(label, cap.use, cap.limit, `${fmtInt(cap.use)} of ${fmtAmount(cap.limit)} ${cap.unit}`);
      row.dataset.cap = name;
      return row;
    }),
  );
}

function renderResources(stats) {
  renderCaps(stats);
  const resources = stats.resources || {};
  const names = Object.keys(resources).sort();
  const box = $("resources");
  if (!names.length) {
    const text = isTenantView(stats)
      ? "None of this tenant's kinds counts against a resource limit."
      : "No resource limits are configured.";
    box.replaceChildren(h("p", { cls: "empty", text }));
    return;
  }
  box.replaceChildren(
    ...names.map((name) => {
      const r = resources[name] || {};
      const chips = [];
      if (Number.isFinite(r.rate_factor) && r.rate_factor < 0.999) {
        chips.push(h("span", { cls: "chip warn", text: `adaptive rate ${Math.round(r.rate_factor * 100)} %` }));
      }
      if (r.paused_for > 0) chips.push(h("span", { cls: "chip bad", text: `paused ${fmtSeconds(r.paused_for)} after a 429` }));
      if (Number.isFinite(r.throttles)) {
        const split = Number.isFinite(r.throttles_limit)
          ? ` (limit ${fmtInt(r.throttles_limit)} · noise ${fmtInt(r.throttles_noise ?? 0)})`
          : "";
        chips.push(h("span", { cls: "chip", text: `429s seen: ${fmtInt(r.throttles)}${split}` }));
      }
      const own = isTenantView(stats);
      const inFlight = own
        ? h("div", { cls: "meter-row" }, [
            h("span", { cls: "meter-label", text: "In flight" }),
            h("span", {
              cls: "meter-text",
              text: `${fmtInt(r.in_flight ?? 0)} of this tenant's tasks${r.concurrency > 0 ? ` · limit ${fmtInt(r.concurrency)} for every tenant` : ""}`,
            }),
          ])
        : r.concurrency > 0
        ? meter("In flight", r.in_flight, r.concurrency, `${fmtInt(r.in_flight)} of ${fmtInt(r.concurrency)}`)
        : h("div", { cls: "meter-row" }, [
            h("span", { cls: "meter-label", text: "In flight" }),
            h("span", { cls: "meter-text", text: `${fmtInt(r.in_flight ?? 0)} (no concurrency cap)` }),
          ]);
      const card = h("div", { cls: "resource", attrs: { "data-resource": name } }, [
        h("div", { cls: "resource-head" }, [h("h3", { text: name }), h("div", { cls: "chips" }, chips)]),
        own && r.kinds ? h("p", { cls: "muted", text: `used by ${r.kinds.join(", ")}` }) : null,
        inFlight,
        bucketMeter("Requests", r.requests, "req"),
        bucketMeter("Tokens", r.tokens, "tokens"),
        limitsList(r.limits),
        heldBack(r.held_back_by),
      ]);
      card.dataset.inFlight = String(r.in_flight ?? 0);
      card.dataset.concurrency = String(r.concurrency ?? 0);
      return card;
    }),
  );
}

// -- spend ---------------------------------------------------------------------------------
const SPEND_REFRESH_MS = 10000; // the spend ledger is re-read at most this often
// The time range the page shows: the charts' window (at most what the page and the server keep,
// 15 min) and the spend panel's and the per-kind breakdown's span.
export const RANGES = {
  "5m": { label: "5 min", chartMs: 5 * 60000, since: "5m", bucket: "1m", bars: 5, bar: "minute" },
  "15m": { label: "15 min", chartMs: 15 * 60000, since: "15m", bucket: "1m", bars: 15, bar: "minute" },
  "1h": { label: "1 h", chartMs: 15 * 60000, since: "1h", bucket: "5m", bars: 12, bar: "5 min" },
  "24h": { label: "24 h", chartMs: 15 * 60000, since: "24h", bucket: "1h", bars: 24, bar: "hour" },
  "7d": { label: "7 days", chartMs: 15 * 60000, since: "7d", bucket: "6h", bars: 28, bar: "6 h" },
};
let range = RANGES["24h"];
const spendSub = () => `last ${range.label}, at the configured prices`;
let spendReadAt = 0;
let spendBusy = false;

/** Spent per hour over the window, one bar each (summed over tenants and kinds). */
function renderSpendBars(view) {
  const perBucket = new Map();
  for (const p of view.series || []) {
    const t = Date.parse(p.at);
    perBucket.set(t, (perBucket.get(t) || 0) + p.cost);
  }
  const bucketMs = (view.bucket_s || 3600) * 1000;
  const end = Math.floor(Date.now() / bucketMs) * bucketMs;
  const starts = Array.from({ length: range.bars }, (_, i) => end - (range.bars - 1 - i) * bucketMs);
  const top = Math.max(0, ...starts.map((t) => perBucket.get(t) || 0));
  const box = $("spend-bars");
  box.replaceChildren(
    ...starts.map((t) => {
      const value = perBucket.get(t) || 0;
      const bar = h("span", { cls: "spend-bar", title: `${fmtDate(new Date(t).toISOString())}: ${fmtMoney(value)}` });
      bar.style.height = `${top > 0 ? Math.max(value > 0 ? 4 : 0, (100 * value) / top) : 0}%`;
      bar.dataset.value = String(value);
      return bar;
    }),
  );
  box.setAttribute("aria-label", `Spend per ${range.bar} over the last ${range.label}: at most ${fmtMoney(top)} a ${range.bar}, ${fmtMoney(view.cost)} in all`);
  $("spend-axis-start").textContent = `${range.label} ago`;
  $("spend-axis-unit").textContent = `per ${range.bar}`;
}

function renderBudgets(budgets) {
  $("budgets").replaceChildren(
    ...(budgets || []).map((b) => {
      const used = b.spent + b.held;
      const row = meter(
        `Budget of ${b.tenant}`,
        used,
        b.amount,
        `${fmtMoney(b.left)} left of ${fmtMoney(b.amount)} (spent ${fmtMoney(b.spent)}, held ${fmtMoney(b.held)}) · resets ${fmtDate(b.resets_at)}`,
      );
      row.dataset.tenant = b.tenant;
      return row;
    }),
  );
}

function renderSpend(view) {
  $("spend-cost").textContent = fmtMoney(view.cost);
  $("spend-cost").dataset.value = String(view.cost);
  $("spend-saved").textContent = fmtMoney(view.saved);
  $("spend-saved").dataset.value = String(view.saved);
  const lines = view.lines || [];
  $("spend-rows").replaceChildren(
    ...lines.map((line) =>
      h("tr", { attrs: { "data-tenant": line.tenant, "data-kind": line.kind } }, [
        h("td", { text: line.tenant }),
        h("td", { text: line.kind }),
        h("td", { cls: "num", text: fmtMoney(line.cost) }),
        h("td", { cls: "num", text: fmtMoney(line.saved) }),
        h("td", { cls: "num", text: fmtInt(line.calls) }),
        h("td", { cls: "num", text: fmtInt(line.deduped) }),
      ]),
    ),
  );
  $("spend-table").hidden = lines.length === 0;
  $("spend-empty").hidden = lines.length > 0;
  renderSpendBars(view);
  renderBudgets(view.budgets);
}

/**
 * The spend panel, read again every SPEND_REFRESH_MS beside the poll (never holding it up: the
 * connection state follows /v1/stats alone). A failed read is shown and tried at the next poll.
 */
async function refreshSpend() {
  if (spendBusy || Date.now() - spendReadAt < SPEND_REFRESH_MS) return;
  spendBusy = true;
  spendReadAt = Date.now();
  try {
    const view = await getJson("v1/spend", { params: { since: range.since, bucket: range.bucket } });
    renderSpend(view);
    lastSpend = view;
    renderKinds(lastStats, lastSpend);
    $("spend-sub").textContent = spendSub();
  } catch (error) {
    spendReadAt = 0;
    $("spend-sub").textContent = `spend unavailable: ${error.message}`;
  } finally {
    spendBusy = false;
  }
}

// -- dead letters --------------------------------------------------------------------------
let deadSeen = null; // stats.dead_letters when the list was last read
let deadReadAt = 0;
let deadDirty = true;

function deadMessage(text, kind = "") {
  const node = $("dead-message");
  node.textContent = text;
  node.dataset.kind = kind;
}

async function refreshDead() {
  const page = await getJson("v1/tasks", { params: { status: "dead", limit: DEAD_PAGE } });
  deadReadAt = Date.now();
  deadDirty = false;
  const rows = page.items.map((task) => {
    const retry = h("button", { cls: "small", text: "Retry", attrs: { type: "button", "aria-label": `Retry task ${task.id}`, "data-retry": task.id } });
    retry.addEventListener("click", () => retryOne(task.id, retry));
    const open = h("button", { cls: "linklike mono", text: task.id, attrs: { type: "button", title: "Show this task and its events" } });
    open.addEventListener("click", () => {
      $("task-id").value = task.id;
      showTask(task.id);
      $("search-title").scrollIntoView({ behavior: "smooth", block: "start" });
    });
    const err = task.error || {};
    return h("tr", { attrs: { "data-task-id": task.id } }, [
      h("td", {}, [open]),
      h("td", { text: task.kind }),
      h("td", { cls: "error-cell", title: err.message || "" }, [
        h("span", { cls: "error-type", text: err.type || err.class || "" }),
        h("span", { cls: "error-text", text: err.message || "" }),
      ]),
      h("td", { cls: "num", text: `${task.attempts} / ${task.max_attempts}` }),
      h("td", { text: fmtAgo(task.finished_at || task.updated_at), title: fmtDate(task.finished_at || task.updated_at) }),
      h("td", { cls: "action" }, [retry]),
    ]);
  });
  $("dead-rows").replaceChildren(...rows);
  // The badge counts what the list lists: this key's tenant's dead letters (an operator's
  // stats count every tenant's).
  $("dead-count").textContent = page.next ? `${fmtInt(rows.length)}+` : fmtInt(rows.length);
  $("dead-count").dataset.value = page.next ? `${rows.length}+` : String(rows.length);
  $("dead-table").hidden = rows.length === 0;
  $("dead-empty").hidden = rows.length !== 0;
  $("retry-all").disabled = rows.length === 0;
  $("dead-more").hidden = !page.next;
  $("dead-more").textContent = page.next ? `Showing the first ${DEAD_PAGE}; Retry all covers every one of them.` : "";
}

function deadNeedsRefresh(stats) {
  return deadDirty || deadSeen !== stats.dead_letters || Date.now() - deadReadAt > DEAD_REFRESH_MS;
}

function problemText(error) {
  return error instanceof ApiError ? error.message : String(error);
}

async function retryOne(id, button) {
  button.disabled = true;
  button.textContent = "Retrying…";
  try {
    const task = await postJson(`v1/tasks/${encodeURIComponent(id)}/retry`);
    deadMessage(`Task ${id} is ${task.status} again.`, "ok");
    button.closest("tr")?.remove();
  } catch (error) {
    if (error.status === 401) {
      poller.report("blocked", { error });
      showAuthProblem(error);
    } else if (error.status === 409 || error.status === 404) {
      deadMessage(`Task ${id} is no longer a dead letter.`, "warn");
    } else {
      deadMessage(`Could not retry ${id}: ${problemText(error)}`, "error");
    }
    button.disabled = false;
    button.textContent = "Retry";
  }
  deadDirty = true;
  poller.kick();
}

async function allDeadIds() {
  const ids = [];
  let after = null;
  do {
    const page = await getJson("v1/tasks", { params: { status: "dead", limit: 1000, after } });
    ids.push(...page.items.map((t) => t.id));
    after = page.next;
  } while (after);
  return ids;
}

let pendingRetryAll = [];

function showConfirm(show) {
  $("retry-all-confirm").hidden = !show;
  $("retry-all").hidden = show;
}

async function askRetryAll() {
  const button = $("retry-all");
  button.disabled = true;
  try {
    pendingRetryAll = await allDeadIds();
  } catch (error) {
    deadMessage(`Could not list the dead letters: ${problemText(error)}`, "error");
    button.disabled = false;
    return;
  }
  if (!pendingRetryAll.length) {
    deadMessage("There is nothing to retry.", "ok");
    deadDirty = true;
    poller.kick();
    return;
  }
  const n = pendingRetryAll.length;
  $("retry-all-question").textContent = `Put ${fmtInt(n)} dead ${n === 1 ? "letter" : "letters"} back in the queue?`;
  showConfirm(true);
  $("retry-all-yes").focus();
}

async function retryAll() {
  const ids = pendingRetryAll;
  pendingRetryAll = [];
  showConfirm(false);
  $("retry-all").disabled = true;
  let done = 0;
  let skipped = 0;
  const failures = [];
  let next = 0;
  async function worker() {
    while (next < ids.length) {
      const id = ids[next++];
      try {
        await postJson(`v1/tasks/${encodeURIComponent(id)}/retry`);
        done += 1;
      } catch (error) {
        if (error.status === 409 || error.status === 404) skipped += 1;
        else failures.push([id, error]);
      }
      deadMessage(`Retrying… ${done + skipped + failures.length} of ${ids.length}`);
    }
  }
  await Promise.all(Array.from({ length: Math.min(RETRY_PARALLEL, ids.length) }, worker));
  let text = `Retried ${fmtInt(done)} of ${fmtInt(ids.length)} dead letters.`;
  if (skipped) text += ` ${fmtInt(skipped)} had already left the dead-letter list.`;
  if (failures.length) text += ` ${fmtInt(failures.length)} failed (first: ${failures[0][0]}: ${problemText(failures[0][1])}).`;
  deadMessage(text, failures.length ? "error" : "ok");
  if (failures.some(([, e]) => e.status === 401)) showAuthProblem(failures[0][1]);
  deadDirty = true;
  poller.kick();
}

// -- one task and its events ---------------------------------------------------------------
let following = null; // the AbortController of the task on show

function taskMessage(text, kind = "") {
  $("task-message").textContent = text;
  $("task-message").dataset.kind = kind;
}

function json(value) {
  return value === null || value === undefined ? "—" : JSON.stringify(value, null, 2);
}

function renderTask(task) {
  $("task-title").textContent = task.id;
  badge($("task-status"), task.status);
  taskActions(task);
  const fields = [
    ["Kind", task.kind],
    ["Lane", task.lane],
    ["Tenant", task.tenant],
    ["Attempts", `${task.attempts} of ${task.max_attempts}`],
    ["Created", fmtDate(task.created_at)],
    ["Started", task.started_at && fmtDate(task.started_at)],
    ["Finished", task.finished_at && fmtDate(task.finished_at)],
    ["Next attempt", task.next_attempt_at && fmtDate(task.next_attempt_at)],
    ["Deadline", task.deadline_at && fmtDate(task.deadline_at)],
    ["Cost", task.cost && costText(task.cost)],
    ["Upstream ref", task.upstream_ref],
    ["Idempotency key", task.idempotency_key],
    ["Duplicate of", task.duplicate_of],
    ["Error", task.error && `${task.error.class} · ${task.error.type}: ${task.error.message}`],
  ];
  $("task-fields").replaceChildren(
    ...fields.filter(([, v]) => v !== null && v !== undefined && v !== "").flatMap(([k, v]) => [h("dt", { text: k }), h("dd", { text: v })]),
  );
  $("task-input").textContent = json(task.input);
  $("task-result").textContent = json(task.result);
  $("task-error").textContent = json(task.error);
}

let shownEvents = []; // the events of the task on show, for its attempts

function appendEvent(data) {
  shownEvents.push(data);
  renderAttempts(shownEvents, $("task-attempts"));
  const status = h("span");
  badge(status, data.status);
  const row = h("li", { attrs: { "data-status": data.status } }, [
    h("time", { text: fmtTime(data.at), attrs: { datetime: data.at || "" }, title: fmtDate(data.at) }),
    status,
    h("span", { cls: "attempt", text: data.attempt ? `attempt ${data.attempt}` : "" }),
    h("span", { cls: "detail", text: data.detail || "", title: data.detail || "" }),
  ]);
  $("task-events").appendChild(row);
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}

async function follow(id, signal) {
  const state = $("events-state");
  state.textContent = "· following live";
  let lastId = null;
  let quiet = 0;
  let ended = null;
  const deadline = Date.now() + FOLLOW_DEADLINE_MS;
  while (!signal.aborted) {
    let news = false;
    try {
      lastId = await followEvents(id, {
        signal,
        lastEventId: lastId,
        onEvent: (data) => {
          news = true;
          appendEvent(data);
          badge($("task-status"), data.status);
          // The stream's last event carries the task as it ended: its result, no second read.
          if (data.task) {
            ended = data.status;
            renderTask(data.task);
          }
        },
      });
    } catch (error) {
      if (signal.aborted) return;
      if (error.status === 401) {
        showAuthProblem(error);
        state.textContent = "· stopped (API key needed)";
        return;
      }
      if (error.status === 404) {
        state.textContent = "· the task is gone";
        return;
      }
    }
    if (signal.aborted) return;
    if (ended) {
      state.textContent = `· ended (${ended})`;
      return;
    }
    quiet = news ? 0 : quiet + 1;
    if (quiet >= FOLLOW_ATTEMPTS || Date.now() > deadline) {
      state.textContent = "· stopped following; search again to resume";
      return;
    }
    const delay = backoffDelay(Math.max(1, quiet));
    state.textContent = `· reconnecting in ${(delay / 1000).toFixed(1)} s`;
    await sleep(delay, signal);
    state.textContent = "· following live";
  }
}

async function showTask(rawId) {
  const id = rawId.trim();
  if (following) following.abort();
  following = new AbortController();
  const { signal } = following;
  $("task-view").hidden = true;
  $("task-events").replaceChildren();
  shownEvents = [];
  renderAttempts(shownEvents, $("task-attempts"));
  $("events-state").textContent = "";
  if (!/^[A-Za-z0-9_-]{1,64}$/.test(id)) {
    taskMessage("A task id is 1 to 64 letters, digits, '_' or '-'.", "error");
    return;
  }
  taskMessage(`Looking up ${id}…`);
  let task;
  try {
    task = await getJson(`v1/tasks/${encodeURIComponent(id)}`, { signal });
  } catch (error) {
    if (signal.aborted) return;
    if (error.status === 404) taskMessage(`No task ${id} is visible with this API key.`, "error");
    else if (error.status === 401) {
      taskMessage("An API key is needed to look tasks up.", "error");
      showAuthProblem(error);
    } else taskMessage(`Could not load ${id}: ${problemText(error)}`, "error");
    return;
  }
  if (signal.aborted) return;
  taskMessage("");
  renderTask(task);
  $("task-view").hidden = false;
  setFragment({ task: id });
  follow(id, signal);
}

function openTask(id) {
  $("task-id").value = id;
  showTask(id);
  $("search-title").scrollIntoView({ behavior: "smooth", block: "start" });
}

// Cancel and retry of the task on show; the list and the counts follow.
function taskActions(task) {
  const buttons = [];
  const act = (label, method, path) => {
    const button = h("button", { cls: "small secondary", text: label, attrs: { type: "button", id: `task-${label.toLowerCase()}` } });
    button.addEventListener("click", async () => {
      button.disabled = true;
      try {
        const after = await request(method, path);
        taskMessage(`Task ${task.id} is ${after.status}.`, "ok");
        showTask(task.id);
      } catch (error) {
        if (error.status === 401) showAuthProblem(error);
        taskMessage(`Could not ${label.toLowerCase()} ${task.id}: ${error.detail || problemText(error)}`, "error");
        button.disabled = false;
      }
      listsReadAt = 0;
      deadDirty = true;
      poller.kick();
    });
    buttons.push(button);
  };
  const path = `v1/tasks/${encodeURIComponent(task.id)}`;
  if (!TERMINAL.has(task.status)) act("Cancel", "DELETE", path);
  if (RETRYABLE.has(task.status)) act("Retry", "POST", `${path}/retry`);
  $("task-actions").replaceChildren(...buttons);
}

// -- the address: #key=... (read once, then removed), #task=ID, #range=24h ------------------
function fragment() {
  return new URLSearchParams(location.hash.replace(/^#/, ""));
}

function setFragment(changes) {
  const params = fragment();
  for (const [name, value] of Object.entries(changes)) {
    if (value === null || value === undefined || value === "") params.delete(name);
    else params.set(name, value);
  }
  const text = params.toString();
  try {
    window.history.replaceState(null, "", text ? `#${text}` : `${location.pathname}${location.search}`);
  } catch {
    /* sandboxed: the deep link is a nicety */
  }
}

/**
 * A key given after the # (a link from a script or a runbook) is taken and stored like a
 * typed one, then removed from the address bar and the history entry: a fragment never goes
 * to the server, nor to its logs or a proxy's. One in the query string is refused for that.
 */
function keyFromAddress() {
  if (new URLSearchParams(location.search).has("key")) {
    addressNote = "An API key in the query string (?key=) is sent to the server and kept in its logs: it was not used. Pass it after the # instead (#key=...), or type it in the API key field. ";
    const banner = $("auth-message");
    banner.textContent = addressNote;
    banner.hidden = false;
  }
  const given = fragment().get("key");
  if (given === null) return;
  setFragment({ key: null });
  setKey(given);
}

function setRange(name) {
  range = RANGES[name] || RANGES["24h"];
  $("range").value = Object.keys(RANGES).find((k) => RANGES[k] === range);
  for (const chart of Object.values(charts)) chart.setWindow(range.chartMs);
  $("charts-range").textContent = range.chartMs < 15 * 60000 ? `charts: last ${range.label}` : "charts: the last 15 min (what the server keeps)";
  $("spend-empty").textContent = `Nothing billed in the last ${range.label}.`;
  $("kinds-sub").textContent = `tasks in the ledger by state; spend over the last ${range.label}`;
  spendReadAt = 0;
  refreshSpend();
}

// -- wiring --------------------------------------------------------------------------------
function pollInterval() {
  const asked = Number(new URLSearchParams(location.search).get("poll"));
  return Number.isFinite(asked) && asked >= 250 ? Math.min(asked, 60000) : 2000;
}

let lastStats = null;
let lastSpend = null; // the spend panel's last answer, for the per-kind breakdown
let listsReadAt = 0;
let listsBusy = false;
let taskList = null;
let shownJob = null; // the job on show, read again with the lists

function pickJob(id) {
  shownJob = id;
  showJob(id, openTask);
}

/** The task list's page, the batches and the workers, re-read beside the poll. */
async function refreshLists(stats) {
  taskList.kinds(Object.keys(stats.by_kind || {}));
  if (listsBusy || Date.now() - listsReadAt < LISTS_REFRESH_MS) return;
  listsBusy = true;
  listsReadAt = Date.now();
  try {
    await Promise.all([
      taskList.refresh(),
      refreshBatches((id) => taskList.showBatch(id)),
      refreshWorkers(stats, openTask),
      refreshJobs(pickJob),
    ]);
    if (shownJob) await showJob(shownJob, openTask);
  } finally {
    listsBusy = false;
  }
}

async function pollOnce() {
  const stats = await getJson("v1/stats");
  lastOk = Date.now();
  clearAuthProblem();
  const sample = history.add(stats, lastOk);
  renderStates(stats);
  renderCharts(stats, sample);
  renderResources(stats);
  lastStats = stats;
  renderKinds(stats, lastSpend);
  refreshSpend(); // not awaited: it catches its own failures
  refreshLists(stats); // nor this one
  if (deadNeedsRefresh(stats)) {
    await refreshDead();
    deadSeen = stats.dead_letters;
  }
}

/**
 * The server's recent samples of /v1/stats, so the charts open with the last minutes drawn.
 * Their times are moved onto this browser's clock (the server says what its clock read).
 * A server without the history, or one that refuses, leaves the charts to fill as they poll.
 */
async function loadHistory() {
  let answer;
  try {
    answer = await getJson("v1/stats/history");
  } catch {
    return;
  }
  const skew = Date.now() - Date.parse(answer.now);
  for (const sample of answer.samples || []) {
    const t = Date.parse(sample.at) + (Number.isFinite(skew) ? skew : 0);
    if (Number.isFinite(t)) history.add(sample.stats, t);
  }
}

const poller = new Poller(pollOnce, {
  intervalMs: pollInterval(),
  onState: (state) => {
    phase = state;
    showConn();
    if (state.phase === "blocked") showAuthProblem(state.error);
  },
});

function wire() {
  keyFromAddress();
  charts = makeCharts();
  taskList = new TaskList({
    onOpen: openTask,
    onChange: () => {
      deadDirty = true;
      listsReadAt = 0;
      poller.kick();
    },
    onAuth: showAuthProblem,
  });
  for (const [name, r] of Object.entries(RANGES)) $("range").appendChild(h("option", { text: r.label, attrs: { value: name } }));
  $("range").addEventListener("change", () => {
    setRange($("range").value);
    setFragment({ range: $("range").value });
  });
  setRange(fragment().get("range") || "24h");
  for (const status of STATUSES) stateCell(status);
  $("dead-table").hidden = true;
  $("api-key").value = loadKey();
  $("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setKey($("api-key").value);
    clearAuthProblem();
    deadDirty = true;
    poller.resume();
  });
  $("key-forget").addEventListener("click", () => {
    $("api-key").value = "";
    setKey("");
    deadDirty = true;
    poller.resume();
  });
  $("retry-all").addEventListener("click", askRetryAll);
  $("retry-all-yes").addEventListener("click", retryAll);
  $("retry-all-no").addEventListener("click", () => {
    pendingRetryAll = [];
    showConfirm(false);
    $("retry-all").disabled = false;
    $("retry-all").focus();
  });
  $("search-form").addEventListener("submit", (event) => {
    event.preventDefault();
    showTask($("task-id").value);
  });
  setInterval(() => {
    if (phase.phase === "live") showConn();
  }, 1000);
  getJson("healthz")
    .then((health) => {
      $("version").textContent = `floodway ${health.version}`;
    })
    .catch(() => {});
  const linked = fragment().get("task");
  if (linked && /^[A-Za-z0-9_-]{1,64}$/.test(linked)) {
    $("task-id").value = linked;
    showTask(linked);
  }
  window.floodwayDashboard = { poller, history }; // for tests and the curious
  loadHistory().finally(() => poller.start());
}

wire();
