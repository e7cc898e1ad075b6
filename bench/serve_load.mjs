// Serving under hostile load (issue #12's load criterion): `lathe serve` on loopback with 1,000 idle
// connections, 64 slowloris clients (a request byte per second), 64 slow readers (streams read a little every
// second) and 64 normal streaming clients for DURATION seconds, while /health is probed every 100 ms. Reports /health latency (max, p99), completed streams, and
// resident memory before, during and after. Usage: node bench/serve_load.mjs [lathe-binary] [seconds]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const binary = process.argv[2] ?? path.join(root, 'build/lathe');
const seconds = Number(process.argv[3] ?? 60);
const count = (name, d) => Number(process.env[name] ?? d);
const IDLE = count('IDLE', 1000), SLOW = count('SLOWLORIS', 64), SLOW_READERS = count('SLOW_READERS', 64);
const STREAMS = count('STREAMS', 64), WARMUP = count('WARMUP', 10);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rss = (pid) => Number(/VmRSS:\s+(\d+)/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;

const proc = spawn(binary, ['serve', '--port', '0', '--model', path.join(root, 'models/demo'), '--max-queue', '256'], {
  stdio: ['ignore', 'pipe', 'pipe'],
});
let log = '';
const port = await new Promise((resolve, reject) => {
  const on = (d) => {
    log += d;
    const m = /listening on http:\/\/[^:]+:(\d+)/.exec(log);
    if (m) resolve(Number(m[1]));
  };
  proc.stderr.on('data', on);
  proc.stdout.on('data', on);
  proc.on('exit', (c) => reject(new Error(`serve exited ${c}: ${log}`)));
});
const base = `http://127.0.0.1:${port}`;
await sleep(500);
const rssCold = rss(proc.pid);
let stop = false;

// Warm-up: as many concurrent streams as the load runs, for WARMUP seconds, so that the engine's KV pool and
// the allocator's arenas reach their working size before the baseline is taken (they are kept, not leaked).
const streamBody = (maxTokens) =>
  JSON.stringify({ model: 'demo', messages: [{ role: 'user', content: 'hello world' }], max_tokens: maxTokens, stream: true });
async function warm(until) {
  while (Date.now() < until) {
    const r = await fetch(`${base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: streamBody(512) });
    await r.text();
  }
}
const warmUntil = Date.now() + WARMUP * 1000;
await Promise.all(Array.from({ length: STREAMS + SLOW_READERS }, () => warm(warmUntil)));
await sleep(3000);
const rssBaseline = rss(proc.pid);

// Idle: connect and send nothing; reconnect when the server closes the connection (its read timeout).
const sockets = new Set();
function idle() {
  if (stop) return;
  const s = net.connect(port, '127.0.0.1');
  sockets.add(s);
  s.on('error', () => {});
  s.on('close', () => {
    sockets.delete(s);
    setTimeout(idle, 100);
  });
}
for (let i = 0; i < IDLE; ++i) idle();

// Slow: a request byte per second, forever (a new connection when one is closed).
const slowRequest = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n`;
function slow() {
  if (stop) return;
  const s = net.connect(port, '127.0.0.1');
  sockets.add(s);
  let i = 0;
  const t = setInterval(() => s.writable && s.write(slowRequest[i++ % slowRequest.length]), 1000);
  s.on('error', () => {});
  s.on('close', () => {
    clearInterval(t);
    sockets.delete(s);
    setTimeout(slow, 100);
  });
}
for (let i = 0; i < SLOW; ++i) slow();

// Slow readers: a long streamed completion, read in short bursts once a second (the socket is paused between),
// one after another.
const slowReadBody = JSON.stringify({
  model: 'demo', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 512, stream: true,
});
let slowReads = 0;
function slowReader() {
  if (stop) return;
  const s = net.connect(port, '127.0.0.1');
  sockets.add(s);
  s.on('connect', () => {
    s.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n` +
      `Content-Length: ${Buffer.byteLength(slowReadBody)}\r\nConnection: close\r\n\r\n${slowReadBody}`);
    s.pause();
  });
  const t = setInterval(() => {
    s.resume();
    setTimeout(() => s.pause(), 5);
  }, 1000);
  s.on('data', () => {});
  s.on('error', () => {});
  s.on('close', () => {
    clearInterval(t);
    sockets.delete(s);
    ++slowReads;
    setTimeout(slowReader, 100);
  });
}
for (let i = 0; i < SLOW_READERS; ++i) slowReader();

// Normal: streamed chat completions back to back.
let completed = 0, failed = 0;
const failures = {};
async function streamer() {
  while (!stop) {
    try {
      const r = await fetch(`${base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model: 'demo', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 32, stream: true }),
      });
      const text = await r.text();
      if (r.status === 200 && text.includes('[DONE]')) ++completed;
      else {
        ++failed;
        const why = `${r.status} ${text.slice(-120)}`;
        failures[why] = (failures[why] ?? 0) + 1;
      }
    } catch (e) {
      ++failed;
      const why = String(e.cause?.code ?? e.cause ?? e);
      failures[why] = (failures[why] ?? 0) + 1;
    }
  }
}
const streamers = Array.from({ length: STREAMS }, streamer);

// /health every 100 ms from a process of its own (bench/health_probe.mjs), while this one samples RSS.
let rssPeak = 0;
const prober = spawn(process.execPath, [path.join(root, 'bench/health_probe.mjs'), `${base}/health`, String(seconds)], {
  stdio: ['ignore', 'pipe', 'inherit'],
});
let probeOut = '';
prober.stdout.on('data', (d) => (probeOut += d));
const probed = new Promise((resolve) => prober.on('exit', resolve));
const t0 = Date.now();
while (Date.now() - t0 < seconds * 1000) {
  rssPeak = Math.max(rssPeak, rss(proc.pid));
  await sleep(100);
}
await probed;
const { latencies, failures: healthFailures } = JSON.parse(probeOut);
stop = true;
await Promise.all(streamers);
for (const s of sockets) s.destroy();
await sleep(3000);
const rssAfter = rss(proc.pid);
// What the RAM prompt cache holds at the end (kept on purpose, up to --prompt-cache-bytes): part of "after".
const cacheRam = await fetch(`${base}/v1/cache`).then((r) => r.json()).then((c) => c.ram).catch(() => null);
proc.kill('SIGTERM');
latencies.sort((a, b) => a - b);
const pct = (p) => latencies[Math.min(latencies.length - 1, Math.floor(latencies.length * p))].toFixed(1);
console.log(
  JSON.stringify(
    {
      seconds, idle: IDLE, slowloris: SLOW, slow_readers: SLOW_READERS, streams: STREAMS, slow_reads_ended: slowReads,
      health: { probes: latencies.length, failures: healthFailures, p50_ms: pct(0.5), p99_ms: pct(0.99), max_ms: latencies[latencies.length - 1].toFixed(1) },
      streams_completed: completed, streams_failed: failed, failures,
      rss_mb: { cold: (rssCold / 2 ** 20).toFixed(1), baseline: (rssBaseline / 2 ** 20).toFixed(1), peak: (rssPeak / 2 ** 20).toFixed(1), after: (rssAfter / 2 ** 20).toFixed(1) },
      prompt_cache_ram_after: cacheRam,
    },
    null,
    1,
  ),
);
process.exit(0);
