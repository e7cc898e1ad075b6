// The prompt cache under LoRA adapters through `lathe serve --ssd-cache`: a request's namespace is its adapter
// set's content hash, never the mount id. A prompt cached under one id is restored after a restart under another
// id (SSD hit in /v1/cache and /metrics, output equal to a cold run); another adapter, the same files under
// another scale, another stacking order, or no adapter miss and answer with their own cold output.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';

import { SOURCE_DIR, fixtureModel, metricValue, openaiClient, request, scrape, startServer, waitFor } from './harness.js';

const FIXTURES = path.join(SOURCE_DIR, 'tests/fixtures/adapters');
const dirs = [];
const tmpDir = () => {
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-ssd-lora-'));
  dirs.push(d);
  return d;
};
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

// A store with alpha, beta and alpha's files under another scale.
function adapterStore() {
  const store = tmpDir();
  for (const name of ['qwen3-alpha', 'qwen3-beta']) fs.cpSync(path.join(FIXTURES, name), path.join(store, name), { recursive: true });
  const x3 = path.join(store, 'qwen3-alpha-x3');
  fs.cpSync(path.join(FIXTURES, 'qwen3-alpha'), x3, { recursive: true });
  const cfgPath = path.join(x3, 'adapter_config.json');
  const cfg = JSON.parse(fs.readFileSync(cfgPath, 'utf8'));
  cfg.lora_parameters.scale = 3.0;
  fs.writeFileSync(cfgPath, JSON.stringify(cfg));
  return store;
}

const doc = Array.from({ length: 14 }, (_, i) => `line ${i} of the shared document says hello world`).join(' ');
const FIRST = `${doc} first question`;
const SECOND = `${doc} first question and then a second one`;

async function complete(server, prompt, extra = {}) {
  const r = await openaiClient(server).completions.create({ model: 'm', prompt, max_tokens: 8, temperature: 0, ...extra });
  return { text: r.choices[0].text, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

async function cacheInfo(server) {
  const r = await request(server, 'GET', '/v1/cache');
  assert.equal(r.status, 200, r.text);
  return r.json;
}

async function mount(server, dir, id) {
  const r = await request(server, 'POST', '/v1/adapters', { body: { path: dir, id } });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

function kvNamespaces(dir) {
  const out = new Set();
  const walk = (d) => {
    for (const e of fs.readdirSync(d, { withFileTypes: true })) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.lkv')) out.add(path.basename(d));
    }
  };
  walk(dir);
  return out;
}

describe('serve --ssd-cache with LoRA adapters', () => {
  test('restart + remount under a new id hits; another adapter, scale, order or none misses', async () => {
    const store = adapterStore();
    const cache = tmpDir();
    const args = ['--ssd-cache', cache, '--adapter-dir', store, '--accept-any-model'];
    const a = await startServer({ model: fixtureModel('qwen3-q4g64'), args });
    try {
      await mount(a, 'qwen3-alpha', 'first-id');
      assert.equal((await complete(a, FIRST, { adapter: 'first-id' })).cached, 0);
      assert.ok(
        await waitFor(async () => (await cacheInfo(a)).ssd.entries >= 1, { timeoutMs: 15000, intervalMs: 100 }),
        'the adapter request is written behind to the SSD tier',
      );
    } finally {
      await a.stop();
    }
    assert.equal(kvNamespaces(cache).size, 1, 'one adapter namespace on disk');

    const b = await startServer({ model: fixtureModel('qwen3-q4g64'), args });
    try {
      assert.equal((await cacheInfo(b)).ssd.entries, 1, 'the restarted store indexed the file');
      const renamed = await mount(b, 'qwen3-alpha', 'second-id');
      await mount(b, 'qwen3-beta', 'beta');
      const x3 = await mount(b, 'qwen3-alpha-x3', 'alpha-x3');
      assert.equal(renamed.content_hash.length, 32);
      assert.notEqual(x3.content_hash, renamed.content_hash, 'another scale is another content');

      // Misses first (RAM and SSD): each answers with its own cold output (another salt shares nothing).
      for (const adapter of ['none', 'beta', 'alpha-x3', 'beta+second-id']) {
        const miss = await complete(b, SECOND, { adapter });
        assert.equal(miss.cached, 0, `${adapter} never uses alpha's entry`);
        const cold = await complete(b, SECOND, { adapter, cache_salt: 'cold' });
        assert.equal(miss.text, cold.text, `${adapter}: the cold output`);
      }
      assert.equal((await cacheInfo(b)).ssd.hits, 0);

      const warm = await complete(b, SECOND, { adapter: 'second-id' });
      assert.ok(warm.cached > 250, `cached_tokens ${warm.cached} under the new id after the restart`);
      const info = await cacheInfo(b);
      assert.equal(info.ssd.hits, 1);
      assert.equal(metricValue(await scrape(b), 'lathe_prompt_cache_hits_total', { tier: 'ssd' }), 1);
      const cold = await complete(b, SECOND, { adapter: 'second-id', cache_salt: 'cold' });
      assert.equal(cold.cached, 0);
      assert.equal(warm.text, cold.text, 'restored output equals the cold output');
      const base = await complete(b, SECOND, { adapter: 'none', cache_salt: 'cold' });
      assert.notEqual(warm.text, base.text, 'the adapter changes the output (else the test proves nothing)');
    } finally {
      await b.stop();
    }
  });
});
