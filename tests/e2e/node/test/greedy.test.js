// Greedy output through the server equals the fixture's reference continuation (token ids from the reference
// implementation), through the OpenAI and the Anthropic surfaces; seeded sampling is reproducible.
import assert from 'node:assert/strict';
import path from 'node:path';
import { before, describe, test } from 'node:test';

import { anthropicClient, fixtureModel, lathe, openaiClient, readJson, request, useServer } from './harness.js';

const MODEL = fixtureModel('qwen3-q4g64');
const PROMPT = 'Write a haiku about the sea.';
// The tests send model 'm': a client that hard-codes a name.
const ctx = useServer({ model: MODEL, args: ['--accept-any-model'] });
const oai = () => openaiClient(ctx.server);
const ant = () => anthropicClient(ctx.server);

const ref = readJson(path.join(MODEL, 'reference.json'));
const refIds = ref.greedy_continuation;
const N = refIds.length;
let expected;

before(() => {
  // The reference ids decoded with special tokens skipped, as a client should see them.
  expected = lathe(['tokenize', '--tokenizer', MODEL, '--decode', '--skip-special', JSON.stringify(refIds)]);
  assert.ok(expected.length > 0);
});

const messages = [{ role: 'user', content: PROMPT }];

describe('greedy output equals the reference continuation', () => {
  test('the CLI agrees with the reference (sanity check of the expectation)', () => {
    const out = lathe(['generate', '--model', MODEL, '--chat', '--prompt', PROMPT, '--temp', '0', '--max-tokens', `${N}`]);
    assert.equal(out, expected);
  });

  test('openai chat, non-stream; logprobs tokens are the reference tokens', async () => {
    const r = await oai().chat.completions.create({
      model: 'm',
      messages,
      temperature: 0,
      max_tokens: N,
      logprobs: true,
      top_logprobs: 1,
    });
    assert.equal(r.choices[0].message.content, expected);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, N);
    assert.equal(r.usage.prompt_tokens, ref.prompts.chat.length);
    // OpenAI's shape names tokens by their decoded text: one entry per reference id, spelling the output.
    const content = r.choices[0].logprobs.content;
    assert.equal(content.length, refIds.length);
    assert.equal(content.map((e) => e.token).join(''), expected);
    for (const e of content) assert.equal(e.top_logprobs[0].token, e.token);
  });

  test('openai chat, stream', async () => {
    const stream = await oai().chat.completions.create({
      model: 'm',
      messages,
      temperature: 0,
      max_tokens: N,
      stream: true,
      stream_options: { include_usage: true },
    });
    let text = '';
    let finish;
    let last;
    for await (const c of stream) {
      text += c.choices[0]?.delta?.content ?? '';
      finish = c.choices[0]?.finish_reason ?? finish;
      last = c;
    }
    assert.equal(text, expected);
    assert.equal(finish, 'length');
    assert.equal(last.usage.completion_tokens, N);
  });

  test('openai completions on the rendered chat text', async () => {
    const r = await oai().completions.create({ model: 'm', prompt: ref.chat_text, temperature: 0, max_tokens: N });
    assert.equal(r.choices[0].text, expected);
    assert.equal(r.usage.prompt_tokens, ref.prompts.chat.length);
  });

  test('anthropic messages, non-stream', async () => {
    const m = await ant().messages.create({ model: 'm', max_tokens: N, temperature: 0, messages });
    assert.equal(m.content[0].text, expected);
    assert.equal(m.stop_reason, 'max_tokens');
    assert.equal(m.usage.output_tokens, N);
  });

  test('anthropic messages, stream', async () => {
    const stream = await ant().messages.create({ model: 'm', max_tokens: N, temperature: 0, messages, stream: true });
    let text = '';
    for await (const e of stream) if (e.type === 'content_block_delta') text += e.delta.text;
    assert.equal(text, expected);
  });
});

describe('seed', () => {
  const sample = async (seed) => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { messages: [{ role: 'user', content: 'hi' }], temperature: 1.0, max_tokens: 12, seed },
    });
    assert.equal(r.status, 200, r.text);
    return r.json.choices[0].message.content;
  };

  test('the same seed gives the same text (temperature 1)', async () => {
    const a = await sample(1234);
    const b = await sample(1234);
    assert.equal(a, b);
    const c = await oai().chat.completions.create({
      model: 'm',
      messages: [{ role: 'user', content: 'hi' }],
      temperature: 1.0,
      max_tokens: 12,
      seed: 1234,
    });
    assert.equal(c.choices[0].message.content, a);
  });

  test('different seeds give different texts', async () => {
    const texts = new Set();
    for (const seed of [1, 2, 3, 4, 5]) texts.add(await sample(seed));
    assert.ok(texts.size >= 2, `5 seeds gave ${texts.size} distinct text(s)`);
  });
});

// OpenAI `n`: each choice is its own row of the batch; with a seed, choice i samples as a request with seed + i.
describe('n choices', () => {
  const hi = [{ role: 'user', content: 'hi' }];
  const single = async (seed) =>
    (
      await request(ctx.server, 'POST', '/v1/chat/completions', {
        body: { messages: hi, temperature: 1.0, max_tokens: 12, seed },
      })
    ).json;

  test('non-stream: n seeded choices equal the requests with seed, seed + 1, seed + 2', async () => {
    const r = await oai().chat.completions.create({ model: 'm', messages: hi, temperature: 1.0, max_tokens: 12, seed: 77, n: 3 });
    assert.equal(r.choices.length, 3);
    const solo = [await single(77), await single(78), await single(79)];
    for (let i = 0; i < 3; i++) {
      assert.equal(r.choices[i].index, i);
      assert.equal(r.choices[i].message.content, solo[i].choices[0].message.content, `choice ${i}`);
    }
    assert.equal(r.usage.prompt_tokens, solo[0].usage.prompt_tokens);
    assert.equal(r.usage.completion_tokens, solo.reduce((s, x) => s + x.usage.completion_tokens, 0));
  });

  test('stream: chunks carry their choice index; one usage chunk at the end', async () => {
    const params = { model: 'm', messages: hi, temperature: 1.0, max_tokens: 12, seed: 5, n: 2 };
    const whole = await oai().chat.completions.create(params);
    const stream = await oai().chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
    const text = ['', ''];
    const finish = [null, null];
    const usages = [];
    for await (const c of stream) {
      if (c.usage) usages.push(c);
      for (const ch of c.choices) {
        text[ch.index] += ch.delta?.content ?? '';
        if (ch.finish_reason) finish[ch.index] = ch.finish_reason;
      }
    }
    assert.deepEqual(text, whole.choices.map((c) => c.message.content));
    assert.deepEqual(finish, whole.choices.map((c) => c.finish_reason));
    assert.equal(usages.length, 1);
    assert.deepEqual(usages[0].choices, []);
    assert.equal(usages[0].usage.completion_tokens, whole.usage.completion_tokens);
  });

  test('completions: greedy choices are equal; n out of range is a 400 naming n', async () => {
    const r = await oai().completions.create({ model: 'm', prompt: ref.chat_text, temperature: 0, max_tokens: 8, n: 2 });
    assert.equal(r.choices.length, 2);
    assert.equal(r.choices[0].text, r.choices[1].text);
    assert.deepEqual(r.choices.map((c) => c.index), [0, 1]);
    const bad = await request(ctx.server, 'POST', '/v1/chat/completions', { body: { messages: hi, n: 9 } });
    assert.equal(bad.status, 400, bad.text);
    assert.equal(bad.json.error.param, 'n');
  });
});
