// Structured outputs enforced by a grammar mask, through the clients that rely on them: the official openai
// client's parse() with a zod schema, LangChain JS withStructuredOutput (json_schema and function calling), the
// Vercel AI SDK's generateObject, tool_choice "required" / named, the deprecated functions / function_call,
// Anthropic tool_choice, llama-server's grammar and json_schema fields. The demo model answers in upper case, so
// without the mask none of this is JSON.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';

import { createOpenAI } from '@ai-sdk/openai';
import { ChatOpenAI } from '@langchain/openai';
import { generateObject } from 'ai';
import { zodResponseFormat } from 'openai/helpers/zod';
import { z } from 'zod';

import { anthropicClient, openaiClient, request, useServer } from './harness.js';

const ctx = useServer();
const oai = () => openaiClient(ctx.server);
const hello = [{ role: 'user', content: 'hello world' }];
const Greeting = z.object({ word: z.string().max(12), loud: z.boolean() });

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Weather for a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 16 }, days: { type: 'integer', minimum: 0 } },
      required: ['city', 'days'],
      additionalProperties: false,
    },
  },
};

describe('OpenAI response_format', () => {
  test('unconstrained, the demo model does not answer JSON', async () => {
    const r = await oai().chat.completions.create({ model: 'demo', messages: hello, max_tokens: 32 });
    assert.throws(() => JSON.parse(r.choices[0].message.content));
  });

  test('json_object: the reply parses as an object', async () => {
    // Free-form, the demo model fills a key string until max_tokens (it was never taught to close one), so a
    // bias toward the closing characters lets it finish; which tokens come, and in what order, is the mask's.
    const ids = async (text) => (await request(ctx.server, 'POST', '/tokenize', { body: { content: text } })).json.tokens;
    const bias = {};
    for (const t of ['"', '}', ' "', '":']) for (const id of await ids(t)) bias[id] = 8;
    const r = await oai().chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 128,
      logit_bias: bias,
      response_format: { type: 'json_object' },
    });
    assert.equal(r.choices[0].finish_reason, 'stop', r.choices[0].message.content);
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, 'object');
    assert.ok(!Array.isArray(v));
  });

  test('chat.completions.parse with a zod schema returns the parsed object', async () => {
    const r = await oai().chat.completions.parse({
      model: 'demo',
      messages: hello,
      max_tokens: 64,
      response_format: zodResponseFormat(Greeting, 'greeting'),
    });
    const parsed = r.choices[0].message.parsed;
    assert.ok(parsed, r.choices[0].message.content);
    assert.equal(typeof parsed.word, 'string');
    assert.ok(parsed.word.length <= 12);
    assert.equal(typeof parsed.loud, 'boolean');
  });

  test('streamed json_schema output concatenates to a valid object', async () => {
    const stream = await oai().chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 64,
      stream: true,
      response_format: zodResponseFormat(Greeting, 'greeting'),
    });
    let text = '';
    for await (const c of stream) text += c.choices[0]?.delta?.content ?? '';
    assert.deepEqual(Object.keys(JSON.parse(text)), ['word', 'loud']);
  });

  test('an unsupported keyword is a 400 naming it', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: {
        model: 'demo',
        messages: hello,
        response_format: {
          type: 'json_schema',
          json_schema: { name: 'x', schema: { type: 'object', properties: { a: { type: 'number', multipleOf: 3 } } } },
        },
      },
    });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /"multipleOf" is not supported/);
    assert.equal(r.json.error.param, 'response_format.json_schema.schema');
  });

  test('a pattern and numeric bounds are enforced (pydantic constr / conint shapes)', async () => {
    const schema = {
      type: 'object',
      properties: {
        code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2}$' },
        n: { type: 'integer', minimum: 10, maximum: 12 },
      },
      required: ['code', 'n'],
    };
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { model: 'demo', messages: hello, max_tokens: 64, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } },
    });
    assert.equal(r.status, 200, r.text);
    const out = JSON.parse(r.json.choices[0].message.content);
    assert.match(out.code, /^[A-Z]{3}-[0-9]{2}$/);
    assert.ok(Number.isInteger(out.n) && out.n >= 10 && out.n <= 12, String(out.n));
  });
});

describe('tool_choice', () => {
  for (const choice of ['required', { type: 'function', function: { name: 'get_weather' } }]) {
    test(`${JSON.stringify(choice)}: a call with schema-valid arguments`, async () => {
      const r = await oai().chat.completions.create({
        model: 'demo',
        messages: hello,
        max_tokens: 96,
        tools: [weatherTool],
        tool_choice: choice,
      });
      const c = r.choices[0];
      assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
      assert.equal(c.message.tool_calls.length, 1);
      assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
      const args = JSON.parse(c.message.tool_calls[0].function.arguments);
      assert.equal(typeof args.city, 'string');
      assert.ok(Number.isInteger(args.days) && args.days >= 0);
    });
  }

  test('a named tool that is not in tools is a 400', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { model: 'demo', messages: hello, tools: [weatherTool], tool_choice: { type: 'function', function: { name: 'nope' } } },
    });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /nope/);
  });

  test('the deprecated functions / function_call spelling answers with function_call', async () => {
    // As OpenAI answers it: message.function_call (no tool_calls), finish_reason "function_call".
    const forced = { model: 'demo', messages: hello, max_tokens: 96, functions: [weatherTool.function], function_call: { name: 'get_weather' } };
    const r = await oai().chat.completions.create(forced);
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'function_call', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls, undefined);
    assert.equal(c.message.function_call.name, 'get_weather');
    const args = JSON.parse(c.message.function_call.arguments);
    assert.equal(typeof args.city, 'string');
    // Streamed: one function_call delta, then the finish.
    const stream = await oai().chat.completions.create({ ...forced, stream: true });
    let call = null;
    let finish = null;
    for await (const chunk of stream) {
      const ch = chunk.choices[0];
      if (ch?.delta?.function_call) call = ch.delta.function_call;
      if (ch?.finish_reason) finish = ch.finish_reason;
    }
    assert.equal(finish, 'function_call');
    assert.equal(call.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.arguments), args, 'greedy: the same call as the blocking answer');
    // The old turns (an assistant function_call, a "function" result) are accepted in the history.
    const next = await oai().chat.completions.create({
      model: 'demo',
      messages: [...hello, { role: 'assistant', content: null, function_call: c.message.function_call }, { role: 'function', name: 'get_weather', content: 'sunny' }],
      max_tokens: 8,
      functions: [weatherTool.function],
    });
    assert.equal(typeof next.choices[0].message.content, 'string');
    const both = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: { model: 'demo', messages: hello, tools: [weatherTool], functions: [weatherTool.function] },
    });
    assert.equal(both.status, 400);
    assert.equal(both.json.error.param, 'functions');
  });

  test('Anthropic tool_choice any and tool give a tool_use block', async () => {
    for (const tool_choice of [{ type: 'any' }, { type: 'tool', name: 'get_weather' }]) {
      const m = await anthropicClient(ctx.server).messages.create({
        model: 'demo',
        max_tokens: 96,
        messages: hello,
        tools: [{ name: 'get_weather', description: 'Weather', input_schema: weatherTool.function.parameters }],
        tool_choice,
      });
      assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
      const use = m.content.find((b) => b.type === 'tool_use');
      assert.equal(use.name, 'get_weather');
      assert.equal(typeof use.input.city, 'string');
    }
  });
});

describe('llama-server fields', () => {
  test('grammar (GBNF) constrains /v1/completions', async () => {
    const r = await request(ctx.server, 'POST', '/v1/completions', {
      body: { model: 'demo', prompt: 'hello', max_tokens: 16, grammar: 'root ::= ("yes" | "no") "!"' },
    });
    assert.equal(r.status, 200, r.text);
    assert.match(r.json.choices[0].text, /^(yes|no)!$/);
  });

  test('json_schema constrains chat', async () => {
    const r = await request(ctx.server, 'POST', '/v1/chat/completions', {
      body: {
        model: 'demo',
        messages: hello,
        max_tokens: 32,
        json_schema: { type: 'object', properties: { n: { enum: [1, 2, 3] } }, required: ['n'] },
      },
    });
    assert.equal(r.status, 200, r.text);
    assert.ok([1, 2, 3].includes(JSON.parse(r.json.choices[0].message.content).n));
  });

  test('a GBNF syntax error is a 400 with its line', async () => {
    const r = await request(ctx.server, 'POST', '/v1/completions', {
      body: { model: 'demo', prompt: 'hello', grammar: 'root ::= "a"\nroot ::= [' },
    });
    assert.equal(r.status, 400);
    assert.match(r.json.error.message, /grammar line 2/);
  });
});

describe('LangChain JS and the Vercel AI SDK', () => {
  const lc = () =>
    new ChatOpenAI({ model: 'demo', apiKey: 'sk-lathe-test', maxTokens: 128, configuration: { baseURL: `${ctx.server.base}/v1` } });

  test('LangChain withStructuredOutput, json_schema', async () => {
    const out = await lc().withStructuredOutput(Greeting, { method: 'jsonSchema' }).invoke('hello world');
    assert.equal(typeof out.word, 'string');
    assert.equal(typeof out.loud, 'boolean');
  });

  test('LangChain withStructuredOutput, function calling', async () => {
    const out = await lc().withStructuredOutput(Greeting, { method: 'functionCalling', name: 'greeting' }).invoke('hello world');
    assert.equal(typeof out.word, 'string');
    assert.equal(typeof out.loud, 'boolean');
  });

  test('AI SDK generateObject', async () => {
    const provider = createOpenAI({ baseURL: `${ctx.server.base}/v1`, apiKey: 'sk-lathe-test' });
    const { object } = await generateObject({ model: provider.chat('demo'), schema: Greeting, prompt: 'hello world', maxOutputTokens: 64 });
    assert.equal(typeof object.word, 'string');
    assert.equal(typeof object.loud, 'boolean');
  });
});
