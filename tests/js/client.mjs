// The openai JS SDK against an OpenAI-compatible server (tests/integration/test_js_client.py).
// Env: GATEWAY_BASE_URL (the server's root, without /v1) and GATEWAY_MODEL.
// Prints one JSON object with what each call returned (or its error); the Python test asserts
// on it.
import OpenAI from "openai";

const baseURL = `${process.env.GATEWAY_BASE_URL}/v1`;
const model = process.env.GATEWAY_MODEL;
const client = new OpenAI({
  baseURL,
  apiKey: "unused",
  maxRetries: 0,
  timeout: 120_000,
  defaultHeaders: { "Cache-Control": "no-cache" },
});

async function streamChat() {
  const stream = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Name three colours of the rainbow." }],
    temperature: 0,
    max_tokens: 24,
    stream: true,
  });
  const chunks = [];
  for await (const chunk of stream) {
    chunks.push(chunk);
  }
  const withChoices = chunks.filter((c) => c.choices.length > 0);
  return {
    chunks: chunks.length,
    content_chunks: withChoices.filter((c) => c.choices[0].delta.content).length,
    ids: [...new Set(chunks.map((c) => c.id))],
    objects: [...new Set(chunks.map((c) => c.object))],
    first_role: withChoices[0]?.choices[0].delta.role ?? null,
    text: withChoices.map((c) => c.choices[0].delta.content ?? "").join(""),
    finish_reason: withChoices.at(-1)?.choices[0].finish_reason ?? null,
  };
}

async function wholeChat() {
  const reply = await client.chat.completions.create({
    model,
    messages: [{ role: "user", content: "Name three colours of the rainbow." }],
    temperature: 0,
    max_tokens: 24,
  });
  return { text: reply.choices[0].message.content, finish_reason: reply.choices[0].finish_reason };
}

async function jsonObject() {
  const reply = await client.chat.completions.create({
    model,
    messages: [
      { role: "user", content: "Describe a cat as a JSON object with a name and an age." },
    ],
    temperature: 0,
    max_tokens: 60,
    response_format: { type: "json_object" },
  });
  return {
    content: reply.choices[0].message.content,
    finish_reason: reply.choices[0].finish_reason,
  };
}

// Each call on its own: one that fails is reported, and the others still run.
async function attempt(call) {
  try {
    return await call();
  } catch (error) {
    return { error: String(error) };
  }
}

const result = {
  stream: await attempt(streamChat),
  whole: await attempt(wholeChat),
  json_object: await attempt(jsonObject),
};
console.log(JSON.stringify(result));
