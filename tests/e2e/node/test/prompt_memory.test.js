// Building a large chat prompt (body → JSON → template values → rendered text → token ids) peaks at a small
// multiple of the body: its text is moved along, not copied at each stage (see docs/benchmarks/serving.md).
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
// needs the whole prompt built and counted first. Before: 13.5x the body (one message), 11x (many).
const text = 'hello world '.repeat((8 * MiB) / 12);
const bound = 10;

describe('prompt build memory', () => {
  const cases = [
    ['/v1/chat/completions one message', '/v1/chat/completions', { max_tokens: 1, messages: [{ role: 'user', content: text }] }],
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
    ],
    ['/v1/messages', '/v1/messages', { model: 'demo', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text }] }] }],
  ];
  for (const [name, path, body] of cases) {
    test(`${name}: peak RSS within ${bound}x the body`, async (t) => {
      const { r, grew, size } = await peakGrowth(path, body);
      assert.equal(r.status, 400, r.text.slice(0, 200));
      assert.match(r.text, /the prompt is \d+ tokens/);
      t.diagnostic(`body ${(size / MiB).toFixed(1)} MiB, peak RSS +${(grew / MiB).toFixed(1)} MiB (${(grew / size).toFixed(1)}x)`);
      // Under ASan freed memory sits in quarantine (and its allocator pads each block): RSS is no measure there.
      if (process.env.LATHE_SANITIZED !== '1')
        assert.ok(grew < bound * size, `peak RSS grew ${(grew / MiB).toFixed(0)} MiB for a ${(size / MiB).toFixed(1)} MiB body`);
    });
  }
});
