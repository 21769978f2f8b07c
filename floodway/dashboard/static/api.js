// The HTTP API, as the dashboard uses it: one fetch wrapper that adds the API key and turns
// every failure into an ApiError (status 0 = the server could not be reached).

const KEY_STORE = "floodway.apiKey";

export class ApiError extends Error {
  constructor(status, title, detail, retryAfterS = null) {
    super(detail ? `${title}: ${detail}` : title);
    this.name = "ApiError";
    this.status = status;
    this.title = title;
    this.detail = detail;
    this.retryAfterS = retryAfterS;
  }

  get unauthorized() {
    return this.status === 401;
  }
}

export function loadKey() {
  try {
    return localStorage.getItem(KEY_STORE) || "";
  } catch {
    return ""; // storage disabled: the key lives for this page only
  }
}

export function saveKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    /* storage disabled */
  }
}

let currentKey = loadKey();

export function setKey(key) {
  currentKey = key.trim();
  saveKey(currentKey);
}

export function hasKey() {
  return currentKey !== "";
}

/** Headers for a request: the key as a bearer token when one is set. */
export function authHeaders(extra = {}) {
  const headers = { Accept: "application/json", ...extra };
  if (currentKey) headers.Authorization = `Bearer ${currentKey}`;
  return headers;
}

/** Relative to the page, so the dashboard also works behind a path prefix. */
export function apiUrl(path, params) {
  const url = new URL(path.replace(/^\//, ""), document.baseURI);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  return url.toString();
}

function retryAfter(response) {
  const value = response.headers.get("Retry-After");
  if (!value) return null;
  const seconds = Number(value);
  if (Number.isFinite(seconds)) return Math.max(0, seconds);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

/** Raise an ApiError for a non-2xx response, with the problem+json title and detail. */
export async function checked(response) {
  if (response.ok) return response;
  let title = `HTTP ${response.status}`;
  let detail = response.statusText || "";
  try {
    const body = await response.json();
    if (body && typeof body === "object") {
      title = body.title || title;
      detail = body.detail || detail;
    }
  } catch {
    /* not JSON: keep the status line */
  }
  throw new ApiError(response.status, title, detail, retryAfter(response));
}

export async function request(method, path, { params, signal } = {}) {
  let response;
  try {
    response = await fetch(apiUrl(path, params), {
      method,
      headers: authHeaders(),
      signal,
      cache: "no-store",
      credentials: "same-origin",
    });
  } catch (err) {
    if (err && err.name === "AbortError") throw err;
    throw new ApiError(0, "server unreachable", String(err && err.message ? err.message : err));
  }
  await checked(response);
  return response.status === 204 ? null : response.json();
}

export const getJson = (path, options) => request("GET", path, options);
export const postJson = (path, options) => request("POST", path, options);
