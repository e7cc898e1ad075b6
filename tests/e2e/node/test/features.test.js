// Stop sequences, logprobs and the tools round trip, on the demo model ("hello world" → "HELLO WORLD").
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { anthropicClient, demoChatText, openaiClient, request, startServer, useServer } from './harness.js';

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

// OpenAI's shape: the entry is the sampled token, as decoded text with its UTF-8 bytes.
function assertEntry(e) {
  assert.equal(typeof e.token, 'string', JSON.stringify(e));
  assert.equal(typeof e.logprob, 'number');
  assert.ok(e.logprob <= 1e-6, `logprob ${e.logprob} ≤ 0`);
  assert.deepEqual(e.bytes, [...Buffer.from(e.token, 'utf8')]);
  assert.ok(!/^Ġ/.test(e.token), `decoded text, not a BPE piece: ${e.token}`);
}

function assertTopLogprobs(entry, k) {
  assertEntry(entry);
  assert.ok(Array.isArray(entry.top_logprobs), JSON.stringify(entry));
  assert.equal(entry.top_logprobs.length, k);
  let mass = 0;
  for (let i = 0; i < k; i++) {
    const t = entry.top_logprobs[i];
    assertEntry(t);
    if (i > 0) assert.ok(entry.top_logprobs[i - 1].logprob >= t.logprob, 'sorted by logprob, descending');
    mass += Math.exp(t.logprob);
  }
  assert.ok(mass <= 1.0001, `probability mass of the top ${k}: ${mass}`);
  // Greedy: the sampled token is the most likely one.
  assert.equal(entry.token, entry.top_logprobs[0].token);
  assert.ok(Math.abs(entry.logprob - entry.top_logprobs[0].logprob) < 1e-5);
}

describe('ignore_eos (vLLM, llama-server)', () => {
  test('the end-of-sequence token neither stops nor adds text: exactly max_tokens, finish_reason length', async () => {
    const plain = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 40 });
    assert.equal(plain.choices[0].finish_reason, 'stop');
    assert.ok(plain.usage.completion_tokens < 40);
    const body = { model: 'demo', messages: hello, max_tokens: 40, ignore_eos: true };
    const r = await oai().chat.completions.create(body);
    assert.equal(r.usage.completion_tokens, 40);
    assert.equal(r.choices[0].finish_reason, 'length');
    const text = r.choices[0].message.content;
    assert.ok(text.startsWith(plain.choices[0].message.content), text);
    assert.ok(!text.includes('<|im_end|>'), text);
    const chunks = await streamChat({ messages: hello, max_tokens: 40, ignore_eos: true });
    assert.equal(chunks.map((c) => c.choices[0]?.delta?.content ?? '').join(''), text, 'streamed the same');
    const bad = await request(ctx.server, 'POST', '/v1/chat/completions', { body: { ...body, ignore_eos: 'yes' } });
    assert.equal(bad.status, 400);
    assert.equal(bad.json.error.param, 'ignore_eos');
  });
});

describe('logprobs', () => {
  for (const k of [1, 3, 20]) {
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
      assert.equal(content.map((e) => e.token).join(''), r.choices[0].message.content);
    });
  }

  test('chat logprobs=true alone: the sampled tokens, top_logprobs empty', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32, logprobs: true });
    const content = r.choices[0].logprobs?.content;
    assert.ok(Array.isArray(content) && content.length > 0, JSON.stringify(r.choices[0]));
    for (const e of content) {
      assertEntry(e);
      assert.deepEqual(e.top_logprobs, []);
    }
  });

  test('streamed: each content chunk carries the entries of its tokens', async () => {
    const chunks = await streamChat({ messages: hello, max_tokens: 32, logprobs: true, top_logprobs: 2 });
    let text = '';
    let tokens = '';
    for (const c of chunks) {
      const d = c.choices[0]?.delta?.content ?? '';
      text += d;
      const lp = c.choices[0]?.logprobs?.content ?? [];
      for (const e of lp) assertTopLogprobs(e, 2);
      tokens += lp.map((e) => e.token).join('');
    }
    assert.equal(text, 'HELLO WORLD');
    assert.equal(tokens, text);
  });

  test('no logprobs requested: none returned', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
    assert.ok(r.choices[0].logprobs == null, JSON.stringify(r.choices[0].logprobs));
  });

  test('top_logprobs above 20 is a 400 naming the field', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { messages: hello, max_tokens: 4, logprobs: true, top_logprobs: 21 },
    });
    assert.equal(r.status, 400);
    assert.match(`${r.json.error.param} ${r.json.error.message}`, /top_logprobs/);
    await assert.rejects(
      oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 4, logprobs: true, top_logprobs: 21 }),
      (e) => e.status === 400,
    );
  });

  test("completions: the legacy shape (tokens, token_logprobs, top_logprobs, text_offset)", async () => {
    const r = await oai().completions.create({ model: 'demo', prompt: demoChatText('hello world'), max_tokens: 32, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    assert.ok(lp && Array.isArray(lp.tokens) && lp.tokens.length > 0, JSON.stringify(r.choices[0]));
    assert.equal(lp.tokens.join(''), r.choices[0].text);
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    let offset = 0;
    for (let i = 0; i < lp.tokens.length; i++) {
      assert.equal(lp.text_offset[i], offset);
      offset += Buffer.byteLength(lp.tokens[i]);
      assert.equal(Object.keys(lp.top_logprobs[i]).length, 2);
      assert.ok(Math.abs(lp.top_logprobs[i][lp.tokens[i]] - lp.token_logprobs[i]) < 1e-5);
    }
  });

  test('--logprobs-format mlx keeps mlx_lm.server\'s shape', async () => {
    const server = await startServer({ args: ['--logprobs-format', 'mlx'] });
    try {
      const r = await openaiClient(server).chat.completions.create({
        model: 'demo', messages: hello, max_tokens: 32, logprobs: true, top_logprobs: 3,
      });
      for (const e of r.choices[0].logprobs.content) {
        assert.ok(Number.isInteger(e.id));
        assert.equal(e.id, e.top_logprobs[0].id);
      }
    } finally {
      await server.stop();
    }
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
