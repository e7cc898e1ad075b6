// The SSD tier of the prompt cache through `lathe serve --ssd-cache`: a prompt cached by one server process is
// restored by the next one (cached_tokens > 0, output identical to a cold run), salts never share entries,
// corrupted files are deleted (at the start scan and at restore) while the request still answers correctly,
// and a cache directory that cannot be written keeps the server serving.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';

import { anthropicClient, openaiClient, request, startServer, waitFor } from './harness.js';

const dirs = [];
const tmpDir = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-ssd-'));
  dirs.push(d);
  return d;
};
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

// A long document (a few hundred tokens), then a question that extends it.
const doc = Array.from({ length: 24 }, (_, i) => `line ${i} of the shared document says hello world`).join(' ');
const FIRST = `${doc} first question`;
const SECOND = `${doc} first question and then a second one`;

async function complete(server, prompt, extra = {}) {
  const r = await openaiClient(server).completions.create({
    model: 'demo',
    prompt,
    max_tokens: 8,
    temperature: 0,
    ...extra,
  });
  return { text: r.choices[0].text, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0, usage: r.usage };
}

async function cacheInfo(server) {
  const r = await request(server, 'GET', '/v1/cache');
  assert.equal(r.status, 200, r.text);
  return r.json;
}

// The KV files of every identity under dir.
function kvFiles(dir) {
  const out = [];
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.lkv')) out.push(p);
    }
  };
  walk(dir);
  return out;
}

function flipByte(file, offset) {
  const fd = fs.openSync(file, 'r+');
  const b = Buffer.alloc(1);
  fs.readSync(fd, b, 0, 1, offset);
  b[0] ^= 0xff;
  fs.writeSync(fd, b, 0, 1, offset);
  fs.closeSync(fd);
}

const spilled = (server, n = 1) =>
  waitFor(async () => (await cacheInfo(server)).ssd.entries >= n, { timeoutMs: 15000, intervalMs: 100 });

describe('serve --ssd-cache', () => {
  test('a prompt cached before a restart is restored after it, with the cold output', async () => {
    const dir = tmpDir();
    const a = await startServer({ args: ['--ssd-cache', dir] });
    let first;
    try {
      first = await complete(a, FIRST);
      assert.equal(first.cached, 0);
      assert.ok(await spilled(a), 'the kept cache is written behind');
    } finally {
      await a.stop();
    }
    assert.equal(kvFiles(dir).length, 1, 'one file for the conversation');

    const b = await startServer({ args: ['--ssd-cache', dir] });
    try {
      const info = await cacheInfo(b);
      assert.equal(info.ssd.entries, 1, 'the restarted store indexed the file');
      const warm = await complete(b, SECOND);
      assert.ok(warm.cached > 0, `cached_tokens ${warm.cached} after the restart`);
      assert.ok(warm.cached < warm.usage.prompt_tokens);
      assert.ok(warm.usage.prompt_tokens > 300, `a long prompt (${warm.usage.prompt_tokens} tokens)`);
      const after1 = await cacheInfo(b);
      assert.equal(after1.ssd.hits, 1);
      assert.ok(after1.ssd.restore_ms_last > 0);

      // The cold run: another salt shares nothing, in RAM or on the SSD.
      const cold = await complete(b, SECOND, { cache_salt: 'tenant-cold' });
      assert.equal(cold.cached, 0, 'a different salt never reuses the entry');
      assert.equal(warm.text, cold.text, 'restored output equals the cold output');
      assert.equal(first.text.length > 0, true);
    } finally {
      await b.stop();
    }
  });

  test('salts isolate tenants on both APIs', async () => {
    const dir = tmpDir();
    const s = await startServer({ args: ['--ssd-cache', dir] });
    try {
      const ant = anthropicClient(s);
      const ask = async (salt) => {
        const body = { model: 'demo', max_tokens: 8, messages: [{ role: 'user', content: doc }] };
        if (salt !== undefined) body.cache_salt = salt;
        const r = await ant.messages.create(body);
        return r.usage.cache_read_input_tokens ?? 0;
      };
      assert.equal(await ask('alice'), 0);
      assert.ok((await ask('alice')) > 0, 'the same salt reuses its prefix');
      assert.equal(await ask('bob'), 0, 'another salt does not');
      assert.equal(await ask(undefined), 0, 'nor does no salt');
      const o = await complete(s, FIRST, { cache_salt: 'carol' });
      assert.equal(o.cached, 0);
      assert.ok((await complete(s, SECOND, { cache_salt: 'carol' })).cached > 0);
      assert.equal((await complete(s, SECOND, { cache_salt: 'dave' })).cached, 0);
      const bad = await request(s, 'POST', '/v1/completions', {
        body: { model: 'demo', prompt: 'hi', max_tokens: 1, cache_salt: 7 },
      });
      assert.equal(bad.status, 400);
      assert.match(bad.text, /cache_salt/);
    } finally {
      await s.stop();
    }
    // Every salt kept its own namespace folder on disk.
    const namespaces = new Set(kvFiles(dir).map((f) => path.basename(path.dirname(f))));
    assert.ok(namespaces.size >= 3, `namespaces on disk: ${[...namespaces]}`);
  });

  test('corrupted files are deleted at the scan and at restore; requests still answer correctly', async () => {
    const dir = tmpDir();
    const a = await startServer({ args: ['--ssd-cache', dir] });
    let cold;
    try {
      await complete(a, FIRST);
      assert.ok(await spilled(a));
      cold = await complete(a, SECOND, { cache_salt: 'cold' });
    } finally {
      await a.stop();
    }
    const files = kvFiles(dir); // the base namespace's and the cold salt's
    assert.equal(files.length, 2);
    for (const f of files) flipByte(f, 40); // inside the JSON header: its hash no longer matches

    const b = await startServer({ args: ['--ssd-cache', dir, '--ssd-cache-verify', '--ssd-demote-idle', '1'] });
    try {
      const info = await cacheInfo(b);
      assert.equal(info.ssd.entries, 0);
      assert.equal(info.ssd.removed_invalid, 2);
      for (const f of files) assert.equal(fs.existsSync(f), false, 'the scan deleted the bad files');

      // A fresh entry, demoted out of RAM, then its tensor bytes flipped: the restore (verify on) refuses it.
      await complete(b, FIRST);
      assert.ok(
        await waitFor(async () => {
          const c = await cacheInfo(b);
          return c.ssd.entries === 1 && c.ram.entries === 0;
        }, { timeoutMs: 15000, intervalMs: 100 }),
        'written and demoted from RAM',
      );
      const [fresh] = kvFiles(dir);
      const dataStart = fs.readFileSync(fresh).readUInt32LE(12);
      flipByte(fresh, dataStart + 64);
      const r = await complete(b, SECOND);
      assert.equal(r.cached, 0, 'a file that fails to restore is a miss');
      assert.equal(r.text, cold.text, 'and the request is prefilled instead');
      const c = await cacheInfo(b);
      assert.equal(c.ssd.hits, 0);
      assert.ok(c.ssd.removed_invalid >= 3);
      assert.equal(fs.existsSync(fresh), false, 'the bad file is gone');
    } finally {
      await b.stop();
    }
  });

  test('a cache directory that cannot be written, or a cap too small, keeps the server serving', async () => {
    const parent = tmpDir();
    const notADir = path.join(parent, 'file');
    fs.writeFileSync(notADir, 'not a directory');
    const s = await startServer({ args: ['--ssd-cache', notADir] });
    try {
      const r1 = await complete(s, FIRST);
      assert.ok(
        await waitFor(async () => (await cacheInfo(s)).ssd.write_failures >= 1, { timeoutMs: 15000, intervalMs: 100 }),
      );
      const r2 = await complete(s, FIRST);
      assert.equal(r2.text, r1.text);
      assert.ok(r2.cached > 0, 'the RAM tier still works');
    } finally {
      await s.stop();
    }
    assert.equal(fs.readFileSync(notADir, 'utf8'), 'not a directory');

    const dir = tmpDir();
    const small = await startServer({ args: ['--ssd-cache', dir, '--ssd-cache-max', '4096'] });
    try {
      const r = await complete(small, FIRST);
      assert.ok(r.text.length > 0);
      await new Promise((res) => setTimeout(res, 1500));
      const c = await cacheInfo(small);
      assert.equal(c.ssd.entries, 0, 'nothing larger than the cap is stored');
      assert.equal(c.ssd.bytes, 0);
    } finally {
      await small.stop();
    }
    assert.equal(kvFiles(dir).length, 0);
  });

  test('flags without --ssd-cache are refused', async () => {
    await assert.rejects(startServer({ args: ['--ssd-cache-verify'] }), /need --ssd-cache/);
  });
});
