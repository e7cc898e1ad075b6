// Chat and text completions through the official `openai` and `@anthropic-ai/sdk` clients against the bundled
// demo model, which answers any short lowercase message in upper case ("hello world" → "HELLO WORLD").
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import {
  anthropicClient,
  demoChatText,
  metricValue,
  openaiClient,
  parseSSE,
  request,
  scrape,
  startServer,
  useServer,
} from './harness.js';

const ctx = useServer();
const oai = () => openaiClient(ctx.server);
const ant = () => anthropicClient(ctx.server);
const hello = [{ role: 'user', content: 'hello world' }];

function assertUsage(usage) {
  assert.ok(usage, 'usage is present');
  assert.ok(Number.isInteger(usage.prompt_tokens) && usage.prompt_tokens > 0, 'usage.prompt_tokens > 0');
  assert.ok(Number.isInteger(usage.completion_tokens) && usage.completion_tokens > 0, 'usage.completion_tokens > 0');
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
  assert.ok(usage.prompt_tokens_details, 'usage.prompt_tokens_details is present');
  const cached = usage.prompt_tokens_details.cached_tokens;
  assert.ok(Number.isInteger(cached) && cached >= 0 && cached <= usage.prompt_tokens, `cached_tokens=${cached}`);
}

describe('discovery', () => {
  test('GET /health is {"status": "ok"}', async () => {
    const r = await request(ctx.server, 'GET', '/health');
    assert.equal(r.status, 200);
    assert.deepEqual(r.json, { status: 'ok' });
    assert.equal(r.text.trim(), '{"status": "ok"}', 'byte-for-byte as mlx_lm.server');
  });

  test('GET /v1/models lists the served model', async () => {
    const page = await oai().models.list();
    assert.ok(page.data.length >= 1);
    assert.equal(typeof page.data[0].id, 'string');
    assert.ok(page.data[0].id.length > 0);
    assert.equal(page.data[0].object, 'model');
  });
});

describe('chat completions (openai SDK)', () => {
  test('non-stream: the demo model upper-cases the message', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
    assert.match(r.id, /^chatcmpl-/);
    assert.equal(r.object, 'chat.completion');
    assert.ok(Number.isInteger(r.created));
    assert.equal(typeof r.model, 'string');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].index, 0);
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.equal(r.choices[0].message.content, 'HELLO WORLD');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assertUsage(r.usage);
  });

  test('non-stream: a system message and parts content are accepted', async () => {
    const r = await oai().chat.completions.create({
      model: 'demo',
      max_tokens: 32,
      messages: [
        { role: 'system', content: 'You are a helpful assistant.' },
        { role: 'user', content: [{ type: 'text', text: 'good morning' }] },
      ],
    });
    assert.equal(r.choices[0].message.content, 'GOOD MORNING');
  });

  test('stream: no usage unless asked for (as OpenAI)', async () => {
    const stream = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32, stream: true });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    for (const c of chunks) assert.equal(c.usage ?? null, null);
    assert.equal(chunks.at(-1).choices[0].finish_reason, 'stop');
  });

  test('stream: role chunk, content deltas, finish chunk, then usage in a chunk with choices []', async () => {
    const stream = await oai().chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 32,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.ok(chunks.length >= 3, `got ${chunks.length} chunks`);
    for (const c of chunks) {
      assert.equal(c.object, 'chat.completion.chunk');
      assert.match(c.id, /^chatcmpl-/);
    }
    assert.equal(chunks[0].choices[0].delta.role, 'assistant');
    const text = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
    assert.equal(text, 'HELLO WORLD');
    const last = chunks.at(-1);
    assert.deepEqual(last.choices, []);
    assertUsage(last.usage);
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'stop');
    for (const c of chunks.slice(0, -2)) assert.equal(c.choices[0].finish_reason ?? null, null);
    for (const c of chunks.slice(0, -1)) assert.equal(c.usage ?? null, null);
  });

  test('stream: SSE framing and a bare data: [DONE] at the end', async () => {
    const res = await fetch(`${ctx.server.base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: hello, max_tokens: 32, stream: true }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /^text\/event-stream/);
    const body = await res.text();
    assert.ok(body.endsWith('data: [DONE]\n\n'), `stream ends with a bare [DONE]: ${JSON.stringify(body.slice(-40))}`);
    const frames = parseSSE(body);
    assert.equal(frames.at(-1).data, '[DONE]');
    for (const f of frames.slice(0, -1)) JSON.parse(f.data);  // every other frame is one JSON object
  });

  test('max_tokens cuts the answer with finish_reason length', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 3 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 3);
    assert.ok('HELLO WORLD'.startsWith(r.choices[0].message.content), r.choices[0].message.content);
  });

  test('max_completion_tokens wins over max_tokens', async () => {
    const r = await oai().chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 64,
      max_completion_tokens: 2,
    });
    assert.equal(r.usage.completion_tokens, 2);
    assert.equal(r.choices[0].finish_reason, 'length');
  });

  // The first request prefills the shared prompt; the others wait for it (lathe_prefix_waits_total) and reuse it.
  test('requests sent together over one long new prompt prefill it once', async () => {
    const shared = Array.from({ length: 300 }, (_, k) => 5 + ((k * 13) % 600));
    const bodies = [0, 1, 2].map((i) => ({ model: 'demo', prompt: [...shared, 7 + i, 9 + i], max_tokens: 2 }));
    const before = metricValue(await scrape(ctx.server), 'lathe_prefix_waits_total');
    const rs = await Promise.all(bodies.map((body) => request(ctx.server, 'POST', '/v1/completions', { body })));
    for (const r of rs) assert.equal(r.status, 200, r.text);
    const cached = rs.map((r) => r.json.usage.prompt_tokens_details.cached_tokens).sort((a, b) => a - b);
    assert.equal(cached[0], 0, JSON.stringify(cached));
    assert.ok(cached[1] >= shared.length && cached[2] >= shared.length, JSON.stringify(cached));
    assert.ok(metricValue(await scrape(ctx.server), 'lathe_prefix_waits_total') > before);
  });

  test('a repeated prompt reports cached prompt tokens', async () => {
    const messages = [{ role: 'user', content: 'cached prompt check' }];
    await oai().chat.completions.create({ model: 'demo', messages, max_tokens: 4 });
    const r = await oai().chat.completions.create({ model: 'demo', messages, max_tokens: 4 });
    assertUsage(r.usage);
    assert.ok(r.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(r.usage));
  });
});

describe('text completions (openai SDK)', () => {
  const prompt = demoChatText('hello world');

  test('non-stream', async () => {
    const r = await oai().completions.create({ model: 'demo', prompt, max_tokens: 32 });
    assert.match(r.id, /^cmpl-/);
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices[0].text, 'HELLO WORLD');
    assert.equal(r.choices[0].finish_reason, 'stop');
    assertUsage(r.usage);
  });

  test('stream', async () => {
    const stream = await oai().completions.create({
      model: 'demo',
      prompt,
      max_tokens: 32,
      stream: true,
      stream_options: { include_usage: true },
    });
    const chunks = [];
    for await (const c of stream) chunks.push(c);
    assert.equal(chunks.map((c) => c.choices[0]?.text ?? '').join(''), 'HELLO WORLD');
    for (const c of chunks) assert.equal(c.object, 'text_completion');
    assert.equal(chunks.at(-2).choices[0].finish_reason, 'stop');
    assert.deepEqual(chunks.at(-1).choices, []);
    assertUsage(chunks.at(-1).usage);
  });

  test('length finish', async () => {
    const r = await oai().completions.create({ model: 'demo', prompt, max_tokens: 2 });
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 2);
  });
});

describe('messages (anthropic SDK)', () => {
  test('non-stream: the demo model upper-cases the message', async () => {
    const m = await ant().messages.create({ model: 'demo', max_tokens: 32, messages: hello });
    assert.match(m.id, /^msg_/);
    assert.equal(m.type, 'message');
    assert.equal(m.role, 'assistant');
    assert.equal(m.content.length, 1);
    assert.equal(m.content[0].type, 'text');
    assert.equal(m.content[0].text, 'HELLO WORLD');
    assert.equal(m.stop_reason, 'end_turn');
    assert.equal(m.stop_sequence ?? null, null);
    assert.ok(m.usage.input_tokens > 0 && m.usage.output_tokens > 0, JSON.stringify(m.usage));
  });

  test('system prompt and text blocks', async () => {
    const m = await ant().messages.create({
      model: 'demo',
      max_tokens: 32,
      system: 'You are a helpful assistant.',
      messages: [{ role: 'user', content: [{ type: 'text', text: 'good morning' }] }],
    });
    assert.equal(m.content[0].text, 'GOOD MORNING');
  });

  test('max_tokens → stop_reason max_tokens', async () => {
    const m = await ant().messages.create({ model: 'demo', max_tokens: 2, messages: hello });
    assert.equal(m.stop_reason, 'max_tokens');
    assert.equal(m.usage.output_tokens, 2);
  });

  test('stream: Anthropic event order', async () => {
    const stream = await ant().messages.create({ model: 'demo', max_tokens: 32, messages: hello, stream: true });
    const events = [];
    for await (const e of stream) events.push(e);
    const types = events.map((e) => e.type);
    assert.equal(types[0], 'message_start', types.join(','));
    assert.equal(types[1], 'content_block_start', types.join(','));
    assert.equal(types.at(-1), 'message_stop', types.join(','));
    assert.equal(types.at(-2), 'message_delta', types.join(','));
    assert.equal(types.at(-3), 'content_block_stop', types.join(','));
    const middle = types.slice(2, -3);
    assert.ok(middle.length >= 1, 'at least one delta');
    assert.ok(
      middle.every((t) => t === 'content_block_delta'),
      types.join(','),
    );
    assert.equal(events[0].message.role, 'assistant');
    assert.equal(events[1].content_block.type, 'text');
    assert.equal(events[1].index, 0);
    const text = events
      .filter((e) => e.type === 'content_block_delta')
      .map((e) => {
        assert.equal(e.delta.type, 'text_delta');
        return e.delta.text;
      })
      .join('');
    assert.equal(text, 'HELLO WORLD');
    const delta = events.at(-2);
    assert.equal(delta.delta.stop_reason, 'end_turn');
    assert.ok(delta.usage.output_tokens > 0, JSON.stringify(delta.usage));
  });

  test('stream: raw frames are "event: NAME" + "data: JSON" with matching types', async () => {
    const r = await request(ctx.server, 'POST', '/v1/messages', {
      body: { model: 'demo', max_tokens: 32, messages: hello, stream: true },
      headers: { 'anthropic-version': '2023-06-01' },
    });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^text\/event-stream/);
    const frames = parseSSE(r.text);
    assert.ok(frames.length >= 5);
    for (const f of frames) assert.equal(JSON.parse(f.data).type, f.event);
  });
});

describe('model names', () => {
  test('an unknown name is 404 model_not_found listing what is served', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', { body: { model: 'gpt-4o', messages: hello } });
    assert.equal(r.status, 404);
    assert.equal(r.json.error.code, 'model_not_found');
    assert.match(r.json.error.message, /serves: demo/);
    const a = await request(ctx.server, 'POST', '/v1/messages', { body: { model: 'claude-x', max_tokens: 4, messages: hello } });
    assert.equal(a.status, 404);
  });

  test('--alias names are served and listed; --accept-any-model takes any', async () => {
    const server = await startServer({ args: ['--alias', 'gpt-4o-mini', '--alias', 'small'] });
    try {
      const ids = (await openaiClient(server).models.list()).data.map((m) => m.id);
      assert.deepEqual(ids, ['gpt-4o-mini', 'small', 'demo']);
      for (const model of ids) {
        const r = await openaiClient(server).chat.completions.create({ model, messages: hello, max_tokens: 32 });
        assert.equal(r.choices[0].message.content, 'HELLO WORLD');
        assert.equal(r.model, 'gpt-4o-mini');
      }
    } finally {
      await server.stop();
    }
    const any = await startServer({ args: ['--accept-any-model'] });
    try {
      const r = await openaiClient(any).chat.completions.create({ model: 'whatever', messages: hello, max_tokens: 32 });
      assert.equal(r.choices[0].message.content, 'HELLO WORLD');
    } finally {
      await any.stop();
    }
  });
});

describe('no --model', () => {
  test('serves the bundled demo model', async () => {
    const server = await startServer({ model: null });
    try {
      const id = (await openaiClient(server).models.list()).data[0].id;
      const r = await openaiClient(server).chat.completions.create({ model: id, messages: hello, max_tokens: 32 });
      assert.equal(r.choices[0].message.content, 'HELLO WORLD');
    } finally {
      await server.stop();
    }
  });
});
