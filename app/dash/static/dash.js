// forge dash: polls the dash's JSON endpoints and builds the page with DOM calls only. Recorded text (model output,
// prompts, tool results) is data: it is only ever set with textContent or attributes, never parsed as markup.
"use strict";

const POLL_MS = 3000;
const SVG = "http://www.w3.org/2000/svg";
const COLORS = ["#2f6fdd", "#e8590c", "#2b8a3e", "#9c36b5", "#c92a2a", "#1098ad", "#5c940d", "#d6336c"];
const state = { tab: "curves", page: 1, pageSize: 50, filters: {}, selected: null, colour: "logprob", session: null,
                step: "", checkpoints: null, ratios: null };
const COLOUR_MODES = [["logprob", "log-prob"], ["advantage", "advantage"], ["version", "weight version"],
                      ["ratio", "importance ratio"]];

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (key === "text") node.textContent = value;
    else if (key === "class") node.className = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else if (key === "title") node.title = value;
    else if (key === "onclick") node.addEventListener("click", value);
    else node[key] = value;
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
  return node;
}

async function getJSON(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" }, credentials: "same-origin" });
  const body = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

function fmt(value, digits = 3) {
  if (value === null || value === undefined) return "–";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value)) return String(value);
  return Math.abs(value) >= 1000 ? value.toFixed(0) : value.toPrecision(digits);
}

function when(seconds) {
  return seconds ? new Date(seconds * 1000).toLocaleTimeString() : "–";
}

// ---- tabs -------------------------------------------------------------------------------------------------------

function showTab(name) {
  state.tab = name;
  for (const button of document.querySelectorAll("nav button")) button.classList.toggle("active", button.dataset.tab === name);
  for (const section of document.querySelectorAll(".tab")) section.classList.toggle("hidden", section.id !== "tab-" + name);
  refresh();
}

// ---- curves -----------------------------------------------------------------------------------------------------

const CHARTS = [
  { title: "reward", match: (name) => name === "reward_mean" || name.startsWith("reward/") },
  { title: "loss", match: (name) => name === "loss" || name === "policy_loss" },
  { title: "tokens/s", match: (name) => name === "tokens_per_s" },
  { title: "staleness (weight versions)", match: (name) => name.startsWith("staleness") },
  { title: "tree compression (sample tokens / trained tokens)", match: (name) => name === "tree_compression" },
  { title: "importance ratio and clipping", match: (name) => name === "ratio_mean" || name === "clip_frac" },
];

function chart(title, steps, series) {
  const width = 600, height = 180, pad = 34;
  const values = series.flatMap((s) => s.values.filter((v) => v !== null));
  const box = el("div", { class: "chart", "data-chart": title }, el("h3", { text: title }));
  if (!values.length || !steps.length) {
    box.append(el("p", { class: "muted", text: "no data yet" }));
    return box;
  }
  let low = Math.min(...values), high = Math.max(...values);
  if (low === high) { low -= 1; high += 1; }
  const first = steps[0], last = steps[steps.length - 1] === first ? first + 1 : steps[steps.length - 1];
  const x = (step) => pad + ((step - first) / (last - first)) * (width - pad - 8);
  const y = (value) => height - 18 - ((value - low) / (high - low)) * (height - 28);
  const plot = svg("svg", { viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img" });
  plot.append(svg("line", { x1: pad, y1: height - 18, x2: width - 8, y2: height - 18, stroke: "#d9dde5" }));
  plot.append(svg("line", { x1: pad, y1: 10, x2: pad, y2: height - 18, stroke: "#d9dde5" }));
  for (const [value, dy] of [[high, 14], [low, height - 20]]) {
    const label = svg("text", { x: 2, y: dy, "font-size": 10, fill: "#6b7280" });
    label.textContent = fmt(value);
    plot.append(label);
  }
  const stepLabel = svg("text", { x: width - 60, y: height - 4, "font-size": 10, fill: "#6b7280" });
  stepLabel.textContent = `step ${fmt(steps[steps.length - 1])}`;
  plot.append(stepLabel);
  const legend = el("div", { class: "legend" });
  series.forEach((s, i) => {
    const colour = COLORS[i % COLORS.length];
    const points = [];
    s.values.forEach((v, j) => { if (v !== null) points.push(`${x(steps[j]).toFixed(1)},${y(v).toFixed(1)}`); });
    plot.append(svg("polyline", { points: points.join(" "), fill: "none", stroke: colour, "stroke-width": 1.6,
                                  "data-series": s.name }));
    const item = el("span", { text: `${s.name} ${fmt(s.values.filter((v) => v !== null).pop())}` });
    item.style.setProperty("--swatch", colour);
    legend.append(item);
  });
  box.append(plot, legend);
  return box;
}

async function refreshCurves() {
  const data = await getJSON("/api/curves");
  const names = Object.keys(data.curves);
  const charts = CHARTS.map((c) => chart(c.title, data.steps,
    names.filter(c.match).map((name) => ({ name, values: data.curves[name] }))));
  document.getElementById("curves").replaceChildren(...charts);
}

function renderSummary(summary) {
  const target = document.getElementById("summary");
  if (!summary) return;
  const table = el("table");
  for (const [key, value] of Object.entries(summary)) {
    const shown = typeof value === "object" && value !== null ? JSON.stringify(value) : fmt(value);
    table.append(el("tr", {}, el("th", { text: key }), el("td", { text: shown })));
  }
  target.replaceChildren(table);
  target.classList.remove("muted");
}

// ---- health -----------------------------------------------------------------------------------------------------

async function refreshHealth() {
  const data = await getJSON("/api/health");
  document.getElementById("health-counts").textContent =
    data.time ? `${data.up} up, ${data.down} down (polled ${when(data.time)})` : "no services found yet";
  const rows = data.services.map((s) => {
    const gauges = [`uptime ${fmt(s.uptime_s)} s`, `Stats in ${fmt(s.latency_ms)} ms`,
      ...Object.entries(s.gauges || {}).slice(0, 8).map(([k, v]) => `${k} ${fmt(v)}`)].join("  ");
    return el("tr", { class: s.status, "data-service": s.name },
      el("td", { text: s.name }), el("td", { text: s.kind || "?" }), el("td", { class: "status", text: s.status }),
      el("td", { text: s.address }), el("td", { text: when(s.since) }),
      el("td", { text: s.status === "up" ? gauges : s.reason || "" }));
  });
  document.querySelector("#health-table tbody").replaceChildren(...rows);
}

// ---- trajectories -----------------------------------------------------------------------------------------------

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) if (value !== "" && value !== null && value !== undefined) search.set(key, value);
  return search.toString();
}

async function refreshSessions() {
  const error = document.getElementById("filter-error");
  let data;
  try {
    data = await getJSON("/api/sessions?" + query({ ...state.filters, page: state.page, page_size: state.pageSize }));
    error.textContent = "";
  } catch (failure) {
    error.textContent = failure.message;
    return;
  }
  const rows = data.sessions.map((s) => {
    const row = el("tr", { "data-session": s.session_id, onclick: () => openSession(s.session_id) },
      el("td", { text: s.session_id }), el("td", { text: s.domain || "–" }), el("td", { text: s.group_id || "–" }),
      el("td", { text: s.status }), el("td", { text: fmt(s.reward) }),
      el("td", { text: s.min_version === null ? "–" : `${s.min_version}–${s.max_version}` }),
      el("td", { text: String(s.num_calls) }));
    row.classList.toggle("selected", s.session_id === state.selected);
    return row;
  });
  document.querySelector("#sessions-table tbody").replaceChildren(...rows);
  const shown = data.sessions.length;
  const start = (data.page - 1) * data.page_size;
  document.getElementById("page-info").textContent = shown
    ? `${start + 1}–${start + shown}${data.total !== null ? " of " + data.total : ""}` : "no sessions";
  document.getElementById("prev-page").disabled = data.page <= 1;
  document.getElementById("next-page").disabled = !data.has_more;
}

// The importance ratio on a log scale around 1: blue below, red above, saturating at 0.5 and 2.
function ratioColour(ratio) {
  if (ratio === null || ratio === undefined) return "transparent";
  const l = ratio <= 0 ? -1 : Math.max(-1, Math.min(1, Math.log2(ratio)));
  const alpha = (0.12 + 0.6 * Math.abs(l)).toFixed(3);
  if (Math.abs(l) < 0.01) return "rgba(134, 142, 150, 0.12)";
  return l < 0 ? `rgba(47, 111, 221, ${alpha})` : `rgba(224, 49, 49, ${alpha})`;
}

function tokenColour(mode, call, index, scale) {
  if (mode === "ratio") return ratioColour(call.ratios ? call.ratios.ratio[index] : null);
  if (mode === "advantage") {
    const a = call.advantage;
    if (a === null || a === undefined) return "transparent";
    const strength = Math.min(1, Math.abs(a) / (scale || 1));
    return a >= 0 ? `rgba(47, 158, 68, ${0.12 + 0.6 * strength})` : `rgba(224, 49, 49, ${0.12 + 0.6 * strength})`;
  }
  if (mode === "version") {
    const behind = scale - call.weight_versions[index];
    return `hsla(${Math.max(0, 210 - behind * 50)}, 70%, 60%, 0.45)`;
  }
  const p = Math.exp(call.logprobs[index]);
  return `hsla(${Math.round(120 * p)}, 75%, 55%, 0.45)`;
}

function tokens(call, mode, scale) {
  const box = el("div", { class: "completion" });
  call.completion_ids.forEach((id, i) => {
    const piece = call.pieces ? call.pieces[i] : `⟨${id}⟩`;
    const details = [`id ${id}`, `text ${JSON.stringify(piece)}`, `log-prob ${call.logprobs[i].toFixed(4)}`,
      `p ${Math.exp(call.logprobs[i]).toFixed(3)}`, `weight version ${call.weight_versions[i]}`];
    if (call.advantage !== null && call.advantage !== undefined) details.push(`advantage ${call.advantage.toFixed(4)}`);
    if (mode === "ratio" && call.ratios) {
      const ratio = call.ratios.ratio[i], learner = call.ratios.logprob[i];
      details.unshift(`importance ratio ${ratio === null ? "–" : ratio.toFixed(4)}`,
        `learner log-prob ${learner === null ? "–" : learner.toFixed(4)}`,
        `recorded log-prob ${call.logprobs[i].toFixed(4)}`, `checkpoint step ${call.ratios.step}`);
    }
    const span = el("span", { class: "token", text: piece, title: details.join("\n"),
                              "data-logprob": String(call.logprobs[i]) });
    span.style.backgroundColor = tokenColour(mode, call, i, scale);
    box.append(span);
  });
  return box;
}

function messages(call) {
  const out = [];
  if (call.rewrite) {
    out.push(el("div", { class: "rewrite", text: `context rewritten: kept ${call.rewrite.kept} tokens of the previous ` +
      `call, dropped ${call.rewrite.dropped}` }));
  } else if (call.shared_tokens) {
    out.push(el("div", { class: "muted", text: `… ${call.shared_tokens} tokens of the previous call` }));
  }
  const parts = call.added_messages || [{ role: "ids", content: call.added_ids.join(" ") }];
  for (const part of parts) {
    out.push(el("div", { class: "message" }, el("span", { class: "role", text: part.role || "text" }),
      el("pre", { text: part.content })));
  }
  return out;
}

function ratioKey() {
  return JSON.stringify([state.session.session_id, state.filters.pool, state.step]);
}

// Ratios are recomputed by the dash (a forward pass of a learner checkpoint): fetched only when asked for.
async function loadRatios() {
  const key = ratioKey(), pool = state.filters.pool;
  state.ratios = { key, loading: true };
  try {
    if (!state.checkpoints || state.checkpoints.pool !== pool) {
      state.checkpoints = { pool, data: await getJSON("/api/checkpoints?" + query({ pool })) };
    }
    const data = await getJSON(`/api/sessions/${encodeURIComponent(state.session.session_id)}/ratios?` +
      query({ pool, step: state.step }));
    if (state.ratios.key === key) state.ratios = { key, data };
  } catch (failure) {
    if (state.ratios.key === key) state.ratios = { key, error: failure.message };
  }
  if (state.ratios.key === key && state.colour === "ratio") renderSession();
}

function ratioControls() {
  const known = state.checkpoints && state.checkpoints.pool === state.filters.pool ? state.checkpoints.data : null;
  const latest = known && known.latest !== null ? ` (${known.latest})` : "";
  const steps = known ? known.steps.slice().reverse() : [];
  if (state.step !== "" && !steps.includes(Number(state.step))) steps.unshift(Number(state.step));
  const select = el("select", { id: "ratio-step" }, el("option", { value: "", text: `latest${latest}` }),
    ...steps.map((step) => el("option", { value: String(step), text: `step ${step}`,
                                          selected: String(step) === state.step })));
  select.addEventListener("change", () => { state.step = select.value; renderSession(); });
  const r = state.ratios && state.ratios.key === ratioKey() ? state.ratios : null;
  const status = !r || r.loading ? { class: "muted", text: "computing importance ratios…" }
    : r.error ? { class: "error", text: r.error } : { class: "muted", text: `checkpoint step ${r.data.step}` };
  return [el("label", { text: " checkpoint " }, select), el("span", { id: "ratio-status", ...status })];
}

function attachRatios(s) {
  const r = state.ratios;
  const byIndex = new Map(r && r.data && r.key === ratioKey() ? r.data.calls.map((c) => [c.index, c]) : []);
  for (const call of s.calls) {
    const found = byIndex.get(call.index);
    call.ratios = found && found.ratio ? { ...found, step: r.data.step } : null;
  }
}

function renderSession() {
  const s = state.session;
  if (!s) return;
  const mode = state.colour;
  if (mode === "ratio" && (!state.ratios || state.ratios.key !== ratioKey())) loadRatios();
  attachRatios(s);
  const advantages = s.calls.map((c) => Math.abs(c.advantage || 0));
  const versions = s.calls.flatMap((c) => c.weight_versions);
  const scale = mode === "advantage" ? Math.max(1e-9, ...advantages) : Math.max(0, ...versions);
  const select = el("select", { id: "colour-by" },
    ...COLOUR_MODES.map(([m, label]) => el("option", { value: m, text: label, selected: m === mode })));
  select.addEventListener("change", () => { state.colour = select.value; renderSession(); });
  const treeButton = el("button", { type: "button", id: "show-tree", text: "group's prefix tree",
                                    onclick: () => openTree(s.session_id) });
  const header = el("div", {},
    el("h2", { text: `session ${s.session_id}` }),
    el("div", { class: "muted", text: `task ${s.task_id || "–"} · domain ${s.domain || "–"} · group ${s.group_id || "–"} ` +
      `· ${s.status}${s.failure_reason ? " (" + s.failure_reason + ")" : ""} · reward ${fmt(s.reward)} ` +
      `· ${JSON.stringify(s.outcome_rewards)}` }),
    el("div", { class: "controls" }, el("label", { text: "colour tokens by " }, select),
      ...(mode === "ratio" ? ratioControls() : []), treeButton),
    el("div", { id: "tree" }));
  const calls = s.calls.map((call) => el("div", { class: "call", "data-call": String(call.index) },
    el("h4", { text: `call ${call.index} · ${call.prompt_tokens} prompt + ${call.completion_tokens} completion tokens ` +
      `· ${call.finish_reason} · advantage ${fmt(call.advantage)}` +
      (call.process_rewards.length ? ` · process rewards ${call.process_rewards.join(", ")}` : "") }),
    ...messages(call),
    el("div", { class: "message" }, el("span", { class: "role", text: "completion" }), tokens(call, mode, scale))));
  document.getElementById("session").replaceChildren(header, ...calls);
}

async function openSession(id) {
  state.selected = id;
  for (const row of document.querySelectorAll("#sessions-table tbody tr")) row.classList.toggle("selected", row.dataset.session === id);
  const target = document.getElementById("session");
  try {
    state.session = await getJSON(`/api/sessions/${encodeURIComponent(id)}?` + query({ pool: state.filters.pool }));
    state.ratios = state.checkpoints = null;     // asked again: the learner may have written a newer checkpoint
  } catch (failure) {
    target.replaceChildren(el("p", { class: "error", text: failure.message }));
    return;
  }
  renderSession();
}

async function openTree(id) {
  const target = document.getElementById("tree");
  target.replaceChildren(el("p", { class: "muted", text: "building the tree…" }));
  let tree;
  try {
    tree = await getJSON(`/api/sessions/${encodeURIComponent(id)}/tree?` + query({ pool: state.filters.pool }));
  } catch (failure) {
    target.replaceChildren(el("p", { class: "error", text: failure.message }));
    return;
  }
  const level = new Map();
  const widest = Math.max(1, ...tree.segments.map((g) => g.tokens));
  const rows = tree.segments.map((g) => {
    const depth = g.parent === null ? 0 : level.get(g.parent) + 1;
    level.set(g.id, depth);
    const bar = el("span", { class: "tree-bar" });
    bar.style.width = `${Math.max(3, (g.tokens / widest) * 220)}px`;
    bar.style.marginLeft = `${depth * 18}px`;
    bar.style.backgroundColor = g.times > 1 ? `hsl(210, 70%, ${Math.max(35, 70 - g.times * 6)}%)` : "#c4c9d4";
    return el("div", { class: "tree-row", "data-times": String(g.times),
                       title: `samples: ${g.samples.map((i) => tree.samples[i]).join(", ")}` },
      bar, el("span", { text: `${g.tokens} tokens × ${g.times}` }),
      el("span", { class: "tree-text", text: g.text !== null ? g.text.replace(/\n/g, "⏎") : g.ids.join(" ") }));
  });
  target.replaceChildren(
    el("p", { text: `${tree.samples.length} samples: ${tree.sample_tokens} tokens trained sample by sample, ` +
      `${tree.tree_tokens} merged (×${tree.compression.toFixed(2)})${tree.truncated ? "; first segments shown" : ""}` }),
    ...rows);
}

function readFilters(form) {
  const data = new FormData(form);
  const filters = {};
  for (const key of ["pool", "domain", "status", "min_reward", "max_reward", "min_version", "max_version"]) {
    filters[key] = (data.get(key) || "").trim();
  }
  state.pageSize = Number(data.get("page_size")) || 50;
  state.filters = filters;
  state.page = 1;
}

// ---- polling ----------------------------------------------------------------------------------------------------

async function refresh() {
  try {
    if (state.tab === "curves") await refreshCurves();
    else if (state.tab === "health") await refreshHealth();
    else await refreshSessions();
    document.getElementById("updated").textContent = `updated ${new Date().toLocaleTimeString()}`;
  } catch (failure) {
    document.getElementById("updated").textContent = `not updated: ${failure.message}`;
  }
}

async function start() {
  for (const button of document.querySelectorAll("nav button")) button.addEventListener("click", () => showTab(button.dataset.tab));
  const form = document.getElementById("filters");
  form.addEventListener("submit", (event) => { event.preventDefault(); readFilters(form); refreshSessions(); });
  document.getElementById("prev-page").addEventListener("click", () => { state.page = Math.max(1, state.page - 1); refreshSessions(); });
  document.getElementById("next-page").addEventListener("click", () => { state.page += 1; refreshSessions(); });
  const run = await getJSON("/api/run");
  document.getElementById("run-dir").textContent = run.run_dir || "";
  const pools = form.elements.namedItem("pool");
  pools.replaceChildren(...run.pools.map((name) => el("option", { value: name, text: name })));
  readFilters(form);
  renderSummary(run.summary);
  const tab = new URLSearchParams(location.search).get("tab");
  showTab(["curves", "health", "trajectories"].includes(tab) ? tab : "curves");
  setInterval(() => { if (state.tab !== "trajectories") refresh(); }, POLL_MS);
}

document.addEventListener("DOMContentLoaded", () => { start().catch((failure) => {
  document.getElementById("updated").textContent = `failed to start: ${failure.message}`;
}); });
