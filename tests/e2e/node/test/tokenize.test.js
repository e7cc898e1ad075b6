// /tokenize and /detokenize (llama-server and vLLM shapes), Anthropic count_tokens and assistant prefill.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe, test } from 'node:test';

import { anthropicClient, request, useServer } from './harness.js';

const ctx = useServer();
const hello = [{ role: 'user', content: 'hello world' }];

describe('tokenize / detokenize', () => {
  test("llama-server's shape round-trips", async () => {
    const t = await request(ctx.server, 'POST', '/tokenize', { body: { content: 'hello world' } });
    assert.equal(t.status, 200, t.text);
    assert.ok(t.json.tokens.length >= 2 && t.json.tokens.every(Number.isInteger));
    const d = await request(ctx.server, 'POST', '/detokenize', { body: { tokens: t.json.tokens } });
    assert.equal(d.json.content, 'hello world');
    const p = await request(ctx.server, 'POST', '/tokenize', { body: { content: 'hello world', with_pieces: true } });
    assert.equal(p.json.tokens.map((x) => x.piece).join(''), 'hello world');
  });

  test("vLLM's shape: prompt or messages, count and max_model_len", async () => {
    const t = await request(ctx.server, 'POST', '/tokenize', { body: { model: 'demo', prompt: 'hello world' } });
    assert.equal(t.json.count, t.json.tokens.length);
    assert.ok(t.json.max_model_len > 0);
    const m = await request(ctx.server, 'POST', '/tokenize', { body: { model: 'demo', messages: hello } });
    assert.ok(m.json.count > t.json.count, 'the chat template adds its markup');
    const d = await request(ctx.server, 'POST', '/detokenize', { body: { model: 'demo', tokens: t.json.tokens } });
    assert.equal(d.json.prompt, 'hello world');
  });

  test('a long text answers in memory near its size, pieces and all', async () => {
    // 2 MB of one-byte tokens with pieces: the answer held as a JSON DOM peaked ~1.3 GB above the start.
    const peak = () => Number(/VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${ctx.server.pid}/status`, 'utf8'))[1]) * 1024;
    const before = peak();
    const t = await request(ctx.server, 'POST', '/tokenize', { body: { content: 'a\n'.repeat(1 << 20), with_pieces: true } });
    assert.equal(t.status, 200);
    assert.equal(t.json.count, 2 << 20);
    assert.deepEqual(t.json.tokens.slice(0, 2).map((x) => x.piece), ['a', '\n']);
    const grew = peak() - before;
    // Under ASan freed memory sits in quarantine (and its allocator pads each block): RSS is no measure there.
    if (process.env.LATHE_SANITIZED !== '1')
      assert.ok(grew < 256 * 2 ** 20, `peak RSS grew ${(grew / 2 ** 20).toFixed(0)} MiB`);
    // A piece that is part of a UTF-8 character alone reads as U+FFFD; together they make the text.
    const e = await request(ctx.server, 'POST', '/tokenize', { body: { content: 'é', with_pieces: true } });
    assert.ok(e.json.tokens.every((x) => Number.isInteger(x.id) && typeof x.piece === 'string'));
  });

  test('bad ids are a 400', async () => {
    const d = await request(ctx.server, 'POST', '/detokenize', { body: { tokens: [1, 999999] } });
    assert.equal(d.status, 400);
    assert.match(d.json.error.message, /tokens\[1\]/);
  });
});

describe('Anthropic', () => {
  test('count_tokens equals the input_tokens of the same request', async () => {
    const ant = anthropicClient(ctx.server);
    const counted = await ant.messages.countTokens({ model: 'demo', messages: hello });
    const m = await ant.messages.create({ model: 'demo', max_tokens: 16, messages: hello });
    assert.equal(counted.input_tokens, m.usage.input_tokens + (m.usage.cache_read_input_tokens ?? 0));
  });

  test('count_tokens counts a conversation longer than the context (the question it answers is whether it fits)', async () => {
    const ant = anthropicClient(ctx.server);
    const count = async (n) =>
      (await ant.messages.countTokens({ model: 'demo', messages: [{ role: 'user', content: 'hello world '.repeat(n) }] }))
        .input_tokens;
    const [one, many, more] = [await count(1), await count(3000), await count(3001)];
    // Each repetition is the same few tokens, so the whole count is exact, far past the demo's 1,024.
    const per = more - many;
    assert.ok(per > 0, `${per}`);
    assert.equal(many, one + per * 2999);
    const long = [{ role: 'user', content: 'hello world '.repeat(3000) }];
    await assert.rejects(ant.messages.create({ model: 'demo', max_tokens: 8, messages: long }), (e) => e.status === 400);
  });

  test('assistant prefill is continued, and only the continuation comes back', async () => {
    const m = await anthropicClient(ctx.server).messages.create({
      model: 'demo',
      max_tokens: 16,
      messages: [...hello, { role: 'assistant', content: 'HELLO' }],
    });
    assert.equal(m.content[0].text, ' WORLD');
  });

  test('cache_control on blocks and tools is accepted', async () => {
    const m = await anthropicClient(ctx.server).messages.create({
      model: 'demo',
      max_tokens: 16,
      system: [{ type: 'text', text: 'be brief', cache_control: { type: 'ephemeral' } }],
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hello world', cache_control: { type: 'ephemeral' } }] }],
    });
    assert.equal(m.content[0].text, 'HELLO WORLD');
  });
});
