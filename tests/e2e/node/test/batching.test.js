// Continuous batching does not change what a request gets: 16 concurrent requests of different prompt lengths
// and sampling settings (greedy, seeded temperature/top-k/top-p, penalties), half of them arriving while the
// first half generate, on a server whose KV budget is small enough to make rows wait and be preempted, each
// produce exactly the text they produce alone on a server that runs one request at a time.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { fixtureModel, metricValue, parseSSE, request, scrape, useServer, waitFor } from './harness.js';

const MODEL = fixtureModel('qwen3-q4g64');
// Same chunking on both servers (chunk boundaries are part of a server's setup); the batched one holds about
// 300 tokens of KV (256 bytes a token for this model: the CPU's default bf16 cache) for 16 requests of 45-133
// tokens each. The outputs are long enough (40-68 tokens) that the late half always overlaps itself and outgrows
// the budget: with 20-34 tokens a fast engine sometimes finished rows before the next arrived, and nothing was
// preempted.
const COMMON = ['--accept-any-model', '--prefill-chunk', '6', '--max-batch-tokens', '64'];
const solo = useServer({ model: MODEL, args: [...COMMON, '--max-batch', '1'] });
const batched = useServer({ model: MODEL, args: [...COMMON, '--max-batch', '16', '--kv-cache-bytes', '76800'] });

// Token-id prompts with distinct first tokens: no request reuses another's cache, on either server.
const requests = Array.from({ length: 16 }, (_, i) => {
  const prompt = Array.from({ length: 5 + 4 * i }, (_, k) => (10 + i * 37 + k * 11) % 600);
  const body = { model: 'm', prompt, max_tokens: 40 + 4 * (i % 8) };
  if (i % 2) Object.assign(body, { temperature: 0.9, top_k: 40, top_p: 0.95, seed: 100 + i });
  else body.temperature = 0;
  if (i % 3 === 1) body.repetition_penalty = 1.2;
  if (i % 5 === 2) body.presence_penalty = 0.5;
  body.stream = i % 4 < 2;
  return body;
});

// Runs one completion; resolves to {text, tokens, finish}. onFirst fires at the first streamed text.
async function complete(server, body, onFirst = () => {}) {
  const r = await request(server, 'POST', '/v1/completions', { body });
  assert.equal(r.status, 200, r.text);
  if (!body.stream) {
    return { text: r.json.choices[0].text, tokens: r.json.usage.completion_tokens, finish: r.json.choices[0].finish_reason };
  }
  let text = '';
  let finish = null;
  let tokens = null;
  for (const e of parseSSE(r.text)) {
    if (e.data === '[DONE]') continue;
    const c = JSON.parse(e.data);
    if (c.choices?.[0]) {
      text += c.choices[0].text ?? '';
      finish = c.choices[0].finish_reason ?? finish;
    }
    if (c.usage) tokens = c.usage.completion_tokens;
    if (text) onFirst();
  }
  return { text, tokens, finish };
}

describe('batched output equals solo output', () => {
  test('16 concurrent requests, late joiners and preemption', async () => {
    const want = [];
    for (const body of requests) want.push(await complete(solo.server, { ...body, stream: false }));
    assert.ok(new Set(want.map((w) => w.text)).size >= 12, 'the requests produce different texts');

    // The first half starts at once; the second half once the first tokens of the first half are out.
    const first = requests.slice(0, 8).map((b) => complete(batched.server, b));
    await waitFor(
      async () => {
        const s = await scrape(batched.server);
        return (metricValue(s, 'lathe_generation_tokens_total') ?? 0) > 0 ||
          (metricValue(s, 'lathe_scheduler_running_rows') ?? 0) > 0
          ? s
          : null;
      },
      { timeoutMs: 10000, intervalMs: 2 },
    );
    const second = requests.slice(8).map((b) => complete(batched.server, b));
    const got = await Promise.all([...first, ...second]);
    for (let i = 0; i < requests.length; ++i) {
      assert.equal(got[i].text, want[i].text, `request ${i}: batched text differs from solo`);
      if (got[i].tokens !== null) assert.equal(got[i].tokens, want[i].tokens, `request ${i}: token count`);
      assert.equal(got[i].finish, want[i].finish, `request ${i}: finish_reason`);
    }
    // The gauges are set at the end of the engine's step, which may come just after the last reply went out.
    const s = await waitFor(
      async () => {
        const m = await scrape(batched.server);
        return metricValue(m, 'lathe_scheduler_running_rows') === 0 ? m : null;
      },
      { timeoutMs: 10000, intervalMs: 5 },
    );
    assert.ok(metricValue(s, 'lathe_preemptions_total') > 0, 'the small KV budget preempted rows');
    assert.equal(metricValue(s, 'lathe_kv_cache_bytes_budget'), 76800);
    // Kept sequences stay in the CPU's KV blocks: the pool gauges count them.
    assert.ok(metricValue(s, 'lathe_kv_pool_blocks') > 0, 'kept sequences hold KV blocks');
    assert.ok(metricValue(s, 'lathe_kv_pool_block_refs') >= metricValue(s, 'lathe_kv_pool_blocks'));
    assert.ok(metricValue(s, 'lathe_kv_pool_resident_bytes') > 0, 'their pages are resident');
  });

  test('a prompt larger than the whole KV budget is a 400, streamed or not', async () => {
    const prompt = Array.from({ length: 400 }, (_, k) => (k * 13) % 600);  // 300 tokens fit
    for (const stream of [false, true]) {
      const r = await request(batched.server, 'POST', '/v1/completions', { body: { prompt, max_tokens: 4, stream } });
      assert.equal(r.status, 400, r.text);
      assert.match(r.json.error.message, /--kv-cache-bytes/);
    }
  });
});
