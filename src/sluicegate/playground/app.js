// The playground: a chat form streaming through fetch(), with the numbers beside the answer.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = "sluicegate.apiKey"; // sessionStorage only: gone with the tab
const BUDGET_HEADERS = [
  "x-budget-prompt-tokens-before",
  "x-budget-prompt-tokens-after",
  "x-budget-messages-dropped",
  "x-budget-truncation",
  "x-budget-max-tokens",
  "x-budget-max-tokens-source",
];
let controller = null;

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = $("api-key").value.trim();
  if (key) h.Authorization = `Bearer ${key}`;
  return h;
}

async function errorMessage(response) {
  try {
    const body = await response.json();
    return body.error?.message || `HTTP ${response.status}`;
  } catch {
    return `HTTP ${response.status}`;
  }
}

async function loadModels() {
  const select = $("model");
  try {
    const response = await fetch("../v1/models", { headers: headers() });
    if (!response.ok) throw new Error(await errorMessage(response));
    const { data } = await response.json();
    select.replaceChildren(
      ...data.map((m) => Object.assign(document.createElement("option"), { value: m.id, text: m.id })),
    );
    $("error").textContent = "";
  } catch (err) {
    $("error").textContent = `Models: ${err.message}`;
  }
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  messages.push({ role: "user", content: $("prompt").value });
  const body = {
    model: $("model").value,
    messages,
    temperature: Number($("temperature").value),
    top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
    stream: true,
    stream_options: { include_usage: true },
  };
  const schema = $("schema").value.trim();
  if (schema) {
    body.response_format = {
      type: "json_schema",
      json_schema: { name: "answer", schema: JSON.parse(schema) },
    };
  }
  return body;
}

function showHeaders(response) {
  $("cache").textContent = response.headers.get("x-cache") || "–";
  $("request-id").textContent = response.headers.get("x-request-id") || "–";
  const budget = BUDGET_HEADERS.filter((h) => response.headers.has(h)).map(
    (h) => `${h.slice("x-budget-".length)}: ${response.headers.get(h)}`,
  );
  $("budget").textContent = budget.length ? budget.join(", ") : "–";
}

async function send(event) {
  event.preventDefault();
  for (const id of ["output", "error"]) $(id).textContent = "";
  for (const id of ["ttft", "tps", "usage", "cache", "request-id", "budget"]) $(id).textContent = "–";
  let body;
  try {
    body = requestBody();
  } catch (err) {
    $("error").textContent = `JSON schema: ${err.message}`;
    return;
  }
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  const started = performance.now();
  let firstToken = null;
  try {
    const response = await fetch("../v1/chat/completions", {
      method: "POST",
      headers: headers(),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    showHeaders(response);
    if (!response.ok) throw new Error(await errorMessage(response));
    await readEvents(response.body, (data) => {
      if (data === "[DONE]") return true;
      const chunk = JSON.parse(data);
      if (chunk.error) throw new Error(chunk.error.message);
      const text = chunk.choices?.[0]?.delta?.content;
      if (text) {
        if (firstToken === null) {
          firstToken = performance.now();
          $("ttft").textContent = `${Math.round(firstToken - started)} ms`;
        }
        $("output").textContent += text;
      }
      if (chunk.usage) {
        const u = chunk.usage;
        $("usage").textContent = `${u.prompt_tokens} in, ${u.completion_tokens} out`;
        const seconds = (performance.now() - (firstToken ?? started)) / 1000;
        if (u.completion_tokens > 1 && seconds > 0) {
          $("tps").textContent = ((u.completion_tokens - 1) / seconds).toFixed(1);
        }
      }
      return false;
    });
  } catch (err) {
    $("error").textContent = err.name === "AbortError" ? "Stopped." : err.message;
  } finally {
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
  }
}

$("form").addEventListener("submit", send);
$("stop").addEventListener("click", () => controller?.abort());
$("api-key").value = sessionStorage.getItem(KEY_STORAGE) || "";
$("api-key").addEventListener("change", () => {
  sessionStorage.setItem(KEY_STORAGE, $("api-key").value.trim());
  loadModels();
});
loadModels();
