// [data-metrics]: cumulative counters, polled; the rates drawn on <canvas> charts.

import { api } from "./signing.js";
import { denied, poll } from "./polling.js";

const PALETTE = ["#2f6fde", "#e0792b", "#2a9d5b", "#a34fc9", "#c73a4a", "#7a7f87"];
const WINDOW_S = 1800; // charts show the last 30 minutes (stored datapoints)...
const MIN_WINDOW_S = 60; // ...and are a minute wide while they have less

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

export function watchCharts(section) {
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
