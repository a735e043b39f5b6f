// The tideflow web UI: one ES module, no build step, no dependencies. Every value from
// the server is put into the page as text (never as HTML). Live updates come from the
// API's server-sent event streams (/streams/...): the page never polls.

const SVG = "http://www.w3.org/2000/svg";
// A step's shown states (runtime/shown.py): the core's, and what its compensation made it.
const STATUSES = ["pending", "ready", "running", "retrying", "waiting", "succeeded", "failed", "skipped", "cancelled", "compensating", "compensated", "compensation_failed"];
// How an attempt ends (runtime/shown.py): `running` only while it runs.
const OUTCOMES = ["running", "succeeded", "failed", "cancelled", "lost", "timed_out"];
const RUN_TERMINAL = new Set(["succeeded", "failed", "cancelled", "timed_out", "compensated", "compensation_failed"]);
const HISTORY_ROW = 22;
const MAX_LANES = 200;

const state = { me: null, streams: [], cleanup: [] };

// Extension point: panels on the run page (the "why is this run not moving" panel goes
// here). A panel is {id, title, render(runView, element)}; it is called on every update.
export const runPanels = [];
window.tideflow = { runPanels };

// "Why is this run not moving?": GET /runs/{id}/why (runtime/why.py), read again (at most
// once a second) when the run changes, and once more a second later: a reason can change
// without the run changing (a worker stops, a timer falls overdue).
const STUCK = new Set(["no_engine", "no_consumer", "worker_gone", "timer_overdue"]);
const whyPanels = new Map();
runPanels.push({
  id: "why",
  title: "Why is this run where it is?",
  render(view, element) {
    let panel = whyPanels.get(element);
    if (!panel || panel.runId !== view.run_id) {
      const runId = view.run_id;
      panel = { runId, refresh: throttled(() => renderWhy(runId, element), 1000) };
      whyPanels.set(element, panel);
    }
    panel.refresh();
  },
});

async function renderWhy(runId, element) {
  const found = await api(`/runs/${runId}/why`);
  const items = found.reasons.map((r) => h("li", { class: STUCK.has(r.kind) ? "why stuck" : "why", "data-kind": r.kind },
    h("span", { class: "muted" }, r.kind.replaceAll("_", " ")), " ", r.text));
  element.replaceChildren(h("h2", {}, "Why is this run where it is?"), h("ul", { id: "why-reasons" }, items));
}

function h(tag, attrs = {}, ...children) {
  const el = tag.startsWith("svg:") ? document.createElementNS(SVG, tag.slice(4)) : document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "style") el.style.cssText = value; // CSSOM: allowed by the page's CSP
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

class HttpError extends Error {
  constructor(status, detail) { super(detail); this.status = status; }
}

async function api(path, options = {}) {
  const method = options.method || "GET";
  const headers = { "X-Tideflow-UI": "1", Accept: "application/json" };
  // the server refuses a request that changes something without a JSON Content-Type,
  // body or no body (docs/security.md: Browsers)
  if (method !== "GET" || options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, {
    method,
    credentials: "same-origin",
    headers,
    body: options.body === undefined ? undefined : JSON.stringify(options.body),
  });
  if (response.status === 204) return null;
  const body = await response.json().catch(() => ({}));
  if (!response.ok) {
    if (response.status === 401 && !options.noLogin) whoami(); // shows the right login
    throw new HttpError(response.status, body.detail || response.statusText);
  }
  return body;
}

const may = (action) => state.me && state.me.actions.includes(action);
// The API writes times as ISO 8601 strings (docs/api.md); epoch seconds are what the page
// computes with (a number is taken as it is: an older server wrote them so).
const epoch = (t) => (typeof t === "string" ? Date.parse(t) / 1000 : t);
const when = (t) => (t ? new Date(epoch(t) * 1000).toLocaleString() : "—");
const seconds = (a, b) => (a && b ? `${(epoch(b) - epoch(a)).toFixed(2)} s` : "");
const json = (value) => JSON.stringify(value, null, 2);
const badge = (status) => h("span", { class: `badge ${status}`, "data-status": status }, status.replace("_", " "));

function stream(path, event, onData) {
  const source = new EventSource(path, { withCredentials: true });
  source.addEventListener(event, (e) => onData(JSON.parse(e.data)));
  source.addEventListener("problem", (e) => console.warn("stream", path, e.data));
  state.streams.push(source);
  return source;
}

function leave() {
  for (const s of state.streams) s.close();
  for (const f of state.cleanup) f();
  state.streams = [];
  state.cleanup = [];
}

function show(...nodes) {
  const view = document.getElementById("view");
  view.replaceChildren(...nodes.filter((node) => node instanceof Node));
}

function note(text, error = false) {
  return h("div", { class: error ? "note error" : "note", role: error ? "alert" : "status" }, text);
}

// -- login -------------------------------------------------------------------------

function showLogin(mode) {
  leave();
  document.getElementById("me").replaceChildren();
  if (mode === "link") {
    show(h("div", { class: "panel login" }, h("h1", {}, "Open the link"),
      h("p", {}, "This UI opens with the one-time link `tideflow ui` printed. That link was used already? Stop `tideflow ui` and start it again for a new one.")));
    return;
  }
  const input = h("input", { type: "password", id: "token", placeholder: "tf_…", autocomplete: "off", "aria-label": "API token" });
  const message = h("div");
  const form = h("form", {
    class: "panel login",
    onsubmit: async (e) => {
      e.preventDefault();
      try {
        await api("/ui/login", { method: "POST", body: { token: input.value }, noLogin: true });
        await start();
      } catch (err) {
        message.replaceChildren(note(err.message, true));
      }
    },
  }, h("h1", {}, "Log in"), h("p", { class: "muted" }, "An API token (`tideflow tokens create`); its role decides what you may do."),
  input, h("button", { class: "primary", type: "submit" }, "Log in"), message);
  show(form);
}

async function whoami() {
  const response = await fetch("/ui/whoami", { credentials: "same-origin" });
  const body = await response.json();
  if (!response.ok) { showLogin(body.login); return null; }
  return body;
}

function renderMe() {
  const me = document.getElementById("me");
  const out = state.me.login === "none" ? null : h("button", {
    onclick: async () => { await api("/ui/logout", { method: "POST" }).catch(() => null); location.reload(); },
  }, "Log out");
  me.replaceChildren(`${state.me.name} · ${state.me.role}`, out || "");
}

// -- runs list ---------------------------------------------------------------------

// The list pages by the API's cursors (newest first): the hash keeps the filters, the
// page size and `pages`, the cursors of the pages paged through (the last is the page
// shown), so that Newer goes back one and a link or a reload shows the same page. Each
// page is live: its stream sends it again when any run changes.
const PAGE_SIZES = [20, 50, 100, 200];

async function runsPage(params) {
  const definitions = await api("/definitions");
  const names = [...new Set(definitions.definitions.map((d) => d.name))];
  const titles = titlesOf(definitions.definitions);
  const limit = Math.min(500, Math.max(1, Math.floor(Number(params.get("limit")) || 50)));
  const pages = (params.get("pages") || "").split(",").filter(Boolean);
  const workflow = h("select", { id: "filter-workflow", "aria-label": "Definition" },
    h("option", { value: "" }, "All definitions"), names.map((n) => h("option", { value: n, selected: params.get("workflow") === n }, titles.get(n) ? `${titles.get(n)} (${n})` : n)));
  const status = h("select", { id: "filter-status", "aria-label": "Status" }, h("option", { value: "" }, "Any status"),
    [...RUN_TERMINAL, "pending", "running", "compensating"].sort().map((s) => h("option", { value: s, selected: params.get("status") === s }, s)));
  const size = h("select", { id: "page-size", "aria-label": "Runs per page" },
    [...new Set([...PAGE_SIZES, limit])].sort((a, b) => a - b).map((n) => h("option", { value: n, selected: n === limit }, `${n} per page`)));
  const go = (trail) => {
    const q = new URLSearchParams();
    if (workflow.value) q.set("workflow", workflow.value);
    if (status.value) q.set("status", status.value);
    if (Number(size.value) !== 50) q.set("limit", size.value);
    if (trail.length) q.set("pages", trail.join(","));
    location.hash = `#/runs?${q}`;
  };
  for (const select of [workflow, status, size]) select.addEventListener("change", () => go([]));
  const newest = h("button", { id: "page-newest", disabled: !pages.length, onclick: () => go([]) }, "Newest");
  const newer = h("button", { id: "page-newer", disabled: !pages.length, onclick: () => go(pages.slice(0, -1)) }, "Newer");
  const older = h("button", { id: "page-older", disabled: true }, "Older");
  const body = h("tbody", { id: "runs" });
  const live = h("span", { class: "muted", id: "live" }, "connecting…");
  show(h("h1", {}, "Runs"), h("div", { class: "filters" }, workflow, status, size, live),
    h("table", {}, h("thead", {}, h("tr", {}, ["Run", "Definition", "Version", "Status", "Created", "Updated"].map((t) => h("th", {}, t)))), body),
    h("div", { class: "filters pager" }, newest, newer, older));
  const query = new URLSearchParams({ limit: String(limit) });
  for (const key of ["workflow", "status"]) if (params.get(key)) query.set(key, params.get(key));
  if (pages.length) query.set("cursor", pages[pages.length - 1]);
  const first = pages.length * limit + 1;
  const source = stream(`/streams/runs?${query}`, "runs", (page) => {
    const last = first + page.runs.length - 1;
    live.textContent = `live · ${!page.runs.length ? "no runs" : last === first ? `run ${first}` : `runs ${first}–${last}`}`;
    older.disabled = !page.next_cursor;
    older.onclick = () => go([...pages, page.next_cursor]);
    body.replaceChildren(...page.runs.map((run) => h("tr", {
      class: "row", "data-run": run.run_id, onclick: () => { location.hash = `#/runs/${run.run_id}`; },
    }, h("td", {}, h("a", { href: `#/runs/${run.run_id}` }, run.run_id)), h("td", { class: "workflow" }, named(run.title, run.workflow)), h("td", {}, run.version),
    h("td", {}, badge(run.status)), h("td", {}, when(run.created_at)), h("td", {}, when(run.updated_at)))));
    if (!page.runs.length) body.replaceChildren(h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No runs.")));
  });
  source.onerror = () => { live.textContent = "reconnecting…"; };
}

// -- the graph ---------------------------------------------------------------------

function drawGraph(graph, onPick) {
  const svg = h("svg:svg", { class: "graph", width: graph.width, height: graph.height, viewBox: `0 0 ${graph.width} ${graph.height}`, role: "img", "aria-label": `graph of ${graph.name}` });
  const w = graph.node_width, hh = graph.node_height;
  for (const edge of graph.edges) {
    // through the bends the layout gave it, vertical at every point
    const pts = edge.points;
    let d = `M${pts[0][0]},${pts[0][1]}`;
    for (let i = 1; i < pts.length; i += 1) {
      const [px, py] = pts[i - 1];
      const [x, y] = pts[i];
      const end = i === pts.length - 1 ? y - 6 : y;
      const mid = (py + end) / 2;
      d += ` C${px},${mid} ${x},${mid} ${x},${end}`;
    }
    svg.append(h("svg:path", { class: edge.nested ? "edge nested" : "edge", d, "marker-end": "url(#arrow)", "data-edge": `${edge.source}>${edge.target}` }));
    if (edge.label) {
      const [[x1, y1], [x2, y2]] = pts;
      const text = edge.label.length > 24 ? `${edge.label.slice(0, 23)}…` : edge.label;
      // halfway down its first stretch, on the side it leans to
      const anchor = x2 < x1 - 1 ? "end" : "start";
      const x = (x1 + x2) / 2 + (anchor === "end" ? -4 : 4);
      svg.append(h("svg:text", { class: "edge-label", x, y: (y1 + y2) / 2, "text-anchor": anchor }, text, h("svg:title", {}, edge.label)));
    }
  }
  svg.prepend(h("svg:defs", {}, h("svg:marker", { id: "arrow", viewBox: "0 0 10 10", refX: 5, refY: 5, markerWidth: 6, markerHeight: 6, orient: "auto" },
    h("svg:path", { d: "M0,0 L10,5 L0,10 z", fill: "#94a3b8" }))));
  const nodes = new Map();
  for (const node of graph.nodes) {
    const sub = h("svg:text", { class: "sub", x: w / 2, y: 32 }, node.type);
    const g = h("svg:g", { class: "node status-none", transform: `translate(${node.x},${node.y})`, "data-step": node.id, "data-status": "none", tabindex: 0, role: "button", "aria-label": `step ${node.id}`,
      onclick: () => onPick && onPick(node.id), onkeydown: (e) => { if (e.key === "Enter" && onPick) onPick(node.id); } },
    h("svg:rect", { width: w, height: hh, rx: 8 }), h("svg:text", { x: w / 2, y: 15 }, node.id.length > 22 ? `${node.id.slice(0, 21)}…` : node.id), sub);
    svg.append(g);
    nodes.set(node.id, { g, sub, type: node.type });
  }
  return { svg, nodes };
}

function paintGraph(drawn, view) {
  for (const [id, { g, sub, type }] of drawn.nodes) {
    const step = view.steps[id];
    const status = step ? step.status : "pending";
    g.setAttribute("class", `node status-${status}${g.classList.contains("selected") ? " selected" : ""}`);
    g.setAttribute("data-status", status);
    if (step && step.instances > 1) {
      const done = (step.counts.succeeded || 0) + (step.counts.skipped || 0) + (step.counts.compensated || 0);
      sub.textContent = `${type} · ${done}/${step.instances} done${step.counts.failed ? ` · ${step.counts.failed} failed` : ""}`;
    } else {
      sub.textContent = step && step.attempts > 1 ? `${type} · ${step.attempts} attempts` : type;
    }
  }
}

function legend() {
  return h("div", { class: "legend", id: "legend" }, STATUSES.map((s) => badge(s)));
}

function outcomeLegend() {
  return h("div", { class: "legend outcomes" }, OUTCOMES.map((o) => h("span", { class: "outcome", "data-outcome": o },
    h("svg:svg", { width: 14, height: 10 }, h("svg:rect", { class: `bar ${o}`, width: 14, height: 10, rx: 2 })), ` ${o.replace("_", " ")}`)),
  h("span", { class: "outcome", "data-outcome": "compensation" },
    h("svg:svg", { width: 14, height: 10 }, h("svg:rect", { class: "bar succeeded compensation", width: 14, height: 10, rx: 2 })), " compensation"));
}

// -- run page ----------------------------------------------------------------------

async function runPage(runId) {
  const [graph, first] = await Promise.all([api(`/runs/${runId}/graph`), api(`/runs/${runId}/state`)]);
  let view = first;
  let picked = null;
  const head = h("div", { class: "run-head" });
  const detail = h("div", { class: "panel", id: "step-detail" }, h("p", { class: "muted" }, "Click a step to see its input, output, error and attempts."));
  const why = h("section", { id: "why-panel", class: "panel" });
  const drawn = drawGraph(graph, (id) => pick(id));
  const tabs = h("div", { class: "tabs" });
  const tabBody = h("div", { class: "panel", id: "tab-body" });
  let tab = "timeline";

  async function pick(id) {
    picked = id;
    for (const [other, { g }] of drawn.nodes) g.classList.toggle("selected", other === id);
    await renderDetail(0);
  }

  async function renderDetail(offset) {
    if (!picked) return;
    const [step, logs] = await Promise.all([
      api(`/runs/${runId}/steps/${encodeURIComponent(picked)}?offset=${offset}&limit=20`),
      api(`/runs/${runId}/logs?step=${encodeURIComponent(picked)}`),
    ]);
    const parts = [h("h2", {}, `Step ${step.step} `, h("span", { class: "muted" }, `(${step.type})`))];
    if (!step.total) parts.push(h("p", { class: "muted" }, "Not reached yet."));
    for (const inst of step.instances) {
      // one instance: open; a map's or loop's many: one line each, opened on a click
      parts.push(h("details", { class: "instance", "data-key": inst.key, open: step.total === 1 },
        h("summary", {}, h("strong", {}, inst.key), " ", badge(inst.status), " ", h("span", { class: "muted" }, `${inst.attempts} attempt(s) ${seconds(inst.started_at, inst.finished_at)}`)),
        inst.input !== null ? [h("div", { class: "muted" }, "input"), h("pre", {}, json(inst.input))] : null,
        inst.output !== null ? [h("div", { class: "muted" }, "output"), h("pre", { class: "output" }, json(inst.output))] : null,
        inst.error ? [h("div", { class: "muted" }, "error"), h("pre", { class: "error" }, json(inst.error))] : null,
        stepOutput(logs.attempts.filter((a) => a.step_key === inst.key)),
        inst.child_run_id ? h("a", { href: `#/runs/${inst.child_run_id}` }, `child run ${inst.child_run_id}`) : null));
      if (step.signal && inst.status === "waiting") parts.push(signalForm(step.signal));
    }
    if (step.total > step.instances.length) {
      parts.push(h("div", { class: "filters" },
        h("button", { disabled: offset === 0, onclick: () => renderDetail(Math.max(0, offset - 20)) }, "Previous"),
        h("span", { class: "muted" }, `${offset + 1}–${offset + step.instances.length} of ${step.total}`),
        h("button", { disabled: offset + 20 >= step.total, onclick: () => renderDetail(offset + 20) }, "Next")));
    }
    detail.replaceChildren(...parts.filter((part) => part instanceof Node));
  }

  // what each ended attempt of an instance wrote (GET /runs/{id}/logs): its stdout,
  // stderr and logging records, as text (never markup)
  function stepOutput(attempts) {
    const written = attempts.filter((a) => Object.keys(a.streams).length);
    if (!written.length) return null;
    return h("div", { class: "step-output" }, written.flatMap((a) => [
      h("div", { class: "muted" }, `attempt ${a.attempt}${a.compensation ? " (compensation)" : ""}: ${a.outcome}`),
      ...Object.entries(a.streams).flatMap(([name, stream]) => [
        h("div", { class: "muted" }, stream.truncated ? `${name} (the last part: ${stream.truncated} bytes before it dropped)` : name),
        h("pre", { class: `log ${name}`, "data-stream": name, "data-attempt": a.attempt }, stream.text),
      ]),
    ]));
  }

  function signalForm(name) {
    if (!may("signal")) return note(`Waiting for signal ${name}. Your role (${state.me.role}) may not send signals.`);
    const payload = h("textarea", { id: "signal-payload", rows: 5, "aria-label": "signal payload (JSON)" }, "{}");
    const out = h("div");
    return h("form", {
      class: "signal-form",
      onsubmit: async (e) => {
        e.preventDefault();
        let body;
        try { body = JSON.parse(payload.value || "null"); } catch (err) { out.replaceChildren(note(`The payload is not JSON: ${err.message}`, true)); return; }
        try {
          const sent = await api(`/runs/${runId}/signals`, { method: "POST", body: { name, payload: body } });
          out.replaceChildren(note(`Signal ${name}: ${sent.status}`));
        } catch (err) { out.replaceChildren(note(err.message, true)); }
      },
    }, h("h2", {}, `Send signal ${name}`), payload, h("button", { class: "primary", type: "submit", id: "send-signal" }, "Send signal"), out);
  }

  function renderHead() {
    const actions = h("div", { class: "actions" });
    const running = ["pending", "running"].includes(view.status);
    if (running && may("cancel")) actions.append(h("button", { class: "danger", id: "cancel", onclick: () => act("cancel") }, "Cancel"));
    if (["failed", "timed_out"].includes(view.status) && may("retry")) actions.append(h("button", { id: "retry", onclick: () => act("retry") }, "Retry"));
    const waits = view.waiting_for.map((w) => `${w.signal} (step ${w.step_key})`).join(", ");
    head.replaceChildren(h("h1", {}, `Run ${view.run_id}`), h("span", { id: "run-status" }, badge(view.status)),
      h("span", { class: "muted", id: "run-workflow" }, `${view.title ? `${view.title} (${view.workflow} ${view.version})` : `${view.workflow} ${view.version}`} · started ${when(view.created_at)}${view.finished_at ? ` · ended ${when(view.finished_at)}` : ""}`),
      waits ? h("span", { class: "muted", id: "waiting-for" }, `waiting for ${waits}`) : "", actions);
    if (view.error) head.append(h("div", { style: "flex-basis:100%" }, note(`${view.error.type}: ${view.error.message}`, true)));
  }

  async function act(what) {
    try {
      await api(`/runs/${runId}/${what}`, { method: "POST", body: { reason: `${what} from the web UI` } });
      if (!live) follow(); // a retried run moves again
    } catch (err) { head.append(note(err.message, true)); }
  }

  // Reads overlap (a click while a live refresh is on its way): only the last one asked
  // for fills the body, or a slow history read would land under the Timeline tab.
  let tabAsked = 0;
  async function renderTab() {
    const mine = ++tabAsked;
    const shown = tab;
    for (const b of tabs.children) b.classList.toggle("on", b.dataset.tab === shown);
    let body;
    if (shown === "timeline") body = gantt(await api(`/runs/${runId}/attempts?limit=2000`));
    else if (shown === "history") body = historyList((await api(`/runs/${runId}/history`)).events);
    else body = h("pre", {}, json(view.output));
    if (mine === tabAsked) tabBody.replaceChildren(body);
  }
  for (const [key, label] of [["timeline", "Timeline"], ["history", "History"], ["output", "Output"]]) {
    tabs.append(h("button", { "data-tab": key, onclick: () => { tab = key; renderTab(); } }, label));
  }

  const refreshDetail = throttled(() => renderDetail(0), 250);
  const refreshTab = throttled(renderTab, 2000);
  const refreshTabNow = throttled(renderTab, 250);
  let live = null;
  function follow() {
    live = stream(`/streams/runs/${runId}`, "run", update);
  }
  function update(next) {
    view = next;
    if (RUN_TERMINAL.has(view.status) && live) { live.close(); live = null; } // or it reconnects
    renderHead();
    paintGraph(drawn, view);
    for (const panel of runPanels) panel.render(view, why);
    refreshDetail();
    // the timeline and the history read the whole history: at most every 2 s while the
    // run moves, and once more when it ends
    if (RUN_TERMINAL.has(view.status)) refreshTabNow();
    else refreshTab();
  }

  show(head, h("div", { class: "layout" },
    h("div", {}, h("div", { class: "panel graph-box" }, drawn.svg), legend(), tabs, tabBody),
    h("div", {}, detail, why)));
  renderHead();
  paintGraph(drawn, view);
  for (const panel of runPanels) panel.render(view, why);
  renderTab();
  if (!RUN_TERMINAL.has(view.status)) follow();
}

// fn at most once per `ms`, the last call always honoured (trailing): updates come from
// the server's stream, this only spaces out the reads they cause
function throttled(fn, ms) {
  let timer = null;
  let again = false;
  const fire = async () => {
    again = false;
    await Promise.resolve(fn()).catch(() => null);
    timer = setTimeout(() => { timer = null; if (again) schedule(); }, ms);
  };
  const schedule = () => {
    if (timer) { again = true; return; }
    timer = setTimeout(fire, 0);
  };
  return schedule;
}

function lane(stepKey, compensation = false) {
  // a compensation's attempts have a lane of their own, under the step they undo
  return stepKey.replace(/\[\d+\]/g, "[*]").replace(/@\d+\//g, "@*/") + (compensation ? " ↺ compensate" : "");
}

function gantt(list) {
  if (!list.attempts.length) return h("p", { class: "muted" }, "No attempt yet (engine steps such as switch, set and wait run none).");
  const lanes = [...new Set(list.attempts.map((a) => lane(a.step_key, a.compensation)))].slice(0, MAX_LANES);
  const row = new Map(lanes.map((l, i) => [l, i]));
  const now = Date.now() / 1000;
  const t0 = Math.min(...list.attempts.map((a) => epoch(a.started_at) || now));
  const t1 = Math.max(...list.attempts.map((a) => epoch(a.ended_at) || now), t0 + 0.001);
  const left = 160, width = 760, rowH = 18;
  const x = (t) => left + ((t - t0) / (t1 - t0)) * width;
  // scaled to the card's width (viewBox): a bar near the end stays inside the card
  const W = left + width + 10, H = lanes.length * rowH + 24;
  const svg = h("svg:svg", { class: "gantt", viewBox: `0 0 ${W} ${H}`, width: W, height: H, preserveAspectRatio: "xMinYMin meet" });
  lanes.forEach((l, i) => svg.append(h("svg:text", { class: "lane-label", x: 4, y: i * rowH + 13 }, l.length > 24 ? `${l.slice(0, 23)}…` : l)));
  // Bars closer than a pixel in one lane and of one outcome are drawn as one: a lane of
  // 10,000 attempts is a few rectangles, not 10,000.
  const bars = new Map();
  for (const a of list.attempts) {
    const i = row.get(lane(a.step_key, a.compensation));
    if (i === undefined || !a.started_at) continue;
    const from = x(epoch(a.started_at)), to = Math.max(from + 2, x(epoch(a.ended_at) || now));
    const key = `${i} ${a.outcome}`;
    const open = bars.get(key) || [];
    const last = open[open.length - 1];
    if (last && from <= last.to + 1) { last.to = Math.max(last.to, to); last.n += 1; last.a = a; }
    else open.push({ from, to, n: 1, a, i });
    bars.set(key, open);
  }
  for (const [, open] of bars) {
    for (const bar of open) {
      const a = bar.a;
      const what = a.compensation ? "compensation attempt" : "attempt";
      const title = bar.n > 1 ? `${bar.n} attempts of ${lane(a.step_key, a.compensation)}: ${a.outcome}`
        : `${a.step_key} ${what} ${a.attempt}: ${a.outcome.replace("_", " ")} ${seconds(a.started_at, a.ended_at)}${a.error ? ` — ${a.error}` : ""}${a.worker ? ` on ${a.worker}` : ""}`;
      svg.append(h("svg:rect", { class: `bar ${a.outcome}${a.compensation ? " compensation" : ""}`, x: bar.from, y: bar.i * rowH + 3, width: bar.to - bar.from, height: rowH - 6, rx: 2,
        "data-attempts": bar.n, "data-step": a.step_key, "data-outcome": a.outcome, "data-compensation": a.compensation ? "true" : "false" }, h("svg:title", {}, title)));
    }
  }
  svg.append(h("svg:text", { class: "lane-label", x: left, y: lanes.length * rowH + 18 }, `0 s … ${(t1 - t0).toFixed(2)} s`));
  const shown = list.total > list.attempts.length ? ` (the first ${list.attempts.length} of ${list.total})` : "";
  return h("div", {}, h("div", { class: "muted" }, `${list.total} attempt(s)${shown}, one lane per step (and per compensation)`), svg, outcomeLegend());
}

function historyList(entries) {
  // Virtualised: only the rows in sight are in the page, whatever the history's length.
  const box = h("div", { class: "virtual", id: "history" });
  const spacer = h("div", { style: `height:${entries.length * HISTORY_ROW}px` });
  box.append(spacer);
  const text = (e) => {
    const subject = e.event.step_key ? ` ${e.event.step_key}` : "";
    const moves = e.transitions.map((t) => `${t.subject}: ${t.old || "·"}→${t.new}`).join(", ");
    return `#${e.seq} ${when(e.time)} ${e.kind}${subject}${e.event.name ? ` ${e.event.name}` : ""}  ${moves}`;
  };
  const render = () => {
    const first = Math.floor(box.scrollTop / HISTORY_ROW);
    const count = Math.ceil(box.clientHeight / HISTORY_ROW) + 4;
    const rows = entries.slice(first, first + count).map((e, i) => h("div", { class: "vrow", style: `top:${(first + i) * HISTORY_ROW}px` }, text(e)));
    box.replaceChildren(spacer, ...rows);
  };
  box.addEventListener("scroll", render);
  requestAnimationFrame(render);
  return h("div", {}, h("div", { class: "muted" }, `${entries.length} event(s)`), box);
}

// -- definitions and queues -----------------------------------------------------------

// A definition's `title:` (any language) is shown where its name is, the name beside it:
// the name stays the id of URLs, filters and the API.
function named(title, name) {
  return title ? [h("span", { class: "title" }, title), " ", h("span", { class: "muted" }, name)] : name;
}

function titlesOf(definitions) { // name -> the title of its last listed version that has one
  const titles = new Map();
  for (const d of definitions) if (d.title) titles.set(d.name, d.title);
  return titles;
}

async function definitionsPage(name, version) {
  const list = await api("/definitions");
  const rows = list.definitions.map((d) => h("tr", { class: "row", onclick: () => { location.hash = `#/definitions/${encodeURIComponent(d.name)}/${encodeURIComponent(d.version)}`; } },
    h("td", { class: "workflow" }, named(d.title, d.name)), h("td", {}, d.version), h("td", {}, d.active ? "active" : "inactive"), h("td", {}, when(d.created_at)),
    h("td", {}, may("definitions") ? h("button", {
      onclick: async (e) => { e.stopPropagation(); await api(`/definitions/${encodeURIComponent(d.name)}/${encodeURIComponent(d.version)}/${d.active ? "deactivate" : "activate"}`, { method: "POST" }); route(); },
    }, d.active ? "Deactivate" : "Activate") : "")));
  const parts = [h("h1", {}, "Definitions"), h("table", {}, h("thead", {}, h("tr", {}, ["Name", "Version", "State", "Registered", ""].map((t) => h("th", {}, t)))), h("tbody", {}, rows))];
  if (name && version) {
    const graph = await api(`/definitions/${encodeURIComponent(name)}/${encodeURIComponent(version)}/graph`);
    parts.push(h("h2", {}, graph.title ? `${graph.title} (${graph.name} ${graph.version})` : `${graph.name} ${graph.version}`), h("div", { class: "panel graph-box" }, drawGraph(graph, null).svg));
  }
  show(...parts);
}

async function queuesPage() {
  const [body, seen] = await Promise.all([api("/queues"), api("/workers")]);
  const now = Date.now() / 1000;
  const workers = seen.workers.map((w) => h("tr", { class: w.live ? "" : "stopped" }, h("td", {}, w.worker),
    h("td", {}, w.queues === null ? "all" : w.queues.join(", ")), h("td", {}, w.live ? "live" : "stopped"),
    h("td", {}, `${Math.max(now - epoch(w.last_beat), 0).toFixed(1)} s ago`)));
  const rows = body.queues.map((q) => h("tr", {}, h("td", {}, q.queue), h("td", {}, q.priority), h("td", {}, q.depth), h("td", {}, q.held),
    h("td", {}, q.oldest_age === null ? "—" : `${q.oldest_age.toFixed(1)} s`), h("td", {}, q.consumers)));
  show(h("h1", {}, "Queues"), body.unserved.length ? note(`No worker reads: ${body.unserved.join(", ")}`, true) : null,
    h("table", {}, h("thead", {}, h("tr", {}, ["Queue", "Priority", "Waiting", "Held", "Oldest", "Workers"].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 6, class: "muted" }, "No queue has tasks.")))),
    h("h2", {}, "Workers"),
    h("table", { class: "workers" }, h("thead", {}, h("tr", {}, ["Worker", "Queues", "State", "Last heartbeat"].map((t) => h("th", {}, t)))),
      h("tbody", {}, workers.length ? workers : h("tr", {}, h("td", { colspan: 4, class: "muted" }, "No worker reads this bus.")))),
    h("p", {}, h("button", { onclick: () => route() }, "Refresh")));
}

// -- unmatched events: the event gateway's dead letter (docs/events.md) -------------

async function eventsPage(message = null) {
  const list = await api("/events/unmatched?limit=1000");
  const replay = async (event) => {
    try {
      const done = await api(`/events/unmatched/${encodeURIComponent(event.key)}/replay`, { method: "POST" });
      const text = done.status !== "unmatched"
        ? `Replayed ${event.id}: ${done.status} to ${[...done.delivered_to, ...done.started].join(", ")}.`
        : `Replayed ${event.id}: still unmatched (${done.reason}).`;
      await eventsPage(note(text, done.status === "unmatched"));
    } catch (err) {
      await eventsPage(note(err.message, true));
    }
  };
  const rows = list.events.map((e) => h("tr", { class: "unmatched", "data-key": e.key },
    h("td", {}, e.type), h("td", {}, e.source), h("td", {}, e.id), h("td", {}, e.run_id || "—"),
    h("td", {}, when(e.received_at)), h("td", {}, e.reason || ""),
    h("td", {}, may("signal") ? h("button", { class: "replay", onclick: () => replay(e) }, "Replay") : "")));
  show(h("h1", {}, "Unmatched events"), message,
    h("p", { class: "muted" }, "Events no run took and no trigger started, when they came or before their buffer ended. A replay delivers one again, as if it arrived now."),
    h("table", { id: "unmatched" }, h("thead", {}, h("tr", {}, ["Type", "Source", "Id", "Run", "Received", "Why", ""].map((t) => h("th", {}, t)))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 7, class: "muted" }, "No unmatched event.")))),
    h("p", {}, h("button", { onclick: () => route() }, "Refresh")));
}

// -- routing -----------------------------------------------------------------------

async function route() {
  leave();
  const [path, query] = (location.hash.slice(1) || "/runs").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === parts[0]);
  try {
    if (parts[0] === "runs" && parts[1]) await runPage(parts[1]);
    else if (parts[0] === "definitions") await definitionsPage(parts[1], parts[2]);
    else if (parts[0] === "queues") await queuesPage();
    else if (parts[0] === "events") await eventsPage();
    else await runsPage(new URLSearchParams(query || ""));
  } catch (err) {
    if (!(err instanceof HttpError && err.status === 401)) show(note(err.message, true));
  }
}

async function start() {
  state.me = await whoami();
  if (!state.me) return;
  renderMe();
  window.onhashchange = route;
  await route();
}

start();
