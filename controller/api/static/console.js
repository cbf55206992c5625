// The zkcontroller console: reads /api/v1, redraws on every server-sent event from ZooKeeper watches.
// Plain browser JavaScript, no build step. At 10,000 tasks the table shows one filtered page at a time.
"use strict";

const API = "/api/v1";
const PAGE = 200;
const COLOURS = ["#2b6cb0", "#2f855a", "#d69e2e", "#805ad5", "#dd6b20", "#319795", "#b83280", "#718096",
                 "#c05621", "#276749", "#553c9a", "#2c5282"];
const state = { status: null, tasks: [], intervals: [], page: 0, owners: new Map(), colours: new Map(),
                inflight: false, dirty: false, timer: null, painted: false };
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

async function act(method, path, body) {
  const headers = { "Content-Type": "application/json" };
  if (token()) headers.Authorization = "Bearer " + token();
  const r = await fetch(API + path, { method, headers, body: body ? JSON.stringify(body) : undefined });
  const data = await r.json().catch(() => ({}));
  if (!r.ok) { toast(`${method} ${path}: ${data.message || r.status}`); return null; }
  scheduleRefresh();
  return data;
}

function esc(v) {
  return String(v ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
}

function colour(broker) {
  if (!state.colours.has(broker)) state.colours.set(broker, COLOURS[state.colours.size % COLOURS.length]);
  return state.colours.get(broker);
}

function ago(ts) {
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
    const [status, tasks, intervals] = await Promise.all([getJSON("/status"), getJSON("/tasks"),
                                                          getJSON(`/intervals?since=${since}`)]);
    state.status = status; state.tasks = tasks; state.intervals = intervals;
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
  if (t.invalid) return "INVALID";
  if (t.state === "PAUSED") return "PAUSED";
  if (t.shown === "UNASSIGNED" || t.shown === "STALE") return t.shown;
  if (!t.owner) return t.status || "UNASSIGNED";  // a finished task nobody needs to hold
  return t.status || "ASSIGNED";
}

function stateNote(t, s) {  // what STALE and UNASSIGNED stand for, as a tooltip and a suffix
  if (s === "UNASSIGNED" && t.unassigned_since) return ` ${ago(t.unassigned_since)}`;
  return "";
}

function stateTitle(t, s) {
  if (s === "STALE") return `last reported ${t.status} by ${t.status_broker} ${ago(t.status_updated)} ago; that broker's session no longer holds the task`;
  if (s === "UNASSIGNED") return "no broker holds this task";
  return "";
}

function filtered() {
  const text = $("filter-text").value.trim(), group = $("filter-group").value,
        st = $("filter-state").value, broker = $("filter-broker").value;
  return state.tasks.filter((t) => (!text || t.task_id.includes(text)) && (!group || t.group === group)
    && (!broker || t.owner === broker) && (!st || taskState(t) === st || t.state === st));
}

function fillSelect(id, values, label) {
  const sel = $(id), cur = sel.value;
  sel.innerHTML = `<option value="">${label}</option>` + values.map((v) => `<option>${esc(v)}</option>`).join("");
  sel.value = values.includes(cur) ? cur : "";
}

function render() {
  const st = state.status;
  if (st) {
    const c = st.controller;
    const m = st.maintenance;
    $("maintenance").hidden = !(m && m.on);
    $("maintenance").textContent = m && m.on ? `Maintenance mode since ${new Date(m.since * 1000).toLocaleTimeString()} (by ${m.by}): ${m.reason} — nothing moves; tasks of lost brokers wait` + (m.offline && m.offline.length ? ` (lost: ${m.offline.join(", ")})` : "") : "";
    $("controller").textContent = c ? `controller ${c.controller_id} · epoch ${c.epoch}` : `no active controller (last epoch ${st.controller_epoch ?? "-"})`;
    $("broker-count").textContent = `(${st.brokers.length})`;
    $("brokers").tBodies[0].innerHTML = st.brokers.map((b) => `<tr data-broker="${esc(b.broker_id)}">
      <td><i class="dot" style="display:inline-block;width:9px;height:9px;border-radius:2px;background:${colour(b.broker_id)}"></i> ${esc(b.broker_id)}</td>
      <td>${esc(b.epoch)}</td><td>${esc(b.group)}</td><td>${esc(b.rack || "-")}</td><td>${esc(b.capacity)}</td>
      <td>${esc(b.tasks)}</td><td>${b.shutting_down ? "shutting down" : ""}</td></tr>`).join("");
    $("group-count").textContent = `(${st.groups.length})`;
    $("groups").tBodies[0].innerHTML = st.groups.map((g) => `<tr data-group="${esc(g.group)}">
      <td>${esc(g.group)}</td><td>${esc(g.state || g.error)}</td><td>${esc(g.generation)}</td><td>${esc(g.protocol)}</td>
      <td>${esc(g.leader || "-")}</td><td>${esc((g.members || []).join(", "))}</td>
      <td>${g.moving || g.deferred ? `${esc(g.moving)} moving, ${esc(g.deferred)} waiting` : "-"}${g.held ? `, ${esc(g.held)} held` : ""}</td></tr>`).join("");
    fillSelect("filter-broker", st.brokers.map((b) => b.broker_id), "all brokers");
    fillSelect("filter-group", [...new Set(state.tasks.map((t) => t.group).filter(Boolean))].sort(), "all groups");
  }
  const rows = filtered();
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  state.page = Math.min(state.page, pages - 1);
  const page = rows.slice(state.page * PAGE, (state.page + 1) * PAGE);
  $("page").textContent = `${state.page + 1} / ${pages}`;
  $("task-count").textContent = `(${rows.length} of ${state.tasks.length})`;
  const can = token() ? "" : "disabled title=\"enter the admin token above\"";
  $("tasks").tBodies[0].innerHTML = page.map((t) => {
    const s = taskState(t), m = t.metrics || {};
    const moved = state.owners.has(t.task_id) && state.owners.get(t.task_id) !== t.owner ? " class=\"moved\"" : "";
    const pauseOrResume = t.state === "PAUSED" ? `<button class="resume" ${can}>resume</button>` : `<button class="pause" ${can}>pause</button>`;
    return `<tr data-task="${esc(t.task_id)}"${moved}><td>${esc(t.task_id)}</td><td>${esc(t.group)}</td>
      <td class="spec">${esc(t.state || "-")}</td><td class="state s-${s}" title="${esc(stateTitle(t, s))}">${s}${esc(stateNote(t, s))}</td>
      <td class="owner">${t.owner ? `<i style="display:inline-block;width:9px;height:9px;border-radius:2px;background:${colour(t.owner)}"></i> ${esc(t.owner)}` : "-"}</td>
      <td>${esc(m.rows ?? "-")}</td><td>${esc(m.processed_rows_per_s ?? "-")}</td><td>${ago(t.owner_since)}</td>
      <td class="error" title="${esc(t.error)}">${esc(t.error || "")}</td>
      <td class="actions">${pauseOrResume}<button class="restart" ${can}>restart</button><button class="reassign" ${can}>reassign</button></td></tr>`;
  }).join("");
  const now = Date.now() / 1000;
  for (const t of state.tasks) {
    state.owners.set(t.task_id, t.owner);
    observe(t.task_id, t.owner, now);
  }
  drawTimeline(page.map((t) => t.task_id));
  if (!state.painted && state.status) {
    state.painted = true;
    window.zkcFirstPaint = performance.now();
    document.body.dataset.ready = "1";
  }
}

// What this page saw itself, refresh by refresh: a broker killed before it flushed its recorded intervals
// still shows for as long as the page saw it own a task.
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
    byTask.get(iv.task_id).push(iv);
  }
  for (const t of shown) {  // what the page saw, where the recorded intervals say nothing of that broker then
    for (const s of seen.get(t) || []) {
      if (!s.broker) continue;
      const ivs = byTask.get(t) || [];
      const covered = ivs.some((iv) => iv.broker === s.broker && iv.start <= s.start + 1 && (iv.end ?? now) >= s.end - 1);
      if (!covered) { ivs.push({ task_id: t, broker: s.broker, start: s.start, end: s.end }); byTask.set(t, ivs); }
    }
  }
  g.font = "11px system-ui"; g.fillStyle = "#6b7385";
  shown.forEach((t, i) => { if (rowH >= 9) g.fillText(t.length > 16 ? t.slice(0, 15) + "…" : t, 4, 12 + i * rowH + rowH / 2); });
  for (const [t, ivs] of byTask) {
    const y = 6 + row.get(t) * rowH;
    ivs.sort((a, b) => a.start - b.start);
    ivs.forEach((iv, k) => {
      const end = iv.end ?? now;
      g.fillStyle = colour(iv.broker);
      g.fillRect(x(iv.start), y, Math.max(1, x(end) - x(iv.start)), rowH - 2);
      for (const other of ivs.slice(k + 1)) {  // two owners at once: outline the overlap
        const oEnd = other.end ?? now;
        if (other.broker !== iv.broker && other.start < end && iv.start < oEnd) {
          g.strokeStyle = "#c53030"; g.lineWidth = 2;
          g.strokeRect(x(Math.max(iv.start, other.start)), y - 1, Math.max(2, x(Math.min(end, oEnd)) - x(Math.max(iv.start, other.start))), rowH);
        }
      }
    });
  }
  g.fillStyle = "#6b7385";
  g.fillText(`-${span / 60} min`, left, canvas.height - 4);
  g.fillText("now", canvas.width - 30, canvas.height - 4);
  $("legend").innerHTML = [...state.colours].map(([b, c]) => `<span><i style="background:${c}"></i>${esc(b)}</span>`).join("");
}

// ---- events: actions, filters, paging, the live stream ----------------------------------------------
$("tasks").addEventListener("click", async (ev) => {
  const button = ev.target.closest("button");
  const tr = ev.target.closest("tr");
  if (!button || !tr || button.disabled) return;
  const id = encodeURIComponent(tr.dataset.task);
  if (button.classList.contains("pause")) await act("PUT", `/tasks/${id}/pause`);
  else if (button.classList.contains("resume")) await act("PUT", `/tasks/${id}/resume`);
  else if (button.classList.contains("restart")) await act("POST", `/tasks/${id}/restart`);
  else if (button.classList.contains("reassign")) {
    const to = prompt(`Move ${tr.dataset.task} to which broker?`);
    if (to) await act("POST", `/tasks/${id}/reassign`, { to });
  }
});
for (const id of ["filter-text", "filter-group", "filter-state", "filter-broker"]) {
  $(id).addEventListener("input", () => { state.page = 0; render(); });
}
$("window").addEventListener("change", () => scheduleRefresh(0));
$("prev").addEventListener("click", () => { state.page = Math.max(0, state.page - 1); render(); });
$("next").addEventListener("click", () => { state.page += 1; render(); });

function connect() {
  const es = new EventSource(API + "/events");
  es.onopen = () => { $("live").textContent = "live"; $("live").className = "pill on"; scheduleRefresh(0); };
  es.onmessage = () => scheduleRefresh();
  es.onerror = () => { $("live").textContent = "reconnecting…"; $("live").className = "pill off"; };
}

connect();
refresh();
setInterval(() => scheduleRefresh(0), 15000);  // the clock moves on ("since last move") even when nothing happens
