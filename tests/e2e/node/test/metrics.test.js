// GET /metrics: Prometheus text whose counters and histograms move with the requests served.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { anthropicClient, metricValue, openaiClient, parseMetrics, request, scrape, useServer, waitFor } from './harness.js';

const ctx = useServer();
const hello = [{ role: 'user', content: 'hello world' }];
const value = (s, name, labels) => metricValue(s, name, labels) ?? 0;
const REQUESTS = 'lathe_requests_total';

// Counters are updated as a response finishes, possibly just after the client has read it: wait for `ready`.
async function settle(ready) {
  return waitFor(
    async () => {
      const s = await scrape(ctx.server);
      return ready(s) ? s : null;
    },
    { timeoutMs: 5000 },
  );
}

function assertHistogram(samples, name) {
  const buckets = samples.filter((s) => s.name === `${name}_bucket`);
  assert.ok(buckets.length >= 2, `${name} has buckets`);
  let prev = -1;
  let prevLe = -Infinity;
  for (const b of buckets) {
    assert.ok('le' in b.labels);
    const le = b.labels.le === '+Inf' ? Infinity : Number(b.labels.le);
    assert.ok(le > prevLe, `${name} buckets in increasing le order`);
    assert.ok(b.value >= prev, `${name} buckets are cumulative`);
    prev = b.value;
    prevLe = le;
  }
  assert.equal(buckets.at(-1).labels.le, '+Inf');
  assert.equal(buckets.at(-1).value, value(samples, `${name}_count`), `${name}: +Inf bucket = _count`);
  assert.ok(metricValue(samples, `${name}_sum`) !== undefined, `${name}_sum`);
}

describe('/metrics', () => {
  test('Prometheus text with every documented series', async () => {
    const res = await fetch(`${ctx.server.base}/metrics`);
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/plain/);
    const text = await res.text();
    for (const [name, type] of [
      ['lathe_requests_total', 'counter'],
      ['lathe_prompt_tokens_total', 'counter'],
      ['lathe_generation_tokens_total', 'counter'],
      ['lathe_requests_cancelled_total', 'counter'],
      ['lathe_queue_depth', 'gauge'],
      ['lathe_requests_in_flight', 'gauge'],
      ['lathe_time_to_first_token_seconds', 'histogram'],
      ['lathe_inter_token_latency_seconds', 'histogram'],
      ['lathe_engine_steps_total', 'counter'],
      ['lathe_engine_overlapped_steps_total', 'counter'],
      ['lathe_engine_seconds_total', 'counter'],
    ])
      assert.match(text, new RegExp(`^# TYPE ${name} ${type}$`, 'm'), `# TYPE ${name} ${type}`);
    const s = parseMetrics(text);
    for (const name of ['lathe_prompt_tokens_total', 'lathe_generation_tokens_total', 'lathe_requests_cancelled_total'])
      assert.ok(metricValue(s, name) !== undefined, `${name} has a sample before any request`);
    assertHistogram(s, 'lathe_time_to_first_token_seconds');
    assertHistogram(s, 'lathe_inter_token_latency_seconds');
  });

  test('a chat completion moves requests, tokens and both latency histograms', async () => {
    const before = await scrape(ctx.server);
    const labels = { endpoint: '/v1/chat/completions', status: '200' };
    const r = await openaiClient(ctx.server).chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
    // The engine thread lowers the in-flight gauge just after it hands the last event to the HTTP worker, so
    // the reply (and its request count) can be out first: wait for both.
    const s = await settle(
      (now) =>
        value(now, REQUESTS, labels) > value(before, REQUESTS, labels) && value(now, 'lathe_requests_in_flight') === 0,
    );
    assert.ok(s, 'lathe_requests_total{endpoint="/v1/chat/completions",status="200"} went up and in-flight fell to 0');
    assert.equal(value(s, REQUESTS, labels) - value(before, REQUESTS, labels), 1);
    const d = (name) => value(s, name) - value(before, name);
    assert.equal(d('lathe_prompt_tokens_total'), r.usage.prompt_tokens);
    assert.equal(d('lathe_generation_tokens_total'), r.usage.completion_tokens);
    assert.equal(d('lathe_time_to_first_token_seconds_count'), 1);
    assert.ok(d('lathe_time_to_first_token_seconds_sum') > 0);
    assert.ok(d('lathe_inter_token_latency_seconds_count') >= r.usage.completion_tokens - 2, 'one per later token');
    assertHistogram(s, 'lathe_time_to_first_token_seconds');
    assertHistogram(s, 'lathe_inter_token_latency_seconds');
    assert.equal(value(s, 'lathe_queue_depth'), 0);
    assert.equal(value(s, 'lathe_requests_in_flight'), 0);
    // A step per generated token (the counters are published after each step), and the phases fit inside them.
    assert.ok(d('lathe_engine_steps_total') >= r.usage.completion_tokens - 1, 'engine steps counted (the last may be pending)');
    const phase = (p) => value(s, 'lathe_engine_seconds_total', { phase: p });
    assert.ok(phase('step') > 0 && phase('forward') > 0 && phase('emit') > 0, 'engine phase times moved');
    assert.ok(phase('forward') + phase('sample') + phase('emit') <= phase('step') + 1e-6, 'phases within steps');
  });

  test('streaming, completions and messages requests are counted per endpoint', async () => {
    const before = await scrape(ctx.server);
    const stream = await openaiClient(ctx.server).chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 32,
      stream: true,
    });
    for await (const _ of stream);
    await openaiClient(ctx.server).completions.create({ model: 'demo', prompt: 'hello', max_tokens: 2 });
    await anthropicClient(ctx.server).messages.create({ model: 'demo', messages: hello, max_tokens: 2 });
    const want = [
      { endpoint: '/v1/chat/completions', status: '200' },
      { endpoint: '/v1/completions', status: '200' },
      { endpoint: '/v1/messages', status: '200' },
    ];
    const s = await settle((now) => want.every((l) => value(now, REQUESTS, l) > value(before, REQUESTS, l)));
    assert.ok(s, `each endpoint counted: ${JSON.stringify(want)}`);
  });

  test('errors are counted with their status', async () => {
    const before = await scrape(ctx.server);
    const bad = await request(ctx.server, 'POST', '/v1/chat/completions', { body: '{"messages": [' });
    assert.equal(bad.status, 400);
    const labels = { endpoint: '/v1/chat/completions', status: '400' };
    const s = await settle((now) => value(now, REQUESTS, labels) > value(before, REQUESTS, labels));
    assert.ok(s, 'lathe_requests_total{endpoint="/v1/chat/completions",status="400"} went up');
    // No tokens for a rejected request.
    assert.equal(value(s, 'lathe_prompt_tokens_total'), value(before, 'lathe_prompt_tokens_total'));
  });
});
