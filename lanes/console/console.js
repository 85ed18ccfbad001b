// lanes console: chat, drafted against `draft: false`, and the rounds — plain browser JavaScript
// over lanes' own API (lanes/console_routes.py), no build step and nothing from the network.
"use strict";

const $ = (id) => document.getElementById(id);
const MAX_POINTS = 300; // points kept per chart
const POLL_MS = 1000;
let modelId = null;

// ---- the API ---------------------------------------------------------------------------------

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

async function failure(response) {
  const body = await response.json().catch(() => null);
  return new Error((body && body.error && body.error.message) || `${response.status} ${response.statusText}`);
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: headers() });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// A streamed chat completion: onChunk(chunk) for each SSE chunk; ends at [DONE].
async function streamChat(body, onChunk, signal) {
  const response = await fetch("/v1/chat/completions", {
    method: "POST", headers: headers(), signal,
    body: JSON.stringify({ ...body, model: modelId, stream: true, stream_options: { include_usage: true } }),
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split("\n")) {
        if (!line.startsWith("data: ")) continue;
        const data = line.slice(6);
        if (data === "[DONE]") return;
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        onChunk(chunk);
      }
    }
  }
}

// ---- settings --------------------------------------------------------------------------------

function numberOf(id, parse) {
  const raw = $(id).value.trim();
  if (raw === "") return undefined;
  const value = parse(raw);
  if (Number.isNaN(value)) throw new Error(`${$(id).labels[0].textContent.trim()}: not a number`);
  return value;
}

function sampling() {
  const body = {
    temperature: numberOf("temperature", parseFloat),
    top_p: numberOf("top-p", parseFloat),
    top_k: numberOf("top-k", (s) => parseInt(s, 10)),
    max_tokens: numberOf("max-tokens", (s) => parseInt(s, 10)),
    seed: numberOf("seed", (s) => parseInt(s, 10)),
    return_token_ids: true,
    return_draft_spans: true,
  };
  const stop = $("stop").value.split("\n").filter((s) => s.length);
  if (stop.length) body.stop = stop;
  const schema = $("schema").value.trim();
  if (schema) {
    let parsed;
    try { parsed = JSON.parse(schema); } catch (e) { throw new Error("the JSON schema is not JSON: " + e.message); }
    body.response_format = { type: "json_schema", json_schema: { name: "console", schema: parsed } };
  }
  for (const k of Object.keys(body)) if (body[k] === undefined) delete body[k];
  return body;
}

function withSystem(messages) {
  const system = $("system").value.trim();
  return system ? [{ role: "system", content: system }, ...messages] : messages;
}

// ---- one streamed answer, drawn as it comes ----------------------------------------------------

function appendSpans(element, spans) {
  for (const [text, drafted] of spans) {
    if (drafted) {
      const mark = document.createElement("mark");
      mark.className = "drafted";
      mark.textContent = text;
      element.append(mark);
    } else {
      element.append(document.createTextNode(text));
    }
  }
}

// Streams one answer into `element`; its text, token ids, usage and timings.
async function answer(body, element, signal) {
  const started = performance.now();
  const result = { text: "", ids: [], usage: null, firstAt: null, endAt: 0, finish: null };
  await streamChat(body, (chunk) => {
    if (chunk.usage) result.usage = chunk.usage;
    for (const choice of chunk.choices || []) {
      const now = performance.now() - started;
      const delta = choice.delta || {};
      const text = (delta.reasoning_content || "") + (delta.content || "");
      if (choice.token_ids && choice.token_ids.length) {
        result.ids.push(...choice.token_ids);
        if (result.firstAt === null) result.firstAt = now;
      }
      if (choice.draft_spans) appendSpans(element, choice.draft_spans);
      else if (text) element.append(document.createTextNode(text));
      result.text += text;
      if (choice.finish_reason) result.finish = choice.finish_reason;
    }
  }, signal);
  result.endAt = performance.now() - started;
  return result;
}

function statsOf(r) {
  const u = r.usage || { completion_tokens: r.ids.length, completion_tokens_details: {} };
  const n = u.completion_tokens;
  const accepted = (u.completion_tokens_details && u.completion_tokens_details.accepted_prediction_tokens) || 0;
  const steps = n - accepted; // each target step yields one token of its own beside its kept drafts
  const perVerify = steps > 0 ? n / steps : 0;
  // over the whole request (chunks arrive in bursts: the gaps between them say little)
  const tokS = r.endAt > 0 ? n / (r.endAt / 1000) : 0;
  return { n, accepted, perVerify, tokS, ttft: r.firstAt };
}

function describe(s) {
  const ttft = s.ttft === null ? "-" : `${Math.round(s.ttft)} ms`;
  return `${s.n} tokens · ${s.accepted} from drafts · ${s.perVerify.toFixed(2)} tokens per verify · ` +
    `${s.tokS.toFixed(1)} tok/s overall · TTFT ${ttft}`;
}

// ---- chat ------------------------------------------------------------------------------------

const chat = { history: [], abort: null };

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  const who = document.createElement("span");
  who.className = "who";
  who.textContent = role === "user" ? "you" : role;
  const body = document.createElement("span");
  body.className = "body";
  body.textContent = text || "";
  div.append(who, body);
  $("chat-log").append(div);
  return div;
}

async function sendChat(event) {
  event.preventDefault();
  const text = $("chat-input").value;
  if (!text.trim() || chat.abort) return;
  let body;
  try { body = sampling(); } catch (e) { addMessage("error", e.message); return; }
  $("chat-input").value = "";
  chat.history.push({ role: "user", content: text });
  addMessage("user", text);
  const reply = addMessage("assistant", "");
  const stats = document.createElement("span");
  stats.className = "who stats";
  chat.abort = new AbortController();
  $("chat-send").disabled = true;
  $("chat-stop").disabled = false;
  try {
    const r = await answer({ ...body, messages: withSystem(chat.history), draft: $("draft").checked },
      reply.querySelector(".body"), chat.abort.signal);
    chat.history.push({ role: "assistant", content: r.text });
    stats.textContent = describe(statsOf(r)) + (r.finish ? ` · ${r.finish}` : "");
    reply.append(stats);
  } catch (e) {
    chat.history.pop();
    const stopped = e.name === "AbortError";
    reply.classList.toggle("error", !stopped);
    reply.querySelector(".who").textContent = stopped ? "assistant (stopped)" : "error";
    if (!stopped) reply.querySelector(".body").textContent = e.message;
  } finally {
    chat.abort = null;
    $("chat-send").disabled = false;
    $("chat-stop").disabled = true;
    $("chat-input").focus();
  }
}

// ---- compare ---------------------------------------------------------------------------------

function verdictOf(a, b) {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return { same: false, at: i };
  return a.length === b.length ? { same: true, at: n } : { same: false, at: n };
}

async function runCompare(event) {
  event.preventDefault();
  const prompt = $("compare-input").value;
  if (!prompt.trim()) return;
  const verdict = $("compare-verdict");
  let body;
  try { body = { ...sampling(), messages: withSystem([{ role: "user", content: prompt }]) }; } catch (e) {
    verdict.textContent = e.message; verdict.className = "verdict differs"; return;
  }
  for (const id of ["out-drafted", "out-plain", "stats-drafted", "stats-plain"]) $(id).textContent = "";
  verdict.textContent = "running…";
  verdict.className = "verdict";
  $("compare-run").disabled = true;
  const drafted = () => answer({ ...body, draft: true }, $("out-drafted"));
  const plain = () => answer({ ...body, draft: false }, $("out-plain"));
  try {
    let a, b;
    if ($("compare-order").value === "together") [a, b] = await Promise.all([drafted(), plain()]);
    else { a = await drafted(); b = await plain(); }
    $("stats-drafted").textContent = describe(statsOf(a));
    $("stats-plain").textContent = describe(statsOf(b));
    const v = verdictOf(a.ids, b.ids);
    verdict.textContent = v.same
      ? `identical: ${a.ids.length} tokens, token for token`
      : `differs at token ${v.at} (drafted ${a.ids.length} tokens, draft: false ${b.ids.length})`;
    verdict.className = "verdict " + (v.same ? "same" : "differs");
  } catch (e) {
    verdict.textContent = "error: " + e.message;
    verdict.className = "verdict differs";
  } finally {
    $("compare-run").disabled = false;
  }
}

// ---- rounds ----------------------------------------------------------------------------------

const rounds = { after: 0, mixed: [], tokens: [], lanes: [], kv: [], drafts: [], latencies: [], timer: null, slider: false };

function keep(list, items) {
  list.push(...items);
  if (list.length > MAX_POINTS) list.splice(0, list.length - MAX_POINTS);
}

function color(name) {
  return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
}

// Lines of `series` ([{values, color, dashed}]) on a canvas, from 0 to the largest value (or ymax).
function drawLines(canvas, series, ymax) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth, height = canvas.clientHeight || 160;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const g = canvas.getContext("2d");
  g.scale(ratio, ratio);
  g.clearRect(0, 0, width, height);
  const top = ymax || Math.max(1, ...series.flatMap((s) => s.values));
  const left = 44, bottom = height - 16;
  g.strokeStyle = color("--line");
  g.fillStyle = color("--muted");
  g.font = "11px system-ui, sans-serif";
  g.beginPath(); g.moveTo(left, 4); g.lineTo(left, bottom); g.lineTo(width - 4, bottom); g.stroke();
  g.fillText(top >= 100 ? top.toFixed(0) : top.toPrecision(2), 2, 12);
  g.fillText("0", 2, bottom);
  const n = Math.max(2, ...series.map((s) => s.values.length));
  for (const s of series) {
    g.strokeStyle = s.color;
    g.setLineDash(s.dashed ? [5, 4] : []);
    g.lineWidth = 2;
    g.beginPath();
    s.values.forEach((v, i) => {
      const x = left + (i * (width - left - 6)) / (n - 1);
      const y = bottom - (Math.min(v, top) / top) * (bottom - 6);
      if (i) g.lineTo(x, y); else g.moveTo(x, y);
    });
    g.stroke();
  }
  g.setLineDash([]);
  canvas.dataset.points = String(series.length ? series[0].values.length : 0);
}

function drawRounds() {
  const a = color("--series-a"), b = color("--series-b"), c = color("--series-c");
  drawLines($("chart-share"), [
    { values: rounds.mixed.map((r) => r.prefill_share), color: a },
    { values: rounds.mixed.map((r) => r.target), color: c, dashed: true },
  ], 1);
  drawLines($("chart-tokens"), [
    { values: rounds.tokens.map((r) => r.prefill_tokens), color: a },
    { values: rounds.tokens.map((r) => r.decode_tokens), color: b },
  ]);
  drawLines($("chart-lanes"), [
    { values: rounds.lanes.map((p) => p.running), color: a },
    { values: rounds.lanes.map((p) => p.waiting), color: b },
  ]);
  drawLines($("chart-kv"), [
    { values: rounds.kv.map((p) => p.kv), color: a },
    { values: rounds.kv.map((p) => p.cache), color: b },
  ], 1);
  drawLines($("chart-drafts"), [
    { values: rounds.drafts.map((p) => p.proposed), color: a },
    { values: rounds.drafts.map((p) => p.accepted), color: b },
  ]);
  drawLines($("chart-latency"), [
    { values: rounds.latencies.map((l) => (l.ttft || 0) * 1000), color: a },
    { values: rounds.latencies.map((l) => (l.mean_itl || 0) * 1000), color: b },
  ]);
}

async function pollRounds() {
  try {
    const r = await api(`/v1/lanes/rounds?after=${rounds.after}`);
    rounds.after = r.next;
    const target = r.prefill_share_target;
    keep(rounds.tokens, r.rounds);
    keep(rounds.mixed, r.rounds.filter((x) => x.prefill_tokens && x.decode_tokens).map((x) => ({ ...x, target })));
    keep(rounds.lanes, [{ running: r.running_lanes, waiting: r.waiting_lanes }]);
    const total = Math.max(1, r.kv_blocks_total);
    keep(rounds.kv, [{ kv: r.kv_blocks_used / total, cache: r.prompt_cache_blocks / total }]);
    keep(rounds.drafts, [{ proposed: r.draft_tokens, accepted: r.accepted_draft_tokens }]);
    rounds.latencies = r.latencies;
    if (!rounds.slider) { // the slider starts where the server is
      rounds.slider = true;
      $("share").value = String(target);
      $("share-value").textContent = target.toFixed(2);
    }
    $("share-target").textContent = target.toFixed(2);
    $("share-achieved").textContent = r.achieved_prefill_share === null ? "no mixed rounds yet" : r.achieved_prefill_share.toFixed(2);
    $("rounds-status").textContent = `${r.next} rounds so far · ${r.running_lanes} running, ${r.waiting_lanes} waiting · ` +
      `${r.draft_tokens} drafts verified, ${r.accepted_draft_tokens} kept`;
    drawRounds();
  } catch (e) {
    $("rounds-status").textContent = "error: " + e.message;
  }
}

async function applyShare(event) {
  event.preventDefault();
  const value = parseFloat($("share").value);
  try {
    const r = await api("/v1/lanes/prefill_share", { method: "POST", body: JSON.stringify({ prefill_share: value }) });
    $("share-status").textContent = `from the next round on: ${r.prefill_share.toFixed(2)} (was ${r.previous.toFixed(2)})`;
    await pollRounds();
  } catch (e) {
    $("share-status").textContent = "error: " + e.message;
  }
}

// ---- tabs, theme, start ----------------------------------------------------------------------

const TABS = ["chat", "compare", "rounds"];

function show(name, focus) {
  for (const t of TABS) {
    const on = t === name;
    $("tab-" + t).setAttribute("aria-selected", String(on));
    $("tab-" + t).tabIndex = on ? 0 : -1;
    $("view-" + t).hidden = !on;
  }
  $("settings").hidden = name === "rounds"; // sampling is for chat and compare
  if (focus) $("tab-" + name).focus();
  history.replaceState(null, "", "#" + name);
  clearInterval(rounds.timer);
  rounds.timer = null;
  if (name === "rounds") {
    pollRounds();
    rounds.timer = setInterval(pollRounds, POLL_MS);
  }
}

function onTabKey(event) {
  const i = TABS.indexOf(event.target.id.slice(4));
  const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
  if (step) show(TABS[(i + step + TABS.length) % TABS.length], true);
  else if (event.key === "Home") show(TABS[0], true);
  else if (event.key === "End") show(TABS[TABS.length - 1], true);
}

function applyTheme(theme) {
  if (theme === "auto") delete document.documentElement.dataset.theme;
  else document.documentElement.dataset.theme = theme;
  $("theme").textContent = "Theme: " + theme;
  localStorage.setItem("lanes-theme", theme);
  if (!$("view-rounds").hidden) drawRounds();
}

function enterSends(textarea, form) {
  textarea.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); form.requestSubmit(); }
  });
}

async function connect() {
  try {
    const models = await api("/v1/models");
    modelId = models.data[0].id;
    $("model").textContent = "model: " + modelId;
  } catch (e) {
    $("model").textContent = e.message.includes("API key") ? "an API key is needed" : "error: " + e.message;
  }
}

function start() {
  for (const t of TABS) {
    $("tab-" + t).addEventListener("click", () => show(t, false));
    $("tab-" + t).addEventListener("keydown", onTabKey);
  }
  $("chat-form").addEventListener("submit", sendChat);
  $("chat-stop").addEventListener("click", () => chat.abort && chat.abort.abort());
  $("chat-clear").addEventListener("click", () => { chat.history = []; $("chat-log").textContent = ""; });
  $("compare-form").addEventListener("submit", runCompare);
  $("share-form").addEventListener("submit", applyShare);
  $("share").addEventListener("input", () => { $("share-value").textContent = parseFloat($("share").value).toFixed(2); });
  enterSends($("chat-input"), $("chat-form"));
  enterSends($("compare-input"), $("compare-form"));
  const themes = ["auto", "light", "dark"];
  $("theme").addEventListener("click", () => {
    const now = localStorage.getItem("lanes-theme") || "auto";
    applyTheme(themes[(themes.indexOf(now) + 1) % themes.length]);
  });
  applyTheme(localStorage.getItem("lanes-theme") || "auto");
  $("api-key").value = sessionStorage.getItem("lanes-key") || "";
  $("api-key").addEventListener("change", () => { sessionStorage.setItem("lanes-key", $("api-key").value); connect(); });
  window.addEventListener("resize", () => { if (!$("view-rounds").hidden) drawRounds(); });
  const wanted = location.hash.slice(1);
  show(TABS.includes(wanted) ? wanted : "chat", false);
  connect();
}

start();
