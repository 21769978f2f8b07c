// GET /v1/tasks/{id}/events read with fetch (EventSource cannot send an Authorization header).

import { apiUrl, authHeaders, checked } from "./api.js";

/** Split a Server-Sent Events buffer into complete events and the incomplete rest. */
export function parseEvents(buffer) {
  const events = [];
  const text = buffer.replace(/\r\n?/g, "\n");
  const blocks = text.split("\n\n");
  const rest = blocks.pop();
  for (const block of blocks) {
    const event = { id: null, event: "message", data: "" };
    const data = [];
    for (const line of block.split("\n")) {
      if (!line || line.startsWith(":")) continue; // comments are keep-alives
      const colon = line.indexOf(":");
      const field = colon === -1 ? line : line.slice(0, colon);
      let value = colon === -1 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "data") data.push(value);
      else if (field === "id") event.id = value;
      else if (field === "event") event.event = value;
    }
    if (data.length) {
      event.data = data.join("\n");
      events.push(event);
    }
  }
  return { events, rest };
}

/**
 * Follow one task's status events until the server ends the stream; calls onEvent(data, id)
 * for each. Resolves with the last event id seen (for Last-Event-ID on a reconnect).
 */
export async function followEvents(taskId, { signal, onEvent, lastEventId = null }) {
  const headers = authHeaders({ Accept: "text/event-stream" });
  if (lastEventId) headers["Last-Event-ID"] = lastEventId;
  const response = await fetch(apiUrl(`v1/tasks/${encodeURIComponent(taskId)}/events`), {
    headers,
    signal,
    cache: "no-store",
    credentials: "same-origin",
  });
  await checked(response);
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let last = lastEventId;
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += value;
    const { events, rest } = parseEvents(buffer);
    buffer = rest;
    for (const event of events) {
      if (event.id) last = event.id;
      if (event.event !== "status") continue;
      let data;
      try {
        data = JSON.parse(event.data);
      } catch {
        continue;
      }
      onEvent(data, event.id);
    }
  }
  return last;
}
