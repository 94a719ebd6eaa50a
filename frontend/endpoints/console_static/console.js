// mcpvisor console: plain JavaScript, no build step, no dependency. Every text that comes from an
// upstream (tool names, descriptions, log lines) is untrusted: it is only ever set as textContent.
"use strict";

const API = "/api/v1";
const POLL_MS = 1000;
let csrf = "";
let timers = [];
let followers = [];

// -- small helpers -------------------------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

function toast(message, error) {
  const el = h("div", { class: error ? "toast error" : "toast" }, message);
  document.getElementById("toasts").append(el);
  setTimeout(() => el.remove(), error ? 8000 : 4000);
}

function uptime(seconds) {
  if (!seconds) return "";
  const s = Math.floor(seconds);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), mm = Math.floor((s % 3600) / 60);
  const ss = String(s % 60).padStart(2, "0");
  return (d ? d + "d " : "") + hh + ":" + String(mm).padStart(2, "0") + ":" + ss;
}

function when(epoch) {
  const d = new Date(epoch * 1000);
  return d.toISOString().replace("T", " ").slice(0, 19);
}

const STATE_CLASS = {
  RUNNING: "b-ok", STARTING: "b-info", STOPPING: "b-info", STOPPED: "b-mute",
  BACKOFF: "b-warn", EXITED: "b-warn", FATAL: "b-bad",
  ready: "b-ok", connecting: "b-info", authenticating: "b-info", disconnected: "b-mute", error: "b-bad",
  ok: "b-ok", blocked: "b-warn", low: "b-ok", medium: "b-warn", high: "b-bad", critical: "b-bad",
  approved: "b-ok", changed: "b-bad", new: "b-warn", quarantined: "b-warn",
};
function badge(text, cls) {
  return h("span", { class: "badge " + (cls || STATE_CLASS[text] || "b-mute") }, text || "-");
}

async function api(method, path, body) {
  const init = { method, headers: {}, credentials: "same-origin" };
  if (method !== "GET") {
    init.headers["X-CSRF-Token"] = csrf;
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body || {});
  }
  let response;
  try {
    response = await fetch(API + path, init);
  } catch (e) {
    setLive(false, "disconnected");
    throw new Error("mcpvisor does not answer: " + e.message);
  }
  if (response.status < 500) setLive(true, "live");
  if (response.status === 403 && method !== "GET") {
    // The frontend restarted (sessions are in memory) or the session expired: renew once.
    await loadSession();
    init.headers["X-CSRF-Token"] = csrf;
    response = await fetch(API + path, init);
  }
  if (response.status === 401 && document.body.dataset.tokens === "1") {
    location.href = "/ui/login";
  }
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    const message = (data && data.message) || response.status + " " + response.statusText;
    throw new Error(message);
  }
  return data;
}

async function act(method, path, body, done) {
  try {
    const result = await api(method, path, body);
    toast(done || "done");
    return result;
  } catch (e) {
    toast(e.message, true);
    return null;
  }
}

function setLive(on, text) {
  const el = document.getElementById("live");
  el.className = "live " + (on ? "on" : "off");
  document.getElementById("live-text").textContent = text;
}

function every(ms, fn) {
  fn();
  const id = setInterval(fn, ms);
  timers.push(id);
}

function clearView() {
  timers.forEach(clearInterval);
  timers = [];
  followers.forEach((source) => source.close());
  followers = [];
}

async function loadSession() {
  const session = await api("GET", "/session");
  csrf = session.csrf_token;
  document.getElementById("operator").textContent = session.operator;
  document.body.dataset.tokens = session.tokens_required ? "1" : "0";
  document.getElementById("logout").hidden = !session.tokens_required;
}

// -- pending count in the bar --------------------------------------------------------------------

async function refreshPending() {
  try {
    const pending = await api("GET", "/pending");
    const n = pending.servers.length + (pending.proposals || []).length;
    const el = document.getElementById("pending-count");
    el.textContent = String(n);
    el.hidden = n === 0;
  } catch (e) { /* shown by the live indicator */ }
}

// -- dashboard -----------------------------------------------------------------------------------

function serverActions(row, refresh) {
  const name = row.server;
  const buttons = [];
  if (row.tenant) return h("td", { class: "actions" });
  buttons.push(h("button", {
    onclick: async (event) => { event.stopPropagation(); await act("POST", `/servers/${encodeURIComponent(name)}/restart`, {}, name + ": restarted"); refresh(); },
    disabled: row.enabled === false, dataset: { action: "restart" },
  }, "Restart"));
  const enabling = row.enabled === false;
  buttons.push(h("button", {
    onclick: async (event) => { event.stopPropagation(); await act("POST", `/servers/${encodeURIComponent(name)}/${enabling ? "enable" : "disable"}`, {}, name + (enabling ? ": enabled" : ": disabled")); refresh(); },
    dataset: { action: enabling ? "enable" : "disable" },
  }, enabling ? "Enable" : "Disable"));
  return h("td", { class: "actions" }, h("div", { class: "btns right" }, buttons));
}

function renderDashboard(view) {
  const tiles = h("div", { class: "tiles" });
  const tbody = h("tbody", { id: "servers" });
  const frontendLine = h("div", { class: "subtitle" });
  view.append(
    h("h1", {}, "Servers"), frontendLine, tiles,
    h("div", { class: "panel" }, h("table", {},
      h("thead", {}, h("tr", {},
        h("th", {}, "Server"), h("th", {}, "Transport"), h("th", {}, "Process"), h("th", {}, "Upstream"), h("th", { class: "num" }, "Tools"),
        h("th", { class: "num" }, "PID"), h("th", { class: "num" }, "Uptime"), h("th", { class: "num" }, "Restarts"),
        h("th", {}, "Detail"), h("th", {}))),
      tbody)),
    h("div", { class: "below" },
      h("div", { class: "panel" }, h("div", { class: "toolbar" }, h("h3", {}, "Recent calls"), h("div", { class: "spacer" }), h("a", { href: "#/activity" }, "all activity")),
        h("table", {}, h("tbody", { id: "recent" }))),
      h("div", { class: "panel" }, h("div", { class: "toolbar" }, h("h3", {}, "Waiting for an operator"), h("div", { class: "spacer" }), h("a", { href: "#/approvals" }, "review")),
        h("table", {}, h("tbody", { id: "waiting" })))),
  );
  const recent = view.querySelector("#recent");
  const waiting = view.querySelector("#waiting");
  async function refreshBelow() {
    try {
      const [page, pending] = await Promise.all([api("GET", "/activity?limit=8"), api("GET", "/pending")]);
      recent.replaceChildren(...(page.rows.length ? page.rows.slice().reverse().map((r) => h("tr", {},
        h("td", { class: "mono muted" }, when(r.time).slice(11)), h("td", { class: "mono" }, r.server + ":" + r.tool),
        h("td", {}, r.variant), h("td", {}, badge(r.outcome)), h("td", { class: "num" }, r.duration_ms.toFixed(1) + " ms")))
        : [h("tr", {}, h("td", { class: "empty" }, "No calls yet."))]));
      const items = [
        ...(pending.proposals || []).map((p) => [p.name, "proposed " + p.action, "b-info"]),
        ...pending.servers.map((s) => [s.name, s.reason, s.reason === "changed" ? "b-bad" : "b-warn"]),
      ];
      waiting.replaceChildren(...(items.length ? items.map(([name, reason, cls]) => h("tr", {},
        h("td", {}, h("a", { href: "#/approvals/" + encodeURIComponent(name) }, name)), h("td", {}, badge(reason, cls))))
        : [h("tr", {}, h("td", { class: "empty" }, "Nothing waits."))]));
    } catch (e) { /* the table's refresh reports the connection */ }
  }
  every(POLL_MS * 3, refreshBelow);
  async function refresh() {
    let data;
    try {
      data = await api("GET", "/servers");
      setLive(true, "live");
    } catch (e) {
      setLive(false, "disconnected: " + e.message);
      return;
    }
    const rows = data.servers.slice().sort((a, b) => a.name.localeCompare(b.name));
    const running = rows.filter((r) => r.state === "RUNNING").length;
    const ready = rows.filter((r) => r.upstream === "ready").length;
    const tools = rows.reduce((n, r) => n + (r.tools || 0), 0);
    const trouble = rows.filter((r) => ["FATAL", "BACKOFF", "EXITED"].includes(r.state) || r.upstream === "error").length;
    tiles.replaceChildren(
      ...[[rows.length, "servers"], [running, "running"], [ready, "upstreams ready"], [tools, "tools"], [trouble, "need attention"]]
        .map(([n, label]) => h("div", { class: "tile" }, h("div", { class: "n" }, n), h("div", { class: "l" }, label))),
    );
    const fe = data.frontend;
    frontendLine.textContent = fe ? `frontend ${fe.state}, pid ${fe.pid}, uptime ${uptime(fe.uptime)} · updated ${new Date().toLocaleTimeString()}` : "";
    if (!rows.length) {
      tbody.replaceChildren(h("tr", {}, h("td", { colspan: 10, class: "empty" }, "No servers configured.")));
      return;
    }
    tbody.replaceChildren(...rows.map((row) => {
      // A running server's description repeats its pid and uptime; only trouble needs words.
      const detail = row.error && row.upstream !== "ready" ? row.error : row.state === "RUNNING" ? "" : row.description;
      const flags = [];
      if (row.quarantined) flags.push(badge("quarantined"));
      if (row.changed_tools) flags.push(badge(row.changed_tools + " changed", "b-bad"));
      if (row.enabled === false) flags.push(badge("disabled", "b-mute"));
      return h("tr", {
        dataset: { server: row.name, state: row.state, pid: String(row.pid), restarts: String(row.restarts) },
        class: row.tenant ? "" : "clickable",
        onclick: () => { if (!row.tenant) location.hash = "#/servers/" + encodeURIComponent(row.server); },
      },
      h("td", {}, h("span", { class: "name" }, row.name), " ", flags),
      h("td", { class: "transport" }, row.transport || ""),
      h("td", { class: "state" }, badge(row.state)),
      h("td", { class: "upstream" }, row.upstream ? badge(row.upstream) : ""),
      h("td", { class: "num" }, row.tools),
      h("td", { class: "num pid" }, row.pid || ""),
      h("td", { class: "num" }, uptime(row.uptime)),
      h("td", { class: "num restarts" }, row.restarts),
      h("td", { class: "desc", title: detail || "" }, detail || ""),
      serverActions(row, refresh));
    }));
  }
  every(POLL_MS, refresh);
}

// -- server page ---------------------------------------------------------------------------------

// What a sandbox allows, in one line (Flatpak shows an app's permissions the same way).
function sandboxSummary(box) {
  if (!box.enabled) return "none: the process runs as mcpvisor does";
  const cpu = box.cpu ? `${box.cpu} cores` : "CPU unlimited";
  return `network ${box.network}; writable: ${box.writable.join(", ")}; read-only: ${box.read_only.join(", ")}; ` +
    `${box.memory_mb} MiB, ${box.max_processes} processes, ${cpu}; never: ${box.never.join(", ")}`;
}

function renderServer(view, name) {
  const path = "/servers/" + encodeURIComponent(name);
  const head = h("div", {});
  const config = h("dl", { class: "kv", id: "server-config" });
  const tools = h("tbody", {});
  const log = h("pre", { class: "log", id: "log" });
  const streamSelect = h("select", { id: "log-stream" }, h("option", { value: "" }, "worker + stderr"),
    h("option", { value: "worker" }, "worker"), h("option", { value: "stderr" }, "stderr"));
  view.append(
    h("div", { class: "subtitle" }, h("a", { href: "#/" }, "Servers"), " / ", name),
    head,
    h("div", { class: "grid2" },
      h("div", { class: "panel" }, h("div", { class: "toolbar" }, h("h3", {}, "Configuration")), config),
      h("div", { class: "panel" }, h("div", { class: "toolbar" }, h("h3", {}, "Log"), h("div", { class: "spacer" }), streamSelect), log)),
    h("h2", {}, "Tools"),
    h("div", { class: "panel" }, h("table", {},
      h("thead", {}, h("tr", {}, h("th", {}, "Tool"), h("th", {}, "Pin"), h("th", {}, "Annotations"), h("th", {}, "Description"))),
      tools)),
  );

  // The state comes from the listing every two seconds (cheap); the configuration and its
  // security analysis once, and again after an action.
  async function refreshHead() {
    let s;
    try {
      const data = await api("GET", "/servers");
      s = data.servers.find((row) => row.name === name);
    } catch (e) {
      head.replaceChildren(h("div", { class: "warnbox" }, e.message));
      return;
    }
    if (!s) {
      head.replaceChildren(h("div", { class: "warnbox" }, `${name}: no such server`));
      return;
    }
    const btn = (label, verb, cls, disabled) => h("button", {
      class: cls || "", disabled, dataset: { action: verb },
      onclick: async () => { await act("POST", `${path}/${verb}`, {}, `${name}: ${verb} done`); refreshHead(); refreshTools(); loadConfig(); },
    }, label);
    head.replaceChildren(
      h("div", { class: "headline" },
        h("h1", {}, name), badge(s.state), s.upstream ? badge(s.upstream) : "",
        s.quarantined ? badge("quarantined") : "", s.enabled === false ? badge("disabled", "b-mute") : "",
        h("span", { class: "muted" }, s.pid ? `pid ${s.pid}, uptime ${uptime(s.uptime)}, ${s.restarts} restarts` : s.description),
        h("div", { class: "spacer" }),
        h("div", { class: "btns" },
          btn("Restart", "restart", "", s.enabled === false),
          s.state === "RUNNING" ? btn("Stop", "stop", "", false) : btn("Start", "start", "", s.enabled === false),
          s.enabled === false ? btn("Enable", "enable", "primary") : btn("Disable", "disable", "danger"),
          (s.quarantined || s.changed_tools) ? h("a", { href: "#/approvals/" + encodeURIComponent(name) }, h("button", { class: "primary" }, "Review…")) : "")),
      s.error && s.upstream !== "ready" ? h("div", { class: "warnbox" }, s.error) : "",
    );
  }

  async function loadConfig() {
    let s;
    try { s = await api("GET", path); } catch (e) { config.replaceChildren(h("dd", {}, e.message)); return; }
    const c = s.config;
    const rows = [
      ["transport", c.transport],
      c.command.length ? ["command", c.command.join(" ")] : null,
      c.cwd ? ["cwd", c.cwd] : null,
      c.url ? ["url", c.url] : null,
      ["env", c.env.join(", ") || "-"],
      ["headers", c.headers.join(", ") || "-"],
      ["risk", s.risk || "-"],
      ["policy", JSON.stringify(c.policy)],
      ...Object.entries(s.sandboxes || {}).map(([who, box]) => ["sandbox " + who, sandboxSummary(box)]),
    ].filter(Boolean);
    config.replaceChildren(...rows.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
  }

  async function refreshTools() {
    let t;
    try { t = await api("GET", path + "/tools"); } catch (e) { return; }
    if (!t.tools.length) {
      tools.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "empty" }, t.ready ? "No tools." : "Tools are listed once the upstream is ready.")));
      return;
    }
    tools.replaceChildren(...t.tools.map((tool) => {
      const ann = tool.annotations ? Object.entries(tool.annotations).filter(([, v]) => v === true).map(([k]) => k.replace(/Hint$/, "")) : [];
      return h("tr", { dataset: { tool: tool.name } },
        h("td", { class: "mono" }, tool.name),
        h("td", {}, badge(tool.pin, STATE_CLASS[tool.pin] || "b-mute")),
        h("td", {}, ann.map((a) => badge(a, a === "destructive" ? "b-bad" : "b-info"))),
        h("td", { class: "desc" }, tool.description || ""));
    }));
  }

  async function startLog() {
    followers.forEach((source) => source.close());
    followers = [];
    const stream = streamSelect.value;
    const q = stream ? "&stream=" + stream : "";
    try {
      const tail = await api("GET", `${path}/logs?lines=200${q}`);
      log.textContent = tail.streams.map((s) => s.text).filter(Boolean).join("\n") + "\n";
    } catch (e) {
      log.textContent = e.message;
      return;
    }
    log.scrollTop = log.scrollHeight;
    const source = new EventSource(`${API}${path}/logs/follow${stream ? "?stream=" + stream : ""}`);
    source.addEventListener("log", (event) => {
      const chunk = JSON.parse(event.data);
      const atEnd = log.scrollTop + log.clientHeight >= log.scrollHeight - 20;
      log.textContent += chunk.text;
      if (log.textContent.length > 400000) log.textContent = log.textContent.slice(-300000);
      if (atEnd) log.scrollTop = log.scrollHeight;
    });
    followers.push(source);
  }
  streamSelect.addEventListener("change", startLog);

  every(POLL_MS * 2, refreshHead);
  loadConfig();
  every(POLL_MS * 5, refreshTools);
  startLog();
}

// -- approvals -----------------------------------------------------------------------------------

function diffView(text) {
  return h("pre", { class: "diff" }, text.split("\n").map((line) => {
    const cls = line.startsWith("@@") ? "hunk" : line.startsWith("+") && !line.startsWith("+++") ? "add"
      : line.startsWith("-") && !line.startsWith("---") ? "del" : "";
    return h("span", { class: cls }, line + "\n");
  }));
}

function renderApprovals(view, selected) {
  const list = h("div", { class: "panel list", id: "pending-list" });
  const detail = h("div", { id: "pending-detail" });
  view.append(h("h1", {}, "Approvals"),
    h("div", { class: "subtitle" }, "Clients' proposals, quarantined servers and tools changed since their approval. Nothing here runs or is shown to clients until approved."),
    h("div", { class: "split" }, list, detail));

  async function refreshList() {
    let pending;
    try { pending = await api("GET", "/pending"); } catch (e) { list.replaceChildren(h("div", { class: "empty" }, e.message)); return; }
    const items = [
      ...(pending.proposals || []).map((p) => ({ name: p.name, label: "proposed " + p.action, sub: p.proposed_at, cls: "b-info" })),
      ...pending.servers.map((s) => ({ name: s.name, label: s.reason, sub: `${s.tools} tools, risk ${s.risk}`, cls: s.reason === "changed" ? "b-bad" : "b-warn" })),
    ];
    if (!items.length) {
      list.replaceChildren(h("div", { class: "empty" }, "Nothing waits for an operator."));
      if (!selected) detail.replaceChildren();
      return;
    }
    list.replaceChildren(...items.map((item) => h("a", {
      class: "item" + (item.name === selected ? " sel" : ""), href: "#/approvals/" + encodeURIComponent(item.name), dataset: { pending: item.name },
    }, h("div", {}, h("span", { class: "name" }, item.name), " ", badge(item.label, item.cls)), h("div", { class: "muted" }, item.sub))));
    if (!selected) location.hash = "#/approvals/" + encodeURIComponent(items[0].name);
  }

  async function showDetail() {
    if (!selected) return;
    let r;
    try { r = await api("GET", "/pending/" + encodeURIComponent(selected)); } catch (e) {
      detail.replaceChildren(h("div", { class: "warnbox" }, e.message));
      return;
    }
    const decide = (verb) => async () => {
      const done = await act("POST", `/servers/${encodeURIComponent(selected)}/${verb}`, {}, `${selected}: ${verb === "approve" ? "approved" : "blocked"}`);
      if (done) { selected = null; location.hash = "#/approvals"; }
    };
    const buttons = h("div", { class: "btns" },
      h("button", { class: "primary", id: "approve", onclick: decide("approve") }, r.kind === "proposal" ? "Approve and apply" : "Approve"),
      h("button", { class: "danger", id: "block", onclick: decide("block") }, r.kind === "proposal" ? "Reject" : "Block"));
    const parts = [];
    if (r.kind === "proposal") {
      parts.push(h("div", { class: "headline" }, h("h1", {}, r.name), badge("proposed " + r.action, "b-info"), h("span", { class: "muted" }, "by an MCP client, " + r.proposed_at), h("div", { class: "spacer" }), buttons));
      const kv = [["transport", r.transport || "-"]];
      if (r.command.length) kv.push(["command", r.command.join(" ")]);
      if (r.cwd) kv.push(["cwd", r.cwd]);
      if (r.url) kv.push(["url", r.url]);
      kv.push(["env", r.env.join(", ") || "-"], ["headers", r.headers.join(", ") || "-"]);
      parts.push(h("h2", {}, r.action === "add" ? "What it would run" : "The server"), h("div", { class: "panel" }, h("dl", { class: "kv", id: "exact" }, kv.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]))));
      if (r.changes.length) {
        parts.push(h("h2", {}, "Changes"), h("div", { class: "panel" }, h("table", {},
          h("thead", {}, h("tr", {}, h("th", {}, "Field"), h("th", {}, "Before"), h("th", {}, "After"))),
          h("tbody", {}, r.changes.map((c) => h("tr", {}, h("td", { class: "mono" }, c.field), h("td", { class: "mono" }, JSON.stringify(c.before)), h("td", { class: "mono" }, JSON.stringify(c.after))))))));
      }
    } else {
      parts.push(h("div", { class: "headline" }, h("h1", {}, r.name),
        badge(r.quarantined ? "quarantined" : "approved"), badge("risk " + r.risk, STATE_CLASS[r.risk]),
        h("span", { class: "muted" }, r.connected ? "connected" : "not connected"), h("div", { class: "spacer" }), buttons));
      const kv = [["transport", r.transport]];
      if (r.command.length) kv.push(["command", r.command.join(" ")]);
      if (r.url) kv.push(["url", r.url]);
      kv.push(["env", r.env.join(", ") || "-"], ["headers", r.headers.join(", ") || "-"], ["score", String(r.score)]);
      parts.push(h("h2", {}, "What it runs"), h("div", { class: "panel" }, h("dl", { class: "kv", id: "exact" }, kv.flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]))));
      for (const d of r.diffs || []) {
        parts.push(h("h2", {}, `${d.tool}: ${d.approval}`), h("div", { class: "panel" },
          d.note ? h("div", { class: "warnbox" }, d.note) : "",
          d.diff ? diffView(d.diff) : h("pre", { class: "code" }, JSON.stringify(d.after, null, 2))));
      }
      parts.push(h("h2", {}, "Security analysis"), h("div", { class: "panel" }, h("table", {},
        h("thead", {}, h("tr", {}, h("th", {}, "Tool"), h("th", {}, "Approval"), h("th", {}, "Risk"), h("th", {}, "Findings"))),
        h("tbody", {}, r.tools.map((t) => h("tr", {},
          h("td", { class: "mono" }, t.tool), h("td", {}, t.approval), h("td", {}, badge(t.risk)),
          h("td", {}, h("div", {}, t.summary), t.findings.map((f) => h("div", { class: "finding" }, `[${f.severity}] ${f.rule}: ${f.evidence}`)))))))),
        h("p", { class: "muted" }, "Tool descriptions and evidence are untrusted text from the server."));
    }
    detail.replaceChildren(...parts);
  }
  every(POLL_MS * 3, refreshList);
  showDetail();
}

// -- activity ------------------------------------------------------------------------------------

function renderActivity(view) {
  const server = h("select", { id: "f-server" }, h("option", { value: "" }, "all servers"));
  const since = h("select", { id: "f-since" }, ...[["", "any time"], ["15m", "last 15 min"], ["1h", "last hour"], ["24h", "last 24 h"], ["7d", "last 7 days"]].map(([v, l]) => h("option", { value: v }, l)));
  const outcome = h("select", { id: "f-outcome" }, ...[["", "any outcome"], ["ok", "ok"], ["error", "error"], ["blocked", "blocked"]].map(([v, l]) => h("option", { value: v }, l)));
  const text = h("input", { type: "text", id: "f-text", placeholder: "filter: tool, client, request id" });
  const tbody = h("tbody", { id: "activity" });
  const status = h("span", { class: "muted" });
  view.append(h("h1", {}, "Activity"),
    h("div", { class: "subtitle" }, "Every tools/call, resources/read and prompts/get that reached an upstream, newest first."),
    h("div", { class: "panel" }, h("div", { class: "toolbar" }, server, since, outcome, text, h("div", { class: "spacer" }), status),
      h("table", {}, h("thead", {}, h("tr", {},
        h("th", {}, "Time (UTC)"), h("th", {}, "Request"), h("th", {}, "Call"), h("th", {}, "Path"), h("th", {}, "Endpoint"),
        h("th", {}, "Client"), h("th", {}, "Outcome"), h("th", { class: "num" }, "ms"), h("th", { class: "num" }, "Bytes"))), tbody)));
  let rows = [];
  let last = 0;
  api("GET", "/servers").then((data) => {
    for (const name of [...new Set(data.servers.map((s) => s.server))].sort()) server.append(h("option", { value: name }, name));
  }).catch(() => {});
  function draw() {
    const o = outcome.value, t = text.value.toLowerCase();
    const shown = rows.filter((r) => (!o || r.outcome === o) &&
      (!t || [r.server + ":" + r.tool, r.client, r.request_id, r.variant, r.endpoint].join(" ").toLowerCase().includes(t)));
    status.textContent = `${shown.length} of ${rows.length} calls`;
    if (!shown.length) { tbody.replaceChildren(h("tr", {}, h("td", { colspan: 9, class: "empty" }, "No calls match."))); return; }
    tbody.replaceChildren(...shown.slice().reverse().slice(0, 500).map((r) => h("tr", { dataset: { request: r.request_id } },
      h("td", { class: "mono" }, when(r.time)), h("td", { class: "mono", title: r.request_id }, r.request_id.slice(0, 12)),
      h("td", { class: "mono" }, r.server + ":" + r.tool), h("td", {}, r.variant), h("td", {}, r.endpoint || "-"),
      h("td", {}, r.client || "-"), h("td", {}, badge(r.outcome)), h("td", { class: "num" }, r.duration_ms.toFixed(1)),
      h("td", { class: "num" }, r.result_bytes))));
  }
  async function load(reset) {
    const q = new URLSearchParams({ limit: "500" });
    if (server.value) q.set("server", server.value);
    if (since.value) q.set("since", since.value);
    if (!reset && last) q.set("after", String(last));
    let page;
    try { page = await api("GET", "/activity?" + q); setLive(true, "live"); } catch (e) { setLive(false, e.message); return; }
    rows = reset ? page.rows : rows.concat(page.rows).slice(-2000);
    last = page.last || last;
    draw();
  }
  for (const el of [server, since]) el.addEventListener("change", () => load(true));
  for (const el of [outcome]) el.addEventListener("change", draw);
  text.addEventListener("input", draw);
  load(true);
  timers.push(setInterval(() => load(false), POLL_MS * 2));
}

// -- accounts: the upstream logins kept (never a token) ------------------------------------------

function renderAccounts(view) {
  const tbody = h("tbody", { id: "accounts" });
  view.append(h("h1", {}, "Accounts"),
    h("div", { class: "subtitle" }, "Upstream logins kept: the operator's, and each tenant's own account. Disconnecting forgets the tokens; the tenant logs in again with the server's login tool."),
    h("div", { class: "panel" }, h("table", {}, h("thead", {}, h("tr", {},
      h("th", {}, "Tenant"), h("th", {}, "Server"), h("th", {}, "Token expires"), h("th", {}))), tbody)));
  async function load() {
    let data;
    try { data = await api("GET", "/accounts"); setLive(true, "live"); } catch (e) { setLive(false, e.message); return; }
    if (!data.accounts.length) { tbody.replaceChildren(h("tr", {}, h("td", { colspan: 4, class: "empty" }, "No upstream logins kept."))); return; }
    tbody.replaceChildren(...data.accounts.map((row) => {
      const target = row.tenant ? `/accounts/${encodeURIComponent(row.tenant)}/${encodeURIComponent(row.server)}` : null;
      const button = target ? h("button", {
        dataset: { action: "disconnect" },
        onclick: async () => { await act("DELETE", target, undefined, row.name + ": disconnected"); load(); },
      }, "Disconnect") : h("span", { class: "muted" }, row.shared ? "shared: ctl logout" : "ctl logout");
      return h("tr", { dataset: { account: row.name } },
        h("td", {}, row.tenant || "(operators)"), h("td", { class: "mono" }, row.server),
        h("td", {}, row.expires ? when(row.expires) : "-"), h("td", { class: "actions" }, button));
    }));
  }
  load();
  timers.push(setInterval(load, POLL_MS * 5));
}

// -- calls waiting for an operator's approval (@approval("operator") policies) -------------------

function waited(seconds) {
  const s = Math.max(0, Math.floor(seconds));
  return s >= 60 ? Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s" : s + "s";
}

function renderCalls(view) {
  const tbody = h("tbody", { id: "calls" });
  view.append(h("h1", {}, "Calls"),
    h("div", { class: "subtitle" }, "Calls a policy holds until an operator allows or denies them; the client waits meanwhile. Arguments are redacted as the activity log redacts them."),
    h("div", { class: "panel" }, h("table", {}, h("thead", {}, h("tr", {},
      h("th", {}, "Id"), h("th", {}, "Tenant"), h("th", {}, "Tool"), h("th", {}, "Arguments"),
      h("th", {}, "Waiting"), h("th", {}, "Left"), h("th", {}, "Policies"), h("th", {}))), tbody)));
  async function load() {
    let data;
    try { data = await api("GET", "/calls"); setLive(true, "live"); } catch (e) { setLive(false, e.message); return; }
    const now = Date.now() / 1000;
    if (!data.calls.length) { tbody.replaceChildren(h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No calls are waiting."))); return; }
    tbody.replaceChildren(...data.calls.map((call) => {
      const reason = h("input", { type: "text", placeholder: "reason (told to the client)", maxlength: 1000, "aria-label": "reason" });
      const decide = (verdict) => async () => {
        const body = verdict === "deny" ? { reason: reason.value } : undefined;
        await act("POST", `/calls/${encodeURIComponent(call.id)}/${verdict}`, body, call.id + ": " + (verdict === "allow" ? "allowed" : "denied"));
        load();
      };
      return h("tr", { dataset: { call: call.id } },
        h("td", { class: "mono" }, call.id), h("td", {}, call.tenant), h("td", { class: "mono" }, call.tool),
        h("td", { class: "mono wrap" }, call.arguments), h("td", {}, waited(now - call.since)),
        h("td", {}, waited(call.expires - now)), h("td", { class: "mono" }, call.policies.join(", ")),
        h("td", { class: "actions" }, reason,
          h("button", { dataset: { action: "allow" }, onclick: decide("allow") }, "Allow"),
          h("button", { class: "danger", dataset: { action: "deny" }, onclick: decide("deny") }, "Deny")));
    }));
  }
  load();
  timers.push(setInterval(load, POLL_MS));
}

async function refreshCalls() {
  try {
    const data = await api("GET", "/calls");
    const el = document.getElementById("calls-count");
    el.textContent = String(data.calls.length);
    el.hidden = data.calls.length === 0;
  } catch (e) { /* shown by the live indicator */ }
}

// -- routing -------------------------------------------------------------------------------------

function route() {
  clearView();
  const view = document.getElementById("view");
  view.replaceChildren();
  const hash = location.hash.replace(/^#/, "") || "/";
  const parts = hash.split("/").filter(Boolean).map(decodeURIComponent);
  const section = parts[0] || "servers";
  document.querySelectorAll("[data-nav]").forEach((a) => a.classList.toggle("active", a.dataset.nav === section));
  if (section === "servers" && parts[1]) renderServer(view, parts[1]);
  else if (section === "approvals") renderApprovals(view, parts[1] || null);
  else if (section === "calls") renderCalls(view);
  else if (section === "activity") renderActivity(view);
  else if (section === "accounts") renderAccounts(view);
  else renderDashboard(view);
  document.title = "mcpvisor · " + (parts[1] || section);
}

async function start() {
  try {
    await loadSession();
  } catch (e) {
    setLive(false, e.message);
    return;
  }
  document.getElementById("logout").addEventListener("click", async () => {
    await fetch("/ui/logout", { method: "POST", headers: { "X-CSRF-Token": csrf }, credentials: "same-origin" }).catch(() => {});
    location.href = "/ui/login";
  });
  window.addEventListener("hashchange", route);
  route();
  refreshPending();
  setInterval(refreshPending, POLL_MS * 5);
  refreshCalls();
  setInterval(refreshCalls, POLL_MS * 2);
}

document.addEventListener("DOMContentLoaded", start);
