// CORS: a real headless Chromium page served from another port calls the API (preflight + request with the
// API key), plus raw preflights for origins that are and are not allowed. Skipped when no Chromium is installed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import http from 'node:http';
import { after, before, describe, test } from 'node:test';

import { request, useServer } from './harness.js';

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'].find((p) => fs.existsSync(p));
const KEY = 'sk-cors-test';
const ctx = useServer({ args: ['--api-key', KEY, '--cors-origin', 'https://app.example'] });

const preflight = (origin, route = '/v1/chat/completions') =>
  request(ctx.server, 'OPTIONS', route, {
    headers: { Origin: origin, 'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': 'authorization, content-type' },
  });

describe('preflight', () => {
  test('a loopback origin passes without the API key', async () => {
    const r = await preflight('http://localhost:5173');
    assert.equal(r.status, 204);
    assert.equal(r.headers.get('access-control-allow-origin'), 'http://localhost:5173');
    assert.match(r.headers.get('access-control-allow-methods'), /POST/);
    assert.match(r.headers.get('access-control-allow-headers'), /authorization/);
  });

  test('every API route answers it', async () => {
    for (const route of ['/v1/models', '/v1/messages', '/v1/completions', '/health'])
      assert.equal((await preflight('http://127.0.0.1:3000', route)).status, 204, route);
  });

  test('--cors-origin adds an origin; others are refused', async () => {
    assert.equal((await preflight('https://app.example')).status, 204);
    const bad = await preflight('https://evil.example');
    assert.equal(bad.status, 403);
    assert.equal(bad.headers.get('access-control-allow-origin'), null);
  });

  test('responses (errors too) carry Allow-Origin for an allowed origin only', async () => {
    const denied = await request(ctx.server, 'GET', '/v1/models', { headers: { Origin: 'http://localhost:1' } });
    assert.equal(denied.status, 401);
    assert.equal(denied.headers.get('access-control-allow-origin'), 'http://localhost:1');
    const other = await request(ctx.server, 'GET', '/v1/models', {
      headers: { Origin: 'https://evil.example', Authorization: `Bearer ${KEY}` },
    });
    assert.equal(other.status, 200);
    assert.equal(other.headers.get('access-control-allow-origin'), null);
  });
});

describe('headless Chromium', { skip: CHROMIUM ? false : 'no chromium installed' }, () => {
  let page;
  let browser;
  before(async () => {
    page = http.createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<!doctype html><title>cors</title>');
    });
    await new Promise((r) => page.listen(0, '127.0.0.1', r));
    const { chromium } = await import('playwright-core');
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  });
  after(async () => {
    await browser?.close();
    page?.close();
  });

  test('a page on another port calls /v1/chat/completions with its key', async () => {
    await ctx.ready;
    const tab = await browser.newPage();
    await tab.goto(`http://127.0.0.1:${page.address().port}/`);
    const out = await tab.evaluate(
      async ({ base, key }) => {
        const r = await fetch(`${base}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
          body: JSON.stringify({ model: 'demo', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 16 }),
        });
        return { status: r.status, body: await r.json(), id: r.headers.get('x-request-id') };
      },
      { base: ctx.server.base, key: KEY },
    );
    assert.equal(out.status, 200);
    assert.equal(out.body.choices[0].message.content, 'HELLO WORLD');
    assert.ok(out.id, 'X-Request-Id is exposed to the page');
  });
});
