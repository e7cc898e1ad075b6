// Crash durability of the SSD tier: `lathe serve --ssd-cache` is killed with SIGKILL at random moments around
// its spills (KV files written 0.2 s after each request, several queued at once), N times in a row over one
// cache directory. After every kill: each committed KV file verifies (`lathe cache verify`); the restarted
// server comes up, deletes the unfinished .tmp writes and indexes exactly the files on disk (entries and bytes
// in /v1/cache, within the cap); and every answer, restored or not, equals the cold output of its prompt (the
// same prompt under a never-used salt, on the same server).
//
// LATHE_SSD_KILL_RUNS (default 8) sets N; bench/ssd_kill_loop.sh runs 100. LATHE_SSD_KILL_REPORT names a file
// that receives the run's counts as JSON. LATHE_SSD_KILL_SEED makes the kill times reproducible.
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { performance } from 'node:perf_hooks';
import { after, describe, test } from 'node:test';

import { BINARY, openaiClient, request, seededRandom, startServer } from './harness.js';

const RUNS = Number(process.env.LATHE_SSD_KILL_RUNS ?? 8);
const dirs = [];
after(() => {
  for (const d of dirs) fs.rmSync(d, { recursive: true, force: true });
});

// Three conversations, each at four lengths; a run asks new questions after them (a restore serves the prefix).
const CONVERSATIONS = ['ocean tides', 'mountain trails', 'city lights'].map((topic) =>
  Array.from({ length: 4 }, (_, k) =>
    Array.from({ length: 6 * (k + 1) }, (_, i) => `${topic} note ${i} keeps the story going`).join(' '),
  ),
);

async function complete(server, prompt, extra = {}) {
  const r = await openaiClient(server).completions.create({ model: 'demo', prompt, max_tokens: 6, temperature: 0, ...extra });
  return { text: r.choices[0].text, cached: r.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

// .lkv files (count, bytes as the store counts them: the larger of size and allocated blocks) and .tmp files.
// While a server runs, files come and go under the walk: a vanished one is skipped.
function onDisk(dir) {
  const out = { files: 0, bytes: 0, tmp: 0 };
  const gone = (e) => {
    if (e.code !== 'ENOENT') throw e;
  };
  const walk = (d) => {
    let entries = [];
    try {
      entries = fs.readdirSync(d, { withFileTypes: true });
    } catch (e) {
      gone(e);
    }
    for (const e of entries) {
      const p = path.join(d, e.name);
      if (e.isDirectory()) walk(p);
      else if (e.name.endsWith('.tmp')) out.tmp += 1;
      else if (e.name.endsWith('.lkv')) {
        try {
          const st = fs.statSync(p);
          out.files += 1;
          out.bytes += Math.max(st.size, st.blocks * 512);
        } catch (err) {
          gone(err);
        }
      }
    }
  };
  walk(dir);
  return out;
}

describe('serve --ssd-cache under kill -9', () => {
  test(`${RUNS} kills during spills leave no file that loads wrong`, async (t) => {
    const seed = Number(process.env.LATHE_SSD_KILL_SEED ?? Date.now() % 100000);
    t.diagnostic(`seed ${seed}`);
    const random = seededRandom(seed);
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lathe-ssd-kill-'));
    dirs.push(dir);

    const counts = { runs: RUNS, seed, killed_mid_write: 0, tmp_seen: 0, tmp_removed: 0, restored: 0, requests: 0, files_max: 0 };
    const cap = 48 << 20; // small enough that evictions run too
    const args = ['--ssd-cache', dir, '--ssd-demote-idle', '0.2', '--ssd-cache-max', String(cap)];
    // The restarted server cleaned up and indexed exactly what is on disk.
    const check = async (s, run) => {
      const disk = onDisk(dir);
      assert.equal(disk.tmp, 0, `run ${run}: unfinished writes are deleted at start`);
      const info = (await request(s, 'GET', '/v1/cache')).json.ssd;
      assert.equal(info.entries, disk.files, `run ${run}: indexed entries = files on disk`);
      assert.equal(info.bytes, disk.bytes, `run ${run}: indexed bytes = bytes on disk`);
      assert.ok(disk.bytes <= cap, `run ${run}: ${disk.bytes} bytes on disk within the cap`);
      assert.equal(info.removed_invalid, 0, `run ${run}: no committed file was damaged`);
      counts.tmp_removed += info.removed_tmp;
      counts.files_max = Math.max(counts.files_max, disk.files);
    };
    for (let run = 0; run < RUNS; run++) {
      const s = await startServer({ args });
      try {
        await check(s, run);

        // Two or three conversations at once, each at a random length: restores, prefills and queued spills.
        const picks = CONVERSATIONS.filter(() => random() < 0.8);
        if (picks.length === 0) picks.push(CONVERSATIONS[run % CONVERSATIONS.length]);
        // Each prompt is new (so every run writes files) and extends a stored conversation (so it restores one).
        const prompts = picks.map((conv, i) => `${conv[Math.floor(random() * conv.length)]} then question ${run}.${i}`);
        // The cold output: a salt never used before is a namespace with nothing in it.
        const answers = await Promise.all(prompts.map((p) => complete(s, p)));
        const colds = await Promise.all(prompts.map((p, i) => complete(s, p, { cache_salt: `cold-${run}-${i}` })));
        answers.forEach((a, i) => {
          assert.equal(colds[i].cached, 0);
          assert.equal(a.text, colds[i].text, `run ${run}: output equals the cold output`);
          if (a.cached > 0) counts.restored += 1;
        });
        counts.requests += answers.length;
        // Kill inside the spill window: demotion at 0.2 s idle, then the writer's files one by one. Watch for the
        // first .tmp (up to 0.6 s), then kill 0–10 ms later: mid-file, between files, or after the last.
        const until = Date.now() + 600;
        while (Date.now() < until && onDisk(dir).tmp === 0) {}
        const at = performance.now() + random() * 10;
        while (performance.now() < at) {}
      } finally {
        process.kill(s.pid, 'SIGKILL');
        await s.stop();
      }
      const left = onDisk(dir).tmp;
      counts.tmp_seen += left;
      if (left > 0) counts.killed_mid_write += 1;
      // Every committed file is whole: header and every tensor hash check out.
      const v = spawnSync(BINARY, ['cache', 'verify', '--dir', dir], { encoding: 'utf8' });
      assert.equal(v.status, 0, `run ${run}: lathe cache verify: ${v.stdout}${v.stderr}`);
    }
    const last = await startServer({ args });
    try {
      await check(last, RUNS);
    } finally {
      await last.stop();
    }
    t.diagnostic(JSON.stringify(counts));
    if (process.env.LATHE_SSD_KILL_REPORT) fs.writeFileSync(process.env.LATHE_SSD_KILL_REPORT, `${JSON.stringify(counts)}\n`);
    assert.equal(counts.tmp_removed, counts.tmp_seen, 'every unfinished write was removed by the next start');
    assert.ok(counts.restored > 0 || RUNS < 3, 'some requests were served from files written before a kill');
  });
});
