// rollstream ui: the page. Plain JavaScript, no build step. It polls the server's JSON API
// (/api/state, /api/groups, /api/trajectory/UID) and renders with textContent only: model
// replies and observations are data, never markup.
"use strict";

const POLL_MS = 1000;
const KNOWN_SNAPSHOT_KEYS = new Set([
  "run", "version", "val_round", "pause", "stopped", "sync", "ratio", "live_producers",
  "server_time", "producers", "modes", "batchers", "dropped", "redis", "model_servers",
  "warnings", "node",
]);
const PRODUCER_COLUMNS = ["id", "state", "heartbeat_age_s", "shards", "traj_per_s", "committed",
  "envs", "in_flight", "version", "paused", "cpu_percent", "rss_mb", "host", "pid"];
const BATCHER_COLUMNS = ["consumer", "state", "mode", "waiting_s", "wanted", "complete",
  "partial", "version", "batches", "delivered"];

const ui = {
  filters: { mode: "", tag: "", outcome: "all" },
  openGroups: new Set(),
  selected: null, // uid of the trajectory shown
  groups: new Map(), // key -> element
  lastState: null,
  groupsSignature: "",
};

// -- small DOM helpers ----------------------------------------------------------------------
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else if (name.startsWith("data-")) node.setAttribute(name, value);
    else node[name] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function setText(id, text) {
  const node = document.getElementById(id);
  if (node && node.textContent !== String(text)) node.textContent = String(text);
}

function fmt(value) {
  if (value === null || value === undefined) return "–";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return value.toLocaleString("en-US");
    return Math.abs(value) >= 100 ? value.toFixed(0) : Math.abs(value) >= 1 ?
      value.toFixed(2) : value.toPrecision(3);
  }
  if (typeof value === "boolean") return value ? "yes" : "no";
  if (Array.isArray(value)) return value.map(fmt).join(", ");
  if (typeof value === "object") {
    return Object.entries(value).map(([k, v]) => `${k}: ${fmt(v)}`).join("; ");
  }
  return String(value);
}

function ago(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const s = Math.max(0, seconds);
  return s < 60 ? `${s.toFixed(0)} s ago` : `${(s / 60).toFixed(1)} min ago`;
}

function table(rows, columns, opts = {}) {
  if (!rows.length) return el("p", { class: "muted", text: opts.empty || "none" });
  const cols = columns || [];
  if (opts.extraColumns) {
    // every other field the rows have (counters other parts add show up by themselves)
    for (const row of rows) {
      for (const key of Object.keys(row)) if (!cols.includes(key)) cols.push(key);
    }
  }
  const head = el("tr", {}, ...cols.map((c) => el("th", { text: c })));
  const body = rows.map((row) => el("tr", { class: opts.rowClass ? opts.rowClass(row) : "" },
    ...cols.map((c) => el("td", { text: fmt(row[c]) }))));
  return el("table", {}, el("thead", {}, head), el("tbody", {}, ...body));
}

function replace(id, node) {
  const holder = document.getElementById(id);
  holder.replaceChildren(node);
}

async function getJSON(url) {
  const response = await fetch(url, { cache: "no-store" });
  const body = await response.json();
  if (!response.ok) throw new Error(body.error || `${url}: HTTP ${response.status}`);
  return body;
}

// -- the run's state --------------------------------------------------------------------------
function renderState(state) {
  ui.lastState = state;
  const snap = state.snapshot || {};
  setText("run-name", state.run);
  const pause = (snap.pause || []).length ? `paused (${snap.pause.join(", ")})` : "running";
  const policy = state.config.policy || {};
  const model = policy.model ? ` · model ${policy.model}` : "";
  setText("run-line", `Redis ${state.redis} · ${snap.stopped ? "stopped" : pause} · ` +
    `policy ${policy.type}${model} · seed ${state.config.seed}`);
  const error = document.getElementById("error");
  error.hidden = !state.error;
  error.textContent = state.error || "";
  setText("stat-version", fmt(snap.version));
  setText("stat-mode", snap.sync ? "sync" : `async ≤ ${snap.ratio} stale`);
  setText("stat-producers", fmt(snap.live_producers));
  const live = (snap.producers || []).filter((p) => p.state === "live");
  setText("stat-throughput", fmt(live.reduce((a, p) => a + (p.traj_per_s || 0), 0)));
  setText("stat-committed", fmt((snap.producers || []).reduce((a, p) => a + (p.committed || 0), 0)));
  // generated tokens thrown away (producers' aborted turns, the batchers' stale and filtered
  // groups, ...): the total, with each reason in the tooltip
  const discarded = snap.tokens_discarded || {};
  setText("stat-discarded", fmt(Object.values(discarded).reduce((a, n) => a + n, 0)));
  document.getElementById("stat-discarded").title =
    Object.entries(discarded).map(([why, n]) => `${why}: ${n}`).join(", ") || "none";
  const tools = state.samples.tools || { calls: 0, malformed: 0 };
  setText("stat-tools", `${fmt(tools.calls)} (${fmt(tools.malformed)})`);
  setText("stat-samples", fmt(state.samples.received));
  setText("stat-redis", snap.redis ? `${fmt(snap.redis.used_mb)} MB` : "–");
  setText("stat-updated", state.updated_at ? ago(Date.now() / 1000 - state.updated_at) : "–");
  setText("sample-rate", `${(100 * state.config.sample_rate).toFixed(1)}%`);

  const warnings = document.getElementById("warnings");
  warnings.replaceChildren(...(snap.warnings || []).map((w) => el("li", { text: w })));

  replace("producers", table(snap.producers || [], [...PRODUCER_COLUMNS],
    { extraColumns: true, empty: "no producer yet",
      rowClass: (row) => row.state === "gone" ? "gone" : "" }));
  const servers = (snap.model_servers || []).map((s) => ({
    url: s.url, version: s.version, model: s.model,
    "set aside by": Object.entries(s.set_aside || {}).map(([p, why]) => `${p}: ${why}`).join("; "),
  }));
  const policyUrls = policy.base_urls || [];
  for (const url of policyUrls) {
    if (!servers.some((s) => s.url === url.replace(/\/$/, ""))) {
      servers.push({ url, version: "(not recorded)", model: policy.model, "set aside by": "" });
    }
  }
  replace("servers", table(servers, ["url", "version", "model", "set aside by"],
    { empty: "none (this policy needs no model server)" }));
  replace("batchers", table(snap.batchers || [], [...BATCHER_COLUMNS],
    { extraColumns: true, empty: "no batcher yet (a trainer's)" }));
  const tagRows = [];
  for (const [mode, info] of Object.entries(snap.modes || {})) {
    for (const [tag, figures] of Object.entries(info.tags || {})) {
      tagRows.push({ mode, tag, ...figures });
    }
  }
  replace("modes", table(tagRows, ["mode", "tag", "envs", "envs_running", "episodes_per_s",
    "success", "mean_actions", "committed"], { extraColumns: true }));
  const dropped = Object.entries(snap.dropped || {}).map(([reason, n]) => ({ reason, count: n }));
  replace("dropped", table(dropped, ["reason", "count"]));
  replace("counters", table(otherCounters(snap), ["counter", "value"],
    { empty: "none reported" }));
  renderCharts(state.history);
  renderTagOptions(state.samples.tags || []);
}

function otherCounters(snap) {
  // whatever else the status snapshot reports (counters other parts add), flattened
  const rows = [];
  const walk = (prefix, value) => {
    if (value !== null && typeof value === "object" && !Array.isArray(value)) {
      for (const [k, v] of Object.entries(value)) walk(prefix ? `${prefix}.${k}` : k, v);
    } else if (typeof value === "number" || typeof value === "string" || typeof value === "boolean") {
      rows.push({ counter: prefix, value });
    }
  };
  for (const [key, value] of Object.entries(snap)) {
    if (!KNOWN_SNAPSHOT_KEYS.has(key)) walk(key, value);
  }
  return rows;
}

// -- charts: SVG polylines ----------------------------------------------------------------------
function renderCharts(history) {
  chart("chart-throughput", "note-throughput", [{ points: history.throughput, cls: "line-a" }]);
  chart("chart-wait", "note-wait", [{ points: history.batch_wait, cls: "line-b" }]);
  chart("chart-staleness", "note-staleness", [
    { points: history.staleness_mean, cls: "line-a", name: "mean" },
    { points: history.staleness_max, cls: "line-c", name: "max" }]);
}

function chart(svgId, noteId, lines) {
  const svg = document.getElementById(svgId);
  const W = 320, H = 120, PAD = 4;
  const all = lines.flatMap((l) => l.points || []);
  const ns = "http://www.w3.org/2000/svg";
  svg.replaceChildren();
  if (!all.length) {
    setText(noteId, "no data yet");
    return;
  }
  const t0 = Math.min(...all.map((p) => p[0])), t1 = Math.max(...all.map((p) => p[0]));
  const top = Math.max(1e-9, ...all.map((p) => p[1]));
  const x = (t) => PAD + (W - 2 * PAD) * (t1 > t0 ? (t - t0) / (t1 - t0) : 1);
  const y = (v) => H - PAD - (H - 2 * PAD) * (v / top);
  for (const line of lines) {
    if (!line.points || !line.points.length) continue;
    const poly = document.createElementNS(ns, "polyline");
    poly.setAttribute("points", line.points.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" "));
    poly.setAttribute("class", line.cls);
    svg.append(poly);
  }
  const last = lines.map((l) => {
    const pts = l.points || [];
    return pts.length ? `${l.name ? l.name + " " : "now "}${fmt(pts[pts.length - 1][1])}` : null;
  }).filter(Boolean).join(" · ");
  setText(noteId, `${last} · top ${fmt(top)} · last ${fmt((t1 - t0) / 60)} min`);
}

// -- the browser of sampled groups ----------------------------------------------------------
function renderTagOptions(tags) {
  const select = document.getElementById("filter-tag");
  const have = new Set([...select.options].map((o) => o.value));
  for (const tag of tags) if (!have.has(tag)) select.append(el("option", { value: tag, text: tag }));
}

function groupsUrl() {
  const q = new URLSearchParams({ outcome: ui.filters.outcome, limit: "100" });
  if (ui.filters.tag) q.set("tag", ui.filters.tag);
  if (ui.filters.mode) q.set("mode", ui.filters.mode);
  return `/api/groups?${q}`;
}

function renderGroups(data) {
  const signature = JSON.stringify([data, ui.filters]);
  if (signature === ui.groupsSignature) return; // nothing new: leave the list as it is
  ui.groupsSignature = signature;
  const holder = document.getElementById("groups");
  setText("groups-count", `${data.groups.length} group episode(s) shown · ${data.received} samples read`);
  if (!data.groups.length) {
    holder.replaceChildren(el("p", { class: "muted", text: "No sampled group episode yet" +
      (ui.filters.outcome !== "all" || ui.filters.tag ? " matches these filters." : ".") }));
    ui.groups.clear();
    return;
  }
  // keyed: a group already shown keeps its element (and whether it is open); only a group
  // whose members changed is filled again, so what a person is clicking stays put
  const seen = new Map();
  const nodes = data.groups.map((group) => {
    const groupSignature = JSON.stringify(group);
    let entry = ui.groups.get(group.key);
    if (!entry) {
      entry = { node: newGroupNode(group.key), signature: "" };
    }
    if (entry.signature !== groupSignature) {
      fillGroup(entry.node, group);
      entry.signature = groupSignature;
    }
    seen.set(group.key, entry);
    return entry.node;
  });
  ui.groups = seen;
  const current = [...holder.children];
  if (current.length !== nodes.length || current.some((node, i) => node !== nodes[i])) {
    holder.replaceChildren(...nodes);
  }
}

function newGroupNode(key) {
  const details = el("details", { class: "group", "data-key": key });
  details.open = ui.openGroups.has(key);
  details.addEventListener("toggle", () => {
    if (details.open) ui.openGroups.add(key); else ui.openGroups.delete(key);
  });
  return details;
}

function fillGroup(details, group) {
  const scores = group.members.map((m) => fmt(m.score)).join(" ");
  const complete = group.expected ? `${group.members.length}/${group.expected}` : `${group.members.length}`;
  const versions = [...new Set(group.members.map((m) => m.version_start))].join(",");
  const badges = [];
  if (group.members.some((m) => m.outcome.success)) badges.push(el("span", { class: "badge ok", text: "success" }));
  if (group.members.some((m) => m.outcome.context_full)) badges.push(el("span", { class: "badge warn", text: "context_full" }));
  if (group.members.some((m) => m.outcome.stale)) badges.push(el("span", { class: "badge warn", text: "stale" }));
  if (group.members.some((m) => m.env_failed)) badges.push(el("span", { class: "badge bad", text: "env error" }));
  const summary = el("summary", {},
    el("span", { class: "tag", text: group.tag }),
    ` ${group.mode} · group ${group.group_id} · episode ${group.episode_id}` +
      (group.mode === "val" ? ` · round ${group.round}` : "") +
      ` · ${complete} members · v${versions} · scores ${scores} `,
    ...badges);
  // a member's sample never changes: its row is kept as more members arrive
  const kept = details.rowsByUid || new Map();
  details.rowsByUid = new Map();
  const rows = group.members.map((m) => {
    let row = kept.get(m.uid);
    if (!row) row = memberRow(m);
    details.rowsByUid.set(m.uid, row);
    return row;
  });
  if (!details.membersBody) {
    details.membersBody = el("tbody", {});
    details.membersTable = el("table", { class: "members" }, details.membersBody);
  }
  const current = [...details.membersBody.children];
  if (current.length !== rows.length || current.some((row, i) => row !== rows[i])) {
    details.membersBody.replaceChildren(...rows);
  }
  const oldSummary = details.querySelector("summary");
  if (oldSummary) oldSummary.replaceWith(summary); else details.append(summary);
  if (!details.membersTable.parentNode) details.append(details.membersTable);
}

function memberRow(m) {
  const row = el("tr", { class: `member${m.uid === ui.selected ? " selected" : ""}`, "data-uid": m.uid },
    el("td", { text: `#${m.member}` }),
    el("td", { text: fmt(m.score) }),
    el("td", { text: m.env_failed ? "env error" : m.outcome.success ? "success" : "failed" }),
    el("td", { text: `${m.num_actions} turns` }),
    el("td", { text: `v${m.version_start}–${m.version_end} (run v${m.run_version})` }),
    el("td", { text: m.outcome.context_full ? "context_full" : m.truncated ? "truncated" : "" }),
    el("td", { text: m.producer || "" }));
  row.addEventListener("click", () => showTrajectory(m.uid));
  return row;
}

async function showTrajectory(uid) {
  ui.selected = uid;
  document.querySelectorAll("tr.member").forEach((row) => {
    row.classList.toggle("selected", row.dataset.uid === uid);
  });
  const pane = document.getElementById("trajectory");
  try {
    renderTrajectory(await getJSON(`/api/trajectory/${encodeURIComponent(uid)}`));
  } catch (err) {
    pane.replaceChildren(el("p", { class: "banner error", text: String(err.message || err) }));
  }
}

function renderTrajectory(t) {
  const pane = document.getElementById("trajectory");
  const outcome = t.failed ? "env error" : t.success ? "success" : "failed";
  const head = el("div", { class: "traj-head" },
    el("h3", { text: `${t.traj_id} · ${t.tag} · ${outcome}` }),
    el("p", { class: "muted", text:
      `score ${fmt(t.episode_score)} · ${t.num_actions} turns · versions ${t.version_start}–${t.version_end} ` +
      `(run v${t.run_version} at commit) · ${t.terminated ? "terminated" : t.truncated ? "truncated" : "ended"} · ` +
      `producer ${t.producer} · seed ${t.seed} · wall ${fmt(t.wall_time_s)} s (policy ${fmt(t.policy_time_s)} s)` }));
  const parts = [head];
  if (t.error) parts.push(el("p", { class: "banner error", text: `env error: ${t.error}` }));
  if (t.context_full) parts.push(el("p", { class: "banner warn", text: `context full: ${t.context_full}` }));
  const steps = t.steps || [];
  const omitted = t.steps_omitted;
  steps.forEach((step, i) => {
    const index = omitted && i >= omitted.from ? i + omitted.count : i;
    if (omitted && i === omitted.from) {
      parts.push(el("p", { class: "muted", text: `… ${omitted.count} turns left out of the sample (size limit) …` }));
    }
    parts.push(turnNode(step, index));
  });
  if (!steps.length && !t.error) parts.push(el("p", { class: "muted", text: "no turns" }));
  if (t.final_observation !== undefined && t.final_observation !== null) {
    parts.push(el("div", { class: "final" }, el("h4", { text: "final observation" }), observation(t.final_observation)));
  }
  pane.replaceChildren(...parts);
}

function turnNode(step, index) {
  const info = step.info || {};
  const invalid = info.action_is_valid === false;
  const action = step.action_name !== undefined ? step.action_name : fmt(step.action);
  const summary = el("summary", {},
    el("span", { class: "turn-no", text: `turn ${index + 1}` }),
    ` action ${invalid ? "–" : action} · reward ${fmt(step.reward)} · v${step.version}`,
    invalid ? el("span", { class: "badge bad", text: step.response !== undefined ? "format error" : "invalid action" }) : null,
    step.finish_reason && step.finish_reason !== "stop" ? el("span", { class: "badge warn", text: step.finish_reason }) : null);
  const body = el("div", { class: "turn-body" },
    el("h4", { text: "observation" }), observation(step.observation));
  if (step.response !== undefined && step.response !== null) {
    body.append(el("h4", { text: "reply" }), el("pre", { class: "reply", text: String(step.response) }));
    body.append(el("p", { class: invalid ? "parsed bad" : "parsed", text: invalid ?
      "format error: the reply has no valid action (the env's format penalty applies)" :
      `parsed action: ${action}` }));
  }
  if (step.tool_calls) {
    body.append(el("h4", { text: "tool calls" }), el("pre", { class: "reply", text: JSON.stringify(step.tool_calls, null, 2) }));
  }
  const meta = {};
  for (const [k, v] of Object.entries(step)) {
    if (!["observation", "response", "tool_calls", "info", "action", "action_name"].includes(k)) meta[k] = v;
  }
  const metaRows = Object.entries({ ...meta, ...Object.fromEntries(Object.entries(info).map(([k, v]) => [`info.${k}`, v])) })
    .map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: fmt(v) })));
  body.append(el("table", { class: "meta" }, el("tbody", {}, ...metaRows)));
  const details = el("details", { class: `turn${invalid ? " invalid" : ""}` }, summary, body);
  return details;
}

function observation(value) {
  if (Array.isArray(value) && value.length && value.every(Array.isArray)) {
    // a grid: one cell per value, monospace
    return el("table", { class: "grid" }, el("tbody", {},
      ...value.map((row) => el("tr", {}, ...row.map((cell) => el("td", { text: fmt(cell) }))))));
  }
  if (typeof value === "string") return el("pre", { class: "grid-text", text: value });
  return el("pre", { class: "grid-text", text: JSON.stringify(value) });
}

// -- polling ------------------------------------------------------------------------------------
async function poll() {
  try {
    renderState(await getJSON("/api/state"));
    renderGroups(await getJSON(groupsUrl()));
  } catch (err) {
    const error = document.getElementById("error");
    error.hidden = false;
    error.textContent = `the ui server cannot be reached: ${err.message || err}`;
  }
}

function start() {
  for (const [id, name] of [["filter-mode", "mode"], ["filter-tag", "tag"], ["filter-outcome", "outcome"]]) {
    document.getElementById(id).addEventListener("change", (event) => {
      ui.filters[name] = event.target.value;
      getJSON(groupsUrl()).then(renderGroups).catch(() => {});
    });
  }
  poll();
  setInterval(poll, POLL_MS);
}

document.addEventListener("DOMContentLoaded", start);
