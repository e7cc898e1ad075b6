// LoRA adapters through `lathe serve` with the official openai client: mount from a store, confinement of
// mount paths, per-request selection (`adapter`, `"model": "<adapter id>"`), interleaved requests with different
// adapters each giving its solo output, and mounting/unmounting while another request streams.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describe, test } from 'node:test';

import { SOURCE_DIR, fixtureModel, openaiClient, request, startServer, useServer } from './harness.js';

const STORE = path.join(SOURCE_DIR, 'tests/fixtures/adapters');
// A second store of damaged copies of qwen3-alpha: each must be refused with a 400 naming the fault.
const DAMAGED = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-damaged-adapters-'));
process.on('exit', () => fs.rmSync(DAMAGED, { recursive: true, force: true }));
const damaged = (name, edit) => {
  const dir = path.join(DAMAGED, name);
  fs.cpSync(path.join(STORE, 'qwen3-alpha'), dir, { recursive: true });
  edit(dir);
};
const weights = (dir) => path.join(dir, 'adapters.safetensors');
damaged('truncated', (d) => fs.truncateSync(weights(d), fs.statSync(weights(d)).size - 100));
damaged('config-not-json', (d) => fs.writeFileSync(path.join(d, 'adapter_config.json'), '{not json'));
damaged('config-rank-0', (d) => {
  const c = JSON.parse(fs.readFileSync(path.join(d, 'adapter_config.json'), 'utf8'));
  c.lora_parameters.rank = 0;
  fs.writeFileSync(path.join(d, 'adapter_config.json'), JSON.stringify(c));
});
// One weight element set to NaN / infinity in place (mounted fine before, then every output was empty).
const poison = (file, tensorIndex, bits) => {
  const buf = fs.readFileSync(file);
  const headerLen = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + headerLen).toString('utf8'));
  const [name, info] = Object.entries(header).filter(([k]) => k !== '__metadata__').sort()[tensorIndex];
  const at = 8 + headerLen + info.data_offsets[0] + 2 * (info.dtype === 'F32' ? 4 : 2);
  if (info.dtype === 'F32') buf.writeUInt32LE(bits.f32, at);
  else buf.writeUInt16LE(info.dtype === 'BF16' ? bits.bf16 : bits.f16, at);
  fs.writeFileSync(file, buf);
  return name;
};
const POISONED = {};
damaged('nan-weight', (d) => (POISONED['nan-weight'] = poison(weights(d), 0, { f32: 0x7fc00000, bf16: 0x7fc0, f16: 0x7e00 })));
damaged('inf-weight', (d) => (POISONED['inf-weight'] = poison(weights(d), 3, { f32: 0xff800000, bf16: 0xff80, f16: 0xfc00 })));
// A weights file far over the mounted adapters' memory budget (a quarter of the memory available at start),
// sparse so that it costs no disk: the budget is checked from its size before anything is read.
damaged('huge', (d) => fs.truncateSync(weights(d), 4 * 2 ** 40));
const ctx = useServer({
  model: fixtureModel('qwen3-q4g64'),
  args: ['--adapter-dir', STORE, '--adapter-dir', DAMAGED, '--accept-any-model'],
});
const oai = () => openaiClient(ctx.server);
const messages = [{ role: 'user', content: 'Write a haiku about the sea.' }];

// Same tokens, logprobs within float noise (a prompt whose prefix is cached runs in two parts).
function assertSame(got, want, what) {
  assert.equal(got.text, want.text, what);
  assert.equal(got.lp.length, want.lp.length, what);
  got.lp.forEach((v, i) => assert.ok(Math.abs(v - want.lp[i]) < 1e-4, `${what}: logprob ${i}: ${v} vs ${want.lp[i]}`));
}

async function complete(extra) {
  const r = await oai().chat.completions.create({ model: 'm', messages, temperature: 0, max_tokens: 12, logprobs: true, ...extra });
  return { text: r.choices[0].message.content, lp: r.choices[0].logprobs.content.map((t) => t.logprob) };
}

describe('LoRA adapters over HTTP', () => {
  test('the store scan lists every adapter with its config and whether it fits', async () => {
    const r = await request(ctx.server, 'GET', '/v1/adapters/available');
    assert.equal(r.status, 200);
    const by = Object.fromEntries(r.json.data.map((e) => [e.id, e]));
    assert.equal(by['qwen3-alpha'].fits, true);
    assert.equal(by['qwen3-alpha'].rank, 4);
    assert.equal(by['qwen3-alpha'].scale, 2);
    assert.equal(by['qwen3-alpha-peft'].format, 'peft');
    assert.equal(by['qwen3-alpha-peft'].base_model, 'org/qwen3-q4g64');
    assert.equal(by['gemma3-alpha'].fits, false);
    assert.match(by['gemma3-alpha'].reason, /another base model/);
  });

  test('mount paths stay inside the stores; a misfit mounts nothing', async () => {
    for (const [p, status] of [['../models/qwen3-q4g64', 400], ['/etc', 403], ['/no/such/adapter', 403], ['no-such-adapter', 404], ['gemma3-alpha', 400]]) {
      const r = await request(ctx.server, 'POST', '/v1/adapters', { body: { path: p } });
      assert.equal(r.status, status, `${p}: ${r.text}`);
    }
    const bad = await request(ctx.server, 'POST', '/v1/adapters', { body: { path: 'qwen3-beta', id: 'a+b' } });
    assert.equal(bad.status, 400);
    const list = await request(ctx.server, 'GET', '/v1/adapters');
    assert.deepEqual(list.json.data, []);
  });

  test('damaged adapter files are a 400 naming the fault, and mount nothing', async () => {
    for (const [name, fault] of [['truncated', /run past the end of the file/], ['config-not-json', /not valid JSON/], ['config-rank-0', /rank 0 is outside/]]) {
      const r = await request(ctx.server, 'POST', '/v1/adapters', { body: { path: name } });
      assert.equal(r.status, 400, `${name}: ${r.text}`);
      assert.equal(r.json.error.type, 'invalid_request_error');
      assert.match(r.json.error.message, fault);
      assert.doesNotMatch(r.json.error.message, /internal error/);
    }
    assert.deepEqual((await request(ctx.server, 'GET', '/v1/adapters')).json.data, []);
  });

  test('an adapter holding NaN or infinity is refused at mount, naming the tensor', async () => {
    for (const name of ['nan-weight', 'inf-weight']) {
      const r = await request(ctx.server, 'POST', '/v1/adapters', { body: { path: name } });
      assert.equal(r.status, 400, `${name}: ${r.text}`);
      assert.ok(r.json.error.message.includes(`tensor '${POISONED[name]}' holds a NaN or infinite value (element 2)`), r.text);
    }
    assert.deepEqual((await request(ctx.server, 'GET', '/v1/adapters')).json.data, []);
    // --adapter at start: serve refuses to start.
    await assert.rejects(
      startServer({ model: fixtureModel('qwen3-q4g64'), args: ['--adapter', path.join(DAMAGED, 'nan-weight')] }),
      (e) => e.message.includes(`tensor '${POISONED['nan-weight']}' holds a NaN`),
    );
  });

  test('mounted adapters have a memory budget: beyond it a mount is a 409', async () => {
    // Any one adapter could be mounted under ids without end (30 mounts of a 50 MB one held 1 GB).
    for (const route of ['/v1/adapters', '/v1/load_lora_adapter']) {
      const r = await request(ctx.server, 'POST', route, { body: { path: 'huge', lora_name: 'huge', lora_path: 'huge' } });
      assert.equal(r.status, 409, `${route}: ${r.text}`);
      assert.match(r.text, /over their budget of \d+ MiB/);
    }
    assert.deepEqual((await request(ctx.server, 'GET', '/v1/adapters')).json.data, []);
  });

  test('adapter routes hold their bodies to the request JSON limits', async () => {
    const keys = Object.fromEntries(Array.from({ length: 10001 }, (_, i) => [`k${i}`, 1]));
    for (const route of ['/v1/adapters', '/v1/load_lora_adapter', '/v1/unload_lora_adapter']) {
      const r = await request(ctx.server, 'POST', route, { body: { path: 'qwen3-alpha', lora_name: 'x', lora_path: 'qwen3-alpha', ...keys } });
      assert.equal(r.status, 400, `${route}: ${r.text}`);
      assert.match(r.json.error.message, /keys/);
    }
    assert.deepEqual((await request(ctx.server, 'GET', '/v1/adapters')).json.data, []);
  });

  test('per-request adapters, interleaved, each equal to its solo output', async () => {
    let r = await request(ctx.server, 'POST', '/v1/adapters', { body: { path: 'qwen3-alpha', id: 'alpha' } });
    assert.equal(r.status, 200, r.text);
    r = await request(ctx.server, 'POST', '/v1/load_lora_adapter', { body: { lora_name: 'beta', lora_path: 'qwen3-beta' } });
    assert.equal(r.status, 200, r.text);
    const models = await request(ctx.server, 'GET', '/v1/models');
    assert.deepEqual(models.json.data.slice(1).map((m) => [m.id, m.parent]), [['alpha', 'qwen3-q4g64'], ['beta', 'qwen3-q4g64']]);

    const solo = {};
    for (const a of ['none', 'alpha', 'alpha+beta', 'beta+alpha', 'beta']) solo[a] = await complete({ adapter: a });
    solo['alpha,beta'] = solo['alpha+beta'];
    const far = (x, y) => x.lp.some((v, i) => Math.abs(v - y.lp[i]) > 1e-2);
    assert.ok(far(solo.alpha, solo.none) && far(solo['alpha+beta'], solo.alpha) && far(solo.beta, solo.none));
    assertSame(await complete({}), solo.none, 'no default: the base');
    assertSame(await complete({ model: 'alpha' }), solo.alpha, 'vLLM-style selection');
    // 8 concurrent requests over 6 specs (none and stacked among them), each equal to its solo run.
    const order = ['alpha', 'none', 'alpha+beta', 'beta+alpha', 'beta', 'alpha,beta', 'none', 'alpha'];
    const got = await Promise.all(order.map((a) => complete({ adapter: a })));
    order.forEach((a, i) => assertSame(got[i], solo[a], `${a} (#${i})`));

    const unknown = await request(ctx.server, 'POST', '/v1/chat/completions', { body: { messages, adapter: 'gamma' } });
    assert.equal(unknown.status, 404);
    assert.match(unknown.json.error.message, /mounted: alpha, beta/);
  });

  test('mounting and unmounting while a request streams does not disturb it', async () => {
    const want = (await oai().chat.completions.create({ model: 'm', messages, temperature: 0, max_tokens: 48, adapter: 'alpha' }))
      .choices[0].message.content;
    const stream = await oai().chat.completions.create({ model: 'm', messages, temperature: 0, max_tokens: 48, adapter: 'alpha', stream: true });
    let text = '';
    let n = 0;
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      if (++n === 2) {
        assert.equal((await request(ctx.server, 'DELETE', '/v1/adapters/alpha')).status, 200);
        assert.equal((await request(ctx.server, 'POST', '/v1/adapters', { body: { path: 'qwen3-alpha-peft', id: 'alpha' } })).status, 200);
        assert.equal((await request(ctx.server, 'POST', '/v1/unload_lora_adapter', { body: { lora_name: 'beta' } })).status, 200);
      }
    }
    assert.equal(text, want);
    assert.equal((await request(ctx.server, 'DELETE', '/v1/adapters/beta')).status, 404);
  });
});
