// A client that goes away mid-stream cancels its generation: the cancelled counter goes up, the engine stops
// early (fewer tokens than the full answer), and the server goes on serving.
import assert from 'node:assert/strict';
import net from 'node:net';
import { before, describe, test } from 'node:test';

import {
  anthropicClient,
  metricValue,
  openaiClient,
  request,
  scrape,
  useServer,
  waitFor,
} from './harness.js';

const ctx = useServer();
const hello = [{ role: 'user', content: 'hello world' }];
// ~100 lowercase words: the demo model answers with ~320 tokens (60-100 ms on two cores, since the batched engine).
const long = [{ role: 'user', content: 'the quick brown fox jumps over the lazy dog and runs away '.repeat(8).trim() }];
const MAX_TOKENS = 600;
let fullTokens;
let fullText;

const counter = (s, name) => metricValue(s, name) ?? 0;

// Waits until the server is idle (nothing queued or running) and returns that scrape.
async function idle(server) {
  return waitFor(
    async () => {
      const s = await scrape(server);
      return counter(s, 'lathe_requests_in_flight') === 0 && counter(s, 'lathe_queue_depth') === 0 ? s : null;
    },
    { timeoutMs: 15000 },
  );
}

async function expectCancelled(before, what) {
  const s = await waitFor(
    async () => {
      const now = await scrape(ctx.server);
      return counter(now, 'lathe_requests_cancelled_total') > counter(before, 'lathe_requests_cancelled_total')
        ? now
        : null;
    },
    { timeoutMs: 10000 },
  );
  assert.ok(s, `${what}: lathe_requests_cancelled_total went up`);
  const after = await idle(ctx.server);
  assert.ok(after, `${what}: the server went idle`);
  const generated = counter(after, 'lathe_generation_tokens_total') - counter(before, 'lathe_generation_tokens_total');
  assert.ok(generated < fullTokens, `${what}: the engine stopped early (${generated} of ${fullTokens} tokens)`);
}

async function expectStillServing(what) {
  const r = await openaiClient(ctx.server).chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
  assert.equal(r.choices[0].message.content, 'HELLO WORLD', what);
  assert.ok(ctx.server.alive());
}

before(async () => {
  await ctx.ready;
  const r = await openaiClient(ctx.server).chat.completions.create({
    model: 'demo',
    messages: long,
    max_tokens: MAX_TOKENS,
  });
  fullTokens = r.usage.completion_tokens;
  fullText = r.choices[0].message.content;
  assert.ok(fullTokens > 60, `the long answer is long enough to abort (${fullTokens} tokens)`);
});

describe('abort mid-stream', () => {
  test('openai SDK: AbortController after the first content', async () => {
    const before = await idle(ctx.server);
    const ac = new AbortController();
    const stream = await openaiClient(ctx.server).chat.completions.create(
      { model: 'demo', messages: long, max_tokens: MAX_TOKENS, stream: true },
      { signal: ac.signal },
    );
    let text = '';
    let aborted = false;
    try {
      for await (const c of stream) {
        text += c.choices[0]?.delta?.content ?? '';
        if (text.length >= 3) ac.abort();
      }
    } catch (e) {
      aborted = true;
      assert.ok(e.name === 'AbortError' || e.constructor.name === 'APIUserAbortError', String(e));
    }
    assert.ok(aborted || ac.signal.aborted);
    await expectCancelled(before, 'openai abort');
    await expectStillServing('after the openai abort');
  });

  test('anthropic SDK: stream.controller.abort()', async () => {
    const before = await idle(ctx.server);
    const stream = await anthropicClient(ctx.server).messages.create({
      model: 'demo',
      max_tokens: MAX_TOKENS,
      messages: long,
      stream: true,
    });
    let deltas = 0;
    try {
      for await (const e of stream) {
        if (e.type === 'content_block_delta' && ++deltas === 2) stream.controller.abort();
      }
    } catch {
      // the SDK reports the abort as an error
    }
    await expectCancelled(before, 'anthropic abort');
    await expectStillServing('after the anthropic abort');
  });

  test('raw socket closed after the response headers', async () => {
    const before = await idle(ctx.server);
    const { port } = ctx.server;
    const body = JSON.stringify({ messages: long, max_tokens: MAX_TOKENS, stream: true });
    await new Promise((resolve, reject) => {
      const sock = net.connect(port, '127.0.0.1', () => {
        sock.write(
          `POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n` +
            `Content-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`,
        );
      });
      let got = '';
      sock.on('data', (d) => {
        got += d.toString();
        if (got.includes('data: ')) {
          sock.destroy();
          resolve();
        }
      });
      sock.on('error', reject);
      sock.setTimeout(10000, () => reject(new Error(`no stream data: ${got}`)));
    });
    await expectCancelled(before, 'socket close');
    await expectStillServing('after the socket close');
  });

  test('a stream aborted while queued behind another never runs to completion', async () => {
    const before = await idle(ctx.server);
    const first = new AbortController();
    const second = new AbortController();
    const start = (ac) =>
      fetch(`${ctx.server.base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: long, max_tokens: MAX_TOKENS, stream: true }),
        signal: ac.signal,
      }).catch(() => null);
    const a = await start(first);  // response headers: it is running
    assert.equal(a?.status, 200);
    const b = start(second);  // queued behind the first, or batched with it
    // Both abort as soon as the server holds the second, well before either could finish. A fixed wait was wrong
    // both ways: 50 ms let two rows make more tokens than one whole answer on a quick run (358 of 324); 10 ms
    // sometimes aborted the second before the server had it (under ASan), so it was never counted as cancelled.
    const both = await waitFor(
      async () => counter(await scrape(ctx.server), 'lathe_requests_in_flight') >= 2,
      { timeoutMs: 10000, intervalMs: 2 },
    );
    assert.ok(both, 'the server took the second request');
    second.abort();
    first.abort();
    await b;
    const s = await idle(ctx.server);
    assert.ok(s);
    const cancelled = counter(s, 'lathe_requests_cancelled_total') - counter(before, 'lathe_requests_cancelled_total');
    assert.equal(cancelled, 2, 'both requests count as cancelled');
    const generated = counter(s, 'lathe_generation_tokens_total') - counter(before, 'lathe_generation_tokens_total');
    assert.ok(generated < fullTokens, `${generated} tokens generated for two aborted requests`);
    await expectStillServing('after the queued abort');
  });

  test('a later request is unaffected: same greedy answer as before the aborts', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { messages: long, max_tokens: MAX_TOKENS },
    });
    assert.equal(r.status, 200);
    assert.equal(r.json.usage.completion_tokens, fullTokens);
    assert.equal(r.json.choices[0].message.content, fullText);
  });
});
