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

  async function signatureHeaders(url, creds, method = "GET", body = "", extra = {}) {
    const u = new URL(url, location.href);
    const stamp = new Date().toISOString().replace(/[-:]/g, "").replace(/\.\d+/, "");
    const day = stamp.slice(0, 8);
    const payload = body ? await sha256Hex(body) : EMPTY_SHA256;
    const headers = { host: u.host, "x-amz-content-sha256": payload, "x-amz-date": stamp };
    for (const [k, v] of Object.entries(extra)) headers[k.toLowerCase()] = String(v).trim();
    const names = Object.keys(headers).sort();
    const signed = names.join(";");
    const canonical = [
      method,
      canonicalUri(u.pathname),
      canonicalQuery(u.search),
      names.map((n) => `${n}:${headers[n]}\n`).join(""),
      signed,
      payload,
    ].join("\n");
    const scope = `${day}/${REGION}/${SERVICE}/aws4_request`;
    const toSign = ["AWS4-HMAC-SHA256", stamp, scope, await sha256Hex(canonical)].join("\n");
    let key = encoder.encode("AWS4" + creds.secret);
    for (const part of [day, REGION, SERVICE, "aws4_request"]) key = await hmac(key, part);
    const signature = hex(await hmac(key, toSign));
    delete headers.host; // the browser sends it, as signed
    return {
      ...headers,
      authorization:
        `AWS4-HMAC-SHA256 Credential=${creds.key}/${scope}, ` +
        `SignedHeaders=${signed}, Signature=${signature}`,
    };
  }

  // A request as any client sends it: signed under auth:, its `extra` headers covered.
  async function send(url, method = "GET", body = "", extra = {}) {
    let headers = { ...extra };
    if (AUTH) {
      const creds = credentials();
      if (!creds) throw new AuthError("MissingAuthenticationTokenException", "Sign in first.");
      headers = await signatureHeaders(url, creds, method, body, extra);
    }
    const init = { method, headers, cache: "no-store", credentials: "omit" };
    if (method !== "GET") init.body = body;
    return fetch(url, init);
  }

  async function api(url) {
    const response = await send(url);
    if (response.status === 403) {
      const answer = await response.json().catch(() => ({}));
      throw new AuthError(answer.__type || "AccessDeniedException", answer.message || "Refused.");
    }
    return response;
  }

  class ApiError extends Error {
    constructor(type, message) {
      super(message);
      this.type = type;
    }
  }

  const TARGETS = {
    sagemaker: ["SageMaker", "application/x-amz-json-1.1"],
    "application-autoscaling": ["AnyScaleFrontendService", "application/x-amz-json-1.1"],
    cloudwatch: ["GraniteServiceVersion20100801", "application/x-amz-json-1.0"],
  };

  // One action of the public API (POST /, X-Amz-Target), called as boto3 calls it:
  // the gateway authorises it exactly as it would boto3's.
  async function call(action, params) {
    const [service, name] = action.split(":");
    const [prefix, type] = TARGETS[service];
    const body = JSON.stringify(params);
    const response = await send("/", "POST", body, {
      "content-type": type,
      "x-amz-target": `${prefix}.${name}`,
    });
    const text = await response.text();
    let answer = {};
    try {
      answer = text ? JSON.parse(text) : {};
    } catch (_) {
      answer = { message: text };
    }
    if (!response.ok) {
      const kind = String(answer.__type || response.status).split("#").pop();
      throw new ApiError(kind, answer.message || answer.Message || text || "Refused.");
    }
    return answer;
  }

  // -- polling ---------------------------------------------------------------------------

  const problem = document.getElementById("problem");
  const content = document.getElementById("content");

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
    const epoch = generation;
    const tick = async () => {
      const url = element.dataset.view;
      const response = await api(url);
      const html = await response.text();
      if (url !== element.dataset.view || epoch !== generation) return true; // asked anew
      if (html !== last) {
        element.innerHTML = html; // rendered and escaped by the server (fragments.py)
        last = html;
        guard(element);
        element.dispatchEvent(new Event("changed"));
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
  function watchWhenApplies() {
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

  // -- actions ---------------------------------------------------------------------------
  //
  // Every control calls the public API (call() above, or the runtime door for Try it),
  // signed like the page's reads: the gateway decides, as for boto3. The key's own
  // permissions (GET /console/api/whoami) only disable, ahead of time, what it would
  // refuse, and say why.

  const main = content;
  const pageName = main.dataset.name || "";
  const outcome = document.getElementById("outcome");
  let permissions = { allow: ["*"], resources: ["*"], arn: "" };

  function wildcard(pattern) {
    const escaped = pattern.toLowerCase().replace(/[.+^${}()|[\]\\]/g, "\\$&");
    return new RegExp(`^${escaped.replace(/\*/g, ".*").replace(/\?/g, ".")}$`, "s");
  }

  const arnOf = (kind, name) => `${permissions.arn}:${kind}/${name.toLowerCase()}`;

  // Why the key may not call `action` on the resource `kind`/`name` ("" when it may).
  function forbidden(action, kind, name) {
    if (!permissions.allow.some((p) => wildcard(p).test(action.toLowerCase()))) {
      return `Your key may not call ${action}.`;
    }
    if (kind && name && !permissions.resources.some((p) => wildcard(p).test(arnOf(kind, name)))) {
      return `Your key may not call ${action} on ${kind} ${name}.`;
    }
    return "";
  }

  function guard(root) {
    for (const element of root.querySelectorAll("[data-needs]")) {
      const why = forbidden(element.dataset.needs, element.dataset.on, pageName);
      const controls = element.tagName === "FORM"
        ? element.querySelectorAll("button, input, select, textarea") : [element];
      for (const control of controls) {
        control.disabled = Boolean(why);
        if (why) {
          control.setAttribute("aria-description", why);
          control.title = why;
        } else {
          control.removeAttribute("aria-description");
          control.removeAttribute("title");
        }
      }
    }
  }

  function announce(text, failed) {
    outcome.textContent = text;
    outcome.setAttribute("role", failed ? "alert" : "status");
    outcome.dataset.kind = failed ? "bad" : "good";
  }

  const failure = (err) => (err.type ? `${err.type}: ${err.message}` : String(err.message || err));

  // The element `tag` with `props`, its children text or nodes: no HTML is parsed.
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") node.className = v;
      else if (k in node && typeof v !== "string") node[k] = v;
      else node.setAttribute(k, v === true ? "" : v);
    }
    node.append(...children.filter((c) => c !== null && c !== undefined));
    return node;
  }

  const field = (label, input) => el("label", {}, label + " ", input);

  // A panel's form: fields, a submit button, and what to do on submit.
  function panelForm(panel, parts, submitLabel, run) {
    const submit = el("button", { type: "submit" }, submitLabel);
    const cancel = el("button", { type: "button", class: "link" }, "Cancel");
    const form = el("form", {}, ...parts, el("div", { class: "buttons" }, submit, cancel));
    cancel.addEventListener("click", () => closePanel(panel));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      submit.disabled = true;
      try {
        const said = await run(form);
        if (said) announce(said, false);
        closePanel(panel);
      } catch (err) {
        announce(failure(err), true);
      } finally {
        submit.disabled = false;
      }
    });
    panel.replaceChildren(el("h2", {}, panel.getAttribute("aria-label")), form);
    return form;
  }

  function closePanel(panel) {
    panel.hidden = true;
    panel.replaceChildren();
    const opener = document.querySelector(`[data-open="${panel.dataset.panel}"]`);
    if (opener) opener.focus();
  }

  // Leave a resource gone: stop every poller first, so nothing more is called for it.
  function leave(url) {
    generation += 1;
    location.assign(url);
  }

  function confirmDelete(panel, what, consequence, run) {
    const confirm = el("input", { name: "confirm", autocomplete: "off", required: true });
    const form = panelForm(
      panel,
      [el("p", {}, consequence), field(`Type “${pageName}” to confirm. Confirm`, confirm)],
      "Delete",
      async () => {
        if (confirm.value !== pageName) throw new Error(`Type the ${what}'s name to confirm.`);
        await run();
        return "";
      },
    );
    confirm.setAttribute("aria-label", "Confirm");
    return form;
  }

  const describeEndpoint = () => call("sagemaker:DescribeEndpoint", { EndpointName: pageName });

  async function componentsOf(endpoint) {
    const listed = await call("sagemaker:ListInferenceComponents", {
      EndpointNameEquals: endpoint, MaxResults: 100,
    });
    return Promise.all((listed.InferenceComponents || []).map((c) =>
      call("sagemaker:DescribeInferenceComponent", {
        InferenceComponentName: c.InferenceComponentName,
      })));
  }

  const number = (name, value, min = 0) =>
    el("input", { name, type: "number", min: String(min), step: "1", value: String(value), required: true });

  const PANELS = {
    async weights(panel) {
      const endpoint = await describeEndpoint();
      const components = await componentsOf(pageName);
      const groups = [];
      for (const v of endpoint.ProductionVariants || []) {
        const weight = el("input", {
          name: "weight", type: "number", min: "0", step: "any",
          value: String(v.CurrentWeight ?? v.DesiredWeight ?? 1), required: true,
        });
        const count = number("instances", v.DesiredInstanceCount ?? v.CurrentInstanceCount ?? 1);
        groups.push(el("fieldset", { "data-variant": v.VariantName },
          el("legend", {}, v.VariantName), field("Weight", weight), field("Instances", count)));
      }
      for (const c of components) {
        const copies = number("instances", c.RuntimeConfig?.DesiredCopyCount ?? 1);
        groups.push(el("fieldset", { "data-component": c.InferenceComponentName },
          el("legend", {}, c.InferenceComponentName), field("Instances", copies),
          el("p", { class: "muted" }, "copies of this inference component")));
      }
      const before = JSON.stringify(groups.map((g) => [...g.querySelectorAll("input")].map((i) => i.value)));
      panelForm(panel, [
        el("p", { class: "muted" }, "Traffic moves at once, in proportion to the weights; "
          + "instances start or drain without dropping a request."),
        ...groups,
      ], "Apply", async (form) => {
        const now = JSON.stringify(groups.map((g) => [...g.querySelectorAll("input")].map((i) => i.value)));
        if (now === before) return "Nothing changed.";
        const variants = [...form.querySelectorAll("fieldset[data-variant]")].map((g) => ({
          VariantName: g.dataset.variant,
          DesiredWeight: Number(g.querySelector("[name=weight]").value),
          DesiredInstanceCount: Number(g.querySelector("[name=instances]").value),
        }));
        const said = [];
        const changedVariants = variants.filter((v, n) => {
          const was = endpoint.ProductionVariants[n];
          return v.DesiredWeight !== (was.CurrentWeight ?? was.DesiredWeight)
            || v.DesiredInstanceCount !== (was.DesiredInstanceCount ?? was.CurrentInstanceCount);
        });
        if (changedVariants.length) {
          await call("sagemaker:UpdateEndpointWeightsAndCapacities", {
            EndpointName: pageName, DesiredWeightsAndCapacities: changedVariants,
          });
          said.push(`UpdateEndpointWeightsAndCapacities: ${changedVariants.map((v) => v.VariantName).join(", ")}`);
        }
        for (const [n, g] of [...form.querySelectorAll("fieldset[data-component]")].entries()) {
          const copies = Number(g.querySelector("[name=instances]").value);
          if (copies === components[n].RuntimeConfig?.DesiredCopyCount) continue;
          await call("sagemaker:UpdateInferenceComponentRuntimeConfig", {
            InferenceComponentName: g.dataset.component, DesiredRuntimeConfig: { CopyCount: copies },
          });
          said.push(`${g.dataset.component}: ${copies} copies`);
        }
        return `Updating ${pageName} (${said.join("; ")}).`;
      });
    },

    async update(panel) {
      const [endpoint, listed] = await Promise.all([
        describeEndpoint(),
        call("sagemaker:ListEndpointConfigs", { MaxResults: 100, SortBy: "CreationTime", SortOrder: "Descending" }),
      ]);
      const configs = el("select", { name: "config", required: true },
        ...(listed.EndpointConfigs || []).map((c) => el("option", {
          value: c.EndpointConfigName, selected: c.EndpointConfigName === endpoint.EndpointConfigName ? true : false,
        }, c.EndpointConfigName + (c.EndpointConfigName === endpoint.EndpointConfigName ? " (current)" : ""))));
      const kinds = ["All at once", "Canary", "Linear", "Rolling"];
      const radios = kinds.map((k, n) => el("label", {},
        el("input", { type: "radio", name: "policy", value: k, checked: n === 0 ? true : false }), " " + k));
      const size = number("size", 1, 1);
      const unit = el("select", { name: "unit" }, el("option", { value: "INSTANCE_COUNT" }, "Instances"),
        el("option", { value: "CAPACITY_PERCENT" }, "Percent"));
      const wait = number("wait", 30, 0);
      const alarms = el("input", { name: "alarms", placeholder: "alarm names, comma-separated", autocomplete: "off" });
      panelForm(panel, [
        field("Endpoint config", configs),
        el("fieldset", { role: "radiogroup", "aria-label": "Deployment policy" },
          el("legend", {}, "Deployment policy"), ...radios),
        el("div", { class: "row" }, field("Size", size), field("Unit", unit)),
        field("Wait interval", wait), el("span", { class: "muted" }, " seconds between steps"),
        field("Rollback alarms", alarms),
        el("p", { class: "muted" }, "A new fleet starts beside the old one, takes traffic in the "
          + "steps chosen, and replaces it; an alarm going off rolls traffic back."),
      ], "Start update", async () => {
        const policy = panel.querySelector("[name=policy]:checked").value;
        const sized = { Type: unit.value, Value: Number(size.value) };
        const waitS = Number(wait.value);
        const names = alarms.value.split(",").map((a) => a.trim()).filter(Boolean);
        const deployment = {};
        if (policy === "Rolling") {
          deployment.RollingUpdatePolicy = { MaximumBatchSize: sized, WaitIntervalInSeconds: waitS };
        } else if (policy !== "All at once" || names.length) {
          const routing = { Type: "ALL_AT_ONCE", WaitIntervalInSeconds: waitS };
          if (policy === "Canary") Object.assign(routing, { Type: "CANARY", CanarySize: sized });
          if (policy === "Linear") Object.assign(routing, { Type: "LINEAR", LinearStepSize: sized });
          deployment.BlueGreenUpdatePolicy = { TrafficRoutingConfiguration: routing };
        }
        if (names.length) {
          deployment.AutoRollbackConfiguration = { Alarms: names.map((AlarmName) => ({ AlarmName })) };
        }
        const params = { EndpointName: pageName, EndpointConfigName: configs.value };
        if (Object.keys(deployment).length) params.DeploymentConfig = deployment;
        await call("sagemaker:UpdateEndpoint", params);
        return `Updating ${pageName} to ${configs.value} (${policy.toLowerCase()}).`;
      });
    },

    async scaling(panel) {
      const endpoint = await describeEndpoint();
      const names = (endpoint.ProductionVariants || []).map((v) => v.VariantName);
      const ids = names.map((v) => `endpoint/${pageName}/variant/${v}`);
      // What is set now, to edit it (none yet: the defaults).
      const [targets, policies] = await Promise.all([
        call("application-autoscaling:DescribeScalableTargets", { ServiceNamespace: "sagemaker", ResourceIds: ids }),
        call("application-autoscaling:DescribeScalingPolicies", { ServiceNamespace: "sagemaker" }),
      ]).catch(() => [{}, {}]);
      const variants = el("select", { name: "variant" }, ...names.map((v) => el("option", {}, v)));
      const low = number("min", 1, 1);
      const high = number("max", 4, 1);
      const target = el("input", { name: "target", type: "number", min: "1", step: "any", value: "100", required: true });
      const current = () => {
        const id = `endpoint/${pageName}/variant/${variants.value}`;
        const t = (targets.ScalableTargets || []).find((x) => x.ResourceId === id);
        const p = (policies.ScalingPolicies || []).find((x) => x.ResourceId === id
          && x.PolicyType === "TargetTrackingScaling");
        low.value = String(t ? t.MinCapacity : 1);
        high.value = String(t ? t.MaxCapacity : 4);
        target.value = String(p ? p.TargetTrackingScalingPolicyConfiguration.TargetValue : 100);
        target.dataset.policy = p ? p.PolicyName : "";
      };
      variants.addEventListener("change", current);
      current();
      panelForm(panel, [
        field("Variant", variants), field("Min instances", low), field("Max instances", high),
        field("Target invocations per instance", target),
        el("p", { class: "muted" }, "Target tracking: instances are added or removed to keep each "
          + "instance near the target invocations per minute."),
      ], "Save policy", async () => {
        const resource = `endpoint/${pageName}/variant/${variants.value}`;
        const dimension = "sagemaker:variant:DesiredInstanceCount";
        await call("application-autoscaling:RegisterScalableTarget", {
          ServiceNamespace: "sagemaker", ResourceId: resource, ScalableDimension: dimension,
          MinCapacity: Number(low.value), MaxCapacity: Number(high.value),
        });
        await call("application-autoscaling:PutScalingPolicy", {
          PolicyName: target.dataset.policy || `${pageName}-${variants.value}-invocations`,
          ServiceNamespace: "sagemaker",
          ResourceId: resource, ScalableDimension: dimension, PolicyType: "TargetTrackingScaling",
          TargetTrackingScalingPolicyConfiguration: {
            TargetValue: Number(target.value),
            PredefinedMetricSpecification: { PredefinedMetricType: "SageMakerVariantInvocationsPerInstance" },
          },
        });
        return `Scaling policy saved for ${variants.value}.`;
      });
    },

    async delete(panel) {
      confirmDelete(panel, "endpoint",
        `Deleting endpoint ${pageName} stops all its instances: every request to it fails `
        + "from then on. Its endpoint config and models stay.",
        async () => {
          await call("sagemaker:DeleteEndpoint", { EndpointName: pageName });
          leave("/console?deleted=" + encodeURIComponent(pageName));
        });
    },

    async "create-endpoint"(panel) {
      const name = el("input", { name: "endpoint", required: true, pattern: "[a-zA-Z0-9](-*[a-zA-Z0-9])*", maxlength: "63", autocomplete: "off" });
      const type = el("input", { name: "instanceType", value: "ml.m5.large", required: true });
      const count = number("instances", 1, 1);
      const routing = el("select", { name: "routing" },
        el("option", { value: "LEAST_OUTSTANDING_REQUESTS" }, "Least outstanding requests"),
        el("option", { value: "RANDOM" }, "Random"));
      const capture = el("input", { name: "capture", placeholder: "optional: s3:// or file:// URI" });
      const asyncOut = el("input", { name: "async", placeholder: "optional: makes it asynchronous" });
      panelForm(panel, [
        field("Endpoint name", name), field("Instance type", type), field("Instances", count),
        field("Routing strategy", routing), field("Capture to", capture),
        field("Async output path", asyncOut),
        el("p", { class: "muted" }, "Creates an endpoint config of the same name, then the endpoint."),
      ], "Create", async () => {
        const config = {
          EndpointConfigName: name.value,
          ProductionVariants: [{
            VariantName: "AllTraffic", ModelName: pageName, InstanceType: type.value,
            InitialInstanceCount: Number(count.value), RoutingConfig: { RoutingStrategy: routing.value },
          }],
        };
        if (capture.value) {
          config.DataCaptureConfig = {
            EnableCapture: true, InitialSamplingPercentage: 100, DestinationS3Uri: capture.value,
            CaptureOptions: [{ CaptureMode: "Input" }, { CaptureMode: "Output" }],
          };
        }
        if (asyncOut.value) config.AsyncInferenceConfig = { OutputConfig: { S3OutputPath: asyncOut.value } };
        await call("sagemaker:CreateEndpointConfig", config);
        await call("sagemaker:CreateEndpoint", { EndpointName: name.value, EndpointConfigName: name.value });
        leave(`/console/endpoints/${encodeURIComponent(name.value)}`);
      });
      name.focus();
    },

    async "delete-model"(panel) {
      confirmDelete(panel, "model", `Deleting model ${pageName} removes its definition; `
        + "endpoints already serving it keep serving.", async () => {
        await call("sagemaker:DeleteModel", { ModelName: pageName });
        leave("/console/models");
      });
    },

    async "delete-config"(panel) {
      confirmDelete(panel, "endpoint config", `Deleting endpoint config ${pageName} removes its `
        + "definition; endpoints running it keep running.", async () => {
        await call("sagemaker:DeleteEndpointConfig", { EndpointConfigName: pageName });
        leave("/console/endpoint-configs");
      });
    },

    async copies(panel) {
      const c = await call("sagemaker:DescribeInferenceComponent", { InferenceComponentName: pageName });
      const copies = number("instances", c.RuntimeConfig?.DesiredCopyCount ?? 1);
      panelForm(panel, [field("Instances", copies), el("span", { class: "muted" }, " copies")],
        "Apply", async () => {
          await call("sagemaker:UpdateInferenceComponentRuntimeConfig", {
            InferenceComponentName: pageName, DesiredRuntimeConfig: { CopyCount: Number(copies.value) },
          });
          return `Updating ${pageName} to ${copies.value} copies.`;
        });
    },

    async "stop-job"(panel) {
      stopJob(panel, true);
    },

    async "stop-transform"(panel) {
      stopJob(panel, false);
    },

    async "delete-component"(panel) {
      const c = await call("sagemaker:DescribeInferenceComponent", { InferenceComponentName: pageName });
      confirmDelete(panel, "inference component", `Deleting ${pageName} stops its copies on `
        + `${c.EndpointName}: requests naming it fail from then on.`, async () => {
        await call("sagemaker:DeleteInferenceComponent", { InferenceComponentName: pageName });
        leave(`/console/endpoints/${encodeURIComponent(c.EndpointName)}`);
      });
    },
  };

  function stopJob(panel, training) {
    const action = training ? "sagemaker:StopTrainingJob" : "sagemaker:StopTransformJob";
    const params = training ? { TrainingJobName: pageName } : { TransformJobName: pageName };
    panelForm(panel, [el("p", {}, `Stopping ${pageName} sends its processes SIGTERM, then `
      + "SIGKILL after the grace period; what it wrote so far stays where it is.")],
    "Stop", async () => {
      await call(action, params);
      return `Stopping ${pageName}.`;
    });
  }

  async function openPanel(button) {
    const key = button.dataset.open;
    const panel = document.querySelector(`[data-panel="${key}"]`);
    if (!panel) return;
    if (!panel.hidden) return closePanel(panel);
    for (const other of document.querySelectorAll("[data-panel]")) {
      if (other !== panel && !other.hidden) closePanel(other);
    }
    panel.hidden = false;
    panel.replaceChildren(el("p", { class: "muted" }, "Loading…"));
    try {
      await PANELS[key](panel);
      const first = panel.querySelector("input, select, textarea, button[type=submit]");
      if (first) first.focus();
    } catch (err) {
      panel.replaceChildren(el("p", { class: "problem" }, failure(err)));
    }
  }

  async function rollBack(button) {
    button.disabled = true;
    try {
      await call("cloudwatch:SetAlarmState", {
        AlarmName: button.dataset.rollback, StateValue: "ALARM",
        StateReason: "Rolled back from the console.",
      });
      announce(`Alarm ${button.dataset.rollback} set to ALARM: the deployment rolls back.`, false);
    } catch (err) {
      announce(failure(err), true);
      button.disabled = false;
    }
  }

  // -- try it ----------------------------------------------------------------------------

  // The variants and components to choose from, as the endpoint's view last said.
  function syncChoices(select, names) {
    const have = [...select.options].slice(select.dataset.fixed ? 1 : 0).map((o) => o.value);
    if (have.join(",") === names.join(",")) return;
    const keep = select.value;
    const fixed = select.dataset.fixed ? [select.options[0]] : [];
    select.replaceChildren(...fixed, ...names.map((n) => el("option", {}, n)));
    if (names.includes(keep)) select.value = keep;
  }

  function fillTryIt(form, view) {
    form.elements.variant.dataset.fixed = "1"; // "by weight" stays first
    view.addEventListener("changed", () => {
      const status = view.querySelector("[data-variants]");
      if (!status) return;
      const split = (s) => (s ? s.split(",") : []);
      syncChoices(form.elements.variant, split(status.dataset.variants));
      const components = split(status.dataset.components);
      form.querySelector("[data-if=components]").hidden = components.length === 0;
      syncChoices(form.elements.component, components);
    });
  }

  // InvokeEndpointWithResponseStream's answer: AWS event-stream messages, each a
  // prelude (total and headers lengths, CRC), headers, a payload and a CRC. Only the
  // framing is read here; the gateway computed the CRCs and TCP kept them intact.
  function eventHeaders(bytes) {
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const found = {};
    let at = 0;
    const fixed = { 0: 0, 1: 0, 2: 1, 3: 2, 4: 4, 5: 8, 8: 8, 9: 16 };
    while (at < bytes.length) {
      const nameLength = bytes[at];
      const name = new TextDecoder().decode(bytes.subarray(at + 1, at + 1 + nameLength));
      at += 1 + nameLength;
      const type = bytes[at];
      at += 1;
      if (type === 6 || type === 7) {
        const length = view.getUint16(at);
        if (type === 7) found[name] = new TextDecoder().decode(bytes.subarray(at + 2, at + 2 + length));
        at += 2 + length;
      } else {
        at += fixed[type] ?? bytes.length;
      }
    }
    return found;
  }

  // Each message of `response`'s body as it arrives: onMessage(headers, payload).
  async function readEvents(response, onMessage) {
    const reader = response.body.getReader();
    let buffer = new Uint8Array(0);
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      const joined = new Uint8Array(buffer.length + value.length);
      joined.set(buffer);
      joined.set(value, buffer.length);
      buffer = joined;
      while (buffer.length >= 12) {
        const view = new DataView(buffer.buffer, buffer.byteOffset, buffer.byteLength);
        const total = view.getUint32(0);
        const headersLength = view.getUint32(4);
        if (buffer.length < total) break;
        const headers = eventHeaders(buffer.subarray(12, 12 + headersLength));
        onMessage(headers, buffer.subarray(12 + headersLength, total - 4));
        buffer = buffer.slice(total);
      }
    }
  }

  async function invoke(form) {
    const out = form.parentElement.querySelector(".response");
    const f = form.elements;
    const headers = { "content-type": f.contentType.value || "application/json" };
    if (f.variant.value) headers["x-amzn-sagemaker-target-variant"] = f.variant.value;
    if (f.component.value) headers["x-amzn-sagemaker-inference-component"] = f.component.value;
    if (f.targetModel.value) headers["x-amzn-sagemaker-target-model"] = f.targetModel.value;
    if (f.session.value) headers["x-amzn-sagemaker-session-id"] = f.session.value;
    const streamed = f.stream.checked;
    const door = streamed ? "invocations-response-stream" : "invocations";
    const button = form.querySelector("button[type=submit]");
    button.disabled = true;
    const started = performance.now();
    try {
      const response = await send(
        `/endpoints/${encodeURIComponent(pageName)}/${door}`, "POST", f.body.value, headers);
      const first = performance.now() - started;
      const variant = response.headers.get("x-amzn-invoked-production-variant") || "—";
      const latency = el("dd", {}, `${first.toFixed(1)} ms`);
      const answer = el("pre", { class: "answer", tabindex: "0" });
      const listed = el("dl", { class: "facts headers" });
      for (const [k, v] of response.headers) listed.append(el("dt", {}, k), el("dd", {}, v));
      out.replaceChildren(
        el("dl", { class: "facts" },
          el("dt", {}, "Status"),
          el("dd", { "data-http-status": String(response.status) }, String(response.status)),
          el("dt", {}, "Invoked variant"), el("dd", { "data-variant": variant }, variant),
          el("dt", {}, streamed ? "First byte, whole answer" : "Latency"), latency),
        answer, el("details", {}, el("summary", {}, "Headers"), listed));
      out.hidden = false;
      let failed = !response.ok;
      if (streamed && response.ok) {
        const text = new TextDecoder();
        let parts = 0;
        await readEvents(response, (h, payload) => {
          if (h[":message-type"] === "event" && h[":event-type"] === "PayloadPart") {
            answer.append(text.decode(payload, { stream: true }));
            parts += 1;
          } else {
            failed = true;
            const kind = h[":exception-type"] || h[":error-code"] || "Error";
            answer.append(el("strong", {}, `\n${kind}: ${new TextDecoder().decode(payload)}`));
          }
        });
        out.dataset.parts = String(parts);
        latency.textContent = `${first.toFixed(1)} ms, ${(performance.now() - started).toFixed(1)} ms`;
      } else {
        answer.textContent = await response.text();
        latency.textContent = `${(performance.now() - started).toFixed(1)} ms`;
      }
      announce(failed ? `${pageName} answered ${response.status}${streamed && response.ok ? ", then failed mid-stream" : ""}.`
        : `Invoked ${pageName}: ${response.status}.`, failed);
    } catch (err) {
      announce(failure(err), true);
    } finally {
      button.disabled = false;
      guard(form.parentElement);
    }
  }

  // -- filters and pages of lists --------------------------------------------------------

  function filterList(form) {
    const view = form.nextElementSibling;
    const base = view.dataset.view.split("?")[0];
    const refresh = (page) => {
      const query = new URLSearchParams();
      for (const input of form.elements) if (input.name && input.value) query.set(input.name, input.value);
      if (page) query.set("page", page);
      view.dataset.view = base + (query.toString() ? "?" + query : "");
      view.dispatchEvent(new Event("refresh"));
    };
    let timer = null;
    form.addEventListener("input", () => {
      clearTimeout(timer);
      timer = setTimeout(() => refresh(0), 250);
    });
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      refresh(0);
    });
    view.addEventListener("click", (event) => {
      const button = event.target.closest("[data-page]");
      if (button) refresh(button.dataset.page);
    });
  }

  async function startActions() {
    for (const form of document.querySelectorAll("form[data-form=invoke]")) {
      form.addEventListener("submit", (event) => {
        event.preventDefault();
        invoke(form);
      });
      fillTryIt(form, document.querySelector("section[data-view][aria-label=Endpoint]"));
    }
    document.addEventListener("click", (event) => {
      const opener = event.target.closest("[data-open]");
      if (opener && !opener.disabled) openPanel(opener);
      const back = event.target.closest("[data-rollback]");
      if (back && !back.disabled) rollBack(back);
    });
    document.addEventListener("keydown", (event) => {
      if (event.key !== "Escape") return;
      const open = [...document.querySelectorAll("[data-panel]")].find((p) => !p.hidden);
      if (open) closePanel(open);
    });
    const deleted = new URLSearchParams(location.search).get("deleted");
    if (deleted) announce(`Deleting endpoint ${deleted}: its instances stop.`, false);
    try {
      const response = await api("/console/api/whoami");
      if (response.ok) permissions = await response.json();
    } catch (_) {
      // Left as it was: the gateway still decides each call.
    }
    guard(document);
  }

  // -- sign-in and start -----------------------------------------------------------------

  const form = document.getElementById("signin");
  const signOutButton = document.getElementById("signout");

  function start() {
    generation += 1;
    form.hidden = true;
    content.hidden = false;
    signOutButton.hidden = !AUTH;
    startActions();
    document.querySelectorAll("form.filter").forEach(filterList);
    watchWhenApplies();
    document.querySelectorAll("[data-view]:not([data-when])").forEach(watchView);
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
