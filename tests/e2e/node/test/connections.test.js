// Issue #12, the HTTP layer: idle and slow connections hold no worker (the server runs with the smallest worker
// pool, 16 threads, and far more connections than that), pipelined requests are answered in order, and a client
// that half-closes after sending still gets its answer.
import assert from 'node:assert/strict';
import net from 'node:net';
import { describe, test } from 'node:test';

import { parseSSE, rawExchange, request, sleep, useServer } from './harness.js';

// Opens a socket and resolves once connected.
const connect = (port) =>
  new Promise((resolve, reject) => {
    const s = net.connect(port, '127.0.0.1', () => resolve(s));
    s.on('error', reject);
  });

const statuses = (text) => [...text.matchAll(/HTTP\/1\.1 (\d{3})/g)].map((m) => Number(m[1]));

async function timedHealth(server) {
  const t0 = performance.now();
  const r = await request(server, 'GET', '/health');
  assert.equal(r.status, 200);
  return performance.now() - t0;
}

describe('connections hold no worker', () => {
  const ctx = useServer({ args: ['--http-threads', '16', '--max-queue', '8'] });

  test('200 idle connections (16 workers) do not delay /health or a generation', async () => {
    const { port } = ctx.server;
    const idle = await Promise.all(Array.from({ length: 200 }, () => connect(port)));
    try {
      await sleep(200);
      const ms = await timedHealth(ctx.server);
      assert.ok(ms < 1000, `/health took ${ms} ms beside 200 idle connections`);
      const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
        body: { model: 'demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 },
      });
      assert.equal(r.status, 200, r.text);
      assert.equal(r.json.object, 'chat.completion');
    } finally {
      for (const s of idle) s.destroy();
    }
  });

  test('slowloris: 64 connections sending a header byte at a time do not delay a normal request', async () => {
    const { port } = ctx.server;
    const slow = await Promise.all(Array.from({ length: 64 }, () => connect(port)));
    const header = 'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ';
    let i = 0;
    const drip = setInterval(() => {
      for (const s of slow) if (!s.destroyed) s.write(header[Math.min(i, header.length - 1)]);
      ++i;
    }, 100);
    try {
      await sleep(500);
      for (let k = 0; k < 5; ++k) {
        const ms = await timedHealth(ctx.server);
        assert.ok(ms < 1000, `/health took ${ms} ms beside 64 slowloris connections`);
      }
      const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
        body: { model: 'demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4, stream: true },
      });
      assert.equal(r.status, 200);
      assert.equal(parseSSE(r.text).at(-1).data, '[DONE]');
    } finally {
      clearInterval(drip);
      for (const s of slow) s.destroy();
    }
  });

  test('two pipelined requests in one write get two answers, in order', async () => {
    const text = await rawExchange(
      ctx.server.port,
      'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n' +
        'POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}' +
        'GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n',
    );
    assert.deepEqual(statuses(text), [200, 400, 404], text);
    assert.ok(text.indexOf('"status"') < text.indexOf('"error"'), text);
  });

  test('a client that half-closes after its request still gets the answer', async () => {
    const text = await rawExchange(ctx.server.port, 'GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n', { halfClose: true });
    assert.deepEqual(statuses(text), [200], text);
    assert.match(text, /"object":"list"/);
    const both = await rawExchange(
      ctx.server.port,
      'GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n',
      { halfClose: true },
    );
    assert.deepEqual(statuses(both), [200, 200], both);
  });

  test('bodies in flight have a budget: beyond it a POST is a 503, and finished ones free it', async () => {
    // 16 connections each declare a body of --max-body-bytes (16 MiB) and send none of it: 256 MiB held. A
    // thousand such connections that did send held 16 GB before.
    const post = (len) => `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: ${len}\r\n\r\n`;
    const hogs = await Promise.all(Array.from({ length: 16 }, () => connect(ctx.server.port)));
    try {
      for (const s of hogs) s.write(post(16 << 20));
      await sleep(300);
      const refused = await rawExchange(ctx.server.port, post(16 << 20), { timeoutMs: 5000 });
      assert.deepEqual(statuses(refused), [503], refused);
      assert.match(refused, /Retry-After: 1/);
      assert.match(refused, /busy reading other request bodies/);
      assert.equal((await request(ctx.server, 'GET', '/v1/models')).status, 200);
    } finally {
      for (const s of hogs) s.destroy();
    }
    await sleep(300);
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { model: 'demo', messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 },
    });
    assert.equal(r.status, 200, r.text);
  });

  test('a request line or header that is never finished is dropped at the header deadline', async () => {
    // Not waited out here (10 s): the connection is still open after a second, and holds no worker meanwhile.
    const s = await connect(ctx.server.port);
    s.write('GET /health HTTP/1.1\r\nHost');
    await sleep(1000);
    assert.equal(s.destroyed, false);
    const ms = await timedHealth(ctx.server);
    assert.ok(ms < 1000, `${ms} ms`);
    s.destroy();
  });
});
