// Building a large chat prompt (body → JSON → template values → rendered text → token ids) peaks at a small
// multiple of the body: its text is moved along, not copied at each stage, and of its ids no more than the
// context's are kept (see docs/benchmarks/serving.md).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { describe, test } from 'node:test';

import { request, useServer } from './harness.js';

const ctx = useServer({ args: ['--max-body-bytes', String(32 << 20)] });
const MiB = 2 ** 20;

function status(pid, key) {
  return Number(new RegExp(`${key}:\\s+(\\d+) kB`).exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'))[1]) * 1024;
}

// The peak RSS growth of the server while it answers one request (the high-water mark is reset first, so what
// earlier requests peaked at does not hide this one).
async function peakGrowth(path, body) {
  const pid = ctx.server.pid;
  const data = JSON.stringify(body);
  fs.writeFileSync(`/proc/${pid}/clear_refs`, '5');
  const base = status(pid, 'VmRSS');
  const r = await request(ctx.server, 'POST', path, { body });
  return { r, grew: status(pid, 'VmHWM') - base, size: Buffer.byteLength(data) };
}

// 8 MB of text makes ~5M demo tokens: far past the demo's context, so the answer is the context error, which
// needs the whole prompt counted first (exactly: the error names the count) but only a context's worth of its ids
// kept. Before: 13.5x the body (one message), 11x (many); 8.7x / 8.0x / 7.6x while every id was kept.
const repeats = Math.floor((8 * MiB) / 12);
const text = 'hello world '.repeat(repeats);
const bound = 7;

// The token count of one user message of `hello world ` x n, for any n: linear in n (checked on three prompts
// under the context, counted by /tokenize).
async function chatCount(n) {
  const counts = [];
  for (const k of [1, 2, 3]) {
    const r = await request(ctx.server, 'POST', '/tokenize', {
      body: { messages: [{ role: 'user', content: 'hello world '.repeat(k) }] },
    });
    assert.equal(r.status, 200, r.text);
    counts.push(r.json.count);
  }
  const step = counts[1] - counts[0];
  assert.equal(counts[2] - counts[1], step, `not linear: ${counts}`);
  return counts[0] + (n - 1) * step;
}

describe('prompt build memory', () => {
  const cases = [
    ['/v1/chat/completions one message', '/v1/chat/completions', { max_tokens: 1, messages: [{ role: 'user', content: text }] }, true],
    [
      '/v1/chat/completions many messages',
      '/v1/chat/completions',
      {
        max_tokens: 1,
        messages: Array.from({ length: 8 * 1024 }, (_, i) => ({
          role: i % 2 ? 'assistant' : 'user',
          content: 'word '.repeat(200),
        })),
      },
      false,
    ],
    ['/v1/messages', '/v1/messages', { model: 'demo', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text }] }] }, true],
  ];
  for (const [name, path, body, oneMessage] of cases) {
    test(`${name}: peak RSS within ${bound}x the body, the exact count in the error`, async (t) => {
      const { r, grew, size } = await peakGrowth(path, body);
      assert.equal(r.status, 400, r.text.slice(0, 200));
      const m = /the prompt is (\d+) tokens; the model's context is (\d+)/.exec(r.text);
      assert.ok(m, r.text.slice(0, 200));
      assert.equal(Number(m[2]), 1024);
      // The ids past the context are counted, not kept: the count is still the whole prompt's.
      if (oneMessage) assert.equal(Number(m[1]), await chatCount(repeats));
      t.diagnostic(`body ${(size / MiB).toFixed(1)} MiB, ${m[1]} tokens, peak RSS +${(grew / MiB).toFixed(1)} MiB (${(grew / size).toFixed(1)}x)`);
      // Under ASan freed memory sits in quarantine (and its allocator pads each block): RSS is no measure there.
      if (process.env.LATHE_SANITIZED !== '1')
        assert.ok(grew < bound * size, `peak RSS grew ${(grew / MiB).toFixed(0)} MiB for a ${(size / MiB).toFixed(1)} MiB body`);
    });
  }
});
