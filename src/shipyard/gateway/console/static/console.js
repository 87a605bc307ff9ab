// The shipyard console's only script: no framework, no build step.
//
// A page is a shell (gateway/console/pages.py). This script fills its regions from
// the gateway's /console/api/ views and keeps them fresh:
//   [data-view]     an HTML fragment rendered by the server, polled and replaced;
//   [data-metrics]  cumulative counters, polled; rates drawn on <canvas> charts here;
//   [data-log]      a job's log, tailed from an offset and appended.
// With an auth: section (body[data-auth="1"]) every call is signed with AWS
// Signature V4 using a key the user enters, kept in this tab's sessionStorage, with
// Web Crypto's HMAC-SHA256, exactly as botocore signs, so the gateway's own verifier
// (gateway/edge/auth.py) checks it.
"use strict";

(() => {
  const body = document.body;
  const AUTH = body.dataset.auth === "1";
  const REGION = body.dataset.region || "us-east-1";
  const SERVICE = "sagemaker";
  const STORAGE_KEY = "shipyard.console.key";
  const EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
  const SIGN_OUT_ERRORS = new Set([
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "MissingAuthenticationTokenException",
  ]);
  const PALETTE = ["#2f6fde", "#e0792b", "#2a9d5b", "#a34fc9", "#c73a4a", "#7a7f87"];
  const WINDOW_S = 1800; // charts show the last 30 minutes (stored datapoints)...
  const MIN_WINDOW_S = 60; // ...and are a minute wide while they have less
  const encoder = new TextEncoder();
  let generation = 0; // bumped to stop every poller (sign-out)

  // -- signing (SigV4) -------------------------------------------------------------------

  class AuthError extends Error {
    constructor(type, message) {
      super(message);
      this.type = type;
    }
  }

  function credentials() {
    try {
      return JSON.parse(sessionStorage.getItem(STORAGE_KEY) || "null");
    } catch (_) {
      return null;
    }
  }

  const hex = (buffer) =>
    Array.from(new Uint8Array(buffer), (b) => b.toString(16).padStart(2, "0")).join("");

  async function hmac(key, text) {
    const imported = await crypto.subtle.importKey(
      "raw", key, { name: "HMAC", hash: "SHA-256" }, false, ["sign"],
    );
    return crypto.subtle.sign("HMAC", imported, encoder.encode(text));
  }

  async function sha256Hex(text) {
    return hex(await crypto.subtle.digest("SHA-256", encoder.encode(text)));
  }

  // RFC 3986 encoding, as Python's quote(safe="-_.~") does it.
  const encode = (s) =>
    encodeURIComponent(s).replace(/[!'()*]/g, (c) => "%" + c.charCodeAt(0).toString(16).toUpperCase());

  const canonicalUri = (path) => path.split("/").map(encode).join("/");

  function canonicalQuery(search) {
    const pairs = [];
    for (const [k, v] of new URLSearchParams(search)) pairs.push([encode(k), encode(v)]);
    pairs.sort((a, b) => (a[0] === b[0] ? (a[1] < b[1] ? -1 : 1) : a[0] < b[0] ? -1 : 1));
    return pairs.map(([k, v]) => `${k}=${v}`).join("&");
  }

  async function signatureHeaders(url, creds) {
    const u = new URL(url, location.href);
    const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "");
    const day = stamp.slice(0, 8);
    const signed = "host;x-amz-content-sha256;x-amz-date";
    const canonical = [
      "GET",
      canonicalUri(u.pathname),
      canonicalQuery(u.search),
      `host:${u.host}\nx-amz-content-sha256:${EMPTY_SHA256}\nx-amz-date:${stamp}\n`,
      signed,
      EMPTY_SHA256,
    ].join("\n");
    const scope = `${day}/${REGION}/${SERVICE}/aws4_request`;
    const toSign = ["AWS4-HMAC-SHA256", stamp, scope, await sha256Hex(canonical)].join("\n");
    let key = encoder.encode("AWS4" + creds.secret);
    for (const part of [day, REGION, SERVICE, "aws4_request"]) key = await hmac(key, part);
    const signature = hex(await hmac(key, toSign));
    return {
      "x-amz-date": stamp,
      "x-amz-content-sha256": EMPTY_SHA256,
      authorization:
        `AWS4-HMAC-SHA256 Credential=${creds.key}/${scope}, ` +
        `SignedHeaders=${signed}, Signature=${signature}`,
    };
  }

  async function api(url) {
    let headers = {};
    if (AUTH) {
      const creds = credentials();
      if (!creds) throw new AuthError("MissingAuthenticationTokenException", "Sign in first.");
      headers = await signatureHeaders(url, creds);
    }
    const response = await fetch(url, { headers, cache: "no-store", credentials: "omit" });
    if (response.status === 403) {
      const answer = await response.json().catch(() => ({}));
      throw new AuthError(answer.__type || "AccessDeniedException", answer.message || "Refused.");
    }
    return response;
  }

  // -- polling ---------------------------------------------------------------------------

  const problem = document.getElementById("problem");

  function showProblem(text, kind) {
    problem.textContent = text;
    problem.dataset.kind = kind;
    problem.hidden = false;
  }

  function clearProblem(kind) {
    if (!problem.hidden && problem.dataset.kind === kind) problem.hidden = true;
  }

  // Run tick() now and every `every` ms while it returns true and no sign-out happened.
  function poll(tick, every, onDenied) {
    const epoch = generation;
    const loop = async () => {
      if (epoch !== generation) return;
      let again = true;
      try {
        again = await tick();
        clearProblem("network");
      } catch (err) {
        if (err instanceof AuthError) {
          if (SIGN_OUT_ERRORS.has(err.type)) signOut(`${err.type}: ${err.message}`);
          else onDenied(`${err.type}: ${err.message}`);
          return;
        }
        showProblem("The gateway does not answer; retrying.", "network");
      }
      if (again && epoch === generation) setTimeout(loop, document.hidden ? every * 5 : every);
    };
    loop();
  }

  function denied(element) {
    return (text) => {
      const p = document.createElement("p");
      p.className = "problem";
      p.textContent = text;
      element.replaceChildren(p);
    };
  }

  function watchView(element) {
    let last = null;
    poll(async () => {
      const response = await api(element.dataset.view);
      const html = await response.text();
      if (html !== last) {
        element.innerHTML = html; // rendered and escaped by the server (fragments.py)
        last = html;
        for (const tail of element.querySelectorAll("pre.tail")) tail.scrollTop = tail.scrollHeight;
      }
      element.dataset.loaded = String(Date.now());
      return response.status !== 404; // deleted meanwhile: stays on screen, polled no more
    }, Number(element.dataset.everyMs) || 3000, denied(element));
  }

  function watchLog(pre) {
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

  // -- charts ----------------------------------------------------------------------------

  const ZERO = {
    invocations: 0, errors_4xx: 0, errors_5xx: 0,
    model_latency_sum_s: 0, model_latency_count: 0, overhead_latency_sum_s: 0,
  };

  // From two readings of cumulative counters, per variant: rates and mean latency.
  function rates(previous, current) {
    const dt = Math.max(current.t - previous.t, 0.001);
    const values = {};
    for (const [variant, now] of Object.entries(current.variants)) {
      const was = previous.variants[variant] || ZERO;
      const calls = now.model_latency_count - was.model_latency_count;
      const spent = now.model_latency_sum_s + now.overhead_latency_sum_s
        - was.model_latency_sum_s - was.overhead_latency_sum_s;
      values[variant] = {
        invocations: Math.max(now.invocations - was.invocations, 0) / dt,
        errors: Math.max(now.errors_4xx + now.errors_5xx - was.errors_4xx - was.errors_5xx, 0) / dt,
        latency: calls > 0 ? (1000 * spent) / calls : null,
      };
    }
    return values;
  }

  function niceMax(value) {
    if (!(value > 0)) return 1;
    const step = 10 ** Math.floor(Math.log10(value));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * step >= value) return m * step;
    return 10 * step;
  }

  const format = (v) => (v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2));

  function draw(figure, kind, history, variants, now) {
    const canvas = figure.querySelector("canvas");
    const ratio = window.devicePixelRatio || 1;
    const width = canvas.clientWidth || 300;
    const height = canvas.clientHeight || 140;
    if (canvas.width !== Math.round(width * ratio)) canvas.width = Math.round(width * ratio);
    if (canvas.height !== Math.round(height * ratio)) canvas.height = Math.round(height * ratio);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    ctx.clearRect(0, 0, width, height);
    const style = getComputedStyle(figure);
    const ink = style.getPropertyValue("--ink-muted").trim() || "#888";
    const grid = style.getPropertyValue("--grid").trim() || "#ddd";
    let top = 0;
    for (const point of history) {
      for (const v of variants) top = Math.max(top, (point.values[v] || {})[kind] || 0);
    }
    top = niceMax(top);
    const left = 40, right = 6, topPad = 6, bottom = 6;
    const plotW = width - left - right, plotH = height - topPad - bottom;
    ctx.font = "11px system-ui, sans-serif";
    ctx.fillStyle = ink;
    ctx.strokeStyle = grid;
    ctx.lineWidth = 1;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    for (let i = 0; i <= 2; i++) {
      const y = topPad + plotH - (plotH * i) / 2;
      ctx.beginPath();
      ctx.moveTo(left, Math.round(y) + 0.5);
      ctx.lineTo(width - right, Math.round(y) + 0.5);
      ctx.stroke();
      ctx.fillText(format((top * i) / 2), left - 4, y);
    }
    const oldest = history.length ? history[0].t : now;
    const span = Math.min(WINDOW_S, Math.max(MIN_WINDOW_S, now - oldest));
    const x = (t) => left + plotW - ((now - t) * plotW) / span;
    variants.forEach((variant, n) => {
      ctx.strokeStyle = PALETTE[n % PALETTE.length];
      ctx.lineWidth = 2;
      ctx.beginPath();
      let drawing = false;
      for (const point of history) {
        const value = point.values[variant] ? point.values[variant][kind] : null;
        if (value === null || value === undefined) {
          drawing = false;
          continue;
        }
        const y = topPad + plotH - (plotH * value) / top;
        if (drawing) ctx.lineTo(x(point.t), y);
        else ctx.moveTo(x(point.t), y);
        drawing = true;
      }
      ctx.stroke();
    });
  }

  function legend(figure, variants) {
    const box = figure.querySelector(".legend");
    if (box.dataset.variants === variants.join(",")) return;
    box.dataset.variants = variants.join(",");
    box.replaceChildren(
      ...variants.map((variant, n) => {
        const item = document.createElement("span");
        const swatch = document.createElement("i");
        swatch.className = `swatch c${n % PALETTE.length}`;
        item.append(swatch, variant);
        return item;
      }),
    );
  }

  function watchCharts(section) {
    const figures = [...section.querySelectorAll("figure[data-chart]")];
    const history = [];
    let previous = null;
    let stored = 0; // points drawn from the stored datapoints
    poll(async () => {
      // The first poll also asks for the stored datapoints (CloudWatch's, 10 s each).
      const url = section.dataset.metrics + (previous ? "" : "?history=1");
      const response = await api(url);
      if (!response.ok) return true; // try again at the next tick
      const current = await response.json();
      if (!previous && Array.isArray(current.datapoints)) {
        // Older than the gateway's in-memory readings: those take over from there.
        const memory = Array.isArray(current.history) && current.history.length
          ? current.history[0].t : current.t;
        for (const point of current.datapoints) {
          if (point.t - 10 < memory) { // a period begun before the gateway's readings
            history.push(point);
            stored += 1;
          }
        }
      }
      if (!previous && Array.isArray(current.history)) {
        // The gateway's own readings of the last minutes (console/history.py).
        for (const reading of current.history) {
          if (previous && reading.t > previous.t) {
            history.push({ t: reading.t, values: rates(previous, reading) });
          }
          previous = reading;
        }
      }
      if (previous && current.t > previous.t) {
        history.push({ t: current.t, values: rates(previous, current) });
      }
      while (history.length && history[0].t < current.t - WINDOW_S) history.shift();
      previous = current;
      const variants = Object.keys(current.variants).sort();
      const totals = {
        invocations: variants.reduce((s, v) => s + current.variants[v].invocations, 0),
        errors: variants.reduce(
          (s, v) => s + current.variants[v].errors_4xx + current.variants[v].errors_5xx, 0),
        latency: variants.reduce((s, v) => s + current.variants[v].model_latency_count, 0),
      };
      const last = history.length ? history[history.length - 1].values : {};
      for (const figure of figures) {
        const kind = figure.dataset.chart;
        const now = variants.map((v) => last[v] && last[v][kind]).filter((v) => v != null);
        const shown = kind === "latency"
          ? (now.length ? Math.max(...now) : null)
          : now.reduce((s, v) => s + v, 0);
        figure.querySelector(".now").textContent =
          shown === null ? "" : ` · now ${format(shown)} · ${totals[kind]} in all`;
        figure.dataset.total = String(totals[kind]);
        figure.dataset.points = String(history.length);
        figure.dataset.stored = String(stored);
        legend(figure, variants);
        draw(figure, kind, history, variants, current.t);
      }
      return true;
    }, Number(section.dataset.everyMs) || 2000, denied(section));
  }

  // -- sign-in and start -----------------------------------------------------------------

  const form = document.getElementById("signin");
  const signOutButton = document.getElementById("signout");
  const content = document.getElementById("content");

  function start() {
    generation += 1;
    form.hidden = true;
    content.hidden = false;
    signOutButton.hidden = !AUTH;
    document.querySelectorAll("[data-view]").forEach(watchView);
    document.querySelectorAll("[data-metrics]").forEach(watchCharts);
    document.querySelectorAll("[data-log]").forEach(watchLog);
  }

  function signOut(reason) {
    generation += 1;
    sessionStorage.removeItem(STORAGE_KEY);
    signOutButton.hidden = true;
    content.hidden = true;
    form.hidden = false;
    if (reason) showProblem(reason, "auth");
    else problem.hidden = true;
    form.elements.key.focus();
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const key = form.elements.key.value.trim();
    const secret = form.elements.secret.value;
    sessionStorage.setItem(STORAGE_KEY, JSON.stringify({ key, secret }));
    form.reset();
    problem.hidden = true;
    // Pollers fill regions anew: reload so charts and logs start clean.
    location.reload();
  });
  signOutButton.addEventListener("click", () => signOut(null));

  if (AUTH && !(window.crypto && crypto.subtle)) {
    content.hidden = true;
    showProblem(
      "Signing needs Web Crypto, which browsers give only to secure pages: open the console " +
        "over https or on localhost.", "auth");
  } else if (AUTH && !credentials()) {
    signOut(null);
  } else {
    start();
  }
})();
