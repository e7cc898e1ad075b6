// Robustness of `lathe serve` over raw sockets: malformed, truncated, oversized, wrong-typed and invalid-UTF-8
// requests each get their 4xx (or, for a request the client itself cut off, no answer at all — never a 2xx,
// a 5xx or a crash); then storms of concurrent streaming clients that disconnect at random points. Afterwards
// the server still answers, is idle, holds no leaked sockets, and its resident memory is back near its
// baseline. LATHE_ROBUSTNESS_SEED picks the storm's random plan (printed as a diagnostic).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { describe, test } from 'node:test';

import {
  demoChatText,
  metricValue,
  request,
  rssBytes,
  scrape,
  seededRandom,
  sleep,
  useServer,
  waitFor,
} from './harness.js';

const MAX_BODY = 64 * 1024;
const ctx = useServer({ args: ['--max-body-bytes', `${MAX_BODY}`, '--max-queue', '128'] });
const MiB = 1024 * 1024;
const hello = [{ role: 'user', content: 'hello world' }];

// One HTTP exchange over a fresh socket. `parts` are written in order (a number is a pause in ms); then the
// socket is half-closed (`end`), left open (`open`) or destroyed (`destroy`). Resolves when the server closes
// the connection, the socket errors, or after `timeoutMs`, with the status line's code (null if none came).
// (A half-closed client gets no answer from cpp-httplib, which will not write to a peer that sent FIN, so
// complete requests keep their socket open and rely on `Connection: close`.)
function exchange(port, parts, { after = 'open', timeoutMs = 15000 } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    const bufs = [];
    let done = false;
    const finish = (why) => {
      if (done) return;
      done = true;
      sock.destroy();
      const text = Buffer.concat(bufs).toString('latin1');
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      const split = text.indexOf('\r\n\r\n');
      resolve({ status: m ? Number(m[1]) : null, head: text.slice(0, split), body: text.slice(split + 4), why });
    };
    sock.on('connect', async () => {
      for (const p of parts) {
        if (typeof p === 'number') await sleep(p);
        else if (!sock.destroyed) sock.write(p);
      }
      if (after === 'end') sock.end();
      else if (after === 'destroy') finish('client closed');
    });
    sock.on('data', (d) => bufs.push(d));
    sock.on('end', () => finish('server closed'));
    sock.on('close', () => finish('closed'));
    sock.on('error', (e) => finish(`error ${e.code}`));
    sock.setTimeout(timeoutMs, () => finish('timeout'));
  });
}

const head = (route, length, extra = '') =>
  `POST ${route} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nConnection: close\r\n` +
  `Content-Length: ${length}\r\n${extra}\r\n`;
const post = (route, body, extra) => {
  const b = Buffer.isBuffer(body) ? body : Buffer.from(typeof body === 'string' ? body : JSON.stringify(body));
  return [Buffer.concat([Buffer.from(head(route, b.length, extra)), b])];
};

const ROUTES = ['/v1/chat/completions', '/v1/completions', '/v1/messages'];
const validBody = {
  '/v1/chat/completions': { messages: hello, max_tokens: 8 },
  '/v1/completions': { prompt: 'hello', max_tokens: 8 },
  '/v1/messages': { messages: hello, max_tokens: 8 },
};

// [name, route, raw request parts, expected status]
function badRequests() {
  const cases = [];
  const malformed = [
    '{',
    '{"messages": [}',
    '{"messages": [{"role": "user", "content": "hi"}]',
    'nul',
    '{"messages": [{"role": "user", "content": "hi"}]} trailing',
    '{"messages": [{"role": "user", "content": "unterminated}]}',
    "{'messages': []}",
    '{"messages": [{"role": "user", "content": "\\ud800"}], "max_tokens": 4}',  // lone surrogate escape
    '\u0000\u0001\u0002',
    '',
    `{"messages": ${'['.repeat(20000)}${']'.repeat(20000)}}`,  // deep nesting, within the size limit
  ];
  for (const route of ROUTES)
    malformed.forEach((body, i) => cases.push([`malformed #${i}`, route, post(route, body), 400]));

  const wrong = [
    { messages: 'hello', max_tokens: 8 },
    { messages: [{ role: 7, content: 'hi' }], max_tokens: 8 },
    { messages: [{ role: 'user', content: { text: 'hi' } }], max_tokens: 8 },
    { messages: hello, max_tokens: 'many' },
    { messages: hello, max_tokens: 1e300 },
    { messages: hello, max_tokens: -1 },
    { messages: hello, temperature: [1] },
    { messages: hello, temperature: -0.5 },
    { messages: hello, top_p: 'x' },
    { messages: hello, stream: 1 },
    { messages: hello, stop: { text: 'x' } },
    { messages: hello, seed: -3.5 },
    { messages: hello, logprobs: 1 },
    { messages: hello, logprobs: true, top_logprobs: 1000 },
    { messages: hello, tools: [{ type: 'function', function: 5 }] },
    { messages: [{ role: 'assistant', tool_calls: [{ function: { name: 'f', arguments: '{not json' } }] }] },
  ];
  wrong.forEach((b, i) => cases.push([`wrong type #${i}`, '/v1/chat/completions', post('/v1/chat/completions', b), 400]));
  cases.push(['prompt a number', '/v1/completions', post('/v1/completions', { prompt: 5 }), 400]);
  cases.push(['prompt an object', '/v1/completions', post('/v1/completions', { prompt: { a: 1 } }), 400]);
  cases.push(['max_tokens missing', '/v1/messages', post('/v1/messages', { messages: hello }), 400]);
  cases.push(['content a number', '/v1/messages', post('/v1/messages', { max_tokens: 4, messages: [{ role: 'user', content: 3 }] }), 400]);
  cases.push(['system a number', '/v1/messages', post('/v1/messages', { max_tokens: 4, system: 3, messages: hello }), 400]);

  // Invalid UTF-8 inside JSON strings: a stray continuation byte, a truncated sequence, an overlong
  // encoding, a UTF-8-encoded surrogate, and bytes that are never valid.
  const badUtf8 = [[0x80], [0xe2, 0x82], [0xc0, 0xaf], [0xed, 0xa0, 0x80], [0xff, 0xfe], [0xf8, 0x88, 0x80, 0x80, 0x80]];
  for (const bytes of badUtf8) {
    const hex = bytes.map((b) => b.toString(16)).join(' ');
    const chat = Buffer.concat([
      Buffer.from('{"messages": [{"role": "user", "content": "hi '),
      Buffer.from(bytes),
      Buffer.from(' there"}], "max_tokens": 4}'),
    ]);
    cases.push([`invalid UTF-8 (${hex}) in chat content`, '/v1/chat/completions', post('/v1/chat/completions', chat), 400]);
    const prompt = Buffer.concat([Buffer.from('{"prompt": "'), Buffer.from(bytes), Buffer.from('", "max_tokens": 4}')]);
    cases.push([`invalid UTF-8 (${hex}) in prompt`, '/v1/completions', post('/v1/completions', prompt), 400]);
    const stop = Buffer.concat([
      Buffer.from('{"messages": [{"role": "user", "content": "hi"}], "stop": ["'),
      Buffer.from(bytes),
      Buffer.from('"], "max_tokens": 4}'),
    ]);
    cases.push([`invalid UTF-8 (${hex}) in stop`, '/v1/chat/completions', post('/v1/chat/completions', stop), 400]);
  }

  // Oversized: a body over the limit, and one only announced (the server should not wait for it).
  for (const route of ROUTES) {
    const big = JSON.stringify({ ...validBody[route], pad: 'x'.repeat(MAX_BODY + 100) });
    cases.push([`oversized body`, route, post(route, big), 413]);
    const junk = Buffer.alloc(MAX_BODY + 1000, 0x7b);  // the server must not try to parse these bytes
    cases.push([`oversized body of junk`, route, [head(route, junk.length), junk], 413]);
  }
  const chunk = (s) => `${Buffer.byteLength(s).toString(16)}\r\n${s}\r\n`;
  // A chunked upload is read only up to the limit, then answered 413.
  cases.push([
    'oversized chunked body',
    '/v1/chat/completions',
    [
      `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
        `Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n`,
      chunk('{"messages": [{"role": "user", "content": "'),
      ...Array.from({ length: 5 }, () => chunk('x'.repeat(16 * 1024))),
      chunk('"}]}'),
      '0\r\n\r\n',
    ],
    413,
  ]);
  return cases;
}

// Requests cut off by the client: the server may answer 4xx or nothing, never 2xx/5xx, and must not hang.
function truncatedRequests() {
  const cases = [];
  for (const route of ROUTES) {
    const body = JSON.stringify(validBody[route]);
    cases.push([`Content-Length ${body.length + 100}, body sent, half-closed`, route, [head(route, body.length + 100), body], 'end']);
    cases.push([`half the body, half-closed`, route, [head(route, body.length), body.slice(0, body.length >> 1)], 'end']);
    cases.push([`half the body, then closed`, route, [head(route, body.length), body.slice(0, body.length >> 1), 20], 'destroy']);
    cases.push([`headers only, then closed`, route, [head(route, body.length), 20], 'destroy']);
    cases.push([`Content-Length of 50 MiB, a little sent, half-closed`, route, [head(route, 50 * MiB), body], 'end']);
    cases.push([`half the headers, half-closed`, route, [head(route, body.length).slice(0, 40)], 'end']);
  }
  cases.push(['garbage request line', '-', ['GARBAGE\r\n\r\n'], 'end']);
  cases.push(['binary noise', '-', [Buffer.from(Array.from({ length: 512 }, (_, i) => (i * 37) & 0xff))], 'end']);
  cases.push(['bad Content-Length', '/v1/chat/completions', [`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: abc\r\n\r\n{}`], 'end']);
  cases.push(['negative Content-Length', '/v1/chat/completions', [`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n{}`], 'end']);
  cases.push([
    'bad chunk size',
    '/v1/chat/completions',
    [`POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n`],
    'end',
  ]);
  // Not malformed, only large: any answer but a 5xx is fine.
  cases.push([
    'header line of 64 KiB',
    '/health',
    [`GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ${'a'.repeat(64 * 1024)}\r\n\r\n`],
    'end',
    true,
  ]);
  return cases;
}

const WORDS = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa'.split(' ');

// One streaming client with a random disconnect point. Resolves to {kind, status, frames, outcome}.
function stormClient(port, random) {
  const route = ROUTES[Math.floor(random() * ROUTES.length)];
  const n = 4 + Math.floor(random() * 12);
  const text = Array.from({ length: n }, () => WORDS[Math.floor(random() * WORDS.length)]).join(' ');
  const maxTokens = 16 + Math.floor(random() * 48);
  const body = JSON.stringify(
    route === '/v1/completions'
      ? { prompt: demoChatText(text), max_tokens: maxTokens, stream: true }
      : { messages: [{ role: 'user', content: text }], max_tokens: maxTokens, stream: true },
  );
  const kinds = ['headers', 'partial', 'sent', 'sent', 'frames', 'frames', 'frames', 'complete'];
  const kind = kinds[Math.floor(random() * kinds.length)];
  const delay = Math.floor(random() * 300);
  const wantFrames = 1 + Math.floor(random() * 20);
  const last = route === '/v1/messages' ? 'event: message_stop' : 'data: [DONE]';

  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let got = '';
    let done = false;
    const end = (outcome) => {
      if (done) return;
      done = true;
      sock.destroy();
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(got);
      resolve({ route, kind, status: m ? Number(m[1]) : null, frames: (got.match(/\ndata: /g) ?? []).length, outcome });
    };
    sock.on('connect', () => {
      const h = head(route, body.length);
      if (kind === 'headers') sock.write(h);
      else if (kind === 'partial') sock.write(h + body.slice(0, Math.floor(random() * body.length)));
      else sock.write(h + body);
      if (kind === 'headers' || kind === 'partial' || kind === 'sent') setTimeout(() => end('client closed'), delay);
    });
    sock.on('data', (d) => {
      got += d.toString('latin1');
      if (kind === 'frames' && (got.match(/\ndata: /g) ?? []).length >= wantFrames) end('client closed');
      else if (got.includes(last)) end('complete');
    });
    sock.on('end', () => end('server closed'));
    sock.on('close', () => end('closed'));
    sock.on('error', (e) => end(`error ${e.code}`));
    sock.setTimeout(90000, () => end('timeout'));
  });
}

async function storm(server, clients, seed) {
  const random = seededRandom(seed);
  const results = await Promise.all(Array.from({ length: clients }, () => stormClient(server.port, random)));
  for (const r of results) {
    assert.notEqual(r.outcome, 'timeout', JSON.stringify(r));
    if (r.status !== null) assert.ok(r.status === 200 || r.status === 429, `storm status: ${JSON.stringify(r)}`);
    if (r.kind === 'complete' && r.status === 200) assert.equal(r.outcome, 'complete', JSON.stringify(r));
  }
  return results;
}

async function waitIdle(server) {
  const s = await waitFor(
    async () => {
      const m = await scrape(server);
      return metricValue(m, 'lathe_requests_in_flight') === 0 && metricValue(m, 'lathe_queue_depth') === 0 ? m : null;
    },
    { timeoutMs: 90000, intervalMs: 100 },
  );
  assert.ok(s, 'the server went idle');
  return s;
}

const openFds = (pid) => fs.readdirSync(`/proc/${pid}/fd`).length;

async function assertServing(server) {
  const h = await request(server, 'GET', '/health');
  assert.equal(h.status, 200);
  const r = await request(server, 'POST', '/v1/chat/completions', { body: { messages: hello, max_tokens: 32 } });
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.choices[0].message.content, 'HELLO WORLD');
  assert.ok(server.alive(), 'the server process is alive');
}

describe('bad requests', () => {
  for (const [name, route, parts, want] of badRequests()) {
    test(`${route} ${name} → ${want}`, async () => {
      const r = await exchange(ctx.server.port, parts);
      assert.equal(r.status, want, `${r.why}: ${r.head.split('\r\n')[0]} ${r.body.slice(0, 300)}`);
      assert.ok(ctx.server.alive());
    });
  }

  test('cut-off requests get a 4xx or no answer, never 2xx/5xx, never a hang', async () => {
    for (const [name, route, parts, after, anyStatus] of truncatedRequests()) {
      const r = await exchange(ctx.server.port, parts, { after, timeoutMs: 12000 });
      assert.notEqual(r.why, 'timeout', `${route} ${name}: the server neither answered nor closed`);
      const ok = r.status === null || (r.status >= 400 && r.status < 500) || (anyStatus && r.status < 500);
      assert.ok(ok, `${route} ${name}: ${r.status} ${r.body}`);
      assert.ok(ctx.server.alive(), `${route} ${name}: the server is alive`);
    }
    await assertServing(ctx.server);
  });

  test('the server still serves after every bad request', async () => {
    await assertServing(ctx.server);
  });
});

describe('disconnect storm', () => {
  const seed = Number(process.env.LATHE_ROBUSTNESS_SEED ?? Date.now() % 100000);

  test(`64 concurrent streaming clients disconnecting at random (seed ${seed}); memory returns to baseline`, async (t) => {
    const server = ctx.server;
    // Warm-up: a smaller storm and a few normal requests, so allocator pools and caches reach steady state.
    await storm(server, 16, seed + 1);
    await waitIdle(server);
    await assertServing(server);
    await sleep(200);
    const baseRss = rssBytes(server.pid);
    const baseFds = openFds(server.pid);

    const t0 = Date.now();
    const results = await storm(server, 64, seed);
    const idle = await waitIdle(server);
    const byKind = {};
    for (const r of results) byKind[`${r.kind}:${r.status ?? '-'}`] = (byKind[`${r.kind}:${r.status ?? '-'}`] ?? 0) + 1;
    t.diagnostic(`storm of 64 took ${Date.now() - t0} ms: ${JSON.stringify(byKind)}`);
    t.diagnostic(`cancelled so far: ${metricValue(idle, 'lathe_requests_cancelled_total')}`);
    await assertServing(server);

    // A second storm must not keep growing memory either.
    await storm(server, 64, seed + 2);
    await waitIdle(server);
    await assertServing(server);
    await sleep(200);
    const rss = rssBytes(server.pid);
    t.diagnostic(`RSS baseline ${(baseRss / MiB).toFixed(1)} MiB, after two storms ${(rss / MiB).toFixed(1)} MiB`);
    // Under ASan freed memory sits in quarantine, so RSS says nothing about leaks there.
    if (process.env.LATHE_SANITIZED !== '1')
      assert.ok(rss <= baseRss + 30 * MiB, `RSS ${(rss / MiB).toFixed(1)} MiB vs baseline ${(baseRss / MiB).toFixed(1)} MiB`);

    // Every storm socket is closed on the server side too (keep-alive connections time out within seconds).
    const fds = await waitFor(() => (openFds(server.pid) <= baseFds + 2 ? openFds(server.pid) : null), {
      timeoutMs: 15000,
      intervalMs: 200,
    });
    assert.ok(fds !== null, `open fds ${openFds(server.pid)} vs baseline ${baseFds}`);
  });
});
