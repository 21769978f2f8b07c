// The polling loop: a steady interval while healthy, exponential backoff with
// full jitter on errors, and nothing at all while the page is hidden.

/**
 * Full jitter (a uniform draw below an exponentially growing ceiling) after `failures`
 * consecutive errors: failure 1 waits up to baseMs, failure 2 up to 2 * baseMs, ... capped.
 */
export function backoffDelay(failures, { baseMs = 1000, capMs = 30000, random = Math.random } = {}) {
  const exponent = Math.min(Math.max(0, failures - 1), 30);
  const ceiling = Math.min(capMs, baseMs * 2 ** exponent);
  return Math.floor(random() * ceiling);
}

export class Poller {
  /**
   * `poll(signal)` does one round of requests and throws on failure. `onState(state)` hears
   * {phase, failures, delayMs, error}: phase is "live", "backoff", "paused" (tab hidden),
   * "blocked" (401: waits for resume()) or "stopped".
   */
  constructor(poll, { intervalMs = 2000, baseMs = 1000, capMs = 30000, minMs = 100, onState } = {}) {
    this.poll = poll;
    this.intervalMs = intervalMs;
    this.baseMs = baseMs;
    this.capMs = capMs;
    this.minMs = minMs;
    this.onState = onState || (() => {});
    this.failures = 0;
    this.timer = null;
    this.inFlight = false;
    this.again = false;
    this.phase = "stopped";
    this.onVisibility = () => this.visibilityChanged();
  }

  get hidden() {
    return document.visibilityState === "hidden";
  }

  start() {
    document.addEventListener("visibilitychange", this.onVisibility);
    this.phase = "live";
    this.tick();
  }

  stop() {
    document.removeEventListener("visibilitychange", this.onVisibility);
    this.clear();
    this.report("stopped");
  }

  /** Poll again now (after an action, a new key, or to leave "blocked"). */
  resume() {
    if (this.phase === "stopped") return;
    this.failures = 0;
    this.phase = "live";
    this.clear();
    this.tick();
  }

  /** Poll as soon as possible (after an action), unless hidden or blocked. */
  kick() {
    if (this.phase === "stopped" || this.phase === "blocked") return;
    if (this.inFlight) {
      this.again = true; // the round under way polls again when it ends
      return;
    }
    this.clear();
    this.tick();
  }

  clear() {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
  }

  report(phase, extra = {}) {
    this.phase = phase;
    this.onState({ phase, failures: this.failures, ...extra });
  }

  visibilityChanged() {
    if (this.phase === "stopped" || this.phase === "blocked") return;
    if (this.hidden) {
      this.clear();
      this.report("paused");
    } else {
      this.tick(); // catch up at once, then back to the interval (or the backoff)
    }
  }

  schedule(delayMs) {
    this.clear();
    if (this.hidden) {
      this.report("paused");
      return;
    }
    this.timer = setTimeout(() => {
      this.timer = null;
      this.tick();
    }, delayMs);
  }

  async tick() {
    if (this.phase === "stopped" || this.phase === "blocked") return;
    if (this.hidden) {
      this.clear();
      this.report("paused");
      return;
    }
    if (this.inFlight) return; // the round under way schedules the next one
    this.inFlight = true;
    try {
      await this.poll();
      this.failures = 0;
      const delayMs = this.again ? 0 : this.intervalMs;
      this.report("live", { delayMs });
      this.schedule(delayMs);
    } catch (error) {
      if (error && error.status === 401) {
        this.clear();
        this.report("blocked", { error });
        return;
      }
      this.failures += 1;
      const jitter = backoffDelay(this.failures, { baseMs: this.baseMs, capMs: this.capMs });
      const server = error && error.retryAfterS ? error.retryAfterS * 1000 : 0;
      const delayMs = Math.max(this.minMs, jitter, Math.min(server, this.capMs * 4));
      this.report("backoff", { error, delayMs });
      this.schedule(delayMs);
    } finally {
      this.inFlight = false;
      this.again = false;
    }
  }
}
