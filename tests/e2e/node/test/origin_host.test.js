// Cross-site requests and DNS rebinding against a keyless loopback server: a web page's "simple" requests
// (text/plain or form bodies, no preflight) from a foreign Origin are refused on every route unless the API key
// authenticates them, and while bound to loopback only loopback Host names (or --allowed-host ones) are
// answered. Clients that send no Origin (curl, SDKs) are unaffected.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';

import { rawExchange, request, useServer } from './harness.js';

const status = (text) => Number(/^HTTP\/1\.1 (\d{3})/.exec(text)?.[1]);
const body = (text) => JSON.parse(text.slice(text.indexOf('\r\n\r\n') + 4));
const get = (port, route, host) => rawExchange(port, `GET ${route} HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);

describe('keyless loopback server', () => {
  const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-origin-'));
  const ctx = useServer({ args: ['--data-dir', dataDir] });

  test('a cross-site text/plain job submission is refused and no job is created', async () => {
    const out = path.join(dataDir, 'page-chose-this');
    const r = await request(ctx.server, 'POST', '/api/jobs', {
      headers: { Origin: 'https://evil.example', 'content-type': 'text/plain;charset=UTF-8' },
      body: JSON.stringify({ kind: 'quantize', config: { model: 'models/demo', out } }),
    });
    assert.equal(r.status, 403, r.text);
    assert.match(r.json.error.message, /https:\/\/evil\.example/);
    assert.match(r.json.error.message, /--cors-origin/);
    assert.equal(r.json.error.type, 'permission_error');
    const list = await request(ctx.server, 'GET', '/api/jobs');
    assert.equal(list.status, 200);
    assert.deepEqual(list.json.jobs, []);
    assert.equal(fs.existsSync(out), false);
  });

  test('form-encoded generation, GETs and Origin: null are refused too', async () => {
    const form = await request(ctx.server, 'POST', '/v1/chat/completions', {
      headers: { Origin: 'https://evil.example', 'content-type': 'application/x-www-form-urlencoded' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 }),
    });
    assert.equal(form.status, 403, form.text);
    for (const route of ['/v1/models', '/v1/cache', '/api/jobs', '/health']) {
      const r = await request(ctx.server, 'GET', route, { headers: { Origin: 'http://evil.example:8080' } });
      assert.equal(r.status, 403, route);
    }
    const sandboxed = await request(ctx.server, 'GET', '/v1/models', { headers: { Origin: 'null' } });
    assert.equal(sandboxed.status, 403);
    const anthropic = await request(ctx.server, 'POST', '/v1/messages', {
      headers: { Origin: 'https://evil.example', 'content-type': 'text/plain' },
      body: '{}',
    });
    assert.equal(anthropic.status, 403);
    assert.equal(anthropic.json.type, 'error');
  });

  test('loopback origins and requests without an Origin still work', async () => {
    const local = await request(ctx.server, 'POST', '/v1/chat/completions', {
      headers: { Origin: 'http://localhost:5173' },
      body: { messages: [{ role: 'user', content: 'hi' }], max_tokens: 4 },
    });
    assert.equal(local.status, 200, local.text);
    assert.equal(local.headers.get('access-control-allow-origin'), 'http://localhost:5173');
    assert.equal((await request(ctx.server, 'GET', '/v1/models')).status, 200);
  });

  test('Host names: loopback ones are answered, a rebinding name is refused', async () => {
    const { port } = ctx.server;
    for (const host of ['localhost', `localhost:${port}`, 'LOCALHOST:1', `127.0.0.1:${port}`, '127.1.2.3', `[::1]:${port}`, '[::1]'])
      assert.equal(status(await get(port, '/v1/models', host)), 200, host);
    for (const host of ['evil.example', `evil.example:${port}`, 'localhost.evil.example', '127.0.0.1.nip.io', '0x7f.0.0.1', 'localhost:x']) {
      const text = await get(port, '/v1/models', host);
      assert.equal(status(text), 403, `${host}: ${text}`);
    }
    const text = await get(port, '/health', `evil.example:${port}`);
    assert.equal(status(text), 403);
    assert.match(body(text).error.message, /--allowed-host evil\.example/);
    // Two Host headers: which one counts would be a guess.
    const two = await rawExchange(port, 'GET /v1/models HTTP/1.1\r\nHost: localhost\r\nHost: evil.example\r\nConnection: close\r\n\r\n');
    assert.equal(status(two), 400, two);
  });
});

describe('--allowed-host', () => {
  const ctx = useServer({ args: ['--allowed-host', 'box.lan', '--allowed-host', 'Other.Lan:9999'] });

  test('adds names (any port, any case); others stay refused', async () => {
    const { port } = ctx.server;
    for (const host of ['box.lan', `box.lan:${port}`, 'BOX.LAN', 'other.lan:1'])
      assert.equal(status(await get(port, '/v1/models', host)), 200, host);
    assert.equal(status(await get(port, '/v1/models', 'evil.example')), 403);
  });
});

describe('--allowed-host *', () => {
  const ctx = useServer({ args: ['--allowed-host', '*'] });
  test('answers any Host', async () => {
    assert.equal(status(await get(ctx.server.port, '/v1/models', 'evil.example')), 200);
  });
});

describe('bound to a non-loopback address', () => {
  const ctx = useServer({ args: ['--host', '0.0.0.0'] });
  test('no Host check (exposed on purpose), but foreign origins are still refused without a key', async () => {
    assert.equal(status(await get(ctx.server.port, '/v1/models', 'my-server.lan:8080')), 200);
    const r = await request(ctx.server, 'GET', '/v1/models', { headers: { Origin: 'https://evil.example' } });
    assert.equal(r.status, 403);
  });
});

describe('with an API key', () => {
  const KEY = 'sk-origin-test';
  const ctx = useServer({ args: ['--api-key', KEY] });
  test('a foreign origin needs the key; with it the request is served', async () => {
    const without = await request(ctx.server, 'POST', '/v1/chat/completions', {
      headers: { Origin: 'https://evil.example', 'content-type': 'text/plain' },
      body: '{}',
    });
    assert.equal(without.status, 403);
    assert.match(without.json.error.message, /API key/);
    const withKey = await request(ctx.server, 'GET', '/v1/models', {
      headers: { Origin: 'https://evil.example', Authorization: `Bearer ${KEY}` },
    });
    assert.equal(withKey.status, 200);
    assert.equal(withKey.headers.get('access-control-allow-origin'), null);
  });
});
