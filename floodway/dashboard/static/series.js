// A client-side time series built from successive GET /v1/stats answers: the server reports
// counts and counters; rates are their differences between two polls.

export const STATUSES = [
  "queued",
  "running",
  "retrying",
  "succeeded",
  "failed",
  "dead",
  "timeout",
  "cancelled",
  "deduped",
];
const FAILED_END = ["failed", "dead", "timeout"];

/** Counter increase between two readings; a smaller reading means the counter restarted. */
export function increase(prev, next) {
  if (!Number.isFinite(next)) return null;
  if (!Number.isFinite(prev)) return null;
  return next >= prev ? next - prev : next;
}

function sum(values) {
  return values.reduce((total, v) => total + (Number.isFinite(v) ? v : 0), 0);
}

/** Upstream counters: the `upstream` section when the server has one, else the limiter's. */
export function upstreamCounters(stats) {
  const up = stats.upstream;
  if (up && typeof up === "object") {
    return {
      calls: Number.isFinite(up.calls) ? up.calls : null,
      throttled: Number.isFinite(up.throttled) ? up.throttled : null,
      serverErrors: Number.isFinite(up.server_errors) ? up.server_errors : null,
    };
  }
  const resources = Object.values(stats.resources || {});
  const throttles = resources.map((r) => r && r.throttles).filter(Number.isFinite);
  return { calls: null, throttled: throttles.length ? sum(throttles) : null, serverErrors: null };
}

export class History {
  /**
   * maxAgeMs: how much history is kept. smoothMs: rates are averaged over this trailing
   * span (several polls), so one poll that happened to see no change does not read as zero.
   */
  constructor(maxAgeMs = 15 * 60 * 1000, smoothMs = 10000) {
    this.maxAgeMs = maxAgeMs;
    this.smoothMs = smoothMs;
    this.samples = [];
  }

  get last() {
    return this.samples.at(-1) || null;
  }

  /** Record one stats answer taken at `t` (ms); returns the sample with its derived rates. */
  add(stats, t = Date.now()) {
    const prev = this.last;
    const tasks = stats.tasks || {};
    const counters = upstreamCounters(stats);
    const sample = {
      t,
      stats,
      counters,
      succeeded: tasks.succeeded ?? 0,
      failedEnd: sum(FAILED_END.map((s) => tasks[s])),
      p50: stats.completion?.p50_s ?? null,
      mean: stats.completion?.mean_s ?? null,
      p95: stats.completion?.p95_s ?? null,
      waitP95: stats.queue_wait?.p95_s ?? null,
      step: null, // what changed since the previous sample
      rates: { succeededPerS: null, failedPerS: null, throttledPerMin: null, serverErrorsPerMin: null, throttledPct: null, serverErrorPct: null },
    };
    if (prev && t > prev.t) {
      sample.step = {
        dt: (t - prev.t) / 1000,
        // Counts can also fall (a manual retry, a purge): a fall is not negative throughput.
        succeeded: Math.max(0, sample.succeeded - prev.succeeded),
        failed: Math.max(0, sample.failedEnd - prev.failedEnd),
        throttled: increase(prev.counters.throttled, counters.throttled),
        errors: increase(prev.counters.serverErrors, counters.serverErrors),
        calls: increase(prev.counters.calls, counters.calls),
      };
    }
    this.samples.push(sample);
    const oldest = t - this.maxAgeMs;
    while (this.samples.length && this.samples[0].t < oldest) this.samples.shift();
    if (sample.step) sample.rates = this.rates(t);
    return sample;
  }

  /** Rates over the steps of the last smoothMs before `t` (at least the newest step). */
  rates(t) {
    const steps = [];
    for (let i = this.samples.length - 1; i >= 0; i -= 1) {
      const s = this.samples[i];
      if (!s.step) break;
      steps.push(s.step);
      if (s.t - s.step.dt * 1000 <= t - this.smoothMs) break;
    }
    const total = (key) => {
      const known = steps.filter((s) => s[key] !== null);
      return known.length ? { n: sum(known.map((s) => s[key])), dt: sum(known.map((s) => s.dt)) } : null;
    };
    const perS = (key) => {
      const v = total(key);
      return v && v.dt > 0 ? v.n / v.dt : null;
    };
    const share = (key) => {
      // Only over steps that know both: a server that began reporting calls mid-window
      // must not divide old counts by new ones.
      const both = steps.filter((s) => s[key] !== null && s.calls !== null);
      const calls = sum(both.map((s) => s.calls));
      return calls > 0 ? (100 * sum(both.map((s) => s[key]))) / calls : null;
    };
    const perMin = (key) => {
      const v = perS(key);
      return v === null ? null : v * 60;
    };
    return {
      succeededPerS: perS("succeeded"),
      failedPerS: perS("failed"),
      throttledPerMin: perMin("throttled"),
      serverErrorsPerMin: perMin("errors"),
      throttledPct: share("throttled"),
      serverErrorPct: share("errors"),
    };
  }

  /** True once any answer carried a completion p50 (newer servers); else charts show the mean. */
  get hasP50() {
    return this.samples.some((s) => s.p50 !== null);
  }
}
