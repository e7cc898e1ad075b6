// The embedded web UI (web/, served at GET /), driven in a real headless Chromium against a real server with an
// API key: the page and its files load without the key and under a strict CSP, the page asks for the key, chat
// streams an answer, a fine-tune job started from its form is followed live to the end (progress, log, loss
// chart), a job page whose read answers late stays out of the next page, a noop job is cancelled from its page
// (and a failed cancel shows why), a long fine-tune stops and saves, the job list filters, bad configs show the
// server's message and queue nothing, and nothing a model says becomes markup. Skipped when no Chromium is
// installed.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';

import { DEMO_MODEL, request, startServer } from './harness.js';

const CHROMIUM = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'].find((p) => fs.existsSync(p));
const KEY = 'sk-web-ui-test';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-web-ui-'));
const auth = { Authorization: `Bearer ${KEY}` };

let server;
before(async () => {
  process.env.LATHE_TEST_JOB_KINDS = '1'; // the noop job kind, for the cancel test
  server = await startServer({ args: ['--api-key', KEY, '--data-dir', path.join(dir, 'data'), '--adapter-dir', dir] });
});
after(async () => {
  if (server) await server.stop();
  fs.rmSync(dir, { recursive: true, force: true });
});

describe('the UI files', () => {
  test('GET / and /ui/* need no key, carry a CSP, and revalidate by ETag', async () => {
    const page = await request(server, 'GET', '/');
    assert.equal(page.status, 200);
    assert.match(page.headers.get('content-type'), /^text\/html/);
    assert.match(page.headers.get('content-security-policy'), /script-src 'self'/);
    assert.equal(page.headers.get('x-content-type-options'), 'nosniff');
    assert.match(page.text, /<script type="module" src="\/ui\/js\/main.js">/);
    const js = await request(server, 'GET', '/ui/js/main.js');
    assert.equal(js.status, 200);
    assert.match(js.headers.get('content-type'), /^text\/javascript/);
    const again = await request(server, 'GET', '/ui/js/main.js', { headers: { 'If-None-Match': js.headers.get('etag') } });
    assert.equal(again.status, 304);
    assert.equal((await request(server, 'GET', '/ui/missing.js')).status, 404);
    assert.equal((await request(server, 'GET', '/ui/%2e%2e/CMakeLists.txt', { headers: auth })).status, 404);
    // The API itself still needs the key.
    assert.equal((await request(server, 'GET', '/api/jobs')).status, 401);
    assert.equal((await request(server, 'POST', '/')).status, 401, 'only GET and HEAD are open');
    assert.equal((await request(server, 'POST', '/', { headers: auth })).status, 405);
  });
});

describe('--no-ui', () => {
  test('turns the page off and leaves the API', async () => {
    const plain = await startServer({ args: ['--no-ui'] });
    try {
      assert.equal((await request(plain, 'GET', '/')).status, 404);
      assert.equal((await request(plain, 'GET', '/ui/js/main.js')).status, 404);
      assert.equal((await request(plain, 'GET', '/v1/models')).status, 200);
    } finally {
      await plain.stop();
    }
  });
});

describe('in Chromium', { skip: CHROMIUM ? false : 'no chromium installed' }, () => {
  let browser;
  let tab;
  let finetuneJobUrl;
  const errors = [];
  before(async () => {
    const { chromium } = await import('playwright-core');
    browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
    tab = await browser.newPage();
    tab.on('pageerror', (e) => errors.push(`pageerror: ${e.message}`));
    // API answers are checked by the tests; every file of the page itself must load.
    tab.on('response', (r) => {
      const url = new URL(r.url());
      if (r.status() >= 400 && (url.pathname === '/' || url.pathname.startsWith('/ui/'))) errors.push(`${r.status()} ${r.url()}`);
    });
  });
  after(async () => {
    await browser?.close();
  });

  test('the page asks for the key, then lists the served model', async () => {
    await tab.goto(`${server.base}/`);
    await tab.waitForSelector('#key-bar:not([hidden]) #api-key');
    await tab.fill('#api-key', KEY);
    await tab.click('#api-key-save');
    await tab.waitForSelector('#chat-model option', { state: 'attached' });
    const models = await tab.$$eval('#chat-model option', (o) => o.map((x) => x.value));
    assert.ok(models.includes('demo'), JSON.stringify(models));
  });

  test('a polling page keeps what is being typed into the key bar', async () => {
    const fresh = await browser.newPage();
    try {
      await fresh.goto(`${server.base}/#/jobs`);
      await fresh.waitForSelector('#key-bar:not([hidden]) #api-key');
      await fresh.fill('#api-key', 'half-typed');
      await fresh.waitForTimeout(2600); // the list polls every 2 s, and each poll gets a 401
      assert.equal(await fresh.inputValue('#api-key'), 'half-typed');
    } finally {
      await fresh.close();
    }
  });

  test('chat streams the answer, with timing under it', async () => {
    await tab.fill('#chat-input', 'hello world');
    await tab.press('#chat-input', 'Enter');
    await tab.waitForFunction(() => document.querySelector('.msg.assistant .meta')?.textContent.includes('first token'));
    assert.equal(await tab.textContent('.msg.assistant .content'), 'HELLO WORLD');
    assert.match(await tab.textContent('.msg.assistant .meta'), /\d+ prompt \+ \d+ tokens · stop/);
  });

  test('the conversation survives a reload of the tab', async () => {
    await tab.reload();
    await tab.waitForSelector('.msg.assistant .content');
    assert.equal(await tab.textContent('.msg.assistant .content'), 'HELLO WORLD');
  });

  test('what a message says stays text', async () => {
    await tab.click('#chat-new');
    const hostile = '<img src=x onerror="window.pwned=1"> <b>bold</b>';
    await tab.fill('#chat-input', hostile);
    await tab.press('#chat-input', 'Enter');
    await tab.waitForFunction(() => document.querySelector('.msg.assistant .meta'));
    assert.equal(await tab.textContent('.msg.user .content'), hostile);
    assert.equal(await tab.$('.msg img, .msg b'), null);
    assert.equal(await tab.evaluate(() => window.pwned), undefined);
  });

  test('answers render as Markdown built from text nodes', async () => {
    const out = await tab.evaluate(async () => {
      const { renderMarkdown } = await import('/ui/js/markdown.js');
      const box = document.createElement('div');
      box.append(renderMarkdown([
        '# Title', 'some **bold** and `code` and *it*', '', '- one', '- two', '', '```js', 'let a = "<b>";', '```',
        '[ok](https://example.com/x) [bad](javascript:alert(1)) <script>window.pwned=2</script>',
      ].join('\n')));
      return {
        tags: [...box.querySelectorAll('*')].map((n) => n.tagName.toLowerCase()).join(','),
        code: box.querySelector('pre code').textContent,
        links: [...box.querySelectorAll('a')].map((a) => a.getAttribute('href')),
        last: box.lastElementChild.textContent,
      };
    });
    assert.equal(out.tags, 'h3,p,strong,code,em,ul,li,li,pre,code,p,a');
    assert.equal(out.code, 'let a = "<b>";');
    assert.deepEqual(out.links, ['https://example.com/x']);
    assert.match(out.last, /\[bad\]\(javascript:alert\(1\)\) <script>window.pwned=2<\/script>$/);
    assert.equal(await tab.evaluate(() => window.pwned), undefined);
  });

  test('a bad config shows the server\'s message and queues nothing', async () => {
    await tab.goto(`${server.base}/#/jobs/new/quantize`);
    await tab.fill('#field-model', path.join(dir, 'no-such-model'));
    await tab.fill('#field-out', path.join(dir, 'q-out'));
    await tab.click('#job-submit');
    await tab.waitForSelector('#form-status.error');
    assert.match(await tab.textContent('#form-status'), /no-such-model/);
    const jobs = await request(server, 'GET', '/api/jobs', { headers: auth });
    assert.equal(jobs.json.jobs.length, 0);
  });

  test('a fine-tune started from its form is followed to the end', async () => {
    const data = path.join(dir, 'ft-data');
    fs.mkdirSync(data);
    const row = (q) => JSON.stringify({ messages: [{ role: 'user', content: q }, { role: 'assistant', content: 'banana' }] });
    const rows = Array.from({ length: 24 }, (_, i) => row(`question ${i} please`));
    fs.writeFileSync(path.join(data, 'train.jsonl'), rows.join('\n') + '\n');
    fs.writeFileSync(path.join(data, 'valid.jsonl'), rows.slice(0, 4).join('\n') + '\n');
    await tab.goto(`${server.base}/#/jobs/new/finetune?model_dir=${encodeURIComponent(DEMO_MODEL)}`);
    await tab.waitForSelector('#field-model_dir');
    assert.equal(await tab.inputValue('#field-model_dir'), DEMO_MODEL, 'the query presets a field');
    await tab.fill('#field-data_dir', data);
    await tab.fill('#field-adapter_path', path.join(dir, 'adapter'));
    await tab.fill('#field-iters', '30');
    await tab.fill('#field-learning_rate', '0.001');
    await tab.click('details:has(#field-extra) summary');
    await tab.fill('#field-extra', '{"steps_per_report": 5, "steps_per_eval": 10}');
    await tab.click('#job-submit');
    await tab.waitForURL(/#\/jobs\/job_[0-9a-f]{16}$/);
    await tab.waitForSelector('#job-status .badge.done', { timeout: 240000 });
    finetuneJobUrl = tab.url();
    assert.match(await tab.textContent('#job-output'), /adapter/);
    assert.ok(fs.existsSync(path.join(dir, 'adapter', 'adapters.safetensors')));
    const points = await tab.getAttribute('#loss-chart polyline.train', 'points');
    assert.ok(points.split(' ').length >= 3, points);
    assert.ok(await tab.$('#loss-chart polyline.val'), 'validation loss is drawn');
    assert.match(await tab.textContent('#job-log'), /train rows 24/);
    const width = await tab.$eval('.progress > div', (d) => d.style.width);
    assert.equal(width, '100%');
  });

  test('the trained adapter mounts from the job page, shows in chat and unmounts from status', async () => {
    await tab.click('#job-mount');
    await tab.waitForSelector('#job-action-note');
    assert.match(await tab.textContent('#job-action-note'), /mounted as 'adapter'/);
    await tab.goto(`${server.base}/#/chat`);
    await tab.waitForSelector('#chat-model option[value="adapter"]', { state: 'attached' });
    await tab.goto(`${server.base}/#/status`);
    await tab.waitForSelector('tr[data-adapter="adapter"] button');
    await tab.click('tr[data-adapter="adapter"] button');
    await tab.waitForSelector('tr[data-available="adapter"] button:not([disabled])');
    const mounted = await request(server, 'GET', '/v1/adapters', { headers: auth });
    assert.deepEqual(mounted.json.data, []);
  });

  test('the trained adapter fuses into its base from the job page', async () => {
    await tab.goto(finetuneJobUrl);
    await tab.click('#job-fuse');
    await tab.waitForURL((u) => u.toString() !== finetuneJobUrl && /#\/jobs\/job_[0-9a-f]{16}$/.test(u.toString()));
    const fuseId = tab.url().split('/').pop();
    await tab.waitForFunction((id) => document.querySelector('#job-view h2 code')?.textContent === id, fuseId);
    await tab.waitForSelector('#job-status .badge.done', { timeout: 120000 });
    const fused = path.join(dir, 'adapter-fused');
    assert.match(await tab.textContent('#job-output'), /adapter-fused/);
    assert.ok(fs.existsSync(path.join(fused, 'config.json')));
    assert.ok(fs.existsSync(path.join(fused, 'model.safetensors.index.json')));
    const summary = JSON.parse(await tab.textContent('#job-summary'));
    assert.ok(summary.fused_modules > 0, JSON.stringify(summary));
    // The same job has its own form.
    await tab.goto(`${server.base}/#/jobs/new/fuse`);
    await tab.waitForSelector('#form-fuse #field-adapter');
    assert.ok(await tab.$('#form-fuse #field-dequantize[type=checkbox]'));
  });

  test('a dataset built from its form opens a fine-tune form on its folder', async () => {
    const out = path.join(dir, 'qa-data');
    await tab.goto(`${server.base}/#/jobs/new/dataset`);
    await tab.waitForSelector('#field-template option[value="sft_qa_pairs"]', { state: 'attached' });
    await tab.selectOption('#field-template', 'sft_qa_pairs');
    await tab.waitForSelector('#field-pairs');
    await tab.fill('#field-out', out);
    const pairs = Array.from({ length: 10 }, (_, i) => `Q: question ${i}\nA: answer ${i}\n`).join('\n');
    await tab.fill('#field-pairs', pairs);
    await tab.click('#job-submit');
    await tab.waitForURL(/#\/jobs\/job_[0-9a-f]{16}$/);
    await tab.waitForSelector('#job-status .badge.done', { timeout: 60000 });
    const summary = JSON.parse(await tab.textContent('#job-summary'));
    assert.equal(summary.rows, 10, JSON.stringify(summary));
    const train = fs.readFileSync(path.join(out, 'train.jsonl'), 'utf8').trim().split('\n').map(JSON.parse);
    assert.equal(train.length, 9);
    assert.deepEqual(train[0].messages, [{ role: 'user', content: 'question 0' }, { role: 'assistant', content: 'answer 0' }]);
    await tab.click('#job-finetune-on');
    await tab.waitForSelector('#field-data_dir');
    assert.equal(await tab.inputValue('#field-data_dir'), out);
  });

  test('a dataset text too large for a job config comes from a file on the server', async () => {
    const file = path.join(dir, 'many-pairs.txt');
    fs.writeFileSync(file, Array.from({ length: 1500 }, (_, i) => `Q: question ${i}\nA: answer ${i}`).join('\n'));
    assert.ok(fs.statSync(file).size > 16 * 1024);
    await tab.goto(`${server.base}/#/jobs/new/dataset?template=sft_qa_pairs`);
    await tab.waitForSelector('#field-pairs_file');
    await tab.fill('#field-out', path.join(dir, 'big-qa'));
    await tab.fill('#field-pairs_file', file);
    await tab.click('#job-submit');
    await tab.waitForSelector('#job-status .badge.done', { timeout: 60000 });
    assert.equal(JSON.parse(await tab.textContent('#job-summary')).rows, 1500);
  });

  test('a dataset template the server refuses shows why', async () => {
    await tab.goto(`${server.base}/#/jobs/new/dataset`);
    await tab.waitForSelector('#field-template option[value="hf_dataset_import"]', { state: 'attached' });
    await tab.selectOption('#field-template', 'hf_dataset_import');
    await tab.waitForSelector('#field-dataset');
    await tab.fill('#field-out', path.join(dir, 'hf-data'));
    await tab.fill('#field-dataset', 'owner/name');
    await tab.click('#job-submit');
    await tab.waitForSelector('#form-status.error');
    assert.match(await tab.textContent('#form-status'), /network/);
  });

  // A job process once kept copies of the server's sockets: a kept-alive browser connection the server closed
  // stayed open, and a Cancel or Stop sent on it waited until the job ended (JobRunner's descriptor test).
  test('a job page left before its job was read stays out of the next page', async () => {
    const ids = [];
    for (let i = 0; i < 2; i++) {
      const made = await request(server, 'POST', '/api/jobs', { headers: auth, body: { kind: 'noop', config: { steps: 0 } } });
      assert.equal(made.status, 201, made.text);
      ids.push(made.json.job.id);
    }
    const [slow, shown] = ids;
    let release;
    const held = new Promise((r) => (release = r));
    await tab.route(`**/api/jobs/${slow}`, async (route) => {
      await held;
      await route.continue().catch(() => {}); // the page may have dropped the request meanwhile
    });
    try {
      await tab.goto(`${server.base}/#/jobs/${slow}`);
      await tab.waitForFunction((id) => location.hash.endsWith(id), slow);
      await tab.goto(`${server.base}/#/jobs/${shown}`);
      await tab.waitForSelector('#job-status .badge.done');
      assert.equal(await tab.textContent('#job-view h2 code'), shown);
      release();
      await new Promise((r) => setTimeout(r, 500));
      const title = await tab.$('#job-view h2 code');
      assert.equal(title && (await title.textContent()), shown, "the late answer left the shown job's page as it was");
    } finally {
      release();
      await tab.unroute(`**/api/jobs/${slow}`);
    }
  });

  test('a running job is cancelled from its page, and the list shows it', async () => {
    const made = await request(server, 'POST', '/api/jobs', { headers: auth, body: { kind: 'noop', config: { steps: 600, step_ms: 100 } } });
    assert.equal(made.status, 201, made.text);
    const id = made.json.job.id;
    await tab.goto(`${server.base}/#/jobs/${id}`);
    await tab.waitForSelector('#job-status .badge.running');
    await tab.waitForFunction(() => document.querySelector('#job-stage')?.textContent !== '–');
    await tab.click('#job-cancel');
    await tab.waitForSelector('#job-status .badge.cancelled', { timeout: 30000 });
    await tab.goto(`${server.base}/#/jobs`);
    await tab.waitForSelector(`tr[data-id="${id}"] .badge.cancelled`);
    assert.ok(await tab.$('tr .badge.done'), 'the fine-tune is listed as done');
  });

  test('a failed cancel shows why and gives the button back', async () => {
    const made = await request(server, 'POST', '/api/jobs', { headers: auth, body: { kind: 'noop', config: { steps: 600, step_ms: 100 } } });
    assert.equal(made.status, 201, made.text);
    const id = made.json.job.id;
    // The cancel request fails once (as a dropped proxy would answer); the job keeps running.
    await tab.route('**/api/jobs/*/cancel', (route) =>
      route.fulfill({ status: 502, contentType: 'application/json', body: JSON.stringify({ error: { message: 'bad gateway (simulated)' } }) }),
    );
    try {
      await tab.goto(`${server.base}/#/jobs/${id}`);
      await tab.waitForSelector('#job-status .badge.running');
      await tab.click('#job-cancel');
      await tab.waitForSelector('#job-action-error');
      assert.match(await tab.textContent('#job-action-error'), /bad gateway \(simulated\)/);
      assert.equal(await tab.isEnabled('#job-cancel'), true, 'the Cancel button is usable again');
    } finally {
      await tab.unroute('**/api/jobs/*/cancel');
    }
    await tab.click('#job-cancel');
    await tab.waitForSelector('#job-status .badge.cancelled', { timeout: 30000 });
    assert.equal(await tab.$('#job-action-error'), null, 'the old error is gone once the cancel went through');
  });

  test('a running fine-tune stops and saves from its page', async () => {
    const made = await request(server, 'POST', '/api/jobs', {
      headers: auth,
      body: {
        kind: 'finetune',
        config: {
          model_dir: DEMO_MODEL,
          data_dir: path.join(dir, 'ft-data'),
          adapter_path: path.join(dir, 'stopped'),
          iters: 100000,
          learning_rate: 0.001,
          steps_per_report: 1,
        },
      },
    });
    assert.equal(made.status, 201, made.text);
    const id = made.json.job.id;
    await tab.goto(`${server.base}/#/jobs/${id}`);
    await tab.waitForSelector('#job-stop');
    await tab.waitForSelector('#loss-chart polyline.train', { timeout: 120000 }); // training has begun
    await tab.click('#job-stop');
    await tab.waitForSelector('#job-status .badge.done', { timeout: 120000 });
    assert.match(await tab.textContent('#job-summary'), /"stopped_early": true/);
    assert.match(await tab.textContent('#job-log'), /stopped early at step \d+ of 100000/);
    assert.ok(fs.existsSync(path.join(dir, 'stopped', 'adapters.safetensors')));
    assert.equal(await tab.$('#job-stop'), null, 'no Stop button on a finished job');
    const again = await request(server, 'POST', `/api/jobs/${id}/stop`, { headers: auth, body: {} });
    assert.equal(again.status, 409, again.text);
    // Run again: a new job with the same config resumes from the checkpoint the stop wrote.
    await tab.click('#job-rerun');
    await tab.waitForURL((u) => /#\/jobs\/job_[0-9a-f]{16}$/.test(u.toString()) && !u.toString().endsWith(id));
    await tab.waitForFunction(() => /resuming from .*\(step \d+\)/.test(document.querySelector('#job-log')?.textContent ?? ''), null, {
      timeout: 120000,
    });
    await tab.waitForSelector('#job-stop');
    await tab.click('#job-stop');
    await tab.waitForSelector('#job-status .badge.done', { timeout: 120000 });
    assert.match(await tab.textContent('#job-summary'), /"resumed_from": [1-9]/);
    const noop = await request(server, 'POST', '/api/jobs', { headers: auth, body: { kind: 'noop', config: { steps: 0 } } });
    const refused = await request(server, 'POST', `/api/jobs/${noop.json.job.id}/stop`, { headers: auth, body: {} });
    assert.equal(refused.status, 400, refused.text);
    assert.match(refused.json.error.message ?? refused.json.error, /cannot stop early/);
  });

  test('the job list filters by kind and status, and a reload keeps the filter', async () => {
    await tab.goto(`${server.base}/#/jobs`);
    await tab.waitForSelector('#jobs-rows tr .badge.cancelled');
    await tab.waitForSelector('#jobs-rows tr .badge.done');
    await tab.selectOption('#jobs-status', 'cancelled');
    await tab.waitForFunction(() => location.hash === '#/jobs?status=cancelled');
    await tab.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#jobs-rows tr')];
      return rows.length > 0 && rows.every((r) => r.querySelector('.badge.cancelled'));
    });
    await tab.reload();
    await tab.waitForSelector('#jobs-rows tr .badge.cancelled');
    assert.equal(await tab.inputValue('#jobs-status'), 'cancelled', 'the filter survives the reload');
    assert.equal(await tab.$('#jobs-rows tr .badge.done'), null, 'no done job is listed');
    await tab.selectOption('#jobs-kind', 'finetune');
    await tab.waitForFunction(() => location.hash === '#/jobs?status=cancelled&kind=finetune');
    await tab.waitForFunction(() => document.querySelector('#jobs-note')?.textContent === 'No jobs match.');
    await tab.selectOption('#jobs-status', '');
    await tab.waitForFunction(() => location.hash === '#/jobs?kind=finetune');
    await tab.waitForFunction(() => {
      const rows = [...document.querySelectorAll('#jobs-rows tr')];
      return rows.length > 0 && rows.every((r) => r.children[1].textContent === 'finetune');
    });
  });

  test('the status page shows the model and live counters', async () => {
    await tab.goto(`${server.base}/#/status`);
    await tab.waitForSelector('#status-model');
    assert.equal(await tab.textContent('#status-model'), 'demo');
    assert.ok(Number(await tab.textContent('#status-generated')) > 0);
  });

  test('no script error on any page', () => {
    assert.deepEqual(errors, []);
  });
});
