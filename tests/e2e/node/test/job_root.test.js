// serve --job-root: a shared server confines what jobs read and write. Paths outside the roots (symlinks
// followed, '..' refused) are a 403 naming the field before anything reads them; paths inside go on to the
// kind's own checks.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, describe, test } from 'node:test';

import { request, useServer } from './harness.js';

const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-job-root-')));
const root = path.join(dir, 'root');
fs.mkdirSync(root);
fs.symlinkSync('/etc', path.join(root, 'etc-link'));
const ctx = useServer({ args: ['--job-root', root, '--data-dir', path.join(dir, 'data')] });
after(() => fs.rmSync(dir, { recursive: true, force: true }));

const submit = (kind, config) => request(ctx.server, 'POST', '/api/jobs', { body: { kind, config } });

describe('--job-root', () => {
  test('paths outside the roots are 403s naming the field, and nothing is queued', async () => {
    const cases = [
      ['quantize', { model: '/etc', out: path.join(root, 'q4') }, "'model'"],
      ['quantize', { model: path.join(root, 'm'), out: path.join(dir, 'q4') }, "'out'"],
      ['dataset', { template: 'sft_qa_pairs', out: path.join(root, 'd'), pairs_file: '/etc/passwd' }, "'pairs_file'"],
      ['dataset', { template: 'format_conversion', out: path.join(root, 'd'), path: path.join(root, 'etc-link/passwd') }, "'path'"],
      ['finetune', { model_dir: path.join(root, 'm'), data_dir: `${root}/../data`, adapter_path: path.join(root, 'a') }, "'data_dir'"],
    ];
    for (const [kind, config, field] of cases) {
      const r = await request(ctx.server, 'POST', '/api/jobs', { body: { kind, config } });
      assert.equal(r.status, 403, `${kind} ${JSON.stringify(config)}: ${r.text}`);
      assert.match(r.json.error.message, new RegExp(field));
      assert.equal(r.json.error.param, 'config');
    }
    const jobs = await request(ctx.server, 'GET', '/api/jobs');
    assert.deepEqual(jobs.json.jobs, []);
  });

  test('paths inside go on to the kind\'s own checks', async () => {
    const missing = await submit('quantize', { model: path.join(root, 'no-model'), out: path.join(root, 'q4') });
    assert.notEqual(missing.status, 403);
    assert.match(missing.json.error.message, /no-model/);
    const qa = await submit('dataset', { template: 'sft_qa_pairs', out: path.join(root, 'qa'), pairs: 'Q: a\nA: b' });
    assert.equal(qa.status, 201, qa.text);
    assert.equal((await submit('nope', {})).status, 400, 'an unknown kind is still a 400');
  });
});
