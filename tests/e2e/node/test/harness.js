// Shared helpers for the `lathe serve` end-to-end tests: start the real binary on a free loopback port, build
// SDK clients pointed at it, read SSE and Prometheus text, and run the CLI for reference outputs.
//
// Environment (set by CTest; the defaults suit a run from the source tree after `scripts/build.sh build`):
//   LATHE_BINARY      path to the lathe executable   (default: <source>/build/lathe)
//   LATHE_SOURCE_DIR  the repository root            (default: four levels above this file)
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

const here = path.dirname(fileURLToPath(import.meta.url));
export const SOURCE_DIR = process.env.LATHE_SOURCE_DIR ?? path.resolve(here, '../../../..');
export const BINARY = process.env.LATHE_BINARY ?? path.join(SOURCE_DIR, 'build/lathe');
export const DEMO_MODEL = path.join(SOURCE_DIR, 'models/demo');
export const fixtureModel = (name) => path.join(SOURCE_DIR, 'tests/fixtures/models', name);

const READY = /listening on http:\/\/([^\s:/]+|\[[^\]]+\]):(\d+)/;
const LOG_KEEP = 256 * 1024;

// Starts `lathe serve --port 0 [--model DIR] ARGS...` and resolves once it prints its ready line.
// model: a checkpoint directory, or null to let the server pick its bundled default.
export async function startServer({ model = DEMO_MODEL, args = [], readyTimeoutMs = 30000 } = {}) {
  const argv = ['serve', '--port', '0', ...(model ? ['--model', model] : []), ...args];
  const started = process.hrtime.bigint();
  const proc = spawn(BINARY, argv, { cwd: SOURCE_DIR, stdio: ['ignore', 'pipe', 'pipe'] });
  let log = '';
  const append = (chunk) => {
    log += chunk.toString();
    if (log.length > LOG_KEEP) log = log.slice(-LOG_KEEP);
  };
  proc.stdout.on('data', append);
  proc.stderr.on('data', append);
  let exit = null;
  const exited = new Promise((resolve) => {
    proc.on('exit', (code, signal) => {
      exit = { code, signal };
      resolve(exit);
    });
  });

  const { host, port } = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      proc.kill('SIGKILL');
      reject(new Error(`lathe serve not ready after ${readyTimeoutMs} ms; log:\n${log}`));
    }, readyTimeoutMs);
    const check = () => {
      const m = READY.exec(log);
      if (m) {
        clearTimeout(timer);
        resolve({ host: m[1], port: Number(m[2]) });
      }
    };
    proc.stdout.on('data', check);
    proc.stderr.on('data', check);
    proc.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${BINARY}: ${e.message}`));
    });
    proc.on('exit', (code, signal) => {
      clearTimeout(timer);
      reject(new Error(`lathe serve exited (${code ?? signal}) before it was ready; log:\n${log}`));
    });
  });
  const readyMs = Number(process.hrtime.bigint() - started) / 1e6;
  const connectHost = host === '0.0.0.0' || host === '[::]' ? '127.0.0.1' : host;

  return {
    argv,
    host,
    port,
    pid: proc.pid,
    readyMs,
    base: `http://${connectHost}:${port}`,
    log: () => log,
    alive: () => exit === null,
    exitStatus: () => exit,
    // SIGTERM, then SIGKILL if it has not exited within `graceMs`. Resolves to the exit status.
    async stop(graceMs = 5000) {
      if (exit) return exit;
      proc.kill('SIGTERM');
      const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
      const status = await exited;
      clearTimeout(timer);
      return status;
    },
  };
}

// Registers before/after hooks for the current file (or describe block) that run one server; read it from
// the returned object's `server` field inside tests.
// `ready` resolves to the server once it is up (await it in other before hooks).
export function useServer(options) {
  const ctx = { server: null };
  let resolve;
  let reject;
  ctx.ready = new Promise((res, rej) => {
    resolve = res;
    reject = rej;
  });
  ctx.ready.catch(() => {});
  before(async () => {
    try {
      ctx.server = await startServer(options);
      resolve(ctx.server);
    } catch (e) {
      reject(e);
      throw e;
    }
  });
  after(async () => {
    if (ctx.server) await ctx.server.stop();
  });
  return ctx;
}

// The official SDK clients. Retries are off so that a 429 or 5xx is seen by the test, not retried away.
export function openaiClient(server, { apiKey = 'sk-lathe-test', ...rest } = {}) {
  return new OpenAI({ baseURL: `${server.base}/v1`, apiKey, maxRetries: 0, timeout: 60000, ...rest });
}

export function anthropicClient(server, { apiKey = 'sk-ant-lathe-test', ...rest } = {}) {
  return new Anthropic({ baseURL: server.base, apiKey, maxRetries: 0, timeout: 60000, ...rest });
}

// Raw request with fetch; resolves to {status, headers, text, json} (json is undefined when the body is not JSON).
export async function request(server, method, route, { body, headers = {}, signal } = {}) {
  const init = { method, headers: { ...headers }, signal };
  if (body !== undefined) {
    init.body = typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body);
    if (!Object.keys(init.headers).some((h) => h.toLowerCase() === 'content-type'))
      init.headers['content-type'] = 'application/json';
  }
  const res = await fetch(server.base + route, init);
  const text = await res.text();
  let json;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json };
}

// Parses a complete SSE body into [{event, data}] (data is the raw string after "data: ").
export function parseSSE(text) {
  const frames = [];
  for (const block of text.split(/\r?\n\r?\n/)) {
    if (!block.trim()) continue;
    const frame = { event: null, data: null };
    for (const line of block.split(/\r?\n/)) {
      if (line.startsWith('event:')) frame.event = line.slice(6).trim();
      else if (line.startsWith('data:')) {
        const d = line.slice(5).replace(/^ /, '');
        frame.data = frame.data === null ? d : `${frame.data}\n${d}`;
      }
    }
    frames.push(frame);
  }
  return frames;
}

// Prometheus text exposition → [{name, labels, value}].
export function parseMetrics(text) {
  const samples = [];
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) for (const l of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]] = l[2];
    samples.push({ name: m[1], labels, value: Number(m[4]) });
  }
  return samples;
}

// Sum of the samples called `name` whose labels include `labels`; undefined when there is none.
export function metricValue(samples, name, labels = {}) {
  let sum;
  for (const s of samples) {
    if (s.name !== name) continue;
    if (!Object.entries(labels).every(([k, v]) => s.labels[k] === v)) continue;
    sum = (sum ?? 0) + s.value;
  }
  return sum;
}

export async function scrape(server) {
  const res = await fetch(`${server.base}/metrics`);
  if (res.status !== 200) throw new Error(`/metrics answered ${res.status}`);
  return parseMetrics(await res.text());
}

// Polls `predicate()` (sync or async) every `intervalMs` until it is truthy; returns its last value.
export async function waitFor(predicate, { timeoutMs = 10000, intervalMs = 50 } = {}) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await predicate();
    if (v || Date.now() > deadline) return v;
    await sleep(intervalMs);
  }
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// A deterministic PRNG (mulberry32) in [0, 1), so a randomized test can be replayed with its seed.
export function seededRandom(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Writes `bytes` on a fresh socket to 127.0.0.1:port (half-closing after when asked) and resolves to everything
// read until the server closes it (or timeoutMs), as latin1 text: for tests that speak raw HTTP.
export function rawExchange(port, bytes, { halfClose = false, timeoutMs = 10000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    const bufs = [];
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      sock.destroy();
      resolve(Buffer.concat(bufs).toString('latin1'));
    };
    sock.on('connect', () => (halfClose ? sock.end(bytes) : sock.write(bytes)));
    sock.on('data', (d) => bufs.push(d));
    sock.on('end', finish);
    sock.on('close', finish);
    sock.on('error', finish);
    sock.setTimeout(timeoutMs, finish);
  });
}

// Runs the lathe CLI synchronously; throws with its stderr when it fails. Returns stdout.
export function lathe(args, { input } = {}) {
  const r = spawnSync(BINARY, args, { cwd: SOURCE_DIR, input, encoding: 'utf8', maxBuffer: 64 << 20 });
  if (r.error) throw r.error;
  if (r.status !== 0) throw new Error(`lathe ${args.join(' ')} exited ${r.status}: ${r.stderr}`);
  return r.stdout;
}

export const readJson = (file) => JSON.parse(fs.readFileSync(file, 'utf8'));

// Resident set size of a process in bytes (Linux /proc).
export function rssBytes(pid) {
  const status = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const m = /VmRSS:\s+(\d+)\s+kB/.exec(status);
  if (!m) throw new Error(`no VmRSS for pid ${pid}`);
  return Number(m[1]) * 1024;
}

// The demo model's prompt text for one user turn, as its chat template renders it (for /v1/completions).
export const demoChatText = (message) => `<|im_start|>user\n${message}<|im_end|>\n<|im_start|>assistant\n`;
