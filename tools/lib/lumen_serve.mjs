// lumen_serve.mjs - what the tools that drive `lumen serve` share: starting
// a server on a free loopback port and stopping it, and cutting a
// server-sent-event stream into its JSON chunks.
import { spawn } from 'node:child_process';

// Starts `bin argv` (argv should hold `serve ... --port 0`) and resolves,
// once the server names its address on stderr, to { proc, url, log(), banner }.
export function startServer(bin, argv) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
    let log = '';
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m && !proc.started) {
        proc.started = true;
        resolve({ proc, url: `http://127.0.0.1:${m[1]}`, log: () => log, banner: log.split('\n')[0] });
      }
    });
    proc.on('exit', (c) => proc.started || reject(new Error(`server exited ${c}: ${log}`)));
  });
}

// SIGTERM and wait; resolves to the exit code or signal.
export function stopServer(s) {
  return new Promise((res) => {
    if (s.proc.exitCode !== null || s.proc.signalCode !== null) return res(s.proc.exitCode ?? s.proc.signalCode);
    s.proc.on('exit', (c, sig) => res(c ?? sig));
    s.proc.kill('SIGTERM');
  });
}

// Feeds a chunk of an SSE body; calls onEvent(json) for each complete
// `data: {...}` event and onEvent(null) for `data: [DONE]`. Returns the
// incomplete tail to pass back in with the next chunk.
export function sseFeed(buf, onEvent) {
  let i;
  while ((i = buf.indexOf('\n\n')) >= 0) {
    const ev = buf.slice(0, i);
    buf = buf.slice(i + 2);
    if (!ev.startsWith('data: ')) continue;
    const data = ev.slice(6);
    onEvent(data === '[DONE]' ? null : JSON.parse(data));
  }
  return buf;
}
