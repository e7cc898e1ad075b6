// Stop sequences, logprobs and the tools round trip, on the demo model ("hello world" → "HELLO WORLD").
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { anthropicClient, demoChatText, openaiClient, request, useServer } from './harness.js';

const ctx = useServer();
const oai = () => openaiClient(ctx.server);
const ant = () => anthropicClient(ctx.server);
const hello = [{ role: 'user', content: 'hello world' }];

async function streamChat(params) {
  const stream = await oai().chat.completions.create({ model: 'demo', ...params, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

describe('stop sequences', () => {
  test('chat non-stream: output ends before the stop text, finish_reason stop', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32, stop: 'WOR' });
    assert.equal(r.choices[0].message.content, 'HELLO ');
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  test('chat non-stream: the earliest of several stops wins', async () => {
    const r = await oai().chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 32,
      stop: ['WORLD', 'LLO'],
    });
    assert.equal(r.choices[0].message.content, 'HE');
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  test('chat non-stream: a stop that never matches changes nothing', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32, stop: ['zzz'] });
    assert.equal(r.choices[0].message.content, 'HELLO WORLD');
  });

  test('chat stream: no chunk carries any part of the stop text', async () => {
    const chunks = await streamChat({ messages: hello, max_tokens: 32, stop: ['O W'] });
    const deltas = chunks.map((c) => c.choices[0]?.delta?.content ?? '');
    assert.equal(deltas.join(''), 'HELL');
    for (const d of deltas) assert.ok(!d.includes('O W') && !d.includes('W'), JSON.stringify(deltas));
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  });

  test('completions non-stream and stream', async () => {
    const prompt = demoChatText('hello world');
    const r = await oai().completions.create({ model: 'demo', prompt, max_tokens: 32, stop: ['RLD'] });
    assert.equal(r.choices[0].text, 'HELLO WO');
    assert.equal(r.choices[0].finish_reason, 'stop');
    const stream = await oai().completions.create({ model: 'demo', prompt, max_tokens: 32, stop: ['RLD'], stream: true });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'HELLO WO');
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  });

  test('anthropic stop_sequences, non-stream and stream', async () => {
    const m = await ant().messages.create({ model: 'demo', max_tokens: 32, messages: hello, stop_sequences: ['WOR'] });
    assert.equal(m.content[0].text, 'HELLO ');
    assert.ok(['end_turn', 'stop_sequence'].includes(m.stop_reason), m.stop_reason);
    const stream = await ant().messages.create({
      model: 'demo',
      max_tokens: 32,
      messages: hello,
      stop_sequences: ['WOR'],
      stream: true,
    });
    let text = '';
    for await (const e of stream) if (e.type === 'content_block_delta') text += e.delta.text;
    assert.equal(text, 'HELLO ');
  });
});

function assertTopLogprobs(entry, k) {
  assert.equal(typeof entry.logprob, 'number');
  assert.ok(entry.logprob <= 1e-6, `logprob ${entry.logprob} ≤ 0`);
  assert.ok(Array.isArray(entry.top_logprobs), JSON.stringify(entry));
  assert.equal(entry.top_logprobs.length, k);
  let mass = 0;
  for (let i = 0; i < k; i++) {
    const t = entry.top_logprobs[i];
    assert.ok(Number.isInteger(t.id), JSON.stringify(t));
    assert.equal(typeof t.token, 'string');
    assert.ok(t.logprob <= 1e-6);
    if (i > 0) assert.ok(entry.top_logprobs[i - 1].logprob >= t.logprob, 'sorted by logprob, descending');
    mass += Math.exp(t.logprob);
  }
  assert.ok(mass <= 1.0001, `probability mass of the top ${k}: ${mass}`);
  // mlx_lm.server's shape: the entry itself is the top-1 candidate.
  assert.equal(entry.id, entry.top_logprobs[0].id);
  assert.ok(Math.abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-5);
}

describe('logprobs', () => {
  for (const k of [1, 3, 11]) {
    test(`chat top_logprobs=${k}: k candidates per token, sorted, descending`, async () => {
      const r = await oai().chat.completions.create({
        model: 'demo',
        messages: hello,
        max_tokens: 32,
        logprobs: true,
        top_logprobs: k,
      });
      const content = r.choices[0].logprobs?.content;
      assert.ok(Array.isArray(content), JSON.stringify(r.choices[0]));
      const n = r.usage.completion_tokens;
      // Every generated token, the EOS possibly excepted.
      assert.ok(content.length === n || content.length === n - 1, `${content.length} entries for ${n} tokens`);
      for (const e of content) assertTopLogprobs(e, k);
    });
  }

  test('chat logprobs=true alone: the sampled token id and logprob', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32, logprobs: true });
    const content = r.choices[0].logprobs?.content;
    assert.ok(Array.isArray(content) && content.length > 0, JSON.stringify(r.choices[0]));
    for (const e of content) {
      assert.ok(Number.isInteger(e.id));
      assert.ok(e.logprob <= 1e-6);
    }
  });

  test('no logprobs requested: none returned', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
    assert.ok(r.choices[0].logprobs == null, JSON.stringify(r.choices[0].logprobs));
  });

  test('top_logprobs above 11 is a 400 naming the field', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { messages: hello, max_tokens: 4, logprobs: true, top_logprobs: 12 },
    });
    assert.equal(r.status, 400);
    assert.match(`${r.json.error.param} ${r.json.error.message}`, /top_logprobs/);
    await assert.rejects(
      oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 4, logprobs: true, top_logprobs: 12 }),
      (e) => e.status === 400,
    );
  });

  test('completions: top_logprobs gives the same shape', async () => {
    const r = await request(ctx.server, 'POST', '/v1/completions', {
      body: { prompt: demoChatText('hello world'), max_tokens: 32, logprobs: true, top_logprobs: 2 },
    });
    assert.equal(r.status, 200, r.text);
    const content = r.json.choices[0].logprobs?.content;
    assert.ok(Array.isArray(content) && content.length > 0, r.text);
    for (const e of content) assertTopLogprobs(e, 2);
  });
});

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};
const toolConversation = [
  { role: 'user', content: 'what is the weather in paris' },
  {
    role: 'assistant',
    content: null,
    tool_calls: [{ id: 'call_0a1b2c3d', type: 'function', function: { name: 'get_weather', arguments: '{"city":"paris"}' } }],
  },
  { role: 'tool', tool_call_id: 'call_0a1b2c3d', content: 'sunny and warm' },
];

describe('tools', () => {
  test('openai: tools + assistant tool_calls + tool result render and answer', async () => {
    const withTools = await oai().chat.completions.create({
      model: 'demo',
      messages: toolConversation,
      tools: [weatherTool],
      max_tokens: 8,
    });
    const without = await oai().chat.completions.create({ model: 'demo', messages: toolConversation, max_tokens: 8 });
    for (const r of [withTools, without]) {
      assert.equal(r.choices[0].message.role, 'assistant');
      assert.ok(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), r.choices[0].finish_reason);
    }
    assert.ok(
      withTools.usage.prompt_tokens > without.usage.prompt_tokens,
      `tools are rendered: ${withTools.usage.prompt_tokens} > ${without.usage.prompt_tokens}`,
    );
    // Both render the assistant's call and the tool result: more tokens than the user turn alone.
    const userOnly = await oai().chat.completions.create({ model: 'demo', messages: toolConversation.slice(0, 1), max_tokens: 1 });
    assert.ok(without.usage.prompt_tokens > userOnly.usage.prompt_tokens + 10);
  });

  test('openai: tool_choice "none" leaves the tools out of the prompt', async () => {
    const none = await oai().chat.completions.create({
      model: 'demo',
      messages: toolConversation,
      tools: [weatherTool],
      tool_choice: 'none',
      max_tokens: 1,
    });
    const without = await oai().chat.completions.create({ model: 'demo', messages: toolConversation, max_tokens: 1 });
    assert.equal(none.usage.prompt_tokens, without.usage.prompt_tokens);
  });

  test('openai stream with tools', async () => {
    const chunks = await streamChat({ messages: toolConversation, tools: [weatherTool], max_tokens: 8 });
    assert.ok(chunks.at(-1).choices[0].finish_reason);
  });

  test('anthropic: tool_use + tool_result blocks and tools render and answer', async () => {
    const messages = [
      { role: 'user', content: 'what is the weather in paris' },
      {
        role: 'assistant',
        content: [{ type: 'tool_use', id: 'toolu_01', name: 'get_weather', input: { city: 'paris' } }],
      },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 'toolu_01', content: 'sunny and warm' }] },
    ];
    const tools = [
      {
        name: 'get_weather',
        description: 'Get the current weather for a city',
        input_schema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    ];
    const withTools = await ant().messages.create({ model: 'demo', max_tokens: 8, messages, tools });
    const without = await ant().messages.create({ model: 'demo', max_tokens: 8, messages });
    assert.equal(withTools.role, 'assistant');
    assert.ok(withTools.usage.input_tokens > without.usage.input_tokens);
  });
});
