// The web UI on the path a user takes, in headless Chromium against a real `lathe serve` on the demo model:
//  - load: from navigation to the model list drawn (the page, its modules and the first API call), per reload;
//  - chat: time to first token as the page shows it, against the same request's from a plain streaming fetch;
//  - job events: a noop job of N steps (stage events with no pause) followed live from submit to "done" on its
//    page, against reading the same job's event stream with ?follow=0 outside the browser — the cost of the
//    page's event parsing and drawing.
// Prints one JSON line. Usage: node bench/web_ui.mjs [build-dir] [rounds] [job-steps]
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';

const here = path.dirname(new URL(import.meta.url).pathname);
const root = path.resolve(here, '..');
const build = path.resolve(process.argv[2] ?? path.join(root, 'build'));
const rounds = Number(process.argv[3] ?? 10);
const steps = Number(process.argv[4] ?? 2000);
const { chromium } = await import(path.join(root, 'tests/e2e/node/node_modules/playwright-core/index.mjs'));

const dataDir = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-web-bench-'));
const proc = spawn(path.join(build, 'lathe'), ['serve', '--port', '0', '--data-dir', dataDir], {
  env: { ...process.env, LATHE_TEST_JOB_KINDS: '1' },
  stdio: ['ignore', 'pipe', 'pipe'],
});
const base = await new Promise((resolve, reject) => {
  let log = '';
  const onData = (d) => {
    log += d;
    const m = /listening on (http:\/\/[^\s]+)/.exec(log);
    if (m) resolve(m[1]);
  };
  proc.stdout.on('data', onData);
  proc.stderr.on('data', onData);
  proc.on('exit', (c) => reject(new Error(`lathe serve exited ${c}: ${log}`)));
});
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const result = { rounds, job_steps: steps };
const browser = await chromium.launch({ executablePath: '/usr/bin/chromium', args: ['--no-sandbox'] });
try {
  const tab = await browser.newPage();
  result.page_bytes = fs.readdirSync(path.join(root, 'web'), { recursive: true })
    .map((f) => path.join(root, 'web', f)).filter((f) => fs.statSync(f).isFile())
    .reduce((n, f) => n + fs.statSync(f).size, 0);
  const loads = [];
  for (let i = 0; i < rounds; i++) {
    const t = performance.now();
    await tab.goto(`${base}/#/chat`);
    await tab.waitForSelector('#chat-model option', { state: 'attached' });
    loads.push(performance.now() - t);
  }
  result.load_ms_p50 = median(loads);

  const pageTtft = [];
  const rawTtft = [];
  for (let i = 0; i < rounds; i++) {
    await tab.click('#chat-new');
    await tab.fill('#chat-input', 'hello world');
    await tab.press('#chat-input', 'Enter');
    await tab.waitForFunction(() => document.querySelector('.msg.assistant .meta')?.textContent.includes('first token'));
    pageTtft.push(Number(/first token (\d+) ms/.exec(await tab.textContent('.msg.assistant .meta'))[1]));
    const t = performance.now();
    const res = await fetch(`${base}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: [{ role: 'user', content: 'hello world' }], stream: true }),
    });
    const reader = res.body.getReader();
    for (let got = ''; !/"content":"[^"]/.test(got); ) got += new TextDecoder().decode((await reader.read()).value);
    rawTtft.push(performance.now() - t);
    await reader.cancel();
  }
  result.chat_ttft_ms_page_p50 = median(pageTtft);
  result.chat_ttft_ms_fetch_p50 = median(rawTtft);

  const submit = () =>
    fetch(`${base}/api/jobs`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ kind: 'noop', config: { steps, step_ms: 0 } }),
    }).then((r) => r.json());
  const pageJob = [];
  const rawJob = [];
  for (let i = 0; i < Math.min(rounds, 5); i++) {
    let t = performance.now();
    const { job } = await submit();
    await tab.goto(`${base}/#/jobs/${job.id}`);
    await tab.waitForSelector('#job-status .badge.done', { timeout: 120000 });
    pageJob.push(performance.now() - t);
    t = performance.now();
    const other = (await submit()).job.id;
    for (;;) {
      const r = await fetch(`${base}/api/jobs/${other}`).then((x) => x.json());
      if (r.job.status === 'done') break;
      await new Promise((r) => setTimeout(r, 5));
    }
    const text = await fetch(`${base}/api/jobs/${other}/events?follow=0`).then((r) => r.text());
    rawJob.push(performance.now() - t);
    result.job_events = text.split('\n\n').filter((f) => f.includes('data:')).length;
  }
  result.job_ms_page_p50 = median(pageJob);
  result.job_ms_fetch_p50 = median(rawJob);
} finally {
  await browser.close();
  proc.kill('SIGTERM');
  fs.rmSync(dataDir, { recursive: true, force: true });
}
console.log(JSON.stringify(result));
