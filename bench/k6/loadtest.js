// Staged load test of a sluicegate deployment (or any OpenAI-compatible server) with k6.
//
//   k6 run bench/k6/loadtest.js
//   k6 run -e BASE_URL=https://gw.example -e API_KEY=sk-... -e PEAK=128 -e P95_MS=4000 \
//       bench/k6/loadtest.js
//
// The ramp and the prompt mix come from workload.json beside this file, which the Python
// runner (bench/ramp.py) reads too: concurrency steps up to PEAK (4, 8, 12, 16 by default),
// each step ramped in 15 s and held 75 s, so the steps hold 5 minutes in all (6 minutes with
// the ramps). SCALE multiplies every duration (SCALE=0.1 gives a 36 s smoke run).
//
// The requests are chat completions drawn by weight from three kinds: short questions,
// questions over ~480 tokens of documents, and multi-turn conversations. STREAM_SHARE of them
// are streamed (0.5). REPEAT_SHARE of them (0.2) are sent at temperature 0, which the response
// cache may answer, as it would a real FAQ; the rest at temperature 0.7, which it does not
// cache by default, so they measure the engine. k6 reads a stream to its end, so a streamed
// request's duration is the whole stream's; time to first token is in bench/ramp.py's table
// and in the gateway's metrics.
//
// Thresholds (the run fails when one is crossed): P95 of request duration under P95_MS, per
// kind of request (streamed or not), and errors (non-200, error events, streams without
// [DONE]) under MAX_ERROR_RATE. The defaults suit the CPU image on a laptop; set your own.
//
// Environment: BASE_URL (http://127.0.0.1:8000), API_KEY (none), MODEL
// (SmolLM2-135M-Instruct), PEAK (16), SCALE (1), MAX_TOKENS (64), STREAM_SHARE (0.5),
// REPEAT_SHARE (0.2), P95_MS (20000), MAX_ERROR_RATE (0.01), TIMEOUT (120s). Defaults in
// parentheses; those of the ramp and the requests come from workload.json.

import http from 'k6/http';
import { check, sleep } from 'k6';
import { Rate } from 'k6/metrics';

const workload = JSON.parse(open('./workload.json'));

const BASE_URL = (__ENV.BASE_URL || 'http://127.0.0.1:8000').replace(/\/+$/, '');
const API_KEY = __ENV.API_KEY || '';
const MODEL = __ENV.MODEL || 'SmolLM2-135M-Instruct';
const PEAK = parseInt(__ENV.PEAK || String(workload.ramp.peak), 10);
const SCALE = parseFloat(__ENV.SCALE || '1');
const MAX_TOKENS = parseInt(__ENV.MAX_TOKENS || String(workload.requests.max_tokens), 10);
const STREAM_SHARE = parseFloat(__ENV.STREAM_SHARE || String(workload.requests.stream_share));
const REPEAT_SHARE = parseFloat(__ENV.REPEAT_SHARE || String(workload.requests.repeat_share));
const P95_MS = parseInt(__ENV.P95_MS || '20000', 10);
const MAX_ERROR_RATE = parseFloat(__ENV.MAX_ERROR_RATE || '0.01');
const TIMEOUT = __ENV.TIMEOUT || '120s';

function seconds(value) {
  return `${Math.max(1, Math.round(value * SCALE))}s`;
}

function rampStages() {
  const stages = [];
  for (const fraction of workload.ramp.steps) {
    const target = Math.max(1, Math.round(PEAK * fraction));
    stages.push({ duration: seconds(workload.ramp.ramp_seconds), target });
    stages.push({ duration: seconds(workload.ramp.hold_seconds), target });
  }
  return stages;
}

const errors = new Rate('errors');

export const options = {
  scenarios: {
    ramp: {
      executor: 'ramping-vus',
      startVUs: 0,
      stages: rampStages(),
      gracefulRampDown: '30s',
      gracefulStop: '60s',
    },
  },
  thresholds: {
    errors: [`rate<${MAX_ERROR_RATE}`],
    http_req_failed: [`rate<${MAX_ERROR_RATE}`],
    'http_req_duration{stream:false}': [`p(95)<${P95_MS}`],
    'http_req_duration{stream:true}': [`p(95)<${P95_MS}`],
  },
  summaryTrendStats: ['avg', 'p(50)', 'p(95)', 'p(99)', 'max'],
};

function pick(items, weightOf) {
  const total = items.reduce((sum, item) => sum + weightOf(item), 0);
  let point = Math.random() * total;
  for (const item of items) {
    point -= weightOf(item);
    if (point <= 0) {
      return item;
    }
  }
  return items[items.length - 1];
}

function streamIsComplete(body) {
  // A stream ends with `data: [DONE]`; an error after the first byte arrives as an event.
  return body.includes('data: [DONE]') && !body.includes('data: {"error"');
}

export default function () {
  const kind = pick(workload.mix, (item) => item.weight);
  const messages = kind.conversations[Math.floor(Math.random() * kind.conversations.length)];
  const stream = Math.random() < STREAM_SHARE;
  const repeat = Math.random() < REPEAT_SHARE;
  const headers = { 'Content-Type': 'application/json' };
  if (API_KEY) {
    headers.Authorization = `Bearer ${API_KEY}`;
  }
  const body = JSON.stringify({
    model: MODEL,
    messages,
    max_tokens: MAX_TOKENS,
    temperature: repeat ? 0 : workload.requests.temperature,
    stream,
  });
  const response = http.post(`${BASE_URL}/v1/chat/completions`, body, {
    headers,
    timeout: TIMEOUT,
    tags: { stream: String(stream), kind: kind.kind },
  });
  const ok = check(response, {
    'status is 200': (r) => r.status === 200,
    'a complete answer': (r) =>
      r.status === 200 &&
      (stream ? streamIsComplete(r.body) : r.json('choices.0.message.content') !== undefined),
  });
  errors.add(!ok, { stream: String(stream), kind: kind.kind });
  if (!ok) {
    sleep(0.1); // a refused request must not spin the loop
  }
}
