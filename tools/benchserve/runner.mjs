// runner.mjs - sends a workload's sessions to one server with at most
// `concurrency` sessions in flight, and sums the run up: wall time, output
// tokens per second, requests per second. Progress goes to `progress`
// (a function taking one line) about twice a second.
import { streamChat } from './client.mjs';

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export async function runSessions(url, sessions, { concurrency, model, apiKey, timeoutMs, progress } = {}) {
  const requests = [];
  const t0 = performance.now();
  let next = 0;
  let outTokens = 0;
  const total = sessions.reduce((n, s) => n + s.length, 0);
  const tick = progress ? setInterval(() => {
    const s = (performance.now() - t0) / 1000;
    progress(`${requests.length}/${total} requests, ${(outTokens / s).toFixed(1)} output tok/s`);
  }, 500) : null;
  async function worker() {
    while (next < sessions.length) {
      const si = next++;
      for (let ti = 0; ti < sessions[si].length; ti++) {
        const turn = sessions[si][ti];
        if (turn.gap_ms) await sleep(turn.gap_ms);
        const r = await streamChat(url, turn.body, { model, apiKey, timeoutMs });
        r.session = si;
        r.turn = ti;
        r.start_ms -= t0;
        outTokens += r.output_tokens ?? 0;
        requests.push(r);
      }
    }
  }
  await Promise.all(Array.from({ length: Math.max(1, concurrency) }, worker));
  if (tick) clearInterval(tick);
  const wall = (performance.now() - t0) / 1000;
  requests.sort((a, b) => a.session - b.session || a.turn - b.turn);
  return {
    wall_s: wall,
    output_tokens: outTokens,
    output_tok_s: outTokens / wall,
    requests_s: requests.length / wall,
    errors: requests.filter((r) => r.error).length,
    requests,
  };
}
