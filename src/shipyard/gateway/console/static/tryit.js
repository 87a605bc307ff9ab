// The Try it panel of an endpoint's page: a request sent through the runtime doors as
// any client sends it (signed under auth:), its answer, status, variant and latency;
// a streaming model's answer read as its event-stream frames arrive.

import { send } from "./signing.js";
import { announce, el, failure, guard, pageName } from "./actions.js";

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

export function startTryIt() {
  for (const form of document.querySelectorAll("form[data-form=invoke]")) {
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      invoke(form);
    });
    fillTryIt(form, document.querySelector("section[data-view][aria-label=Endpoint]"));
  }
}
