// The zkcontroller console: reads /api/v1, redraws on every server-sent event from ZooKeeper watches.
// Plain browser JavaScript, no build step. Tasks come a page at a time, read at the source (GET /tasks with a
// cursor, filtered by group, state and broker on the server): the first paint reads the status (the
// controller's summary) and one page, whatever the size of the cluster; "more" reads the next page.
"use strict";

const API = "/api/v1";
const PAGE = 200;
const COLOURS = ["#2b6cb0", "#2f855a", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#b83280", "#718096",
                 "#c05621", "#276749", "#553c9a", "#2c5282"];
const state = { status: null, tasks: [], intervals: [], want: PAGE, cursor: null, owners: new Map(),
                colours: new Map(), inflight: false, dirty: false, timer: null, painted: false };
const $ = (id) => document.getElementById(id);

function token() { return $("token").value.trim(); }
$("token").value = localStorage.getItem("zkc-token") || "";
$("token").addEventListener("input", () => { localStorage.setItem("zkc-token", token()); render(); });

function toast(text) {
  const t = $("toast"); t.textContent = text; t.style.display = "block";
  clearTimeout(toast.h); toast.h = setTimeout(() => { t.style.display = "none"; }, 4000);
}

async function getJSON(path) {
  const r = await fetch(API + path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: ${r.status}`);
  return r.json();
}

// The first `state.want` tasks matching the server-side filters, in pages of at most 1,000 read at the source;
// returns the rows and the cursor of the page after them (null after the last).
async function getTasks() {
  const q = new URLSearchParams();
  for (const [param, id] of [["group", "filter-group"], ["state", "filter-state"], ["owner", "filter-broker"]]) {
    if ($(id).value) q.set(param, $(id).value);
  }
  let rows = [], cursor = "";
  while (cursor !== null && rows.length < state.want) {
    q.set("cursor", cursor);
    q.set("limit", String(Math.min(1000, state.want - rows.length)));
    const r = await fetch(`${API}/tasks?${q}`, { cache: "no-store" });
    if (!r.ok) throw new Error(`/tasks: ${r.status}`);
    const page = await r.json();
    if (!Array.isArray(page)) break;
    rows = rows.concat(page);
    cursor = r.headers.get("X-Next-Cursor");
  }
  return { rows, cursor };
}

async function act(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const r = await fetch(API + path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) { toast(`${method} ${path}: ${data.message || r.status}`); return null; }
  scheduleRefresh();
  return data;
}

// ---- untrusted data ---------------------------------------------------------------------------------
// Every string below comes from ZooKeeper, where any broker (anyone, on an unsecured root) can write: it is
// only ever put into the page as text (textContent, DOM properties), never parsed as HTML; enumerations are
// checked against what the product writes, numbers against being numbers. The page's Content-Security-Policy
// forbids inline script, so a spot missed here still cannot run anything.
const TASK_STATES = new Set(["RUNNING", "STARTING", "RESTARTING", "FAILED", "COMPLETED", "STOPPED", "PAUSED",
                             "UNASSIGNED", "STALE", "ASSIGNED", "INVALID"]);
const SPEC_STATES = new Set(["RUNNING", "PAUSED", "STOPPED"]);
const GROUP_STATES = new Set(["Empty", "PreparingRebalance", "AwaitingSync", "Stable", "Reconciling", "Dead"]);

function text(v, fallback = "-") {
  if (v === null || v === undefined || v === "") return fallback;
  return typeof v === "string" || typeof v === "number" || typeof v === "boolean" ? String(v) : "invalid";
}
function num(v, fallback = "-") {
  if (v === null || v === undefined) return fallback;
  return typeof v === "number" && Number.isFinite(v) ? String(v) : "invalid";
}
function time(v) { return typeof v === "number" && Number.isFinite(v) ? v : null; }
function oneOf(set, v, fallback = "-") {
  if (v === null || v === undefined || v === "") return fallback;
  return set.has(v) ? v : "invalid";
}

// A pipeline's figures, from the metrics its owner reports: counts and rates only if they are finite,
// non-negative numbers (anything else is "invalid" or left out), the rate history at most 20 such numbers.
function count(v) {
  if (v === null || v === undefined) return "-";
  return typeof v === "number" && Number.isInteger(v) && v >= 0 ? String(v) : "invalid";
}
function rate(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0) return "invalid";
  return v >= 100 ? v.toFixed(0) : v.toFixed(1);
}
// A load share (batch time / trigger interval, smoothed): within 0..10 or "invalid"; past 1 it falls behind.
function share(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number" || !Number.isFinite(v) || v < 0 || v > 10) return "invalid";
  return v.toFixed(2) + (v > 1 ? " behind" : "");
}
// A broker's load report (bounded by the server, checked again here): its tasks' load shares summed, its CPU.
function brokerLoad(b) {
  const l = b.load && typeof b.load === "object" ? b.load : null;
  if (!l) return "-";
  const fig = (v, top) => typeof v === "number" && Number.isFinite(v) && v >= 0 && v <= top;
  const load = fig(l.load, 1e6) ? l.load.toFixed(2) : "invalid";
  return load + (fig(l.cpu_percent, 102400) ? ` · ${l.cpu_percent.toFixed(0)}% cpu` : "");
}
function history(m) {
  const h = Array.isArray(m.rate_history) ? m.rate_history.slice(-20) : [];
  return h.filter((v) => typeof v === "number" && Number.isFinite(v) && v >= 0);
}

// The input rate of the last batches as a small SVG line, built element by element (no markup is parsed;
// SVG presentation attributes, not style attributes, so the page's style-src policy holds).
const SVG_NS = "http://www.w3.org/2000/svg";
function sparkline(values) {
  const w = 64, ht = 16, svg = document.createElementNS(SVG_NS, "svg");
  for (const [k, v] of [["class", "spark"], ["width", w], ["height", ht], ["viewBox", `0 0 ${w} ${ht}`]]) {
    svg.setAttribute(k, String(v));
  }
  const title = document.createElementNS(SVG_NS, "title");
  title.textContent = values.length ? `input rows/s, last ${values.length} batches: ${values.map((v) => v.toFixed(1)).join(", ")}`
    : "no batch yet";
  svg.append(title);
  if (values.length < 2) return svg;
  const top = Math.max(...values) || 1;
  const points = values.map((v, i) => `${(1 + i * (w - 2) / (values.length - 1)).toFixed(1)},`
    + `${(ht - 1 - (v / top) * (ht - 2)).toFixed(1)}`).join(" ");
  const line = document.createElementNS(SVG_NS, "polyline");
  for (const [k, v] of [["points", points], ["fill", "none"], ["stroke", "#2b6cb0"], ["stroke-width", "1.5"]]) {
    line.setAttribute(k, v);
  }
  svg.append(line);
  return svg;
}

const SESSION_STATES = new Set(["starting", "ready", "lazy", "failed"]);
function session(b) {  // a broker's compute session: "ready 9.8s", "starting 4s", "lazy", "failed"
  const s = b.session && typeof b.session === "object" ? b.session : null;
  if (!s) return "-";
  const st = oneOf(SESSION_STATES, s.state);
  if (st === "ready" && time(s.startup_s) !== null) return `ready ${s.startup_s.toFixed(1)}s`;
  if (st === "starting" && time(s.since)) return `starting ${ago(s.since)}`;
  return st;
}

// h("td", {className: "x", title: "..."}, "text", child, ...): properties set as properties, children as text
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "style") Object.assign(el.style, v);
    else el[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}
function swatch(broker) {
  return h("i", { className: "dot", style: { background: colour(broker) } });
}

function colour(broker) {
  if (!state.colours.has(broker)) state.colours.set(broker, COLOURS[state.colours.size % COLOURS.length]);
  return state.colours.get(broker);
}

function ago(ts) {
  ts = time(ts);
  if (!ts) return "-";
  const s = Math.max(0, Date.now() / 1000 - ts);
  return s < 120 ? `${s.toFixed(0)}s` : s < 7200 ? `${(s / 60).toFixed(0)}m` : `${(s / 3600).toFixed(1)}h`;
}

// ---- refresh: one at a time, coalescing bursts of events -------------------------------------------
function scheduleRefresh(delay = 200) {
  if (state.timer) return;
  state.timer = setTimeout(() => { state.timer = null; refresh(); }, delay);
}

async function refresh() {
  if (state.inflight) { state.dirty = true; return; }
  state.inflight = true;
  try {
    const since = Date.now() / 1000 - Number($("window").value);
    const [status, tasks, intervals] = await Promise.all([getJSON("/status"), getTasks(),
                                                          getJSON(`/intervals?since=${since}`)]);
    state.status = status && typeof status === "object" ? status : null;
    state.tasks = tasks.rows.filter((t) => t && typeof t.task_id === "string");
    state.cursor = typeof tasks.cursor === "string" ? tasks.cursor : null;
    state.intervals = Array.isArray(intervals) ? intervals.filter((i) => i && typeof i.task_id === "string"
      && typeof i.broker === "string" && time(i.start) !== null) : [];
    render();
  } catch (e) {
    $("controller").textContent = "API unreachable: " + e.message;
  } finally {
    state.inflight = false;
    if (state.dirty) { state.dirty = false; scheduleRefresh(); }
  }
}

// ---- rendering --------------------------------------------------------------------------------------
function taskState(t) {
  let s;
  if (t.invalid) s = "INVALID";
  else if (t.state === "PAUSED" || t.state === "STOPPED") s = t.state;
  else if (t.shown === "UNASSIGNED" || t.shown === "STALE") s = t.shown;
  else if (!t.owner) s = t.status || "UNASSIGNED";  // a finished task nobody needs to hold
  else s = t.status || "ASSIGNED";
  return TASK_STATES.has(s) ? s : "invalid";
}

function stateNote(t, s) {  // what STALE and UNASSIGNED stand for, as a tooltip and a suffix
  if (s === "UNASSIGNED" && time(t.unassigned_since)) return ` ${ago(t.unassigned_since)}`;
  return "";
}

function versionText(t) {  // the spec's version, and the one its owner runs while that is another
  if (!Number.isSafeInteger(t.revision)) return "-";
  const runs = Number.isSafeInteger(t.status_revision) && t.status_revision !== t.revision;
  return `v${t.revision}` + (runs ? ` (runs v${t.status_revision})` : "");
}

function stateTitle(t, s) {
  if (s === "STALE") return `last reported ${oneOf(TASK_STATES, t.status)} by ${text(t.status_broker)} ${ago(t.status_updated)} ago; that broker's session no longer holds the task`;
  if (s === "UNASSIGNED") return "no broker holds this task";
  if (s === "invalid") return "the state recorded in ZooKeeper is not one this product writes";
  return "";
}

function filtered() {  // group, state and broker are filtered by the server; the id among the rows read
  const want = $("filter-text").value.trim();
  return state.tasks.filter((t) => !want || t.task_id.includes(want));
}

function fillSelect(id, values, label) {
  const sel = $(id), cur = sel.value;
  sel.replaceChildren(new Option(label, ""), ...values.map((v) => new Option(v, v)));
  sel.value = values.includes(cur) ? cur : "";
}

function strings(list) { return Array.isArray(list) ? list.filter((v) => typeof v === "string") : []; }

function renderStatus(st) {
  const c = st.controller && typeof st.controller === "object" ? st.controller : null;
  const m = st.maintenance && typeof st.maintenance === "object" ? st.maintenance : null;
  const on = !!(m && m.on === true);
  $("maintenance").hidden = !on;
  const lost = m ? strings(m.offline) : [];
  const since = m && time(m.since) ? new Date(m.since * 1000).toLocaleTimeString() : "-";
  $("maintenance").textContent = on ? `Maintenance mode since ${since} (by ${text(m.by)}): ${text(m.reason, "")} — nothing moves; tasks of lost brokers wait` + (lost.length ? ` (lost: ${lost.join(", ")})` : "") : "";
  $("controller").textContent = c ? `controller ${text(c.controller_id)} · epoch ${num(c.epoch)}` : `no active controller (last epoch ${num(st.controller_epoch)})`;
  const brokers = Array.isArray(st.brokers) ? st.brokers.filter((b) => b && typeof b.broker_id === "string") : [];
  const groups = Array.isArray(st.groups) ? st.groups.filter((g) => g && typeof g.group === "string") : [];
  $("broker-count").textContent = `(${brokers.length})`;
  $("brokers").tBodies[0].replaceChildren(...brokers.map((b) => h("tr", { dataset: { broker: b.broker_id } },
    h("td", {}, swatch(b.broker_id), " ", b.broker_id), h("td", {}, num(b.epoch)), h("td", {}, text(b.group)),
    h("td", {}, text(b.rack)), h("td", {}, num(b.capacity)), h("td", {}, num(b.tasks)),
    h("td", { className: "load" }, brokerLoad(b)),
    h("td", { className: "session", title: b.session && typeof b.session.error === "string" ? b.session.error : "" }, session(b)),
    h("td", { className: "path", title: text(b.checkpoint_root, "") }, text(b.checkpoint_root).slice(0, 80)),
    h("td", {}, b.shutting_down === true ? "shutting down" : ""))));
  $("group-count").textContent = `(${groups.length})`;
  $("groups").tBodies[0].replaceChildren(...groups.map((g) => h("tr", { dataset: { group: g.group } },
    h("td", {}, g.group), h("td", {}, g.state ? oneOf(GROUP_STATES, g.state) : text(g.error)), h("td", {}, num(g.generation)),
    h("td", {}, text(g.protocol)), h("td", {}, text(g.leader)), h("td", {}, strings(g.members).join(", ")),
    h("td", {}, (g.moving || g.deferred ? `${num(g.moving)} moving, ${num(g.deferred)} waiting` : "-")
      + (g.held ? `, ${num(g.held)} held` : "")),
    // members given no work (backed off, refused, ghosts): their names, the reasons on hover
    h("td", { className: "apart", title: strings(g.ignored).slice(0, 20).join("\n") },
      strings(g.ignored).slice(0, 20).map((x) => x.split(":")[0].slice(0, 100)).join(", ") || "-"))));
  fillSelect("filter-broker", brokers.map((b) => b.broker_id), "all brokers");
  const tasks = st.tasks && typeof st.tasks === "object" ? st.tasks : {};
  const counted = tasks.by_group && typeof tasks.by_group === "object" ? Object.keys(tasks.by_group) : [];
  fillSelect("filter-group", [...new Set([...groups.map((g) => g.group), ...counted])].sort(), "all groups");
}

function taskRow(t, disabled) {
  const s = taskState(t), m = t.metrics && typeof t.metrics === "object" ? t.metrics : {};
  const owner = typeof t.owner === "string" && t.owner ? t.owner : null;
  const moved = state.owners.has(t.task_id) && state.owners.get(t.task_id) !== t.owner;
  const button = (cls, label) => h("button", { className: cls, disabled, title: disabled ? "enter the admin token above" : "" }, label);
  const error = typeof t.error === "string" ? t.error : "";
  return h("tr", { dataset: { task: t.task_id }, className: moved ? "moved" : "" },
    h("td", {}, t.task_id), h("td", {}, text(t.group)),
    h("td", { className: "spec" }, oneOf(SPEC_STATES, t.state)),
    h("td", { className: "version" }, versionText(t)),
    h("td", { className: `state s-${s}`, title: stateTitle(t, s) }, s + stateNote(t, s)),
    h("td", { className: "owner" }, ...(owner ? [swatch(owner), " ", owner] : ["-"])),
    h("td", {}, count(m.rows)), h("td", { className: "rate" }, rate(m.input_rows_per_s), " ", sparkline(history(m))),
    h("td", { className: "load" }, share(m.load_share)),
    h("td", { className: "backlog" }, count(m.backlog_files)), h("td", {}, ago(t.owner_since)),
    h("td", { className: "error", title: error ? `${error} (click: why it failed)` : "click: its last failure" }, error),
    h("td", { className: "actions" }, ...(t.state === "PAUSED" || t.state === "STOPPED" ? [button("resume", "resume")]
        : [button("pause", "pause"), button("stop", "stop")]),
      button("restart", "restart"), button("reassign", "reassign")));
}

function render() {
  if (state.status) renderStatus(state.status);
  const page = filtered();
  const total = state.status && state.status.tasks && typeof state.status.tasks === "object"
    ? state.status.tasks.total : null;
  $("task-count").textContent = `(${page.length} shown, ${state.tasks.length} read${state.cursor === null ? "" : ", more"}`
    + ` of ${num(total)})`;
  $("more").disabled = state.cursor === null;
  const disabled = !token();
  $("tasks").tBodies[0].replaceChildren(...page.map((t) => taskRow(t, disabled)));
  const now = Date.now() / 1000;
  for (const t of state.tasks) {
    const owner = typeof t.owner === "string" ? t.owner : null;
    state.owners.set(t.task_id, owner);
    observe(t.task_id, owner, now);
  }
  drawTimeline(page.map((t) => t.task_id));
  if (!state.painted && state.status) {
    state.painted = true;
    window.zkcFirstPaint = performance.now();
    document.body.dataset.ready = "1";
  }
}

// What this page saw itself, refresh by refresh: a broker killed before it flushed its recorded intervals
// still shows for as long as the page saw it own a task. The page's own sightings are approximate (they end
// when the page next looked): they fill gaps but are never counted as two owners at once.
const seen = new Map();  // task -> [{broker, start, end}]
function observe(task, owner, now) {
  if (!seen.has(task)) seen.set(task, []);
  const segs = seen.get(task), last = segs[segs.length - 1];
  if (last && last.broker === owner) { last.end = now; return; }
  if (last && last.broker) last.end = now;
  segs.push({ broker: owner, start: now, end: now });
  while (segs.length > 50) segs.shift();
}

function drawTimeline(taskIds) {
  const canvas = $("timeline");
  const shown = taskIds.slice(0, 60);
  const rowH = Math.max(3, Math.min(14, Math.floor(400 / Math.max(1, shown.length))));
  canvas.width = canvas.clientWidth || 900;
  canvas.height = Math.max(40, shown.length * rowH + 20);
  const g = canvas.getContext("2d");
  g.clearRect(0, 0, canvas.width, canvas.height);
  const now = Date.now() / 1000, span = Number($("window").value), left = 110, w = canvas.width - left - 10;
  const x = (t) => left + Math.max(0, Math.min(1, (t - (now - span)) / span)) * w;
  const row = new Map(shown.map((t, i) => [t, i]));
  const byTask = new Map();
  for (const iv of state.intervals) {
    if (!row.has(iv.task_id)) continue;
    if (!byTask.has(iv.task_id)) byTask.set(iv.task_id, []);
    byTask.get(iv.task_id).push({ ...iv, end: time(iv.end), recorded: true });
  }
  for (const t of shown) {  // what the page saw, where the recorded intervals say nothing of that broker then
    const ivs = byTask.get(t) || [];
    for (const s of seen.get(t) || []) {
      if (!s.broker) continue;
      const covered = ivs.some((iv) => iv.broker === s.broker && iv.start <= s.start + 1 && (iv.end ?? now) >= s.end - 1);
      if (covered) continue;
      // ends where a recorded run of another broker begins: the page only saw the move when it next looked
      const next = ivs.filter((iv) => iv.recorded && iv.broker !== s.broker && iv.start > s.start && iv.start < s.end);
      const end = next.length ? Math.min(...next.map((iv) => iv.start)) : s.end;
      ivs.push({ task_id: t, broker: s.broker, start: s.start, end, recorded: false });
    }
    if (ivs.length) byTask.set(t, ivs);
  }
  g.font = "11px system-ui"; g.fillStyle = "#6b7385";
  shown.forEach((t, i) => { if (rowH >= 9) g.fillText(t.length > 16 ? t.slice(0, 15) + "…" : t, 4, 12 + i * rowH + rowH / 2); });
  let overlaps = 0;
  for (const [t, ivs] of byTask) {
    const y = 6 + row.get(t) * rowH;
    ivs.sort((a, b) => a.start - b.start);
    ivs.forEach((iv, k) => {
      const end = iv.end ?? now;
      g.fillStyle = colour(iv.broker);
      g.fillRect(x(iv.start), y, Math.max(1, x(end) - x(iv.start)), rowH - 2);
      if (!iv.recorded) return;
      for (const other of ivs.slice(k + 1)) {  // two owners at once, as the brokers recorded it: outline it
        const oEnd = other.end ?? now;
        if (other.recorded && other.broker !== iv.broker && other.start < end && iv.start < oEnd) {
          overlaps += 1;
          g.strokeStyle = "#c53030"; g.lineWidth = 2;
          g.strokeRect(x(Math.max(iv.start, other.start)), y - 1, Math.max(2, x(Math.min(end, oEnd)) - x(Math.max(iv.start, other.start))), rowH);
        }
      }
    });
  }
  canvas.dataset.overlaps = String(overlaps);
  g.fillStyle = "#6b7385";
  g.fillText(`-${span / 60} min`, left, canvas.height - 4);
  g.fillText("now", canvas.width - 30, canvas.height - 4);
  $("legend").replaceChildren(...[...state.colours].map(([b, c]) => h("span", {}, h("i", { style: { background: c } }), b)));
}

// Why a task failed: its last failure from GET /tasks/{id}, every field put in as text (the trace in a <pre>).
async function showFailure(taskId) {
  let d;
  try { d = await getJSON(`/tasks/${encodeURIComponent(taskId)}`); } catch (e) { toast(e.message); return; }
  const f = d && typeof d.last_failure === "object" && d.last_failure !== null ? d.last_failure : null;
  const at = time(f && f.at);
  $("failure-task").textContent = taskId;
  $("failure-summary").textContent = f
    ? `${at === null ? "-" : new Date(at * 1000).toISOString()} · ${text(f.kind)} · ${num(f.restarts)} restart(s) before it: ${text(f.error)}`
    : "no failure recorded";
  $("failure-trace").textContent = f ? text(f.trace, "(no stack trace)") : "";
  $("failure").hidden = false;
}
$("failure-close").addEventListener("click", () => { $("failure").hidden = true; });

// ---- events: actions, filters, paging, the live stream ----------------------------------------------
$("tasks").addEventListener("click", async (ev) => {
  const button = ev.target.closest("button");
  const tr = ev.target.closest("tr");
  if (!button && tr && tr.dataset.task && ev.target.closest("td.error, td.state")) {
    await showFailure(tr.dataset.task);
    return;
  }
  if (!button || !tr || button.disabled) return;
  const id = encodeURIComponent(tr.dataset.task);
  if (button.classList.contains("pause")) await act("PUT", `/tasks/${id}/pause`);
  else if (button.classList.contains("resume")) await act("PUT", `/tasks/${id}/resume`);
  else if (button.classList.contains("stop")) await act("PUT", `/tasks/${id}/stop`);
  else if (button.classList.contains("restart")) await act("POST", `/tasks/${id}/restart`);
  else if (button.classList.contains("reassign")) {
    const to = prompt(`Move ${tr.dataset.task} to which broker?`);
    if (to) await act("POST", `/tasks/${id}/reassign`, { to });
  }
});
$("filter-text").addEventListener("input", () => render());
for (const id of ["filter-group", "filter-state", "filter-broker"]) {
  $(id).addEventListener("input", () => { state.want = PAGE; scheduleRefresh(0); });
}
$("window").addEventListener("change", () => scheduleRefresh(0));
$("more").addEventListener("click", () => { state.want += PAGE; scheduleRefresh(0); });

function connect() {
  const es = new EventSource(API + "/events");
  es.onopen = () => { $("live").textContent = "live"; $("live").className = "pill on"; scheduleRefresh(0); };
  es.onmessage = () => scheduleRefresh();
  es.onerror = () => { $("live").textContent = "reconnecting…"; $("live").className = "pill off"; };
}

// The event stream opens once the first paint is done: subscribing starts the server's watch of the whole
// cluster (a read of every task, the first time), which would otherwise compete with the first page.
refresh().finally(connect);
setInterval(() => scheduleRefresh(0), 15000);  // the clock moves on ("since last move") even when nothing happens
