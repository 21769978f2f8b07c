// What every view of the dashboard shares: building elements safely, and the number, time and
// money formats.

export const $ = (id) => document.getElementById(id);

/** An element with text set as text (never parsed as HTML: task data is untrusted). */
export function h(tag, { cls, text, title, attrs } = {}, children = []) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  if (title) node.title = title;
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  for (const child of children) if (child) node.appendChild(child);
  return node;
}

// -- formatting ----------------------------------------------------------------------------
const ints = new Intl.NumberFormat("en-US");
export const fmtInt = (n) => (Number.isFinite(n) ? ints.format(n) : "—");

export function fmtSeconds(s) {
  if (!Number.isFinite(s)) return "—";
  if (s === 0) return "0";
  if (s < 0.001) return "<1 ms";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(s < 10 ? 2 : 1)} s`;
  if (s < 3600) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

export function fmtRate(v) {
  if (!Number.isFinite(v)) return "—";
  if (v === 0) return "0";
  if (v < 0.1) return v.toFixed(3);
  if (v < 10) return v.toFixed(2);
  if (v < 100) return v.toFixed(1);
  return ints.format(Math.round(v));
}

export function fmtAgo(iso) {
  if (!iso) return "—";
  const seconds = (Date.now() - Date.parse(iso)) / 1000;
  if (!Number.isFinite(seconds)) return "—";
  if (seconds < 5) return "just now";
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 172800) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} days ago`;
}

export function fmtTime(iso) {
  const date = new Date(iso);
  if (Number.isNaN(date.getTime())) return iso || "—";
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${pad(date.getHours())}:${pad(date.getMinutes())}:${pad(date.getSeconds())}.${pad(date.getMilliseconds(), 3)}`;
}

export function fmtDate(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? iso : `${date.toLocaleDateString()} ${fmtTime(iso)}`;
}

/** An amount for labels: whole numbers when large, at most one decimal, no trailing ".0". */
export function fmtAmount(v) {
  if (!Number.isFinite(v)) return "—";
  if (Math.abs(v) >= 100) return ints.format(Math.round(v));
  return String(Number(v.toFixed(Math.abs(v) >= 10 ? 0 : 1)));
}

/** Axis labels: like fmtRate, without trailing zeros. */
export function fmtAxis(v) {
  if (!Number.isFinite(v)) return "";
  if (v >= 100) return ints.format(Math.round(v));
  return String(Number(v.toPrecision(3)));
}

export const pct = (used, total) => (total > 0 ? Math.min(100, Math.max(0, (100 * used) / total)) : 0);

const money = new Intl.NumberFormat("en-US", { minimumFractionDigits: 2, maximumFractionDigits: 4 });
export const fmtMoney = (v) => (Number.isFinite(v) ? money.format(v) : "—");


/** Money when the kind has a price (its estimate priced is held against the budget); the
 * kind's metered units otherwise, said to be units. */
export function costText(cost) {
  const used = cost.actual !== null && cost.actual !== undefined ? `, ${fmtAmount(cost.actual)} used` : "";
  if (cost.held > 0) return `${fmtMoney(cost.held)} estimated at the kind's price (${fmtAmount(cost.estimated)} units${used})`;
  return `${fmtAmount(cost.estimated)} units estimated${used} (the kind has no price)`;
}
