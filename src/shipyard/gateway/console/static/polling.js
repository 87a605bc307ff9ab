// Regions of a page kept fresh: [data-view] (an HTML fragment rendered and escaped by
// the server, replaced when it changes; "changed" is dispatched then) and [data-log] (a
// job's log, tailed from an offset and appended).

import { api, AuthError } from "./signing.js";

const SIGN_OUT_ERRORS = new Set([
  "UnrecognizedClientException",
  "InvalidSignatureException",
  "MissingAuthenticationTokenException",
]);

// Every poller stops when `generation` moves on (sign-out, leaving a deleted resource);
// `signOut` is the page's (console.js).
export const session = { generation: 0, signOut: (_reason) => {} };

const problem = document.getElementById("problem");

export function showProblem(text, kind) {
  problem.textContent = text;
  problem.dataset.kind = kind;
  problem.hidden = false;
}

export function clearProblem(kind) {
  if (!problem.hidden && problem.dataset.kind === kind) problem.hidden = true;
}

// Run tick() now and every `every` ms while it returns true and no sign-out happened.
// Until one tick has succeeded the region is empty, so a failed first read is tried
// again after FIRST_RETRY_MS rather than a whole period.
const FIRST_RETRY_MS = 1000;

export function poll(tick, every, onDenied) {
  const epoch = session.generation;
  let succeeded = false;
  const loop = async () => {
    if (epoch !== session.generation) return;
    let again = true;
    let wait = document.hidden ? every * 5 : every;
    try {
      again = await tick();
      succeeded = true;
      clearProblem("network");
    } catch (err) {
      if (err instanceof AuthError) {
        if (SIGN_OUT_ERRORS.has(err.type)) session.signOut(`${err.type}: ${err.message}`);
        else onDenied(`${err.type}: ${err.message}`);
        return;
      }
      // fetch fails with a TypeError when the gateway is unreachable, and a read given
      // up on (signing.js) with a TimeoutError; anything else is a fault of this script,
      // reported where the tests (and a developer) look.
      if (!(err instanceof TypeError) && err?.name !== "TimeoutError") console.error(err);
      showProblem("The gateway does not answer; retrying.", "network");
      if (!succeeded) wait = Math.min(wait, FIRST_RETRY_MS);
    }
    if (again && epoch === session.generation) setTimeout(loop, wait);
  };
  loop();
}

export function denied(element) {
  return (text) => {
    const p = document.createElement("p");
    p.className = "problem";
    p.textContent = text;
    element.replaceChildren(p);
  };
}

export function watchView(element) {
  let last = null;
  const epoch = session.generation;
  const tick = async () => {
    const url = element.dataset.view;
    const response = await api(url);
    const html = await response.text();
    if (url !== element.dataset.view || epoch !== session.generation) return true; // asked anew
    if (html !== last) {
      element.innerHTML = html; // rendered and escaped by the server (fragments.py)
      last = html;
      element.dispatchEvent(new Event("changed", { bubbles: true }));
      for (const tail of element.querySelectorAll("pre.tail")) tail.scrollTop = tail.scrollHeight;
    }
    element.dataset.loaded = String(Date.now());
    return response.status !== 404; // deleted meanwhile: stays on screen, polled no more
  };
  poll(tick, Number(element.dataset.everyMs) || 3000, denied(element));
  // A filter or page changed: read now rather than at the next tick.
  element.addEventListener("refresh", () => tick().catch(() => {}));
}

// Views that apply to some endpoints only (data-when): read once the endpoint's own
// view says they apply, never for the others.
export function watchWhenApplies() {
  const endpoint = document.querySelector("section[data-view][aria-label=Endpoint]");
  const waiting = [...document.querySelectorAll("[data-view][data-when]")];
  if (!endpoint || !waiting.length) return;
  endpoint.addEventListener("changed", () => {
    const status = endpoint.querySelector("[data-status]");
    for (const view of waiting) {
      if (view.dataset.watched || !status || status.dataset[view.dataset.when] !== "1") continue;
      view.dataset.watched = "1";
      view.hidden = false;
      watchView(view);
    }
  });
}

export function watchLog(pre) {
  let offset = "tail";
  poll(async () => {
    const response = await api(`${pre.dataset.log}?offset=${offset}`);
    if (response.status === 404) return false;
    if (!response.ok) return true; // try again at the next tick
    const chunk = await response.json();
    if (chunk.text) {
      const following = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 8;
      pre.append(chunk.text);
      while (pre.childNodes.length > 2000) pre.firstChild.remove();
      if (following) pre.scrollTop = pre.scrollHeight;
    }
    offset = chunk.next;
    pre.dataset.status = chunk.status;
    if (chunk.done) pre.dataset.done = "1";
    return !chunk.done;
  }, Number(pre.dataset.everyMs) || 1000, denied(pre));
}
