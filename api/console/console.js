// pagedq's console: a few views over the JSON API, no build step. Everything a user wrote reaches the
// page as text nodes (h() below), never as HTML. The API key, when the API asks for one, is kept in this
// tab's sessionStorage and sent as an Authorization header, never in a URL.
"use strict";

const KEY = "pagedq.key";
const REFRESH_MS = 2000;
const main = document.getElementById("main");
const pagedq = (window.pagedq = { charts: {} }); // the tests read the charts' data from here
let stopView = () => {};

// ---- DOM and formatting ----

function h(tag, props = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "dataset") Object.assign(el.dataset, value);
    else if (name.startsWith("on")) el.addEventListener(name.slice(2), value);
    else el[name] = value;
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

const fmt = {
  ms: (v) => (v === null || v === undefined ? "–" : v < 1000 ? `${v.toFixed(1)} ms` : `${(v / 1000).toFixed(2)} s`),
  time: (iso) => (iso ? new Date(iso).toLocaleString() : "–"),
  unix: (s) => (s ? new Date(s * 1000).toLocaleString() : "–"),
  age: (s) => (s === null || s === undefined ? "–" : s < 120 ? `${s.toFixed(0)} s` : `${(s / 60).toFixed(1)} min`),
};

const status = (s) => h("span", { className: `status ${s}` }, s);
const jobLink = (id) => h("a", { href: `#/job/${encodeURIComponent(id)}` }, id);
const batchLink = (id) => h("a", { href: `#/batch/${encodeURIComponent(id)}` }, id);
const atRisk = (b) => (b.at_risk ? h("span", { className: "badge at-risk", title: `estimated end ${fmt.unix(b.estimated_completion_at)}, past its window` }, "at risk") : "");

function show(...nodes) {
  main.replaceChildren(...nodes);
}

// ---- the API ----

async function api(path, options = {}) {
  const headers = { Accept: "application/json", ...(options.headers || {}) };
  const key = sessionStorage.getItem(KEY);
  if (key) headers.Authorization = `Bearer ${key}`;
  const response = await fetch(path, { ...options, headers });
  if (response.status === 401) {
    askForKey();
    throw new Error("this service needs an API key");
  }
  if (options.raw) return response;
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && body.detail;
    throw new Error(`${response.status}: ${typeof detail === "string" ? detail : JSON.stringify(detail)}`);
  }
  return body;
}

function askForKey() {
  stopView();
  const input = h("input", { type: "password", autocomplete: "off", size: 50, placeholder: "pq_…" });
  const form = h(
    "form",
    {
      onsubmit: (event) => {
        event.preventDefault();
        sessionStorage.setItem(KEY, input.value.trim());
        route();
      },
    },
    h("p", {}, "This service asks for an API key. It stays in this tab only."),
    input,
    " ",
    h("button", {}, "Use key"),
  );
  show(h("section", {}, h("h2", {}, "API key"), form));
}

function showKeyState() {
  const holder = document.getElementById("key-state");
  if (!sessionStorage.getItem(KEY)) return holder.replaceChildren();
  const forget = () => {
    sessionStorage.removeItem(KEY);
    route();
  };
  holder.replaceChildren("using an API key ", h("button", { onclick: forget }, "forget it"));
}

function failed(error) {
  if (!String(error.message).includes("API key")) show(h("p", { className: "error" }, String(error.message)));
}

// Runs `load` now and every REFRESH_MS until the view changes or `load` returns true (done).
function repeat(load) {
  let timer = null;
  let live = true;
  const tick = async () => {
    try {
      if ((await load()) === true) return;
    } catch (error) {
      failed(error);
      return;
    }
    if (live) timer = setTimeout(tick, REFRESH_MS);
  };
  tick();
  return () => {
    live = false;
    clearTimeout(timer);
  };
}

// ---- charts ----

function lineChart(name, title, labels, data, options = {}) {
  const holder = h("div", { className: "chart", dataset: { chart: name } });
  pagedq.charts[name]?.destroy(); // the one it replaces
  const series = [{ label: labels[0] }, ...labels.slice(1).map((label, i) => seriesStyle(label, i, options))];
  const chart = new uPlot(
    { title, width: options.width || 540, height: options.height || 200, series, scales: options.scales || {},
      axes: [{}, { size: 70 }] },
    data,
    holder,
  );
  pagedq.charts[name] = chart;
  return holder;
}

function seriesStyle(label, i, options) {
  const colors = ["#3b82f6", "#8b5cf6", "#10b981"];
  const points = (options.points || [])[i];
  return points
    ? { label, stroke: colors[i], width: 0, points: { show: true, size: 9, fill: colors[i] } }
    : { label, stroke: colors[i], width: 1.5, spanGaps: false, points: { show: false } };
}

function histogram(title, data) {
  const max = Math.max(1, ...data.counts);
  const bound = (i) => (i < data.le_ms.length ? `≤ ${fmt.ms(data.le_ms[i])}` : `> ${fmt.ms(data.le_ms.at(-1))}`);
  const rows = data.counts
    .map((count, i) => [count, i])
    .filter(([count]) => count > 0)
    .map(([count, i]) =>
      h("tr", {}, h("td", {}, bound(i)), h("td", { className: "barcell" },
        h("div", { className: "fill", style: `width:${(100 * count) / max}%` })), h("td", { className: "num" }, count)),
    );
  return h("div", { className: "hist" }, h("h3", {}, title),
    rows.length ? h("table", {}, rows) : h("p", { className: "muted" }, "no job has ended yet"));
}

// ---- overview ----

function overview() {
  const cards = h("div", { className: "cards" });
  const queue = h("div", { className: "cards" });
  const workers = h("div");
  const models = h("div");
  const charts = h("div", { className: "charts" });
  show(h("h2", {}, "Overview"), h("section", {}, h("h3", {}, "Jobs by state"), cards),
    h("section", {}, h("h3", {}, "Queue"), queue), h("section", {}, h("h3", {}, "Models"), models),
    h("section", {}, h("h3", {}, "Live workers"), workers),
    h("section", {}, h("h3", {}, "Last hour, by minute"), charts));
  const card = (value, label, name) => h("div", { className: "card", dataset: { count: name || label } }, h("b", {}, value), h("span", {}, label));
  return repeat(async () => {
    const o = await api("/v1/overview");
    cards.replaceChildren(...Object.entries(o.jobs).map(([state, n]) =>
      h("a", { href: `#/jobs?status=${state}`, style: "text-decoration:none;color:inherit" }, card(n, state))));
    queue.replaceChildren(card(o.queue_depth ?? "?", o.scope === "key" ? "your queued jobs" : "messages in the broker", "queue_depth"),
      card(fmt.age(o.oldest_queued_age_s), "oldest queued job waiting", "oldest_queued"));
    models.replaceChildren(modelTable(o.models));
    workers.replaceChildren(o.scope === "key" ? h("p", { className: "muted" }, "shown to admin keys")
      : o.workers.length ? workerTable(o.workers) : h("p", { className: "error" }, "no live worker"));
    const x = o.last_hour.map((m) => Date.parse(m.at) / 1000);
    charts.replaceChildren(
      lineChart("throughput", "Tokens per second", ["time", "tokens/s"], [x, o.last_hour.map((m) => m.tokens_per_s)]),
      lineChart("ttft", "Median time to first token (ms)", ["time", "TTFT ms"],
        [x, o.last_hour.map((m) => m.median_ttft_ms)], { points: [true] }),
    );
    document.title = `pagedq: ${o.jobs.running} running, ${o.jobs.queued} queued`;
  });
}

function modelTable(models) {
  const known = (v) => (v === null ? "–" : v);
  return h("table", { className: "models" },
    h("tr", {}, ["model", "kind", "queued", "in the broker", "live workers", "tokens/s (last hour)"].map((t) => h("th", {}, t))),
    models.map((m) => h("tr", { dataset: { model: m.name } },
      h("td", {}, h("a", { href: `#/jobs?model=${encodeURIComponent(m.name)}` }, m.name)), h("td", {}, m.kind),
      h("td", { className: "num" }, m.queued), h("td", { className: "num" }, known(m.queue_depth)),
      h("td", { className: "num" }, known(m.live_workers)), h("td", { className: "num" }, m.tokens_per_s.toFixed(3)))));
}

function workerTable(workers) {
  const gauge = (w, key, f = (v) => v) => (w.stats[key] === undefined ? "–" : f(w.stats[key]));
  return h("table", { className: "workers" },
    h("tr", {}, ["worker", "model", "running", "waiting", "KV cache", "tokens/s", "heartbeat"].map((t) => h("th", {}, t))),
    workers.map((w) => h("tr", {}, h("td", {}, w.id), h("td", {}, w.model),
      h("td", { className: "num" }, gauge(w, "num_running")), h("td", { className: "num" }, gauge(w, "num_waiting")),
      h("td", { className: "num" }, gauge(w, "kv_cache_usage", (v) => `${(100 * v).toFixed(1)} %`)),
      h("td", { className: "num" }, gauge(w, "tokens_per_s", (v) => v.toFixed(1))), h("td", {}, fmt.time(w.heartbeat_at)))));
}

// ---- jobs ----

const STATES = ["queued", "running", "succeeded", "failed", "cancelled"];

function jobs(params) {
  const field = (label, input) => h("label", {}, label, input);
  const state = h("select", { name: "status" }, h("option", { value: "" }, "any"), STATES.map((s) => h("option", { value: s }, s)));
  state.value = params.get("status") || "";
  const batch = h("input", { name: "batch_id", value: params.get("batch_id") || "", size: 36 });
  const meta = h("input", { name: "metadata", value: params.get("metadata") || "", placeholder: "key=value", size: 20 });
  const model = h("input", { name: "model", value: params.get("model") || "", size: 16 });
  const owner = h("select", { name: "key" }, h("option", { value: "" }, "any"));
  const ownerField = field("key", owner);
  ownerField.hidden = true; // shown to admins, who may list the keys
  const form = h("form", { className: "filters", onsubmit: (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    for (const [name, el] of [["status", state], ["batch_id", batch], ["model", model], ["metadata", meta], ["key", owner]]) if (el.value) query.set(name, el.value);
    location.hash = `#/jobs?${query}`;
  } }, field("status", state), field("batch", batch), field("model", model), field("metadata", meta), ownerField, h("button", {}, "Filter"));
  const list = h("div");
  show(h("h2", {}, "Jobs"), form, list);
  const query = new URLSearchParams({ limit: "50" });
  for (const name of ["after", "key", "model"]) if (params.get(name)) query.set(name, params.get(name));
  if (state.value) query.set("status", state.value);
  if (batch.value) query.set("batch_id", batch.value);
  const [key, ...value] = meta.value.split("=");
  if (key && value.length) query.set(`metadata.${key}`, value.join("="));
  let names;
  return repeat(async () => {
    if (names === undefined) {
      names = await keyNames();
      if (names && Object.keys(names).length) {
        owner.append(...Object.values(names).map((name) => h("option", { value: name }, name)));
        owner.value = params.get("key") || "";
        ownerField.hidden = false;
      }
    }
    const page = await api(`/v1/jobs?${query}`);
    list.replaceChildren(jobTable(page.data, names));
    if (page.next_cursor) {
      const next = new URLSearchParams(params);
      next.set("after", page.next_cursor);
      list.append(h("p", {}, h("a", { href: `#/jobs?${next}` }, "older jobs →")));
    }
  });
}

// Key names by id when this caller may list the keys (an admin key, or auth off); null for a user key.
async function keyNames() {
  const response = await api("/v1/admin/keys", { raw: true });
  if (!response.ok) return null;
  return Object.fromEntries((await response.json()).data.map((k) => [k.id, k.name]));
}

function jobTable(list, names) {
  if (!list.length) return h("p", { className: "muted" }, "no jobs");
  const owners = names && Object.keys(names).length > 0; // which key submitted each job: for admins
  const owner = (job) => (owners ? [h("td", { className: "key" }, names[job.key_id] || job.key_id || "–")] : []);
  return h("table", { className: "jobs" },
    h("tr", {}, ["job", "status", "queued", "tokens", "e2e", "metadata", ...(owners ? ["key"] : [])].map((t) => h("th", {}, t))),
    list.map((job) => h("tr", { dataset: { job: job.id } }, h("td", {}, jobLink(job.id)), h("td", {}, status(job.status)),
      h("td", {}, fmt.time(job.timings.queued_at)), h("td", { className: "num" }, job.usage.completion_tokens),
      h("td", { className: "num" }, fmt.ms(job.timings.e2e_latency_ms)),
      h("td", {}, Object.entries(job.metadata).map(([k, v]) => `${k}=${v}`).join(" ")), owner(job))));
}

// ---- a job ----

function job(id) {
  const path = `/v1/jobs/${encodeURIComponent(id)}`;
  const head = h("div");
  const request = h("section", {}, h("h3", {}, "Request"));
  const outputs = h("section", {}, h("h3", {}, "Output"));
  const timeline = h("section", {}, h("h3", {}, "Token timeline"));
  const deliveries = h("section", {}, h("h3", {}, "Webhook deliveries"));
  show(head, request, outputs, timeline, deliveries);
  api(`${path}/request`).then((r) => request.append(
    r.messages ? h("div", {}, r.messages.map((m) => h("div", {}, h("b", {}, m.role), h("pre", { className: "prompt" }, m.content))))
      : h("pre", { className: "prompt" }, r.prompt),
    h("p", { className: "muted" }, `${r.prompt_tokens} prompt tokens`)), failed);
  const streamed = { attempt: null, text: "" };
  const abort = new AbortController();
  follow(path, streamed, abort.signal, () => outputs.querySelector("pre[data-choice='0']"));
  let shown = null;
  const stop = repeat(async () => {
    const j = await api(path);
    const key = JSON.stringify([j.status, j.usage, j.attempt, j.timings.token_times_ms.length, j.choices.map((c) => c.text.length)]);
    if (key !== shown) {
      shown = key;
      renderJob(j, head, outputs, timeline, streamed);
      api(`${path}/webhook-deliveries`).then((d) => deliveries.replaceChildren(h("h3", {}, "Webhook deliveries"), deliveryTable(d.data)), failed);
    }
    return j.status !== "queued" && j.status !== "running";
  });
  return () => {
    stop();
    abort.abort();
  };
}

// The first choice's text as the worker produces it, from the job's event stream (fetch, not
// EventSource, so the key goes in a header).
async function follow(path, streamed, signal, target) {
  try {
    const response = await api(`${path}/events`, { raw: true, signal, headers: { Accept: "text/event-stream" } });
    if (!response.ok) return;
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const block = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        const event = /^event: ?(.*)$/m.exec(block)?.[1];
        const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.replace(/^data: ?/, "")).join("\n");
        if (event === "delta") streamed.text += JSON.parse(data).text;
        if (event === "restart") {
          streamed.text = "";
          streamed.attempt = JSON.parse(data).attempt;
        }
        const pre = target();
        if (pre && streamed.text.length >= pre.textContent.length) pre.textContent = streamed.text;
      }
    }
  } catch (error) {
    if (error.name !== "AbortError") console.warn("event stream ended", error);
  }
}

function renderJob(j, head, outputs, timeline, streamed) {
  const cancel = h("button", { id: "cancel", onclick: async () => {
    cancel.disabled = true;
    try {
      await api(`/v1/jobs/${encodeURIComponent(j.id)}/cancel`, { method: "POST" });
    } catch (error) {
      alertLine(head, error);
    }
  } }, "Cancel");
  cancel.disabled = j.status !== "queued" && j.status !== "running" || j.cancel_requested;
  head.replaceChildren(h("h2", {}, "Job ", h("code", {}, j.id), " ", status(j.status), " ", cancel),
    h("section", {}, h("dl", {}, [
      ["model", j.model], ["priority", j.priority], ["attempt", j.attempt], ["worker", j.worker_id ?? "–"],
      ["batch", j.batch_id ? batchLink(j.batch_id) : "–"], ["custom_id", j.custom_id ?? "–"],
      ["finish reason", j.finish_reason ?? "–"], ["cancel requested", String(j.cancel_requested)],
      ["usage", `${j.usage.prompt_tokens} prompt (${j.usage.cached_tokens} cached) + ${j.usage.completion_tokens} generated`],
      ["queued", fmt.time(j.timings.queued_at)], ["finished", fmt.time(j.timings.finished_at)],
      ["metadata", Object.entries(j.metadata).map(([k, v]) => `${k}=${v}`).join(" ") || "–"],
      ["webhook", j.webhook_url ?? "–"],
      ["params", h("code", {}, JSON.stringify(j.params))],
    ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)])),
    j.error ? h("p", { className: "error" }, "Error: ", j.error) : "",
  ));
  const choices = j.choices.length ? j.choices : [{ index: 0, text: j.output, finish_reason: j.finish_reason }];
  outputs.replaceChildren(h("h3", {}, "Output"), ...choices.map((c) => h("div", {},
    choices.length > 1 ? h("b", {}, `choice ${c.index}`, c.finish_reason ? ` (${c.finish_reason})` : "") : null,
    h("pre", { dataset: { choice: String(c.index) } }, c.index === 0 && streamed.text.length > c.text.length ? streamed.text : c.text))));
  renderTimeline(j, timeline);
}

function alertLine(holder, error) {
  holder.append(h("p", { className: "error" }, String(error.message)));
}

// Queue, prefill and decode on one time axis, then each token's latency against its index: token 0's
// is the time to first token (from being scheduled), every later one's the gap since the token before.
function renderTimeline(j, holder) {
  const t = j.timings;
  const times = t.token_times_ms;
  const queue = t.queue_time_ms;
  const prefill = t.time_to_first_token_ms;
  const end = t.finished_at && t.started_at ? Date.parse(t.finished_at) - Date.parse(t.started_at) : times.at(-1);
  const decode = prefill !== null && end !== undefined ? Math.max(0, end - prefill) : null;
  const phases = [["queue", queue], ["prefill", prefill], ["decode", decode]].filter(([, v]) => v !== null);
  const total = phases.reduce((sum, [, v]) => sum + v, 0) || 1;
  const nodes = [h("h3", {}, "Token timeline")];
  if (j.attempt > 1) {
    nodes.push(h("p", { className: "restart" }, `Restarted: this is run ${j.attempt}. ${j.attempt - 1} earlier run(s) ` +
      "ended when their worker went away, and the job was requeued; the queue time below counts from the first submission, " +
      "and the tokens are this run's."));
  }
  nodes.push(h("div", { className: "phases", dataset: { phases: phases.map(([n]) => n).join(" ") } },
    phases.map(([name, v]) => h("div", { className: `phase-${name}`, style: `flex:${Math.max(v / total, 0.002)}`, title: `${name}: ${fmt.ms(v)}` },
      `${name} ${fmt.ms(v)}`))));
  nodes.push(h("div", { className: "legend" }, phases.map(([name, v]) => h("span", {}, h("i", { className: `phase-${name}` }), `${name}: ${fmt.ms(v)}`)),
    h("span", {}, `mean per output token: ${fmt.ms(t.mean_time_per_output_token_ms)}`)));
  if (times.length) {
    const index = times.map((_, i) => i);
    const gaps = times.map((v, i) => (i === 0 ? null : v - times[i - 1]));
    const ttft = times.map((v, i) => (i === 0 ? v : null));
    nodes.push(lineChart("timeline", "Latency of each token (ms)", ["token index", "inter-token ms", "time to first token"],
      [index, gaps, ttft], { width: 900, height: 260, scales: { x: { time: false } }, points: [false, true] }));
  } else {
    delete pagedq.charts.timeline;
    nodes.push(h("p", { className: "muted" }, "no token yet"));
  }
  holder.replaceChildren(...nodes);
}

function deliveryTable(list) {
  if (!list.length) return h("p", { className: "muted" }, "none");
  return h("table", {}, h("tr", {}, ["event", "url", "status", "attempts"].map((t) => h("th", {}, t))),
    list.map((d) => h("tr", {}, h("td", {}, d.event_type), h("td", {}, d.url), h("td", {}, status(d.status)),
      h("td", {}, d.attempts.map((a) => h("div", {}, `${fmt.time(a.at)}: ${a.status_code ?? "–"} in ${fmt.ms(a.latency_ms)}${a.error ? ` (${a.error})` : ""}`))))));
}

// ---- batches ----

function batches() {
  const list = h("div");
  show(h("h2", {}, "Batches"), list);
  return repeat(async () => {
    const page = await api("/v1/batches?limit=100");
    list.replaceChildren(page.data.length ? h("table", {},
      h("tr", {}, ["batch", "status", "created", "progress", "endpoint"].map((t) => h("th", {}, t))),
      page.data.map((b) => h("tr", {}, h("td", {}, batchLink(b.id)), h("td", {}, status(b.status), " ", atRisk(b)), h("td", {}, fmt.unix(b.created_at)),
        h("td", {}, `${b.request_counts.completed + b.request_counts.failed} / ${b.request_counts.total}`), h("td", {}, b.endpoint))))
      : h("p", { className: "muted" }, "no batches"));
  });
}

function batch(id) {
  const path = `/v1/batches/${encodeURIComponent(id)}`;
  const head = h("div");
  const errors = h("div");
  const latency = h("section", { className: "charts" });
  const list = h("section", {}, h("h3", {}, "Jobs"));
  show(head, errors, latency, list);
  return repeat(async () => {
    const b = await api(path);
    const c = b.request_counts;
    const percent = c.total ? (100 * (c.completed + c.failed)) / c.total : 100;
    const cancel = h("button", { id: "cancel", disabled: !["in_progress", "validating"].includes(b.status), onclick: async () => {
      cancel.disabled = true;
      await api(`${path}/cancel`, { method: "POST" }).catch((error) => alertLine(head, error));
    } }, "Cancel");
    head.replaceChildren(h("h2", {}, "Batch ", h("code", {}, b.id), " ", status(b.status), " ", atRisk(b), " ", cancel),
      h("section", {},
        h("div", { className: "bar", id: "progress", dataset: { percent: percent.toFixed(1) }, title: `${percent.toFixed(1)} %` },
          h("div", { className: "done", style: `width:${c.total ? (100 * c.completed) / c.total : 0}%` }),
          h("div", { className: "bad", style: `width:${c.total ? (100 * c.failed) / c.total : 0}%` })),
        h("p", {}, `${c.completed} succeeded, ${c.failed} failed or cancelled, of ${c.total} (${percent.toFixed(1)} %)`),
        h("dl", {}, [["endpoint", b.endpoint], ["created", fmt.unix(b.created_at)], ["estimated end", fmt.unix(b.estimated_completion_at)],
          ["window ends", fmt.unix(b.expires_at)], ["completed", fmt.unix(b.completed_at)],
          ["tokens", `${b.usage.input_tokens} in, ${b.usage.output_tokens} out`],
          ["metadata", Object.entries(b.metadata || {}).map(([k, v]) => `${k}=${v}`).join(" ") || "–"],
          ["input file", download(b.input_file_id, "input")], ["output file", download(b.output_file_id, "output")],
          ["error file", download(b.error_file_id, "errors")]].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]))));
    errors.replaceChildren(b.errors ? h("section", {}, h("h3", {}, "Errors"), h("table", {},
      h("tr", {}, ["line", "code", "param", "message"].map((t) => h("th", {}, t))),
      b.errors.data.map((e) => h("tr", {}, h("td", { className: "num" }, e.line ?? "–"), h("td", {}, e.code), h("td", {}, e.param ?? "–"), h("td", {}, e.message))))) : "");
    const l = await api(`${path}/latency`);
    latency.replaceChildren(histogram("End-to-end latency (succeeded jobs)", l.e2e_latency), histogram("Queue time", l.queue_time));
    const page = await api(`/v1/jobs?batch_id=${encodeURIComponent(id)}&limit=100`);
    list.replaceChildren(h("h3", {}, "Jobs"), jobTable(page.data),
      page.has_more ? h("p", {}, h("a", { href: `#/jobs?batch_id=${encodeURIComponent(id)}` }, "all its jobs →")) : "");
    return ["completed", "failed", "cancelled", "expired"].includes(b.status);
  });
}

// A file through the API (with the key), saved under its id.
function download(fileId, label) {
  if (!fileId) return "–";
  return h("a", { href: "#", className: "download", dataset: { file: fileId }, onclick: async (event) => {
    event.preventDefault();
    const response = await api(`/v1/files/${encodeURIComponent(fileId)}/content`, { raw: true });
    const url = URL.createObjectURL(await response.blob());
    h("a", { href: url, download: `${fileId}.jsonl` }).click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  } }, `${label} (${fileId})`);
}

// ---- routing: #/, #/jobs?…, #/job/<id>, #/batches, #/batch/<id> ----

function route() {
  stopView();
  showKeyState();
  const [path, query] = location.hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query || "");
  const [, view, id] = path.split("/");
  const views = { jobs: () => jobs(params), job: () => job(decodeURIComponent(id)), batches, batch: () => batch(decodeURIComponent(id)) };
  stopView = (views[view] || overview)();
}

window.addEventListener("hashchange", route);
route();
