// A small SVG line chart over a sliding time window: no library, no inline styles (CSP).

const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, parent = null) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, String(value));
  if (parent) parent.appendChild(node);
  return node;
}

/** The smallest "nice" number (1, 2, 2.5, 5 x 10^n) at or above `value`. */
export function niceCeil(value) {
  if (!(value > 0)) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) {
    if (step * power >= value * (1 - 1e-9)) return step * power;
  }
  return 10 * power;
}

const WINDOWS = [30, 60, 120, 180, 300, 600, 900].map((s) => s * 1000);

/** The smallest round window that holds `ms`. */
function niceWindow(ms) {
  return WINDOWS.find((w) => w >= ms) || ms;
}

function ago(ms) {
  const s = Math.round(ms / 1000);
  if (s < 60) return `${s} s`;
  const min = s / 60;
  return `${Number.isInteger(min) ? min : min.toFixed(1)} min`;
}

export class LineChart {
  /**
   * series: [{key, label, dashed}] (the n-th gets the CSS class "series-n"; a dashed one stays
   * told apart where it runs on top of another); format(v) labels the
   * y axis; minMax: the y axis shows at least 0..minMax; gapMs: a longer gap breaks the line.
   */
  constructor(container, { series, format = String, minMax = 1, windowMs = 300000, minWindowMs = 30000, gapMs = 15000, height = 150 }) {
    this.container = container;
    this.series = series;
    this.format = format;
    this.minMax = minMax;
    this.maxWindowMs = windowMs;
    this.minWindowMs = minWindowMs;
    this.gapMs = gapMs;
    this.height = height;
    this.points = [];
    this.svg = el("svg", { class: "chart-svg", role: "presentation", focusable: "false" }, container);
    if (typeof ResizeObserver !== "undefined") {
      let lastWidth = 0;
      new ResizeObserver(() => {
        const width = this.container.clientWidth;
        if (width !== lastWidth) {
          lastWidth = width;
          this.draw();
        }
      }).observe(container);
    }
  }

  /** The longest window the chart shows (the time range chosen). */
  setWindow(ms) {
    this.maxWindowMs = ms;
    this.draw();
  }

  /** points: [{t: ms since epoch, values: {key: number | null}}], oldest first. */
  render(points) {
    this.points = points;
    this.draw();
  }

  draw() {
    const width = Math.max(200, this.container.clientWidth || 0);
    const height = this.height;
    const m = { left: 48, right: 10, top: 10, bottom: 22 };
    const plotW = width - m.left - m.right;
    const plotH = height - m.top - m.bottom;
    const svg = this.svg;
    svg.replaceChildren();
    svg.setAttribute("width", width);
    svg.setAttribute("height", height);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);

    const now = this.points.length ? Math.max(Date.now(), this.points.at(-1).t) : Date.now();
    // The window grows with the history, from minWindowMs up to windowMs, then slides.
    const span = this.points.length ? now - this.points[0].t : 0;
    const windowMs = niceWindow(Math.min(this.maxWindowMs, Math.max(this.minWindowMs, span)));
    const t0 = now - windowMs;
    const visible = this.points.filter((p) => p.t >= t0);
    let max = this.minMax;
    for (const p of visible) {
      for (const s of this.series) {
        const v = p.values[s.key];
        if (Number.isFinite(v) && v > max) max = v;
      }
    }
    max = niceCeil(max);
    const x = (t) => m.left + ((t - t0) / windowMs) * plotW;
    const y = (v) => m.top + plotH - (Math.max(0, v) / max) * plotH;

    const grid = el("g", { class: "chart-grid" }, svg);
    for (const frac of [0, 0.5, 1]) {
      const gy = y(max * frac);
      el("line", { x1: m.left, x2: width - m.right, y1: gy, y2: gy }, grid);
      const label = el("text", { x: m.left - 6, y: gy + 4, "text-anchor": "end", class: "chart-label" }, grid);
      label.textContent = this.format(max * frac);
    }
    for (const [frac, text, anchor] of [
      [0, `−${ago(windowMs)}`, "start"],
      [0.5, `−${ago(windowMs / 2)}`, "middle"],
      [1, "now", "end"],
    ]) {
      const label = el("text", { x: m.left + frac * plotW, y: height - 6, "text-anchor": anchor, class: "chart-label" }, grid);
      label.textContent = text;
    }

    this.series.forEach((s, index) => {
      let d = "";
      let prevT = null;
      for (const p of visible) {
        const v = p.values[s.key];
        if (!Number.isFinite(v)) {
          prevT = null;
          continue;
        }
        const joined = prevT !== null && p.t - prevT <= this.gapMs;
        d += `${joined ? "L" : "M"}${x(p.t).toFixed(1)},${y(v).toFixed(1)}`;
        prevT = p.t;
      }
      if (d) el("path", { d, class: `chart-line series-${index}${s.dashed ? " dashed" : ""}` }, svg);
      const last = [...visible].reverse().find((p) => Number.isFinite(p.values[s.key]));
      if (last) el("circle", { cx: x(last.t), cy: y(last.values[s.key]), r: 3, class: `chart-dot series-${index}` }, svg);
    });
  }
}
