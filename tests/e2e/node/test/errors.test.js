// Error statuses and shapes: 400 (invalid JSON, wrong types, out-of-range values — each naming the field),
// 401 (--api-key), 404, 405, 413 (--max-body-bytes), 429 with Retry-After (--max-queue), on the OpenAI surface
// as {"error":{message,type,param,code}} and on /v1/messages as {"type":"error","error":{type,message}}.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import {
  anthropicClient,
  metricValue,
  openaiClient,
  request,
  scrape,
  startServer,
  waitFor,
} from './harness.js';

const MAX_BODY = 4096;
const hello = [{ role: 'user', content: 'hello world' }];

function assertOpenAIError(r, status, field) {
  assert.equal(r.status, status, `status ${r.status}: ${r.text}`);
  assert.ok(r.json && typeof r.json.error === 'object', `OpenAI error shape: ${r.text}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.equal(typeof e.type, 'string');
  assert.ok('param' in e && 'code' in e, `error has param and code: ${r.text}`);
  if (field) assert.ok(`${e.param ?? ''} ${e.message}`.includes(field), `names ${field}: ${r.text}`);
  assert.match(r.headers.get('content-type') ?? '', /application\/json/);
}

function assertAnthropicError(r, status, type = status >= 500 ? 'api_error' : null) {
  assert.equal(r.status, status, `status ${r.status}: ${r.text}`);
  assert.ok(r.json, `JSON body: ${r.text}`);
  assert.equal(r.json.type, 'error', r.text);
  assert.equal(typeof r.json.error?.type, 'string', r.text);
  assert.equal(typeof r.json.error?.message, 'string', r.text);
  if (type) assert.equal(r.json.error.type, type);
}

describe('server with --max-body-bytes and --max-queue', () => {
  let server;
  before(async () => {
    server = await startServer({ args: ['--max-body-bytes', `${MAX_BODY}`, '--max-queue', '1'] });
  });
  after(async () => server?.stop());
  const post = (route, body, headers) => request(server, 'POST', route, { body, headers });

  describe('400', () => {
    test('invalid JSON', async () => {
      assertOpenAIError(await post('/v1/chat/completions', '{"messages": [{"role": "user", "content": "hi"}'), 400);
      assertOpenAIError(await post('/v1/completions', 'not json at all'), 400);
      assertOpenAIError(await post('/v1/chat/completions', ''), 400);
    });

    test('a JSON body that is not an object', async () => {
      assertOpenAIError(await post('/v1/chat/completions', '[1, 2, 3]'), 400);
      assertOpenAIError(await post('/v1/chat/completions', '"hello"'), 400);
    });

    const bad = [
      ['messages missing', {}, 'messages'],
      ['messages not an array', { messages: 'hello' }, 'messages'],
      ['messages empty', { messages: [] }, 'messages'],
      ['message not an object', { messages: ['hello'] }, 'messages'],
      ['message content a number', { messages: [{ role: 'user', content: 42 }] }, 'content'],
      ['temperature a string', { messages: hello, temperature: 'hot' }, 'temperature'],
      ['temperature negative', { messages: hello, temperature: -1 }, 'temperature'],
      ['max_tokens a string', { messages: hello, max_tokens: 'ten' }, 'max_tokens'],
      ['max_tokens negative', { messages: hello, max_tokens: -5 }, 'max_tokens'],
      ['max_tokens fractional', { messages: hello, max_tokens: 2.5 }, 'max_tokens'],
      ['max_completion_tokens negative', { messages: hello, max_completion_tokens: -1 }, 'max_completion_tokens'],
      ['top_p a string', { messages: hello, top_p: 'x' }, 'top_p'],
      ['top_k a string', { messages: hello, top_k: 'x' }, 'top_k'],
      ['min_p out of range', { messages: hello, min_p: 3 }, 'min_p'],
      ['stream a string', { messages: hello, stream: 'yes' }, 'stream'],
      ['stop a number', { messages: hello, stop: 5 }, 'stop'],
      ['seed a string', { messages: hello, seed: 'abc' }, 'seed'],
      ['logprobs a string', { messages: hello, logprobs: 'yes' }, 'logprobs'],
      ['top_logprobs a string', { messages: hello, logprobs: true, top_logprobs: 'two' }, 'top_logprobs'],
      ['top_logprobs 21', { messages: hello, logprobs: true, top_logprobs: 21 }, 'top_logprobs'],
      ['top_logprobs -2', { messages: hello, logprobs: true, top_logprobs: -2 }, 'top_logprobs'],
      ['tools not an array', { messages: hello, tools: 'get_weather' }, 'tools'],
    ];
    for (const [name, body, field] of bad) {
      test(`chat: ${name}`, async () => {
        assertOpenAIError(await post('/v1/chat/completions', body), 400, field);
      });
    }

    test('completions: prompt missing, wrong type', async () => {
      assertOpenAIError(await post('/v1/completions', {}), 400, 'prompt');
      assertOpenAIError(await post('/v1/completions', { prompt: { text: 'x' } }), 400, 'prompt');
      // OpenAI's batch forms (strings, arrays of ids) were "prompt[0] is not a token id of this model".
      for (const prompt of [['a', 'b'], [[1, 2], [3]]]) {
        const r = await post('/v1/completions', { prompt });
        assertOpenAIError(r, 400, 'prompt');
        assert.match(r.json.error.message, /one prompt per request/);
      }
      assertOpenAIError(await post('/v1/completions', { prompt: 'hi', max_tokens: 'ten' }), 400, 'max_tokens');
    });

    test('a prompt over the context: context_length_exceeded naming the field that holds it', async () => {
      const ids = Array(1100).fill(5);  // the demo's context is 1024 (and this suite's body limit 4096 bytes)
      const c = await post('/v1/completions', { prompt: ids, max_tokens: 4 });
      assertOpenAIError(c, 400);
      assert.equal(c.json.error.code, 'context_length_exceeded', c.text);
      assert.equal(c.json.error.param, 'prompt', c.text);
      const m = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'a '.repeat(1100) }] });
      assertOpenAIError(m, 400);
      assert.equal(m.json.error.code, 'context_length_exceeded', m.text);
      assert.equal(m.json.error.param, 'messages', m.text);
      // A string prompt is counted past the context, not kept: the message gives its whole length.
      const s = await post('/v1/completions', { prompt: 'a '.repeat(1100), max_tokens: 4 });
      assertOpenAIError(s, 400);
      assert.equal(s.json.error.code, 'context_length_exceeded', s.text);
      assert.equal(s.json.error.param, 'prompt', s.text);
      const n = Number(/the prompt is (\d+) tokens/.exec(s.json.error.message)?.[1]);
      assert.ok(n > 1024, s.text);
    });

    test('the openai SDK surfaces a BadRequestError with the field', async () => {
      const err = await openaiClient(server)
        .chat.completions.create({ model: 'demo', messages: hello, temperature: 'hot' })
        .then(
          () => null,
          (e) => e,
        );
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.equal(err.status, 400);
      assert.match(`${err.param ?? ''} ${err.message}`, /temperature/);
    });

    test('anthropic: max_tokens is required; errors use the Anthropic shape', async () => {
      const h = { 'anthropic-version': '2023-06-01' };
      assertAnthropicError(await post('/v1/messages', { messages: hello }, h), 400, 'invalid_request_error');
      assertAnthropicError(await post('/v1/messages', { max_tokens: 8, messages: [] }, h), 400, 'invalid_request_error');
      assertAnthropicError(await post('/v1/messages', '{"max_tokens": 8, "messages": [', h), 400, 'invalid_request_error');
      assertAnthropicError(
        await post('/v1/messages', { max_tokens: 'eight', messages: hello }, h),
        400,
        'invalid_request_error',
      );
      // thinking: Anthropic's three types; a budget, when sent, is a positive integer.
      for (const thinking of [{ type: 'on' }, {}, { type: 'enabled', budget_tokens: -1 }, { type: 'enabled', budget_tokens: 'x' }]) {
        const r = await post('/v1/messages', { max_tokens: 8, messages: hello, thinking }, h);
        assertAnthropicError(r, 400, 'invalid_request_error');
        assert.match(r.json.error.message, /thinking\./, JSON.stringify(thinking));
      }
      for (const type of ['enabled', 'disabled', 'adaptive'])
        assert.equal((await post('/v1/messages', { max_tokens: 8, messages: hello, thinking: { type, budget_tokens: 1024 } }, h)).status, 200);
      const err = await anthropicClient(server)
        .messages.create({ model: 'demo', max_tokens: 8, messages: hello, temperature: 'hot' })
        .then(
          () => null,
          (e) => e,
        );
      assert.ok(err instanceof Anthropic.BadRequestError, String(err));
      assert.equal(err.error?.type, 'error');
      assert.equal(err.error?.error?.type, 'invalid_request_error');
    });
  });

  describe('invalid tool schemas: 400 naming the tool and the path, as OpenAI words it', () => {
    const weather = (parameters) => ({ type: 'function', function: { name: 'get_weather', parameters } });
    const good = { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] };

    test('chat: the openai SDK gets a BadRequestError, with tool_choice none or auto', async () => {
      for (const tool_choice of ['none', 'auto']) {
        const err = await openaiClient(server)
          .chat.completions.create({
            model: 'demo',
            messages: hello,
            max_tokens: 1,
            tool_choice,
            tools: [weather(good), weather({ type: 'object', properties: { city: { type: 'str' } } })],
          })
          .then(
            () => null,
            (e) => e,
          );
        assert.ok(err instanceof OpenAI.BadRequestError, String(err));
        assert.equal(err.param, 'tools[1].function.parameters');
        assert.equal(err.code, 'invalid_function_parameters');
        assert.match(err.message, /Invalid schema for function 'get_weather': tools\[1\]\.function\.parameters\.properties\.city\.type: /);
      }
    });

    const bad = [
      ['parameters a string', 'object', /tools\[0\]\.function\.parameters must be a JSON Schema object/],
      ['properties an array', { type: 'object', properties: [] }, /parameters\.properties: /],
      ['required not names', { type: 'object', required: [1] }, /parameters\.required\[0\]: /],
      ['a $ref to nothing', { type: 'object', properties: { a: { $ref: '#/$defs/A' } } }, /\$ref "#\/\$defs\/A" cannot be resolved/],
    ];
    for (const [name, parameters, message] of bad) {
      test(`chat: ${name}`, async () => {
        const r = await post('/v1/chat/completions', { messages: hello, tools: [weather(parameters)] });
        assertOpenAIError(r, 400, 'tools[0].function.parameters');
        assert.match(r.json.error.message, message);
      });
    }

    test('responses: named by the Responses field, counting every tool', async () => {
      const r = await post('/v1/responses', {
        input: 'hello world',
        tools: [
          { type: 'web_search' },
          { type: 'function', name: 'get_weather', parameters: { type: 'object', properties: { a: 'string' } } },
        ],
      });
      assertOpenAIError(r, 400, 'tools[1].parameters');
      assert.match(r.json.error.message, /Invalid schema for function 'get_weather': tools\[1\]\.parameters\.properties\.a: /);
    });

    test('anthropic: input_schema, in the Anthropic shape', async () => {
      const err = await anthropicClient(server)
        .messages.create({
          model: 'demo',
          max_tokens: 1,
          messages: hello,
          tools: [{ name: 'lookup', input_schema: { type: 'object', properties: { q: { type: 7 } } } }],
        })
        .then(
          () => null,
          (e) => e,
        );
      assert.ok(err instanceof Anthropic.BadRequestError, String(err));
      assert.equal(err.error?.error?.type, 'invalid_request_error');
      assert.match(err.error?.error?.message, /Invalid schema for tool 'lookup': tools\[0\]\.input_schema\.properties\.q\.type: /);
    });

    test('valid real-world schemas are still answered', async () => {
      const pydantic = {
        $defs: { Unit: { enum: ['c', 'f'], title: 'Unit', type: 'string' } },
        properties: {
          city: { title: 'City', type: 'string', pattern: '^[A-Z]' },
          unit: { anyOf: [{ $ref: '#/$defs/Unit' }, { type: 'null' }], default: null },
        },
        required: ['city'],
        title: 'Weather',
        type: 'object',
        additionalProperties: false,
      };
      const r = await post('/v1/chat/completions', { messages: hello, max_tokens: 2, tools: [weather(pydantic)] });
      assert.equal(r.status, 200, r.text);
    });
  });

  test('404 for unknown routes', async () => {
    for (const [method, route] of [
      ['GET', '/v1/nope'],
      ['POST', '/v1/nope'],
      ['GET', '/ui/nope.js'],
      ['GET', '/v2/chat/completions'],
    ])
      assertOpenAIError(await request(server, method, route, method === 'POST' ? { body: {} } : {}), 404);
  });

  test('405 for a wrong method on a known route', async () => {
    for (const [method, route] of [
      ['GET', '/v1/chat/completions'],
      ['GET', '/v1/completions'],
      ['DELETE', '/v1/chat/completions'],
      ['POST', '/health'],
      ['POST', '/v1/models'],
    ]) {
      const r = await request(server, method, route, method === 'POST' ? { body: {} } : {});
      assert.equal(r.status, 405, `${method} ${route}: ${r.status} ${r.text}`);
      assertOpenAIError(r, 405);
    }
    const r = await request(server, 'GET', '/v1/messages');
    assertAnthropicError(r, 405);
  });

  test('413 for a body over --max-body-bytes', async () => {
    const big = { messages: [{ role: 'user', content: 'a '.repeat(MAX_BODY) }], max_tokens: 1 };
    assertOpenAIError(await post('/v1/chat/completions', big), 413);
    assertOpenAIError(await post('/v1/completions', { prompt: 'a '.repeat(MAX_BODY), max_tokens: 1 }), 413);
    assertAnthropicError(
      await post('/v1/messages', { max_tokens: 1, ...big }, { 'anthropic-version': '2023-06-01' }),
      413,
    );
    const err = await openaiClient(server)
      .chat.completions.create({ model: 'demo', ...big })
      .then(
        () => null,
        (e) => e,
      );
    assert.equal(err?.status, 413, String(err));
    // A small body on the same server is fine.
    const ok = await post('/v1/chat/completions', { messages: hello, max_tokens: 1 });
    assert.equal(ok.status, 200, ok.text);
  });

  test('429 with Retry-After when the queue is full; the server recovers', async () => {
    // ~100 lowercase words: the demo model answers with a couple of hundred tokens, about a second each.
    const words = 'the quick brown fox jumps over the lazy dog and runs away '.repeat(8);
    const body = JSON.stringify({ messages: [{ role: 'user', content: words }], max_tokens: 400, stream: true });
    const controllers = [];
    const attempts = Array.from({ length: 8 }, async () => {
      const ac = new AbortController();
      controllers.push(ac);
      const res = await fetch(`${server.base}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body,
        signal: ac.signal,
      });
      if (res.status === 200) return { status: 200 };
      return { status: res.status, retryAfter: res.headers.get('retry-after'), text: await res.text() };
    });
    const results = await Promise.all(attempts);
    for (const ac of controllers) ac.abort();
    const rejected = results.filter((r) => r.status === 429);
    assert.ok(results.some((r) => r.status === 200), JSON.stringify(results));
    assert.ok(rejected.length >= 1, JSON.stringify(results));
    assert.ok(results.every((r) => r.status === 200 || r.status === 429), JSON.stringify(results));
    for (const r of rejected) {
      assert.match(r.retryAfter ?? '', /^\d+$/, 'Retry-After is a number of seconds');
      assertOpenAIError({ status: 429, text: r.text, json: JSON.parse(r.text), headers: new Headers({ 'content-type': 'application/json' }) }, 429);
    }
    // The aborted streams are cancelled (a request before that may still get a 429), then requests are served.
    const drained = await waitFor(
      async () => {
        const m = await scrape(server);
        return metricValue(m, 'lathe_requests_in_flight') === 0 && metricValue(m, 'lathe_queue_depth') === 0;
      },
      { timeoutMs: 10000 },
    );
    assert.ok(drained, 'the queue drains after the clients went away');
    const next = await request(server, 'POST', '/v1/chat/completions', { body: { messages: hello, max_tokens: 32 } });
    assert.equal(next.status, 200, next.text);
    assert.equal(next.json.choices[0].message.content, 'HELLO WORLD');
    assert.ok(server.alive());
  });
});

describe('server with --api-key', () => {
  const KEY = 'sk-lathe-e2e-secret';
  let server;
  before(async () => {
    server = await startServer({ args: ['--api-key', KEY] });
  });
  after(async () => server?.stop());
  const chat = (headers) =>
    request(server, 'POST', '/v1/chat/completions', { body: { messages: hello, max_tokens: 32 }, headers });

  test('401 without a key or with a wrong one, OpenAI shape', async () => {
    assertOpenAIError(await chat({}), 401);
    assertOpenAIError(await chat({ authorization: 'Bearer wrong' }), 401);
    assertOpenAIError(await chat({ 'x-api-key': 'wrong' }), 401);
    assertOpenAIError(await chat({ authorization: KEY }), 401);  // not a Bearer credential
    assertOpenAIError(await request(server, 'GET', '/v1/models'), 401);
    assertOpenAIError(
      await request(server, 'POST', '/v1/completions', { body: { prompt: 'hi', max_tokens: 1 } }),
      401,
    );
  });

  test('accepted as Authorization: Bearer and as x-api-key', async () => {
    const a = await chat({ authorization: `Bearer ${KEY}` });
    assert.equal(a.status, 200, a.text);
    assert.equal(a.json.choices[0].message.content, 'HELLO WORLD');
    const b = await chat({ 'x-api-key': KEY });
    assert.equal(b.status, 200, b.text);
  });

  test('openai SDK: AuthenticationError with a wrong key, answers with the right one', async () => {
    const err = await openaiClient(server, { apiKey: 'wrong' })
      .chat.completions.create({ model: 'demo', messages: hello, max_tokens: 4 })
      .then(
        () => null,
        (e) => e,
      );
    assert.ok(err instanceof OpenAI.AuthenticationError, String(err));
    const r = await openaiClient(server, { apiKey: KEY }).chat.completions.create({
      model: 'demo',
      messages: hello,
      max_tokens: 32,
    });
    assert.equal(r.choices[0].message.content, 'HELLO WORLD');
  });

  test('anthropic SDK: 401 in the Anthropic shape with a wrong key, answers with the right one', async () => {
    const err = await anthropicClient(server, { apiKey: 'wrong' })
      .messages.create({ model: 'demo', messages: hello, max_tokens: 4 })
      .then(
        () => null,
        (e) => e,
      );
    assert.ok(err instanceof Anthropic.AuthenticationError, String(err));
    assert.equal(err.error?.type, 'error');
    assert.equal(err.error?.error?.type, 'authentication_error');
    const m = await anthropicClient(server, { apiKey: KEY }).messages.create({
      model: 'demo',
      messages: hello,
      max_tokens: 32,
    });
    assert.equal(m.content[0].text, 'HELLO WORLD');
    const raw = await request(server, 'POST', '/v1/messages', { body: { max_tokens: 4, messages: hello } });
    assertAnthropicError(raw, 401);
  });
});
