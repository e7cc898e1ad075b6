// Probes GET URL every 100 ms for SECONDS seconds and prints the latencies (ms) as one JSON line. It runs as a
// process of its own (bench/serve_load.mjs starts it) so that what it measures is the server's answer time, not
// the delay of an event loop that is also driving a thousand load connections.
// Usage: node bench/health_probe.mjs URL SECONDS
import http from 'node:http';

const url = process.argv[2];
const seconds = Number(process.argv[3] ?? 60);
// One kept-alive connection, as a load balancer's health checker holds; a fresh one each probe is also fine.
const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
const probe = () =>
  new Promise((resolve) => {
    const t = performance.now();
    const req = http.get(url, { agent, timeout: 5000 }, (res) => {
      res.resume();
      res.on('end', () => resolve({ ms: performance.now() - t, ok: res.statusCode === 200 }));
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', () => resolve({ ms: performance.now() - t, ok: false }));
  });
const latencies = [];
let failures = 0;
const t0 = Date.now();
while (Date.now() - t0 < seconds * 1000) {
  const r = await probe();
  latencies.push(r.ms);
  if (!r.ok) ++failures;
  await new Promise((r) => setTimeout(r, 100));
}
agent.destroy();
console.log(JSON.stringify({ latencies, failures }));
