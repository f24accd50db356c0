// The haltwise dashboard: plain DOM, no framework, no build step.
// Every user-supplied text (ids, reasons, tool names, partial results, errors) is put on the
// page with textContent, never as HTML. Live updates come from the server's event streams.
"use strict";

const main = document.getElementById("main");
// the run states and which are final, active (a cancel applies), pausable and resumable: the
// server puts them in the page from haltwise's one home of the states (haltwise/_core/states.py)
const STATES = JSON.parse(document.getElementById("states").textContent);
// what this session's token may do ("operator" or "read"): a read-only page shows no button
// that would only be refused
const SESSION = JSON.parse(document.getElementById("session").textContent);
const READ_ONLY = SESSION.role !== "operator";
// runs per page of the runs list (the hash may ask for another: #/?limit=20)
const PAGE_SIZE = 100;
let stream = null;
let refreshTimer = null;
let tickTimer = null;
let pageNumber = 0;
// what the operator is typing survives the page being redrawn by a live update
const draft = { reason: "" };

// -- small helpers -------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function badge(state) {
  return el("span", { class: `badge state-${STATES.all.includes(state) ? state : "other"}`, text: state });
}

function json(value) {
  return JSON.stringify(value, null, 1);
}

function seconds(value) {
  if (value === null || value === undefined) return "";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  return `${Math.round(value / 60)} min`;
}

function when(epoch) {
  return epoch ? new Date(epoch * 1000).toLocaleString() : "";
}

function toast(text, bad) {
  const box = document.getElementById("toast");
  box.textContent = text;
  box.className = bad ? "show bad" : "show";
  clearTimeout(box.timer);
  box.timer = setTimeout(() => { box.className = ""; }, 5000);
}

async function api(method, path, body) {
  const options = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    options.headers["content-type"] = "application/json";
    options.body = JSON.stringify(body);
  }
  const response = await fetch(path, options);
  let data = null;
  try { data = await response.json(); } catch (error) { data = null; }
  if (!response.ok) {
    const message = data && data.error ? data.error.message : `HTTP ${response.status}`;
    const failure = new Error(message);
    failure.status = response.status;
    failure.code = data && data.error ? data.error.code : null;
    throw failure;
  }
  return data;
}

function runPath(id) {
  return `/api/runs/${encodeURIComponent(id)}`;
}

function listen(path, onChange) {
  if (stream) stream.close();
  stream = new EventSource(path);
  const live = document.getElementById("live");
  // (re)connected: whatever changed while the stream was down is fetched once
  stream.onopen = () => { live.className = "live on"; live.textContent = "● live"; onChange(null); };
  stream.onerror = () => { live.className = "live off"; live.textContent = "disconnected: this page is stale"; };
  for (const kind of ["transition", "step", "partial", "approval"]) {
    stream.addEventListener(kind, (event) => onChange(JSON.parse(event.data)));
  }
}

function soon(render) {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(render, 120);
}

// -- the runs page -------------------------------------------------------------------------

async function showRuns(params) {
  const state = params.get("state") || "";
  const task = params.get("task") || "";
  const cursor = params.get("cursor") || "";
  const limit = params.get("limit") || String(PAGE_SIZE);
  const filters = el("form", { class: "filters", onsubmit: (event) => {
    event.preventDefault();
    const query = new URLSearchParams();
    if (stateSelect.value) query.set("state", stateSelect.value);
    if (taskInput.value.trim()) query.set("task", taskInput.value.trim());
    location.hash = `#/?${query}`;
  } });
  const stateSelect = el("select", { name: "state", id: "filter-state" },
    el("option", { value: "", text: "any state" }),
    ...STATES.all.map((s) => el("option", { value: s, text: s, selected: s === state })));
  const taskInput = el("input", { name: "task", id: "filter-task", placeholder: "task (agent.py:research)", value: task });
  filters.append(stateSelect, taskInput, el("button", { type: "submit", text: "Filter" }));
  // a run by its id: straight to its page
  const find = el("form", { class: "filters", id: "find", onsubmit: (event) => {
    event.preventDefault();
    if (idInput.value.trim()) location.hash = `#/run/${encodeURIComponent(idInput.value.trim())}`;
  } });
  const idInput = el("input", { name: "id", id: "find-id", placeholder: "run id" });
  find.append(idInput, el("button", { type: "submit", text: "Open" }));
  // the runs ticked in the table, cancelled in one request (POST /api/cancel)
  const picked = new Set();
  const bulk = el("button", { id: "cancel-selected", class: "danger", disabled: true, text: "Cancel selected", onclick: async () => {
    try {
      const answer = await api("POST", "/api/cancel", { ids: [...picked], reason: "user" });
      toast(`cancelled ${answer.cancelled.length}, already final ${answer.already_final.length}`);
      picked.clear();
      bulk.disabled = true;
    } catch (error) {
      toast(error.message, true);
    }
  } });
  const table = el("table", { id: "runs" });
  const note = el("p", { class: "muted", id: "runs-note" });
  const pages = el("p", { class: "pages", id: "runs-pages" });
  main.replaceChildren(el("h1", { text: "Runs" }), filters, find, ...(READ_ONLY ? [] : [bulk]), note, table, pages);
  // a page of this listing: the same filters, from the cursor given ("" = the newest)
  const pageLink = (text, from, id) => {
    const query = new URLSearchParams();
    if (state) query.set("state", state);
    if (task) query.set("task", task);
    if (limit !== String(PAGE_SIZE)) query.set("limit", limit);
    if (from) query.set("cursor", from);
    return el("a", { href: `#/?${query}`, text, id });
  };

  const mine = pageNumber;
  const render = async () => {
    const query = new URLSearchParams({ limit, times: "1", progress: "1" });
    if (state) query.set("state", state);
    if (task) query.set("task", task);
    if (cursor) query.set("cursor", cursor);
    let answer;
    try {
      answer = await api("GET", `/api/runs?${query}`);
    } catch (error) {
      note.textContent = error.message;
      return;
    }
    if (mine !== pageNumber) return;
    const head = el("tr", {}, ...(READ_ONLY ? [] : [el("th", { text: "" })]), ...["id", "task", "state", "progress", "started", "took", "reason", "retry", "spent", "waiting for"].map((h) => el("th", { text: h })));
    // steps committed of the steps journaled so far (a run still going may begin more)
    const progress = (run) => (run.progress ? `${run.progress.done}/${run.progress.known}` : "");
    // how long a final run took, or an active one has been going
    const took = (run) => seconds((STATES.final.includes(run.state) ? run.updated_at : Date.now() / 1000) - run.created_at);
    const tick = (run) => {
      const box = el("input", { type: "checkbox", class: "pick", "data-pick": run.id, disabled: !STATES.active.includes(run.state), checked: picked.has(run.id) });
      box.addEventListener("change", () => {
        if (box.checked) picked.add(run.id); else picked.delete(run.id);
        bulk.disabled = picked.size === 0;
      });
      return el("td", {}, box);
    };
    const rows = answer.runs.map((run) => el("tr", { "data-id": run.id, class: `row-${run.state}` },
      ...(READ_ONLY ? [] : [tick(run)]),
      el("td", {}, el("a", { href: `#/run/${encodeURIComponent(run.id)}`, text: run.id, class: "run-link" })),
      el("td", { text: run.task }),
      el("td", {}, badge(run.state)),
      el("td", { text: progress(run), class: "progress", title: "steps committed / steps begun" }),
      el("td", { text: when(run.created_at), class: "started" }),
      el("td", { text: took(run), class: "took" }),
      el("td", { text: run.reason || "", class: "reason" }),
      el("td", { text: run.retry }),
      el("td", { text: run.spent ? spentText(run.spent) : "", class: "spent" }),
      el("td", { class: "waiting", "data-waiting": run.id })));
    table.replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
    const where = cursor ? "older runs, newest first" : "newest first";
    note.textContent = answer.runs.length ? `${answer.runs.length} run(s), ${where}` : "no runs";
    pages.replaceChildren(
      ...(cursor ? [pageLink("« newest", "", "page-newest")] : []),
      ...(answer.next ? [pageLink("older runs »", answer.next, "page-older")] : []));
    for (const run of answer.runs.filter((r) => r.state === "cancelling").slice(0, 20)) {
      api("GET", runPath(run.id)).then((detail) => {
        const cell = table.querySelector(`[data-waiting="${CSS.escape(run.id)}"]`);
        if (cell) cell.textContent = waitSummary(detail);
      }).catch(() => {});
    }
  };
  await render();
  listen("/api/events", () => soon(render));
}

function spentText(spent) {
  return `$${Number(spent.usd).toPrecision(4).replace(/\.?0+$/, "")} · ${spent.tokens} tokens · ${spent.tool_calls} tool calls`;
}

// What the run spent against its limit, one line per kind ("0.36 of 0.5"; no limit: "no limit").
function budgetText(budget) {
  const limit = budget.limit || {};
  const of = (name, value) => (limit[name] === null || limit[name] === undefined ? `${value}` : `${value} of ${limit[name]}`);
  const words = [`$${of("usd", Number(budget.spent.usd).toPrecision(4).replace(/\.?0+$/, ""))}`,
    `${of("tokens", budget.spent.tokens)} tokens`, `${of("tool_calls", budget.spent.tool_calls)} tool calls`];
  return words.join(" · ") + (budget.limit ? ` (on exhaust: ${budget.limit.on_exhaust})` : " (no limit)");
}

function waitSummary(detail) {
  if (detail.forced) return "forced: stopping now";
  if (!detail.waiting.length) return "the next checkpoint";
  return detail.waiting.map((w) => `${w.tool} (${w.policy}${w.grace_left !== null ? `, ${Math.ceil(w.grace_left)} s of grace left` : ""})`).join("; ");
}

// -- one run -------------------------------------------------------------------------------

async function showRun(id) {
  draft.reason = "";
  main.replaceChildren(el("p", { class: "muted", text: "loading…" }));
  let fetchedAt = 0;
  let detail = null;
  let shown = "";
  const mine = pageNumber;
  const render = async () => {
    let fresh;
    try {
      fresh = await api("GET", runPath(id));
      fetchedAt = Date.now();
    } catch (error) {
      if (mine === pageNumber) main.replaceChildren(el("h1", { text: "Run" }), el("p", { class: "error", text: error.message }));
      return;
    }
    if (mine !== pageNumber) return;
    detail = fresh;
    const text = JSON.stringify(detail);
    if (text === shown) return;  // nothing changed: keep the page (and what is being typed)
    shown = text;
    main.replaceChildren(...runPage(detail));
  };
  await render();
  listen(`${runPath(id)}/events`, () => soon(render));
  clearInterval(tickTimer);
  tickTimer = setInterval(() => {
    if (!detail) return;
    const elapsed = (Date.now() - fetchedAt) / 1000;
    for (const cell of document.querySelectorAll("[data-grace-left]")) {
      const left = Math.max(0, Number(cell.getAttribute("data-grace-left")) - elapsed);
      cell.textContent = `${Math.ceil(left)} s left`;
    }
  }, 500);
}

function runPage(run) {
  const parts = [];
  parts.push(el("h1", {}, "Run ", el("span", { class: "mono", id: "run-id", text: run.id }), " ", badge(run.state)));
  const facts = el("dl", { class: "facts" });
  const fact = (name, value, id) => facts.append(el("dt", { text: name }), el("dd", { text: value, id }));
  fact("task", run.task);
  fact("reason", run.reason || "—", "run-reason");
  if (run.forced) fact("cancel", "forced");
  fact("owner", run.owner ? `pid ${run.owner.pid} on ${run.owner.host} (${run.owner.alive ? "alive" : "gone"})` : "none");
  fact("created", when(run.created_at));
  if (run.code) {
    // the version of its code the run recorded, and whether the file on disk differs now
    const version = `${run.code.file} (sha256 ${run.code.digest.slice(0, 12)}…)`;
    const changed = run.code.changed ? " — changed on disk since: resuming runs other code" : "";
    facts.append(el("dt", { text: "code" }), el("dd", { id: "run-code", class: run.code.changed ? "changed" : "", text: version + changed }));
  }
  if (run.error) fact("error", `${run.error.type}: ${run.error.message}`);
  if (run.cancel_error) fact("raised while cancelling", `${run.cancel_error.type}: ${run.cancel_error.message}`);
  if (run.state === "completed") fact("result", json(run.result));
  if (run.budget) fact("budget", budgetText(run.budget), "run-budget");
  parts.push(facts);
  if (run.state === "cancelling") parts.push(waitingBox(run));
  const asking = run.steps.filter((s) => s.approval && s.approval.state === "awaiting");
  if (asking.length) parts.push(approvalsBox(run, asking));
  parts.push(actions(run));
  parts.push(el("h2", { text: "Steps" }), stepsTable(run));
  parts.push(el("h2", { text: `Partial results (${run.partials.length})` }),
    el("ol", { id: "partials", start: "0" }, ...run.partials.map((p) => el("li", {}, el("pre", { text: json(p) })))));
  parts.push(el("h2", { text: "Retry advice" }),
    el("p", { id: "retry" }, el("strong", { text: run.retry }), " — ", el("span", { text: adviceWhy(run) })));
  parts.push(el("h2", { text: "History" }), el("ul", { class: "events" },
    ...run.events.map((e) => el("li", { text: `${when(e.at)}: ${e.from || "created"} → ${e.to}${e.reason ? ` (${e.reason})` : ""}` }))));
  return parts;
}

// -- approvals ---------------------------------------------------------------------------

function timeLeft(request) {
  if (request.timeout_at === null || request.timeout_at === undefined) return "no timeout";
  return `${Math.max(0, Math.ceil(request.timeout_at - Date.now() / 1000))} s left`;
}

function approvalsBox(run, steps) {
  const box = el("section", { class: "approvals-box", id: "approvals" });
  box.append(el("h2", { text: "Approval requested" }));
  for (const step of steps) {
    const item = el("div", { class: "approval", "data-step": String(step.index) });
    item.append(el("p", {}, el("strong", { text: `step ${step.index} ${step.tool}` }), " waits for a decision"));
    const args = el("pre", { class: "approval-arguments", text: "…" });
    item.append(args);
    api("GET", "/api/approvals").then((answer) => {
      const found = answer.approvals.find((a) => a.run === run.id && a.step === step.index);
      if (found) {
        args.textContent = json(found.arguments);
        args.setAttribute("data-arguments", JSON.stringify(found.arguments));
      }
    }).catch(() => {});
    if (!READ_ONLY) item.append(decisionForm(run, step, args));
    box.append(item);
  }
  return box;
}

function decisionForm(run, step, args) {
  const form = el("div", { class: "decision" });
  const note = el("input", { class: "approval-note", placeholder: "note (optional)", maxlength: "2000" });
  const by = el("input", { class: "approval-by", placeholder: "who decides (optional)", maxlength: "200" });
  const edit = el("textarea", { class: "approval-edit", rows: "4", cols: "60", hidden: true });
  const decide = async (decision, edited) => {
    const body = { decision };
    if (edited !== undefined) body.edit = edited;
    if (by.value.trim()) body.by = by.value.trim();
    if (note.value.trim()) body.note = note.value.trim();
    try {
      const answer = await api("POST", `${runPath(run.id)}/approvals/${step.index}`, body);
      toast(`step ${step.index}: ${answer.approval ? answer.approval.state : decision}`);
    } catch (error) {
      toast(error.message, true);
    }
  };
  const approveEdited = el("button", { class: "approval-approve-edited", hidden: true, text: "Approve with these arguments", onclick: () => {
    let edited;
    try { edited = JSON.parse(edit.value); } catch (error) { toast(`not JSON: ${error.message}`, true); return; }
    if (edited === null || typeof edited !== "object" || Array.isArray(edited)) { toast("the arguments are a JSON object", true); return; }
    decide("approve", edited);
  } });
  form.append(by, note,
    el("button", { class: "approval-approve", text: "Approve", onclick: () => decide("approve") }),
    el("button", { class: "approval-edit-open", text: "Edit", onclick: () => {
      edit.value = args.getAttribute("data-arguments") ? json(JSON.parse(args.getAttribute("data-arguments"))) : "{}";
      edit.hidden = false;
      approveEdited.hidden = false;
    } }),
    el("button", { class: "approval-refuse danger", text: "Refuse", onclick: () => decide("refuse") }),
    edit, approveEdited);
  return form;
}

async function showApprovals() {
  main.replaceChildren(el("p", { class: "muted", text: "loading…" }));
  const mine = pageNumber;
  const render = async () => {
    let answer;
    try {
      answer = await api("GET", "/api/approvals");
    } catch (error) {
      if (mine === pageNumber) main.replaceChildren(el("h1", { text: "Approvals" }), el("p", { class: "error", text: error.message }));
      return;
    }
    if (mine !== pageNumber) return;
    const head = el("tr", {}, ...["run", "step", "tool", "arguments", "waiting since", "time left"].map((h) => el("th", { text: h })));
    const rows = answer.approvals.map((a) => el("tr", { "data-run": a.run, "data-step": String(a.step) },
      el("td", {}, el("a", { href: `#/run/${encodeURIComponent(a.run)}`, class: "mono", text: a.run })),
      el("td", { text: String(a.step) }),
      el("td", { text: a.tool, class: "mono" }),
      el("td", {}, el("pre", { text: json(a.arguments) })),
      el("td", { text: when(a.requested_at) }),
      el("td", { class: "time-left", text: timeLeft(a) })));
    main.replaceChildren(el("h1", { text: `Approvals (${answer.approvals.length} pending)` }),
      answer.approvals.length
        ? el("table", { id: "approvals-list" }, el("thead", {}, head), el("tbody", {}, ...rows))
        : el("p", { id: "no-approvals", text: "No approval request awaits a decision." }));
  };
  await render();
  listen("/api/events", () => soon(render));
}

// the advice's sentence without its first word when that word is the advice itself
// ("resume: restarting would repeat ..." under the heading "resume")
function adviceWhy(run) {
  const why = run.retry_why || "";
  return why.startsWith(`${run.retry}: `) ? why.slice(run.retry.length + 2) : why;
}

function waitingBox(run) {
  const box = el("section", { class: "waiting-box", id: "waiting" });
  if (run.stays_cancelling) {
    // nobody works it and this server cannot settle it: say why, and what finishes the cancel
    box.append(el("p", { class: "stays-cancelling", id: "stays-cancelling", text: run.stays_cancelling }));
  }
  if (run.forced) {
    box.append(el("p", { text: "Cancelling, forced: stopping now; nothing is waited for." }));
    return box;
  }
  if (!run.waiting.length) {
    box.append(el("p", { text: "Cancelling: the run stops at its next checkpoint (no step in flight)." }));
    return box;
  }
  box.append(el("p", { text: "Cancelling. The cancel waits for:" }));
  const list = el("ul");
  for (const wait of run.waiting) {
    const item = el("li", {}, el("strong", { text: `step ${wait.index} ${wait.tool}` }), ` — ${wait.policy}`);
    if (wait.policy === "interruptible") item.append(": being interrupted");
    else if (wait.grace === null) item.append(": its grace is unknown here (the tool is not loaded by this server)");
    else {
      item.append(`, grace ${wait.grace} s: `);
      item.append(el("span", { class: "grace-left", "data-grace-left": String(wait.grace_left), text: `${Math.ceil(wait.grace_left)} s left` }));
      item.append(wait.policy === "rollback" ? " to undo it" : " to let it finish");
    }
    list.append(item);
  }
  box.append(list, el("p", { class: "muted", text: "Force skips the wait: finish steps become unknown, no compensation runs." }));
  return box;
}

function stepsTable(run) {
  const head = el("tr", {}, ...["#", "tool", "policy", "effect", "status", "attempts", "duration"].map((h) => el("th", { text: h })));
  const now = Date.now() / 1000;
  const rows = run.steps.map((s) => {
    const end = s.settled_at || (s.status === "running" ? now : null);
    const duration = s.started_at && end ? seconds(end - s.started_at) : "";
    return el("tr", { class: `step-${s.status}` },
      el("td", { text: String(s.index) }),
      el("td", { text: s.tool, class: "mono" }),
      el("td", { text: s.cancel || "undeclared (finish)" }),
      el("td", { text: s.effect + (s.idempotent ? ", idempotent" : "") }),
      el("td", {}, el("span", { class: `status status-${s.status}`, text: s.status })),
      el("td", { text: String(s.attempts) }),
      el("td", { text: duration }));
  });
  return el("table", { id: "steps" }, el("thead", {}, head), el("tbody", {}, ...rows));
}

function actions(run) {
  const box = el("section", { class: "actions" });
  if (READ_ONLY) {
    box.append(el("p", { class: "muted", id: "read-only", text: "Read-only token: this page shows the run; cancel, force, pause and resume need the operator's token." }));
    return box;
  }
  const active = STATES.active.includes(run.state);
  const reason = el("input", { id: "cancel-reason", placeholder: "reason (default: user)", maxlength: "500", value: draft.reason });
  reason.addEventListener("input", () => { draft.reason = reason.value; });
  const act = async (path, body, done) => {
    try {
      const answer = await api("POST", `${runPath(run.id)}/${path}`, body);
      toast(done(answer));
    } catch (error) {
      toast(error.message, true);
    }
  };
  box.append(
    reason,
    el("button", { id: "cancel", disabled: !active, onclick: () => act("cancel", { reason: reason.value.trim() || "user", force: false }, (a) => `cancel requested: ${a.state}`), text: "Cancel" }),
    el("button", { id: "force", class: "danger", disabled: !active, onclick: () => {
      if (confirm("Force the cancel? Finish steps become unknown and no compensation runs.")) {
        act("cancel", { reason: reason.value.trim() || "user", force: true }, (a) => `forced: ${a.state}`);
      }
    }, text: "Force" }),
    el("button", { id: "pause", disabled: !STATES.pausable.includes(run.state), onclick: () => act("pause", {}, (a) => `pause: ${a.state}`), text: "Pause" }),
    el("button", { id: "unpause", disabled: run.state !== "paused", onclick: () => act("unpause", {}, (a) => `unpause: ${a.state}`), text: "Unpause" }),
    el("button", { id: "resume", disabled: !STATES.resumable.includes(run.state), onclick: () => resumeDialog(run, box), text: "Resume" }),
    forkControls(run));
  if (run.state === "paused" && run.reason === "budget") box.append(raiseBudget(run, act));
  return box;
}

// fork from a step: the plan first (which committed write/external steps would run again),
// then, confirmed, the fork runs in the server (POST /api/runs/{id}/fork)
function forkControls(run) {
  const step = el("input", { id: "fork-step", type: "number", min: "0", max: String(run.steps.length), value: "0", class: "narrow" });
  const go = el("button", { id: "fork", text: "Fork from step", onclick: async () => {
    const body = { from_step: Number(step.value) };
    try {
      const plan = await api("POST", `${runPath(run.id)}/fork`, { ...body, dry_run: true });
      const again = plan.will_repeat.map((s) => `${s.index} ${s.tool}`).join(", ");
      if (!confirm(again ? `The fork runs again: ${again}. Fork?` : "Nothing committed runs again. Fork?")) return;
      const forked = await api("POST", `${runPath(run.id)}/fork`, body);
      location.hash = `#/run/${encodeURIComponent(forked.id)}`;
    } catch (error) {
      toast(error.message, true);
    }
  } });
  return el("span", { class: "fork" }, step, go);
}

// A run paused for its budget: raise its limits (the ones filled in; the others stay) and unpause.
function raiseBudget(run, act) {
  const limit = (run.budget && run.budget.limit) || {};
  const field = (name, step) => el("input", { id: `raise-${name}`, type: "number", min: "0", step, placeholder: `${name} (now ${limit[name] ?? "none"})` });
  const usd = field("usd", "any");
  const tokens = field("tokens", "1");
  const calls = field("tool_calls", "1");
  const raise = () => {
    const budget = {};
    if (usd.value !== "") budget.usd = Number(usd.value);
    if (tokens.value !== "") budget.tokens = parseInt(tokens.value, 10);
    if (calls.value !== "") budget.tool_calls = parseInt(calls.value, 10);
    act("unpause", { budget }, (a) => `budget raised, unpause: ${a.state}`);
  };
  return el("div", { id: "raise-budget" }, el("span", { text: "paused for its budget: raise it " }),
    usd, tokens, calls, el("button", { id: "raise", onclick: raise, text: "Raise and unpause" }));
}

// Resume. Before it, the operator says what happened to each unknown step of a tool that is not
// idempotent: where the tool has a reconcile hook, asking it is preselected (the resume asks
// it); otherwise nothing is chosen for them (one click must not record a post as done), and a
// resume without a choice is refused here. When the task's file changed since the run began
// (the run's code.changed, or the server's 409 code_changed), the form says so, and resumes
// with the changed code only if told to (allow_code_change, recorded in the run's history).
function resumeDialog(run, box) {
  const unknown = run.steps.filter((s) => s.status === "unknown" && !s.idempotent);
  const old = box.querySelector("#resume-form");
  if (old) old.remove();
  if (!unknown.length && !(run.code && run.code.changed)) {
    postResume(run, box, {}, null);
    return;
  }
  box.append(resumeForm(run, box, unknown));
}

function postResume(run, box, body, form) {
  api("POST", `${runPath(run.id)}/resume`, body).then((a) => toast(`resumed: ${a.state}`)).catch((error) => {
    if (error.code === "code_changed" && !body.allow_code_change) {
      const shown = form || resumeForm(run, box, []);
      showCodeChange(shown, error.message);
      if (!form) box.append(shown);
      return;
    }
    toast(error.message, true);
  });
}

function showCodeChange(form, message) {
  const part = form.querySelector("#code-change");
  part.hidden = false;
  part.replaceChildren(el("p", { class: "error", id: "code-changed-message", text: message }),
    el("label", {}, el("input", { type: "checkbox", id: "allow-code-change" }),
      " resume with the code as it is now (recorded in the run's history)"));
}

function resumeForm(run, box, unknown) {
  const form = el("form", { class: "resume-form", id: "resume-form" });
  if (unknown.length) form.append(el("p", { text: "Before resuming, say what happened to each unknown step:" }));
  for (const step of unknown) {
    const name = `step-${step.index}`;
    const hooked = step.reconcile_hook === true;
    const set = el("fieldset", { "data-step": String(step.index) }, el("legend", { text: `step ${step.index} ${step.tool}` }));
    if (hooked) {
      set.append(el("label", {}, el("input", { type: "radio", name, value: "hook", checked: true }), " ask the tool's reconcile hook"));
    }
    set.append(
      el("label", {}, el("input", { type: "radio", name, value: "done" }), " it happened; its result (JSON): "),
      el("input", { name: `${name}-result`, value: "null" }),
      el("label", {}, el("input", { type: "radio", name, value: "rerun" }), " it did not happen: run it again"));
    form.append(set);
  }
  form.append(el("div", { id: "code-change", class: "code-change", hidden: true }));
  if (run.code && run.code.changed) {
    showCodeChange(form, `The task's file ${run.code.file} changed since this run began: resuming runs the code as it is now.`);
  }
  form.append(el("button", { type: "submit", id: "resume-submit", text: "Resume" }));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const body = { assume_done: {}, rerun: [] };
    try {
      for (const step of unknown) {
        const checked = form.querySelector(`input[name="step-${step.index}"]:checked`);
        if (!checked) {
          toast(`say what happened to step ${step.index} (${step.tool}) first`, true);
          return;
        }
        const choice = checked.value;
        if (choice === "hook") continue;
        if (choice === "rerun") body.rerun.push(step.index);
        else body.assume_done[String(step.index)] = JSON.parse(form.querySelector(`input[name="step-${step.index}-result"]`).value || "null");
      }
    } catch (error) {
      toast(`not valid JSON: ${error.message}`, true);
      return;
    }
    if (!form.querySelector("#code-change").hidden) {
      if (!form.querySelector("#allow-code-change").checked) {
        toast("the task's file changed: tick \"resume with the code as it is now\", or leave the run as it is", true);
        return;
      }
      body.allow_code_change = true;
    }
    postResume(run, box, body, form);
  });
  return form;
}

// -- the audit -----------------------------------------------------------------------------

async function showAudit() {
  if (stream) { stream.close(); stream = null; }
  let report;
  try {
    report = await api("GET", "/api/audit");
  } catch (error) {
    main.replaceChildren(el("h1", { text: "Audit" }), el("p", { class: "muted", text: error.message }));
    return;
  }
  const head = el("tr", {}, ...["tool", "cancel", "effect", "idempotent", "grace", "compensate", "a cancel mid-call leaves"].map((h) => el("th", { text: h })));
  // an interrupted call is not waited for: its grace is "not used", as the command line says
  const grace = (t) => t.cancel === "interruptible" ? "not used" : `${t.grace} s${t.grace_declared ? "" : " (default)"}`;
  const rows = report.tools.map((t) => el("tr", {},
    el("td", { text: t.name, class: "mono" }), el("td", { text: t.cancel || "undeclared" }), el("td", { text: t.effect }),
    el("td", { text: t.idempotent ? "yes" : "no" }), el("td", { text: grace(t), class: "grace" }), el("td", { text: t.compensate || "" }),
    el("td", { text: t.leaves || "", class: "leaves" })));
  const findings = report.findings.length
    ? el("ul", {}, ...report.findings.map((f) => el("li", {}, el("strong", { text: f.code }), ` ${f.tool}: `, el("span", { text: f.message }))))
    : el("p", { text: "no findings" });
  main.replaceChildren(el("h1", { text: "Audit" }), el("table", { id: "audit" }, el("thead", {}, head), el("tbody", {}, ...rows)),
    el("h2", { text: "Findings" }), findings);
}

// -- routing -------------------------------------------------------------------------------

function route() {
  clearInterval(tickTimer);
  clearTimeout(refreshTimer);
  pageNumber += 1;  // renders of the page being left draw nothing any more
  const hash = location.hash || "#/";
  if (hash.startsWith("#/run/")) return showRun(decodeURIComponent(hash.slice("#/run/".length)));
  if (hash.startsWith("#/audit")) return showAudit();
  if (hash.startsWith("#/approvals")) return showApprovals();
  const query = hash.includes("?") ? hash.slice(hash.indexOf("?") + 1) : "";
  return showRuns(new URLSearchParams(query));
}

window.addEventListener("hashchange", route);
route();
