// The train → serve loop (issue #19): `lathe train` teaches the demo model (which echoes a message in upper case)
// to answer every question with one word; the adapter it writes then mounts in `lathe serve` and changes the
// answer through the HTTP API, per request, while the base model's answer stays what it was.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { DEMO_MODEL, lathe, openaiClient, readJson, startServer } from './harness.js';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-ft-serve-'));
const data = path.join(dir, 'data');
const out = path.join(dir, 'adapter');
const questions = ['what is the sky', 'tell me a joke', 'how are you', 'where is paris', 'name a color', 'count to three',
  'who wrote hamlet', 'is water wet', 'why is grass green', 'what time is it', 'give me a number', 'say something'];
const row = (q) => JSON.stringify({ messages: [{ role: 'user', content: q }, { role: 'assistant', content: 'banana' }] });

let server;
before(async () => {
  fs.mkdirSync(data);
  const train = [];
  for (let i = 0; i < 60; i++) train.push(row(`${questions[(i * 7) % questions.length]} ${i}`));
  fs.writeFileSync(path.join(data, 'train.jsonl'), train.join('\n') + '\n');
  fs.writeFileSync(path.join(data, 'valid.jsonl'), [row('question number 1 please'), row('question number 2 please')].join('\n') + '\n');
  lathe(['train', '--model', DEMO_MODEL, '--data', data, '--adapter-path', out, '--iters', '100',
    '--learning-rate', '1e-3', '--rank', '8', '--steps-per-eval', '100', '--steps-per-report', '100']);
  server = await startServer({ args: ['--adapter', out] });
});
after(async () => {
  if (server) await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('a fine-tuned adapter, served', () => {
  test('training lowered the validation loss', () => {
    const vals = fs.readFileSync(path.join(out, 'metrics.jsonl'), 'utf8').trim().split('\n').map(JSON.parse)
      .filter((e) => e.type === 'metric' && e.kind === 'val');
    assert.ok(vals.length >= 2, JSON.stringify(vals));
    assert.ok(vals.at(-1).loss < 0.25 * vals[0].loss, `val loss ${vals[0].loss} → ${vals.at(-1).loss}`);
    assert.equal(readJson(path.join(out, 'adapter_config.json')).lora_parameters.rank, 8);
  });

  test('questions it never saw get the taught answer; adapter "none" gets the base model', async () => {
    const oai = openaiClient(server);
    for (const q of ['where is the moon', 'what is two plus two']) {
      const messages = [{ role: 'user', content: q }];
      const taught = await oai.chat.completions.create({ model: 'adapter', messages, max_tokens: 12 });
      assert.equal(taught.choices[0].message.content, 'banana', q);
      const base = await oai.chat.completions.create({ model: 'demo', messages, max_tokens: 32, adapter: 'none' });
      assert.equal(base.choices[0].message.content, q.toUpperCase());
    }
  });
});
