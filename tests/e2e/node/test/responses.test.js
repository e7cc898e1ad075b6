// POST /v1/responses through the official openai client and @ai-sdk/openai's default model (the Responses API):
// output items, streamed events in order, previous_response_id chaining, 404 for an unknown id, a malformed
// `tools` refused as chat completions refuses it.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { createOpenAI } from '@ai-sdk/openai';
import { generateText, streamText } from 'ai';

import { openaiClient, request, useServer } from './harness.js';

const ctx = useServer();
const oai = () => openaiClient(ctx.server);

describe('/v1/responses', () => {
  test('openai client: a message item with output_text, usage, status completed', async () => {
    const r = await oai().responses.create({ model: 'demo', input: 'hello world', max_output_tokens: 32 });
    assert.match(r.id, /^resp_/);
    assert.equal(r.status, 'completed');
    assert.equal(r.output_text, 'HELLO WORLD');
    assert.ok(r.usage.input_tokens > 0 && r.usage.output_tokens > 0);
  });

  test('streamed events come in order and add up to the text', async () => {
    const stream = await oai().responses.create({ model: 'demo', input: 'hello world', max_output_tokens: 32, stream: true });
    const types = [];
    let text = '';
    let last;
    for await (const e of stream) {
      types.push(e.type);
      if (e.type === 'response.output_text.delta') text += e.delta;
      last = e;
    }
    assert.equal(text, 'HELLO WORLD');
    assert.deepEqual(types.slice(0, 4), [
      'response.created',
      'response.in_progress',
      'response.output_item.added',
      'response.content_part.added',
    ]);
    assert.deepEqual(types.slice(-4), [
      'response.output_text.done',
      'response.content_part.done',
      'response.output_item.done',
      'response.completed',
    ]);
    assert.equal(last.response.output[0].content[0].text, 'HELLO WORLD');
  });

  test('previous_response_id continues the stored conversation; an unknown id is 404', async () => {
    const first = await oai().responses.create({ model: 'demo', input: 'hello world', max_output_tokens: 32 });
    const alone = await oai().responses.create({ model: 'demo', input: 'good morning', max_output_tokens: 32 });
    const second = await oai().responses.create({
      model: 'demo',
      input: 'good morning',
      previous_response_id: first.id,
      max_output_tokens: 32,
    });
    assert.equal(second.previous_response_id, first.id);
    assert.ok(second.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens);
    // The same conversation sent whole gives the same (greedy) reply and prompt.
    const whole = await oai().responses.create({
      model: 'demo',
      input: [
        { type: 'message', role: 'user', content: 'hello world' },
        { type: 'message', role: 'assistant', content: first.output_text },
        { type: 'message', role: 'user', content: 'good morning' },
      ],
      max_output_tokens: 32,
    });
    assert.equal(second.output_text, whole.output_text);
    assert.equal(second.usage.input_tokens, whole.usage.input_tokens);
    const missing = await request(ctx.server, 'POST', '/v1/responses', {
      body: { model: 'demo', input: 'hi', previous_response_id: 'resp_nope' },
    });
    assert.equal(missing.status, 404);
  });

  test('content parts: input_text is read; an unknown part type is a 400 naming it', async () => {
    const parts = await oai().responses.create({
      model: 'demo',
      input: [{ type: 'message', role: 'user', content: [{ type: 'input_text', text: 'hello world' }] }],
      max_output_tokens: 32,
    });
    assert.equal(parts.output_text, 'HELLO WORLD');
    const bad = await request(ctx.server, 'POST', '/v1/responses', {
      body: { model: 'demo', input: [{ type: 'message', role: 'user', content: [{ type: 'input_video' }] }] },
    });
    assert.equal(bad.status, 400, bad.text);
    assert.match(bad.json.error.message, /input_video/);
    assert.match(bad.json.error.param, /content\[0\]\.type/);
  });

  test('tools that is not an array is a 400 naming the field, as on chat completions; null is no tools', async () => {
    for (const tools of [{ type: 'function', name: 'f' }, 'f', 3, true]) {
      for (const stream of [false, true]) {
        const r = await request(ctx.server, 'POST', '/v1/responses', {
          body: { model: 'demo', input: 'hello world', max_output_tokens: 8, tools, stream },
        });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.type, 'invalid_request_error', r.text);
        assert.equal(r.json.error.param, 'tools', r.text);
        const chat = await request(ctx.server, 'POST', '/v1/chat/completions', {
          body: { model: 'demo', messages: [{ role: 'user', content: 'hello world' }], max_tokens: 8, tools, stream },
        });
        assert.equal(chat.status, 400, chat.text);
        assert.equal(r.json.error.message, chat.json.error.message);
      }
    }
    const none = await oai().responses.create({ model: 'demo', input: 'hello world', max_output_tokens: 32, tools: null });
    assert.equal(none.output_text, 'HELLO WORLD');
  });

  test('a tools entry that is not a tool is a 400 naming it, never dropped; a hosted tool is left out', async () => {
    const cases = [
      [[3], 'tools[0]'],
      [[{ name: 'f' }], 'tools[0].type'],
      [[{ type: 'web_search' }, { type: 7 }], 'tools[1].type'],
      [[{ type: 'function' }], 'tools[0].name'],
    ];
    for (const [tools, param] of cases) {
      for (const stream of [false, true]) {
        const r = await request(ctx.server, 'POST', '/v1/responses', {
          body: { model: 'demo', input: 'hello world', max_output_tokens: 8, tools, stream },
        });
        assert.equal(r.status, 400, r.text);
        assert.equal(r.json.error.param, param, r.text);
      }
    }
    const ok = await oai().responses.create({
      model: 'demo',
      input: 'hello world',
      max_output_tokens: 32,
      tools: [{ type: 'web_search_preview' }, { type: 'function', name: 'f', parameters: { type: 'object' } }],
    });
    assert.ok(['completed', 'incomplete'].includes(ok.status), ok.status);
  });

  test("@ai-sdk/openai's default model (Responses) generates and streams", async () => {
    const provider = createOpenAI({ baseURL: `${ctx.server.base}/v1`, apiKey: 'sk-lathe-test' });
    const { text } = await generateText({ model: provider('demo'), prompt: 'hello world', maxOutputTokens: 32 });
    assert.equal(text, 'HELLO WORLD');
    const s = streamText({ model: provider('demo'), prompt: 'hello world', maxOutputTokens: 32 });
    let streamed = '';
    for await (const part of s.textStream) streamed += part;
    assert.equal(streamed, 'HELLO WORLD');
  });
});
