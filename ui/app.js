// app.js: the kvsidecar console. Talks to /admin/v1 with the admin token
// (kept in sessionStorage, sent as a bearer token). Every piece of stored
// text is put in the page with textContent.
"use strict";
(function () {
  const $ = id => document.getElementById(id);
  const CATEGORIES = ["fact", "core", "episode", "system"];
  const TIER_COLORS = {focus: "#2563eb", working: "#0891b2", archive: "#7c3aed"};
  // SERIES_COLORS: one colour per series the KV page plots, none shared
  // with another series or a tier (whose colours the tier plot uses), so
  // every legend swatch names one line.
  const SERIES_COLORS = {
    kvInterval: "#dc2626", kvCumulative: "#f59e0b", enginePerInterval: "#16a34a",
    engineReused: "#92400e", prefilled: "#db2777", restored: "#475569",
  };
  const CAT_COLORS = {system: "#475569", core: "#b45309", fact: "#2563eb", episode: "#0d9488"};

  const state = {
    token: sessionStorage.getItem("kvs-admin-token") || "",
    tab: "sessions",
    tenant: "",
    user: null,       // null: every user; "" the tenant's default user
    users: [],
    sessions: [],
    session: "",      // the session shown on the Sessions page
    scope: "",        // memories page: "s:<id>" or "u:<user>"
    memories: [],
    selected: null,   // the memory row being edited
    kvTimer: 0,
    kvSamples: null,  // the KV page's last samples, to plot again on resize
  };

  // latest gives each call of a loader a number; an answer that arrives
  // after a later call's is dropped, so overlapping loads never mix rows.
  const gens = {};
  const latest = name => { const g = (gens[name] || 0) + 1; gens[name] = g; return () => gens[name] === g; };

  // h builds an element: h("td", {class: "num"}, "text", childNode…).
  function h(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const k in attrs || {}) {
      const v = attrs[k];
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") e.className = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? "" : v);
    }
    for (const c of kids) {
      if (c === undefined || c === null) continue;
      e.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
    }
    return e;
  }

  function toast(msg, bad) {
    const t = $("toast");
    t.textContent = msg;
    t.className = "toast" + (bad ? " bad" : "");
    t.hidden = false;
    clearTimeout(toast.timer);
    toast.timer = setTimeout(() => { t.hidden = true; }, bad ? 8000 : 4000);
  }

  // armed asks for a second click on a destructive button: the first one
  // arms it for 5 s (its label says so), the second one goes ahead.
  function armed(btn) {
    if (btn.dataset.armed === "1") {
      clearTimeout(btn.armTimer);
      btn.dataset.armed = "";
      btn.textContent = btn.dataset.label;
      return true;
    }
    btn.dataset.label = btn.textContent;
    btn.dataset.armed = "1";
    btn.textContent = "Click again to confirm";
    btn.armTimer = setTimeout(() => { btn.dataset.armed = ""; btn.textContent = btn.dataset.label; }, 5000);
    return false;
  }

  class APIError extends Error {
    constructor(status, body) {
      super((body && body.error && body.error.message) || ("HTTP " + status));
      this.status = status;
      this.code = body && body.error && body.error.code;
    }
  }

  function query(params) {
    const q = new URLSearchParams();
    for (const k in params) if (params[k] !== undefined && params[k] !== null) q.set(k, params[k]);
    const s = q.toString();
    return s ? "?" + s : "";
  }

  async function api(method, path, params, body) {
    const opts = {method, headers: {"Authorization": "Bearer " + state.token}};
    if (body !== undefined) {
      opts.headers["Content-Type"] = "application/json";
      opts.body = JSON.stringify(body);
    }
    const r = await fetch("/admin/v1/" + path + query(params || {}), opts);
    let data = null;
    try { data = await r.json(); } catch (e) { /* not JSON */ }
    if (!r.ok) {
      if (r.status === 401) signOut("The admin token was refused.");
      throw new APIError(r.status, data);
    }
    return data;
  }

  // download fetches an export with the token and saves it under its name.
  async function download(path, params) {
    const r = await fetch("/admin/v1/" + path + query(params), {headers: {"Authorization": "Bearer " + state.token}});
    if (!r.ok) {
      let data = null;
      try { data = await r.json(); } catch (e) { /* not JSON */ }
      throw new APIError(r.status, data);
    }
    const cd = r.headers.get("Content-Disposition") || "";
    const m = /filename="([^"]+)"/.exec(cd);
    const blob = await r.blob();
    const url = URL.createObjectURL(blob);
    const a = h("a", {href: url, download: m ? m[1] : "export"});
    document.body.appendChild(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  }

  const fmtInt = n => (n === undefined || n === null) ? "–" : Number(n).toLocaleString("en-US");
  const fmtNum = (n, d) => (n === undefined || n === null || !isFinite(n)) ? "–" : Number(n).toFixed(d === undefined ? 2 : d);
  const fmtPct = r => (r === undefined || r === null || !isFinite(r)) ? "–" : (100 * r).toFixed(1) + "%";
  function fmtBytes(n) {
    if (n === undefined || n === null) return "–";
    const u = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0, v = Number(n);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : String(v)) + " " + u[i];
  }
  // fmtDur formats nanoseconds (a Go time.Duration in JSON).
  function fmtDur(ns) {
    if (ns === undefined || ns === null || !isFinite(ns) || ns <= 0) return "–";
    if (ns < 1e6) return (ns / 1e3).toFixed(ns < 1e4 ? 1 : 0) + " µs";
    if (ns < 1e9) return (ns / 1e6).toFixed(ns < 1e7 ? 2 : 1) + " ms";
    return (ns / 1e9).toFixed(2) + " s";
  }
  function fmtTime(s) {
    if (!s) return "–";
    const d = new Date(s);
    if (isNaN(d) || d.getFullYear() < 1971) return "–";
    return d.toLocaleString("en-GB", {year: "numeric", month: "short", day: "numeric", hour: "2-digit", minute: "2-digit"});
  }
  function fmtAgo(s) {
    const d = new Date(s);
    if (!s || isNaN(d)) return "–";
    let sec = (Date.now() - d.getTime()) / 1000;
    const future = sec < 0;
    sec = Math.abs(sec);
    const v = sec < 90 ? Math.round(sec) + " s" : sec < 5400 ? Math.round(sec / 60) + " min" :
      sec < 129600 ? Math.round(sec / 3600) + " h" : Math.round(sec / 86400) + " days";
    return future ? "in " + v : v + " ago";
  }
  const userName = u => u === "" ? "(default user)" : u;

  // ---- sign in and scope

  function signOut(msg) {
    state.token = "";
    sessionStorage.removeItem("kvs-admin-token");
    clearInterval(state.kvTimer);
    $("tabs").hidden = $("scope").hidden = true;
    for (const p of document.querySelectorAll(".page")) p.hidden = true;
    $("login").hidden = false;
    $("login-error").hidden = !msg;
    $("login-error").textContent = msg || "";
    $("token").focus();
  }

  async function signIn() {
    try {
      await loadTenants();
    } catch (e) {
      if (e.status !== 401) { $("login-error").hidden = false; $("login-error").textContent = e.message; }
      return;
    }
    $("login").hidden = true;
    $("tabs").hidden = $("scope").hidden = false;
    await showTab(location.hash.slice(1) || state.tab);
  }

  async function loadTenants() {
    const r = await api("GET", "tenants");
    const sel = $("tenant");
    const prev = state.tenant;
    sel.textContent = "";
    for (const t of r.data) {
      const what = [t.sessions || !t.resp_keys ? `${t.sessions} sessions` : "", t.resp_keys ? `${t.resp_keys} RESP keys` : ""].filter(Boolean).join(", ");
      sel.appendChild(h("option", {value: t.tenant}, `${t.tenant} (${what})`));
    }
    if (r.data.length === 0) sel.appendChild(h("option", {value: ""}, "no tenants yet"));
    state.tenant = r.data.some(t => t.tenant === prev) ? prev : (r.data[0] ? r.data[0].tenant : "");
    sel.value = state.tenant;
    await loadSessions();
  }

  async function loadSessions() {
    if (!state.tenant) { state.sessions = []; state.users = []; fillUsers(); return; }
    const current = latest("sessions");
    const r = await api("GET", "sessions", {tenant: state.tenant});
    if (!current()) return;
    state.sessions = r.data;
    state.users = r.users.map(u => u.user);
    if (state.user !== null && !state.users.includes(state.user)) state.user = null;
    fillUsers();
  }

  function fillUsers() {
    const sel = $("user");
    sel.textContent = "";
    sel.appendChild(h("option", {value: "*"}, "all users"));
    for (const u of state.users) sel.appendChild(h("option", {value: "=" + u}, userName(u)));
    sel.value = state.user === null ? "*" : "=" + state.user;
  }

  const userSessions = () => state.sessions.filter(s => state.user === null || s.user === state.user);

  async function showTab(tab) {
    if (!["sessions", "memories", "knowledge", "kv", "resp"].includes(tab)) tab = "sessions";
    state.tab = tab;
    if (location.hash !== "#" + tab) history.replaceState(null, "", "#" + tab);
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.tab === tab);
    for (const p of document.querySelectorAll(".page")) p.hidden = p.id !== "page-" + tab;
    clearInterval(state.kvTimer);
    try {
      if (tab === "sessions") await renderSessions();
      if (tab === "memories") await renderMemoriesPage();
      if (tab === "knowledge") await renderKnowledge();
      if (tab === "kv") await renderKV();
      if (tab === "resp") await renderRESP();
    } catch (e) {
      toast(e.message, true);
    }
  }

  // ---- sessions

  async function renderSessions() {
    const list = userSessions();
    const tb = $("sessions-table").tBodies[0];
    tb.textContent = "";
    $("sessions-count").textContent = "(" + list.length + ")";
    $("sessions-empty").hidden = list.length > 0;
    for (const s of list) {
      const tr = h("tr", {"data-session": s.id, onclick: () => selectSession(s.id)},
        h("td", {class: "id"}, s.id), h("td", {}, userName(s.user)), h("td", {title: fmtTime(s.updated_at)}, fmtAgo(s.updated_at)),
        h("td", {class: "num"}, fmtBytes(s.bytes)));
      if (s.id === state.session) tr.classList.add("selected");
      tb.appendChild(tr);
    }
    if (state.session && list.some(s => s.id === state.session)) await selectSession(state.session);
    else { $("session-body").hidden = true; $("session-none").hidden = false; }
  }

  async function selectSession(id) {
    state.session = id;
    for (const tr of $("sessions-table").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.session === id);
    const current = latest("session");
    let d;
    try {
      d = await api("GET", "sessions/" + encodeURIComponent(id), {tenant: state.tenant});
    } catch (e) { toast(e.message, true); return; }
    if (!current()) return;
    $("session-none").hidden = true;
    $("session-body").hidden = false;
    $("session-title").textContent = "Session " + d.id;
    const facts = $("session-facts");
    facts.textContent = "";
    const fact = (k, v) => { facts.appendChild(h("dt", {}, k)); facts.appendChild(h("dd", {}, v)); };
    const user = (state.sessions.find(s => s.id === d.id) || {}).user;
    fact("User", user === undefined ? "–" : userName(user));
    fact("Created", fmtTime(d.created_at));
    fact("Last write", fmtTime(d.updated_at) + " (" + fmtAgo(d.updated_at) + ")");
    fact("Model", d.model || "–");
    fact("Messages", fmtInt(d.messages ? d.messages.length : 0) + " stored, " + fmtInt(d.tokens) + " tokens; " + fmtInt(d.focus_tokens) + " tokens in the window");
    fact("Memory units", fmtInt(d.units) + " (" + Object.entries(d.categories).map(([c, n]) => n + " " + c).join(", ") + (Object.keys(d.categories).length ? "" : "no categorized memories") + ")");
    if (d.engine) fact("Engine", `slot ${d.engine.slot}, ${d.engine.saves} saves, ${d.engine.restores} restores, ${fmtInt(d.engine.total.cache_n)} prompt tokens reused`);

    const tiers = $("session-tiers");
    tiers.textContent = "";
    const total = d.tiers.focus + d.tiers.working + d.tiers.archive;
    const stack = h("div", {class: "stack"});
    for (const t of ["focus", "working", "archive"]) {
      if (!d.tiers[t]) continue;
      const sp = h("span", {title: t + ": " + d.tiers[t]}, t + " " + d.tiers[t]);
      sp.style.flex = String(d.tiers[t] / Math.max(total, 1));
      sp.style.background = TIER_COLORS[t];
      stack.appendChild(sp);
    }
    tiers.appendChild(stack);
    tiers.appendChild(h("div", {class: "legend"}, "Focus: messages in the window · Working: memory units in RAM · Archive: units on disk"));

    const win = $("session-window");
    win.textContent = "";
    const w = d.last_window;
    if (!w) {
      win.appendChild(h("p", {class: "muted"}, "No window built for this session since the sidecar started."));
    } else {
      const parts = [["system", w.system_tokens, "#475569"], ["stable block", w.stable_tokens, "#b45309"],
        ["history", w.history_tokens, "#2563eb"], ["recall", w.recall_tokens, "#0d9488"], ["tools", w.tools_tokens, "#9333ea"]];
      const bar = h("div", {class: "stack", id: "window-bar", title: "the window against its limit"});
      const legend = h("div", {class: "legend"});
      for (const [name, n, color] of parts) {
        if (!n) continue;
        const sp = h("span", {title: name + ": " + n + " tokens"});
        sp.style.width = (100 * n / Math.max(w.limit, 1)) + "%";
        sp.style.background = color;
        bar.appendChild(sp);
        const sw = h("i");
        sw.style.background = color;
        legend.appendChild(h("span", {}, sw, name + " " + fmtInt(n)));
      }
      win.appendChild(bar);
      win.appendChild(legend);
      win.appendChild(h("div", {class: "legend"}, `${fmtInt(w.total_tokens)} of ${fmtInt(w.limit)} tokens · ${w.window_messages} messages in the window (${w.stored_messages} stored before the turn) · ${w.evicted} left the window · ${fmtInt(w.shared_prefix_tokens)} tokens shared with the previous window · ${fmtAgo(w.at)}`));
      const rf = h("dl", {class: "facts"});
      const add = (k, v) => { rf.appendChild(h("dt", {}, k)); rf.appendChild(h("dd", {}, v)); };
      add("Recall", w.recalled ? `${w.recalled} memories (${w.cross_session} from the user's other sessions), ${w.recall === "reuse" ? "same topic: previous set reused" : "full search"}` : "nothing recalled");
      add("Mode", w.mode + (w.mode_detected ? " (detected)" : "") + "; history " + w.match);
      win.appendChild(rf);
      if (w.recall_block) { win.appendChild(h("div", {class: "muted"}, "Recall block")); win.appendChild(h("pre", {class: "block", id: "recall-block"}, w.recall_block)); }
      if (w.stable_block) { win.appendChild(h("div", {class: "muted"}, "Stable block (pinned memories, summaries)")); win.appendChild(h("pre", {class: "block"}, w.stable_block)); }
    }

    const mt = $("messages-table").tBodies[0];
    mt.textContent = "";
    for (const m of (d.messages || []).slice(-200)) {
      mt.appendChild(h("tr", {}, h("td", {class: "num"}, m.seq), h("td", {}, m.role + (m.system ? " (system)" : "") + (m.partial ? " (partial)" : "")),
        h("td", {}, h("span", {class: "badge " + m.tier}, m.tier)), h("td", {class: "num"}, m.tokens),
        h("td", {class: "text"}, m.content.length > 600 ? m.content.slice(0, 600) + "…" : m.content)));
    }
  }

  async function deleteSession() {
    const id = state.session;
    if (!id || !armed($("session-delete"))) return;
    try {
      await api("DELETE", "sessions/" + encodeURIComponent(id), {tenant: state.tenant});
      toast("Deleted session " + id);
      state.session = "";
      await loadSessions();
      await renderSessions();
    } catch (e) { toast(e.message, true); }
  }

  // ---- memories

  function scopeParams() {
    const p = {tenant: state.tenant};
    if (state.scope.startsWith("s:")) p.session = state.scope.slice(2);
    else p.user = state.scope.slice(2);
    return p;
  }
  const scopeSession = () => state.scope.startsWith("s:") ? state.scope.slice(2) : "";

  function fillScope() {
    const sel = $("memory-scope");
    sel.textContent = "";
    const users = state.user === null ? state.users : [state.user];
    for (const u of users) sel.appendChild(h("option", {value: "u:" + u}, "all sessions of " + userName(u)));
    for (const s of userSessions()) sel.appendChild(h("option", {value: "s:" + s.id}, "session " + s.id));
    const values = [...sel.options].map(o => o.value);
    if (!values.includes(state.scope)) state.scope = values.find(v => v.startsWith("s:")) || values[0] || "";
    sel.value = state.scope;

    const add = $("add-session");
    add.textContent = "";
    for (const s of userSessions()) add.appendChild(h("option", {value: s.id}, s.id + " (" + userName(s.user) + ")"));
    if (scopeSession()) add.value = scopeSession();
  }

  function categoryOptions(sel) {
    sel.textContent = "";
    for (const c of CATEGORIES) sel.appendChild(h("option", {value: c}, c));
  }

  async function renderMemoriesPage() {
    fillScope();
    await Promise.all([loadMemories(), loadStats()]);
  }

  async function loadMemories() {
    const current = latest("memories");
    const tb = $("memories-table").tBodies[0];
    if (!state.scope) {
      tb.textContent = "";
      $("memories-empty").hidden = false; $("memories-count").textContent = ""; selectMemory(null); return;
    }
    const r = await api("GET", "memories", scopeParams());
    if (!current()) return;
    tb.textContent = "";
    $("memories-all").checked = false;
    state.memories = r.data;
    $("memories-count").textContent = "(" + r.data.length + ")";
    $("memories-empty").hidden = r.data.length > 0;
    for (const m of r.data) {
      const key = m.session + "\u0000" + m.id;
      const cb = h("input", {type: "checkbox", class: "pick", "data-id": m.id, "aria-label": "select " + m.id, onclick: e => e.stopPropagation()});
      const bar = h("span", {class: "bar"}, h("i"));
      bar.firstChild.style.width = Math.min(100, 100 * m.importance / 3) + "%";
      let decay = "never";
      if (m.decay) {
        decay = `×${m.decay.factor} ${fmtAgo(m.decay.next_at)}`;
        if (m.decay.expires_at) decay += ", deleted " + fmtAgo(m.decay.expires_at);
      }
      const tr = h("tr", {"data-id": m.id, "data-session": m.session, onclick: () => selectMemory(m)},
        h("td", {}, cb), h("td", {class: "id"}, m.id), h("td", {class: "id"}, m.session),
        h("td", {}, h("span", {class: "badge " + m.category}, m.category)),
        h("td", {class: "num"}, h("span", {class: "imp"}, bar, fmtNum(m.importance))),
        h("td", {}, m.review ? h("span", {class: "flag " + m.review}, m.review) : ""),
        h("td", {}, decay), h("td", {class: "num"}, m.tokens), h("td", {class: "text"}, m.content, mergedNote(m.merged)));
      if (state.selected && state.selected.session + "\u0000" + state.selected.id === key) tr.classList.add("selected");
      tb.appendChild(tr);
    }
    const sel = state.selected;
    selectMemory(sel ? r.data.find(m => m.id === sel.id && m.session === sel.session) || null : null);
  }

  // mergedNote shows what an L4 merge made of a fact: how many it replaced,
  // its fidelity figures and the keywords it lost.
  function mergedNote(mg) {
    if (!mg) return null;
    let t = `merged from ${mg.from.length} · fidelity ${fmtNum(mg.fidelity)} (similarity ${fmtNum(mg.similarity)}, keywords ${fmtNum(mg.keyword_retention)})`;
    if (mg.lost_keywords && mg.lost_keywords.length) t += " · lost: " + mg.lost_keywords.join(", ");
    return h("div", {class: "muted merged", title: "L4 merge of " + mg.from.join(", ")}, t);
  }

  function selectMemory(m) {
    state.selected = m;
    for (const tr of $("memories-table").tBodies[0].rows)
      tr.classList.toggle("selected", !!m && tr.dataset.id === m.id && tr.dataset.session === m.session);
    $("edit-form").hidden = !m;
    $("editor-none").hidden = !!m;
    if (!m) return;
    const del = $("edit-delete");
    if (del.dataset.armed === "1") armed(del); // disarm for the new row
    $("edit-id").textContent = m.id;
    $("edit-session").textContent = m.session;
    $("edit-text").value = m.content;
    $("edit-category").value = m.category;
    $("edit-importance").value = String(Math.round(m.importance * 1000) / 1000);
  }

  async function saveMemory(ev) {
    ev.preventDefault();
    const m = state.selected;
    if (!m) return;
    const body = {};
    const text = $("edit-text").value, cat = $("edit-category").value, imp = parseFloat($("edit-importance").value);
    if (text !== m.content) body.text = text;
    if (cat !== m.category) body.category = cat;
    if (isFinite(imp) && Math.abs(imp - m.importance) > 1e-9) body.importance = imp;
    if (Object.keys(body).length === 0) { toast("Nothing changed."); return; }
    try {
      const u = await api("PATCH", "memories/" + encodeURIComponent(m.id), {tenant: state.tenant, session: m.session}, body);
      state.selected = u;
      toast("Saved " + m.id);
      await Promise.all([loadMemories(), loadStats()]);
    } catch (e) { toast(e.message, true); }
  }

  async function deleteMemory() {
    const m = state.selected;
    if (!m || !armed($("edit-delete"))) return;
    try {
      await api("DELETE", "memories/" + encodeURIComponent(m.id), {tenant: state.tenant, session: m.session});
      toast("Deleted " + m.id);
      state.selected = null;
      await Promise.all([loadMemories(), loadStats()]);
    } catch (e) { toast(e.message, true); }
  }

  async function boostMemory() {
    const m = state.selected;
    if (!m) return;
    try {
      const r = await api("POST", "memories/" + encodeURIComponent(m.id) + "/boost", {tenant: state.tenant, session: m.session});
      toast(`Boosted ${m.id} to ${fmtNum(r.importance)}`);
      await Promise.all([loadMemories(), loadStats()]);
    } catch (e) { toast(e.message, true); }
  }

  async function addMemory(ev) {
    ev.preventDefault();
    const session = $("add-session").value;
    if (!session) { toast("Choose a session first.", true); return; }
    const body = {category: $("add-category").value, text: $("add-text").value};
    const imp = parseFloat($("add-importance").value);
    if (isFinite(imp)) body.importance = imp;
    try {
      const u = await api("POST", "memories", {tenant: state.tenant, session}, body);
      toast(`Added ${u.id} (${u.category}) to ${session}`);
      $("add-text").value = "";
      state.selected = u;
      await Promise.all([loadMemories(), loadStats()]);
    } catch (e) { toast(e.message, true); }
  }

  function checkedIDs() {
    return [...document.querySelectorAll("#memories-table input.pick:checked")].map(c => c.dataset.id);
  }

  async function batchDelete(ev) {
    ev.preventDefault();
    const session = scopeSession();
    const out = $("batch-result");
    if (!session) { toast("Show one session (the selector above the table) to batch-delete its memories.", true); return; }
    const ids = $("batch-ids").value.split(/[\s,;]+/).filter(Boolean);
    if (ids.length === 0) { toast("List at least one id.", true); return; }
    if (!armed($("batch-delete"))) return;
    try {
      const r = await api("POST", "memories/batch-delete", {tenant: state.tenant, session}, {ids});
      out.hidden = false;
      out.textContent = "";
      out.appendChild(h("div", {id: "batch-deleted"}, `Deleted ${r.deleted.length}: ${r.deleted.join(", ") || "none"}`));
      out.appendChild(h("div", {id: "batch-skipped"}, `Skipped ${r.skipped.length}: ${r.skipped.map(s => s.id + " (" + s.reason + ")").join(", ") || "none"}`));
      if (r.not_found.length) out.appendChild(h("div", {id: "batch-missing"}, `Not found ${r.not_found.length}: ${r.not_found.join(", ")}`));
      $("batch-ids").value = "";
      await Promise.all([loadMemories(), loadStats()]);
    } catch (e) { toast(e.message, true); }
  }

  async function loadStats() {
    const current = latest("stats");
    const tb = $("stats-table").tBodies[0];
    const bars = $("stats-bars");
    if (!state.scope) { tb.textContent = ""; bars.textContent = ""; return; }
    const r = await api("GET", "stats", scopeParams());
    if (!current()) return;
    tb.textContent = "";
    bars.textContent = "";
    const top = Math.max(1, ...r.data.map(c => c.count));
    for (const c of r.data) {
      tb.appendChild(h("tr", {"data-category": c.category}, h("td", {}, h("span", {class: "badge " + c.category}, c.category)),
        h("td", {class: "num"}, c.count), h("td", {class: "num"}, fmtInt(c.tokens)), h("td", {class: "num"}, c.count ? fmtNum(c.mean_importance) : "–"),
        h("td", {class: "num"}, c.count ? fmtNum(c.min_importance) + "–" + fmtNum(c.max_importance) : "–"),
        h("td", {class: "num"}, c.review_promote), h("td", {class: "num"}, c.review_decay), h("td", {class: "num"}, c.review_expire)));
      const bar = h("div");
      bar.style.width = (100 * c.count / top) + "%";
      bar.style.background = CAT_COLORS[c.category];
      bars.appendChild(h("div", {class: "b"}, h("span", {}, c.category), h("span", {}, bar), h("span", {class: "num"}, c.count)));
    }
  }

  async function exportFile(path, format) {
    if (!state.scope) return;
    try {
      await download(path, Object.assign(scopeParams(), {format}));
      toast("Downloaded " + path + " as " + format.toUpperCase());
    } catch (e) { toast(e.message, true); }
  }

  // ---- knowledge

  async function renderKnowledge() {
    const user = state.user === null ? "" : state.user;
    const current = latest("knowledge");
    const [t, r] = await Promise.all([api("GET", "triples", {tenant: state.tenant, user}), api("GET", "reviews", {tenant: state.tenant, user})]);
    if (!current()) return;
    $("knowledge-off").hidden = t.available;
    const tb = $("triples-table").tBodies[0];
    tb.textContent = "";
    $("triples-count").textContent = "(" + t.data.length + " for " + userName(user) + (state.user === null ? "; pick a user above for another" : "") + ")";
    $("triples-empty").hidden = t.data.length > 0;
    for (const x of t.data) {
      tb.appendChild(h("tr", {"data-id": x.id}, h("td", {}, x.subject), h("td", {}, x.predicate), h("td", {}, x.object),
        h("td", {class: "id"}, (x.support || []).join(", ")), h("td", {}, fmtTime(x.at)),
        h("td", {}, h("button", {type: "button", class: "danger", onclick: ev => deleteTriple(ev.currentTarget, x.id, user)}, "Delete"))));
    }
    const rb = $("reviews-table").tBodies[0];
    rb.textContent = "";
    $("reviews-count").textContent = "(" + r.data.length + ")";
    $("reviews-empty").hidden = r.data.length > 0;
    for (const x of r.data) {
      rb.appendChild(h("tr", {}, h("td", {class: "id"}, x.fact_id), h("td", {}, h("span", {class: "flag " + (x.decision === "promote" ? "promote" : x.decision === "delete" ? "expire" : "")}, x.decision)),
        h("td", {}, x.trigger === "demote" ? "decayed" : x.trigger === "promote" ? "reached promotion" : ""), h("td", {class: "num"}, x.rounds), h("td", {}, fmtTime(x.at)), h("td", {class: "text"}, x.reason)));
    }
  }

  async function deleteTriple(btn, id, user) {
    if (!armed(btn)) return;
    try {
      await api("DELETE", "triples/" + encodeURIComponent(id), {tenant: state.tenant, user});
      toast("Deleted triple " + id);
      await renderKnowledge();
    } catch (e) { toast(e.message, true); }
  }

  // ---- KV

  function statCard(id, k, v, sub) {
    return h("div", {class: "stat", id}, h("div", {class: "k"}, k), h("div", {class: "v"}, v), sub ? h("div", {class: "s"}, sub) : null);
  }

  async function renderKV() {
    await refreshKV();
    const every = Math.max(1000, state.kvEvery || 5000);
    state.kvTimer = setInterval(() => { if (state.tab === "kv" && !document.hidden) refreshKV().catch(e => toast(e.message, true)); }, every);
  }

  async function refreshKV() {
    const current = latest("kv");
    const d = await api("GET", "kv");
    if (!current()) return;
    state.kvEvery = d.sample_every_ms;
    const cards = $("kv-cards");
    cards.textContent = "";
    // The engine's card, facts and states by tier are the connector's own
    // (engine_facts): the page knows no connector's counters.
    const kv = d.kv, am = d.amortization, en = d.engine, facts = d.engine_facts || {}, mem = d.memory;
    if (kv) {
      cards.appendChild(statCard("card-hitrate", "KV cache hit rate", fmtPct(kv.hit_rate), `${fmtInt(kv.hits)} hits, ${fmtInt(kv.misses)} misses (${kv.strategy})`));
    }
    if (kv && kv.tuning) {
      const tn = kv.tuning, tu = kv.tuner;
      const last = tu && tu.last && tu.last.length ? tu.last[tu.last.length - 1] : null;
      cards.appendChild(statCard("card-tuning", "KV tuning" + (tu ? " (adaptive)" : " (fixed)"),
        `promote at ${tn.promote_threshold.toFixed(2)}, zstd ${tn.archive_level || "-"}` + (tn.balance >= 0 ? `, recency ${fmtPct(tn.balance)}` : ""),
        tu ? `${fmtInt(tu.epochs)} epochs; ` + (last ? `last: ${last.knob} ${last.from.toFixed(2)} → ${last.to.toFixed(2)} (${last.reason})` : "no change yet") : "the AdaptiveTuner is off (--kv-tune)"));
    }
    if (am) cards.appendChild(statCard("card-amortization", "Computes saved per turn", fmtPct(am.amortization_ratio), `${fmtInt(am.compute_saved)} of ${fmtInt(am.total_turns)} turns loaded instead of computed`));
    if (en) {
      const tm = en.timings || {};
      cards.appendChild(statCard("card-reused", "Tokens not reprocessed", fmtInt((tm.cache_n || 0)),
        `engine prompt cache ${fmtPct(en.cached_ratio)}; ${fmtInt(en.reused_tokens)} thanks to restores`));
      cards.appendChild(statCard("card-engine", "Engine (" + en.connector + ")", facts.status || "", facts.summary || ""));
    }
    if (mem) cards.appendChild(statCard("card-memory", "Sessions loaded", fmtInt(mem.Sessions), `${fmtInt(mem.Prepares)} windows built, ${fmtInt(mem.Evicted)} messages left windows`));
    renderThresholds(d.thresholds || [], cards);

    const tb = $("tiers-table").tBodies[0];
    tb.textContent = "";
    for (const t of (kv && kv.tiers) || []) {
      const occ = t.max_bytes > 0 ? t.bytes / t.max_bytes : 0;
      const bar = h("span", {class: "occ"}, h("i"));
      bar.firstChild.style.width = Math.min(100, 100 * occ) + "%";
      bar.firstChild.style.background = TIER_COLORS[t.tier] || "#64748b";
      tb.appendChild(h("tr", {"data-tier": t.tier}, h("td", {}, h("span", {class: "badge " + t.tier}, t.tier)), h("td", {class: "num"}, fmtInt(t.entries)),
        h("td", {class: "num"}, fmtBytes(t.bytes)), h("td", {class: "num"}, t.max_bytes > 0 ? fmtBytes(t.max_bytes) : "none"),
        h("td", {class: "nowrap"}, bar, t.max_bytes > 0 ? fmtPct(occ) : "–"), h("td", {class: "num"}, fmtInt(t.hits)), h("td", {class: "num"}, fmtInt(t.misses)),
        h("td", {class: "num"}, fmtInt(t.demotions)), h("td", {class: "num"}, fmtInt(t.promotions))));
    }

    const ef = $("engine-facts");
    ef.textContent = "";
    const et = $("engine-tiers").tBodies[0];
    et.textContent = "";
    if (en) {
      const add = (k, v) => { ef.appendChild(h("dt", {}, k)); ef.appendChild(h("dd", {}, v)); };
      add("Connector", en.connector + (en.enabled ? "" : " (disabled: " + (en.disabled_reason || "?") + ")"));
      for (const f of facts.lines || []) add(f.name, f.value);
      for (const t of facts.tiers || []) {
        et.appendChild(h("tr", {}, h("td", {}, h("span", {class: "badge " + t.tier}, t.tier)), h("td", {class: "num"}, fmtInt(t.states)),
          h("td", {class: "num"}, fmtBytes(t.bytes))));
      }
    } else {
      ef.appendChild(h("dd", {class: "muted"}, "No engine connector (--engine none)."));
    }
    plotKV(d.samples);
  }

  // renderThresholds fills the alert thresholds table (the MemGPT design's
  // thresholds, judged by the sidecar as its Prometheus rules do), adds a
  // card counting the breached ones and marks the KV tab while any is.
  function renderThresholds(ths, cards) {
    const fmt = (unit, v) => unit === "seconds" ? (v < 1 ? Math.round(v * 1000) + " ms" : fmtNum(v) + " s") : fmtPct(v);
    const tb = $("thresholds-table").tBodies[0];
    tb.textContent = "";
    let breached = 0, unknown = 0;
    for (const th of ths) {
      const state = th.breached ? "breached" : th.known ? "ok" : "unknown";
      if (th.breached) breached++;
      if (!th.known) unknown++;
      tb.appendChild(h("tr", {"data-alert": th.alert, "data-state": state, title: th.alert},
        h("td", {}, th.name), h("td", {class: "num"}, th.known ? fmt(th.unit, th.value) : "–"),
        h("td", {class: "num"}, (th.above ? "> " : "< ") + fmt(th.unit, th.limit)),
        h("td", {class: "state"}, state === "unknown" ? "no data" : state)));
    }
    const card = statCard("card-thresholds", "Alert thresholds", `${breached} breached`,
      `of ${ths.length}; ${unknown} without data yet`);
    if (breached) card.classList.add("breached");
    cards.appendChild(card);
    $("tab-kv").dataset.alerts = String(breached);
    $("tab-kv").title = breached ? breached + " alert threshold(s) breached" : "";
  }

  function plotKV(samples) {
    state.kvSamples = samples;
    const t = s => new Date(s.at).getTime();
    const hit = [], prompt = [], cumulative = [];
    for (const s of samples) {
      const n = s.kv_hits + s.kv_misses;
      cumulative.push([t(s), n > 0 ? 100 * s.kv_hits / n : NaN]);
    }
    for (let i = 1; i < samples.length; i++) {
      const a = samples[i - 1], b = samples[i];
      const dh = b.kv_hits - a.kv_hits, dm = b.kv_misses - a.kv_misses;
      hit.push([t(b), dh + dm > 0 ? 100 * dh / (dh + dm) : NaN]);
      const dc = b.cached_tokens - a.cached_tokens, dp = b.prefilled_tokens - a.prefilled_tokens;
      prompt.push([t(b), dc + dp > 0 ? 100 * dc / (dc + dp) : NaN]);
    }
    Plot.lines($("plot-hitrate"), {title: "hit rate per interval", yMax: 100, yFmt: v => Math.round(v) + "%",
      series: [{name: "KV cache, per interval", color: SERIES_COLORS.kvInterval, points: hit},
        {name: "KV cache, since start", color: SERIES_COLORS.kvCumulative, dashed: true, points: cumulative},
        {name: "engine prompt tokens reused, per interval", color: SERIES_COLORS.enginePerInterval, points: prompt}],
      empty: "Collecting samples… (one every " + Math.round((state.kvEvery || 5000) / 1000) + " s)"});
    const tiers = {};
    for (const s of samples) for (const x of s.tiers || []) (tiers[x.tier] = tiers[x.tier] || []).push([t(s), x.bytes]);
    Plot.lines($("plot-tiers"), {title: "bytes per tier", yFmt: fmtBytes,
      series: Object.keys(tiers).map(k => ({name: k, color: TIER_COLORS[k] || "#64748b", points: tiers[k]}))});
    Plot.lines($("plot-tokens"), {title: "tokens not reprocessed", yFmt: v => fmtInt(Math.round(v)),
      series: [{name: "prompt tokens reused (engine)", color: SERIES_COLORS.engineReused, points: samples.map(s => [t(s), s.cached_tokens])},
        {name: "prompt tokens prefilled", color: SERIES_COLORS.prefilled, points: samples.map(s => [t(s), s.prefilled_tokens])},
        {name: "reused thanks to restores", color: SERIES_COLORS.restored, points: samples.map(s => [t(s), s.reused_tokens])}]});
  }

  // ---- RESP store

  // The RESP store's tiers as an operator names them.
  const RESP_TIERS = [["working", "RAM"], ["archive", "disk"], ["focus", "GPU"]];
  const respTierName = t => (RESP_TIERS.find(x => x[0] === t) || [t, t])[1] + " (" + t + ")";

  async function renderRESP() {
    await refreshRESP();
    const every = Math.max(1000, state.kvEvery || 5000);
    state.kvTimer = setInterval(() => { if (state.tab === "resp" && !document.hidden) refreshRESP().catch(e => toast(e.message, true)); }, every);
  }

  // tierStack draws bytes by tier as one bar with its legend.
  function tierStack(el, tierBytes) {
    el.textContent = "";
    const total = RESP_TIERS.reduce((n, [t]) => n + (tierBytes[t] || 0), 0);
    const stack = h("div", {class: "stack"});
    const legend = h("div", {class: "legend"});
    for (const [t] of RESP_TIERS) {
      const n = tierBytes[t] || 0;
      if (n > 0) {
        const sp = h("span", {title: respTierName(t) + ": " + fmtBytes(n)}, respTierName(t));
        sp.style.flex = String(n / total);
        sp.style.background = TIER_COLORS[t];
        stack.appendChild(sp);
      }
      const sw = h("i");
      sw.style.background = TIER_COLORS[t];
      legend.appendChild(h("span", {"data-tier": t}, sw, respTierName(t) + " " + fmtBytes(n)));
    }
    el.appendChild(stack);
    el.appendChild(legend);
  }

  async function refreshRESP() {
    const current = latest("resp");
    const d = await api("GET", "resp", {tenant: state.tenant || undefined});
    if (!current()) return;
    if (d.sample_every_ms) state.kvEvery = d.sample_every_ms;
    $("resp-off").hidden = d.enabled;
    $("resp-on").hidden = !d.enabled;
    if (!d.enabled) return;

    // The tenant picked above.
    const x = d.tenant;
    $("resp-tenant").hidden = !x;
    if (x) {
      $("resp-tenant-name").textContent = x.tenant;
      const idle = !x.keys && !x.hits && !x.misses && !x.sets;
      $("resp-tenant-note").textContent = idle ? "holds no keys in the RESP store and made no lookups" : "";
      const cards = $("resp-tenant-cards");
      cards.textContent = "";
      cards.appendChild(statCard("resp-card-hitratio", "Hit ratio", fmtPct(x.hit_ratio), `${fmtInt(x.hits)} hits, ${fmtInt(x.misses)} misses`));
      cards.appendChild(statCard("resp-card-keys", "Keys", fmtInt(x.keys), `${fmtBytes(x.bytes)}; ${fmtInt(x.salts)} cache salts`));
      cards.appendChild(statCard("resp-card-evictions", "Evictions", fmtInt(x.evictions), `${fmtBytes(x.evicted_bytes)} evicted to keep the quota`));
      const quota = x.quota > 0 ? fmtBytes(x.quota) : "none";
      cards.appendChild(statCard("resp-card-quota", "Quota", quota,
        (x.quota > 0 ? fmtPct(x.bytes / x.quota) + " used; " : "") + `${fmtInt(x.quota_refusals)} SETs refused (larger than the quota)`));
      tierStack($("resp-tenant-tiers"), x.tier_bytes || {});
      const facts = $("resp-tenant-facts");
      facts.textContent = "";
      const add = (k, v) => { facts.appendChild(h("dt", {}, k)); facts.appendChild(h("dd", {}, v)); };
      add("Stored", `${fmtInt(x.sets)} SETs, ${fmtBytes(x.bytes_in)} written`);
      add("Served", `${fmtBytes(x.bytes_out)} read by GET`);
      add("Deleted", `${fmtInt(x.deletes)} by DEL, ${fmtInt(x.expired)} expired, ${fmtInt(x.lost)} lost by the tiers`);
    }

    // The whole store.
    const tot = d.totals, am = d.amortization;
    const cards = $("resp-cards");
    cards.textContent = "";
    cards.appendChild(statCard("resp-card-total-hitratio", "Hit ratio, all tenants", fmtPct(tot.hit_ratio),
      `${fmtInt(tot.hits)} hits, ${fmtInt(tot.misses)} misses; ${fmtInt(tot.tenants)} tenants`));
    cards.appendChild(statCard("resp-card-conns", "Connections", fmtInt(d.connections),
      `${fmtInt(d.refused_connections)} refused, ${fmtInt(d.auth_failures)} AUTH failures, ${fmtInt(d.protocol_errors)} protocol errors`));
    cards.appendChild(statCard("resp-card-unsynced", "Unsynced bytes", fmtBytes(d.unsynced_bytes),
      `--resp-fsync ${d.fsync}; ${fmtInt(d.persisted)} values written behind` + (d.persist_errors ? `, ${fmtInt(d.persist_errors)} failed` : "")));
    cards.appendChild(statCard("resp-card-total-keys", "Keys", fmtInt(tot.keys), `${fmtBytes(tot.bytes)}; ${fmtInt(d.loaded)} found on disk at start`));
    cards.appendChild(statCard("resp-card-total-evictions", "Evictions", fmtInt(tot.evictions), `${fmtBytes(tot.evicted_bytes)}; ${fmtInt(tot.quota_refusals)} SETs over a whole quota`));
    cards.appendChild(statCard("resp-card-amortized", "Amortized cost per turn", fmtDur(am.amortized_cost_per_turn_ns),
      am.computes ? `C_compute ${fmtDur(am.mean_compute_ns)}, C_load ${fmtDur(am.mean_load_all_ns)}, T ${fmtNum(am.turns_per_compute)}` : "no compute measured yet (a miss, then the SET of that key)"));

    const tb = $("resp-tiers-table").tBodies[0];
    tb.textContent = "";
    for (const t of (d.cache && d.cache.tiers) || []) {
      const occ = t.max_bytes > 0 ? t.bytes / t.max_bytes : 0;
      const bar = h("span", {class: "occ"}, h("i"));
      bar.firstChild.style.width = Math.min(100, 100 * occ) + "%";
      bar.firstChild.style.background = TIER_COLORS[t.tier] || "#64748b";
      tb.appendChild(h("tr", {"data-tier": t.tier}, h("td", {class: "nowrap"}, h("span", {class: "badge " + t.tier, title: t.tier}, (RESP_TIERS.find(x => x[0] === t.tier) || [t.tier, t.tier])[1])), h("td", {class: "num"}, fmtInt(t.entries)),
        h("td", {class: "num"}, fmtBytes(t.bytes)), h("td", {class: "num"}, t.max_bytes > 0 ? fmtBytes(t.max_bytes) : "none"),
        h("td", {class: "nowrap"}, bar, t.max_bytes > 0 ? fmtPct(occ) : "–"), h("td", {class: "num"}, fmtInt(t.hits)), h("td", {class: "num"}, fmtInt(t.misses)),
        h("td", {class: "num"}, fmtInt(t.quarantined || 0))));
    }

    const af = $("resp-amortization");
    af.textContent = "";
    const add = (k, v) => { af.appendChild(h("dt", {}, k)); af.appendChild(h("dd", {}, v)); };
    add("Loads", fmtInt(am.loads) + " GETs served from the tiers instead of a compute");
    add("Computes", fmtInt(am.computes) + " misses followed by the SET of that key");
    add("C_compute", fmtDur(am.mean_compute_ns) + " (a miss to its SET: the engine's prefill and the transfer)");
    const loads = RESP_TIERS.filter(([t]) => am.mean_load_ns && am.mean_load_ns[t]).map(([t]) => respTierName(t) + " " + fmtDur(am.mean_load_ns[t]));
    add("C_load", fmtDur(am.mean_load_all_ns) + (loads.length ? " (" + loads.join(", ") + ")" : ""));
    add("T", am.computes ? fmtNum(am.turns_per_compute) + " lookups per compute" : "–");
    add("Per turn", fmtDur(am.amortized_cost_per_turn_ns) + " = (C_compute + (T−1)·C_load) / T");
    if (d.remote_hits || d.remote_errors) add("--remote", `${fmtInt(d.remote_hits)} hits, ${fmtInt(d.remote_errors)} errors`);

    const cb = $("resp-commands").tBodies[0];
    cb.textContent = "";
    for (const [name, n] of Object.entries(d.commands || {}).sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1))) {
      cb.appendChild(h("tr", {"data-command": name}, h("td", {}, name), h("td", {class: "num"}, fmtInt(n))));
    }

    const rt = $("resp-tenants-table").tBodies[0];
    rt.textContent = "";
    $("resp-tenants-count").textContent = "(" + (d.tenants.length < d.tenants_total ? d.tenants.length + " of " : "") + d.tenants_total + ", most bytes first)";
    $("resp-tenants-empty").hidden = d.tenants.length > 0;
    for (const t of d.tenants) {
      const tiers = t.tier_bytes || {};
      const tr = h("tr", {"data-tenant": t.tenant, title: "Show " + t.tenant, onclick: () => pickTenant(t.tenant)},
        h("td", {class: "id"}, t.tenant), h("td", {class: "num"}, fmtInt(t.keys)), h("td", {class: "num"}, fmtBytes(t.bytes)),
        h("td", {class: "num"}, fmtBytes(tiers.working || 0)), h("td", {class: "num"}, fmtBytes(tiers.archive || 0)), h("td", {class: "num"}, fmtBytes(tiers.focus || 0)),
        h("td", {class: "num"}, fmtPct(t.hit_ratio)), h("td", {class: "num"}, fmtInt(t.hits)), h("td", {class: "num"}, fmtInt(t.misses)),
        h("td", {class: "num"}, fmtInt(t.evictions)), h("td", {class: "num"}, t.quota > 0 ? fmtBytes(t.quota) : "none"), h("td", {class: "num"}, fmtInt(t.quota_refusals)));
      if (t.tenant === state.tenant) tr.classList.add("selected");
      rt.appendChild(tr);
    }
  }

  // pickTenant makes tenant the one the page shows, as the picker does.
  async function pickTenant(tenant) {
    const sel = $("tenant");
    if (![...sel.options].some(o => o.value === tenant)) sel.appendChild(h("option", {value: tenant}, tenant));
    sel.value = tenant;
    sel.dispatchEvent(new Event("change"));
  }

  // ---- wiring

  function init() {
    categoryOptions($("edit-category"));
    categoryOptions($("add-category"));
    $("login-form").addEventListener("submit", ev => {
      ev.preventDefault();
      state.token = $("token").value.trim();
      sessionStorage.setItem("kvs-admin-token", state.token);
      $("token").value = "";
      signIn();
    });
    $("signout").addEventListener("click", () => signOut(""));
    for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => showTab(b.dataset.tab));
    $("tenant").addEventListener("change", async () => {
      state.tenant = $("tenant").value;
      state.user = null; state.session = ""; state.scope = ""; state.selected = null;
      try { await loadSessions(); } catch (e) { toast(e.message, true); }
      showTab(state.tab);
    });
    $("user").addEventListener("change", () => {
      const v = $("user").value;
      state.user = v === "*" ? null : v.slice(1);
      state.scope = ""; state.selected = null;
      showTab(state.tab);
    });
    $("refresh").addEventListener("click", async () => {
      try { await loadTenants(); } catch (e) { toast(e.message, true); }
      showTab(state.tab);
    });
    $("session-delete").addEventListener("click", deleteSession);
    $("memory-scope").addEventListener("change", () => {
      state.scope = $("memory-scope").value;
      state.selected = null;
      if (scopeSession()) $("add-session").value = scopeSession();
      Promise.all([loadMemories(), loadStats()]).catch(e => toast(e.message, true));
    });
    $("memories-all").addEventListener("change", ev => {
      for (const c of document.querySelectorAll("#memories-table input.pick")) c.checked = ev.target.checked;
    });
    $("edit-form").addEventListener("submit", saveMemory);
    $("edit-delete").addEventListener("click", deleteMemory);
    $("edit-boost").addEventListener("click", boostMemory);
    $("add-form").addEventListener("submit", addMemory);
    $("batch-form").addEventListener("submit", batchDelete);
    $("batch-checked").addEventListener("click", () => { $("batch-ids").value = checkedIDs().join(", "); });
    $("export-stats-csv").addEventListener("click", () => exportFile("stats", "csv"));
    $("export-stats-json").addEventListener("click", () => exportFile("stats", "json"));
    $("export-memories-csv").addEventListener("click", () => exportFile("memories", "csv"));
    window.addEventListener("hashchange", () => { if (state.token) showTab(location.hash.slice(1)); });
    // Plots are drawn as wide as their card: draw them again when the
    // window's width changes (once it settles).
    let resizeTimer = 0, lastWidth = window.innerWidth;
    window.addEventListener("resize", () => {
      if (window.innerWidth === lastWidth) return;
      lastWidth = window.innerWidth;
      clearTimeout(resizeTimer);
      resizeTimer = setTimeout(() => { if (state.tab === "kv" && state.kvSamples) plotKV(state.kvSamples); }, 150);
    });
    if (state.token) signIn(); else signOut("");
  }

  init();
})();
