// The API, as the page calls it: JSON both ways, the CSRF header on every
// write, an error as an ApiError carrying the status and the API's one line
// (and, for a 409 that asks for confirmation, its `targets`).

export class ApiError extends Error {
  constructor(status, message, doc) {
    super(message);
    this.status = status;
    this.doc = doc || {};
  }
}

export function cookie(name) {
  for (const part of document.cookie.split(";")) {
    const [key, ...value] = part.trim().split("=");
    if (key === name) return decodeURIComponent(value.join("="));
  }
  return "";
}

export async function api(method, path, body) {
  const headers = { Accept: "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = cookie("peerctl_csrf");
  const init = { method, headers, credentials: "same-origin" };
  if (body !== undefined) {
    headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  let doc = null;
  try {
    doc = await response.json();
  } catch (_) { /* not JSON: the status says it */ }
  if (!response.ok) {
    throw new ApiError(response.status, (doc && doc.error) || `${response.status} ${response.statusText}`, doc);
  }
  return { status: response.status, doc };
}

export const enc = encodeURIComponent;
