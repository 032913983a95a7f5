// GET / of `weft serve`: a small chat page with no dependencies (docs/serving.md, "Chat page").
// It talks to the server's own OpenAI API from the browser: streamed chat completions (SSE read
// from fetch()), the sampling parameters, an optional API key, and a view of the workers from
// /admin/cluster. Text from the model or the server is only ever set as textContent.

#include "actors/serve/chat_page.hpp"

namespace weft::serve {

std::string_view chat_page_html() {
  static constexpr std::string_view page = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>weft chat</title>
<style>
  body { font-family: system-ui, sans-serif; margin: 0; display: flex; height: 100vh; color: #222; }
  main { flex: 1; display: flex; flex-direction: column; min-width: 0; }
  aside { width: 320px; border-left: 1px solid #ddd; padding: 12px; overflow-y: auto;
          font-size: 13px; background: #fafafa; }
  header { padding: 10px 16px; border-bottom: 1px solid #ddd; display: flex; gap: 12px;
           align-items: center; flex-wrap: wrap; }
  header h1 { font-size: 16px; margin: 0; }
  header label { font-size: 13px; }
  header input { width: 70px; }
  #log { flex: 1; overflow-y: auto; padding: 16px; }
  .msg { margin: 0 0 12px; white-space: pre-wrap; line-height: 1.4; }
  .user { color: #0b3d91; }
  .assistant { color: #222; }
  .error { color: #b00020; }
  .meta { color: #888; font-size: 12px; }
  form { display: flex; gap: 8px; padding: 12px 16px; border-top: 1px solid #ddd; }
  textarea { flex: 1; height: 48px; font: inherit; }
  table { border-collapse: collapse; width: 100%; }
  td, th { text-align: left; padding: 2px 4px; border-bottom: 1px solid #eee; }
</style>
</head>
<body>
<main>
  <header>
    <h1>weft</h1>
    <span id="model" class="meta">model: …</span>
    <label>temperature <input id="temperature" type="number" step="0.1" min="0" value="0.7"></label>
    <label>max tokens <input id="max_tokens" type="number" min="1" value="256"></label>
    <label>top-p <input id="top_p" type="number" step="0.05" min="0" max="1" value="1"></label>
    <label>system <input id="system" style="width:200px" placeholder="(none)"></label>
    <label>API key <input id="key" type="password" style="width:120px" placeholder="(none)"></label>
    <button id="clear" type="button">clear</button>
  </header>
  <div id="log"></div>
  <form id="form">
    <textarea id="input" placeholder="Message (Enter sends, Shift+Enter: new line)"></textarea>
    <button id="send" type="submit">Send</button>
  </form>
</main>
<aside>
  <b>Cluster</b> <span id="health" class="meta"></span>
  <table id="workers"><thead><tr><th>worker</th><th>role</th><th>state</th><th>in flight</th>
    <th>KV used</th><th>tok/s</th></tr></thead><tbody></tbody></table>
</aside>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
let model = null;
const history = [];

function headers() {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h["Authorization"] = "Bearer " + $("key").value;
  return h;
}

function add(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.textContent = text;
  $("log").appendChild(div);
  $("log").scrollTop = $("log").scrollHeight;
  return div;
}

async function loadModel() {
  try {
    const r = await fetch("/v1/models", { headers: headers() });
    const j = await r.json();
    if (j.data && j.data.length) {
      model = j.data[0].id;
      $("model").textContent = "model: " + model;
    } else if (j.error) {
      $("model").textContent = j.error.message;
    }
  } catch (e) {
    $("model").textContent = "server unreachable";
  }
}

async function send(text) {
  if (!text.trim()) return;
  if (!model) await loadModel();
  add("user", text);
  history.push({ role: "user", content: text });
  const messages = [];
  if ($("system").value) messages.push({ role: "system", content: $("system").value });
  messages.push(...history);
  const out = add("assistant", "");
  out.dataset.state = "streaming";
  $("send").disabled = true;
  let answer = "";
  const started = performance.now();
  let tokens = 0;
  try {
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({
        model, messages, stream: true,
        temperature: parseFloat($("temperature").value),
        top_p: parseFloat($("top_p").value),
        max_tokens: parseInt($("max_tokens").value, 10),
        stream_options: { include_usage: true },
      }),
    });
    if (!r.ok) {
      const j = await r.json().catch(() => ({}));
      throw new Error((j.error && j.error.message) || ("HTTP " + r.status));
    }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buf = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const event = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        for (const line of event.split("\n")) {
          if (!line.startsWith("data: ")) continue;
          const data = line.slice(6);
          if (data === "[DONE]") continue;
          const j = JSON.parse(data);
          if (j.error) throw new Error(j.error.message);
          if (j.usage) tokens = j.usage.completion_tokens;
          for (const c of j.choices || []) {
            if (c.delta && c.delta.content) {
              answer += c.delta.content;
              out.textContent = answer;
            }
          }
        }
      }
    }
    history.push({ role: "assistant", content: answer });
    const secs = (performance.now() - started) / 1000;
    const meta = document.createElement("div");
    meta.className = "meta";
    meta.textContent = tokens + " tokens in " + secs.toFixed(1) + " s";
    out.after(meta);
    out.dataset.state = "done";
  } catch (e) {
    out.className = "msg error";
    out.textContent = (answer ? answer + "\n" : "") + "error: " + e.message;
    out.dataset.state = "error";
    history.pop();
  } finally {
    $("send").disabled = false;
  }
}

async function pollCluster() {
  try {
    const r = await fetch("/admin/cluster", { headers: headers() });
    const j = await r.json();
    const body = $("workers").tBodies[0];
    body.textContent = "";
    const router = j.router || {};
    $("health").textContent = router.healthy ? "healthy" : "unhealthy";
    for (const w of router.workers || []) {
      const tr = document.createElement("tr");
      const kv = w.kv_blocks_total ? Math.round(100 * w.kv_blocks_used / w.kv_blocks_total) + "%" : "";
      for (const v of [w.name, w.role, w.state, w.inflight, kv,
                       Math.round(w.decode_tokens_per_s || 0)]) {
        const td = document.createElement("td");
        td.textContent = String(v);
        tr.appendChild(td);
      }
      body.appendChild(tr);
    }
  } catch (e) {
    $("health").textContent = "cluster view unavailable";
  }
}

$("form").addEventListener("submit", (e) => {
  e.preventDefault();
  const text = $("input").value;
  $("input").value = "";
  send(text);
});
$("input").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("form").requestSubmit();
  }
});
$("clear").addEventListener("click", () => { history.length = 0; $("log").textContent = ""; });

loadModel();
pollCluster();
setInterval(pollCluster, 2000);
// /?prompt=TEXT sends TEXT once the page is loaded (links that start a chat; the browser test).
const q = new URLSearchParams(location.search).get("prompt");
if (q) send(q);
</script>
</body>
</html>
)HTML";
  return page;
}

}  // namespace weft::serve
