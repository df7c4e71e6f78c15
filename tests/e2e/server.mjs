// server.mjs - starts the real `lumen serve` on a free loopback port for the
// end-to-end tests, and stops it with SIGTERM.
//
// LUMEN_BIN picks the binary (default: build/release/lumen from the repository
// root); LUMEN_FIXTURES the fixtures folder (default ../shared/fixtures).
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..', '..');
export const bin = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
const fixtures = process.env.LUMEN_FIXTURES || path.resolve(root, '..', 'shared', 'fixtures');
export const model = path.join(fixtures, 'models', 'qwen3');
// The bundled demo model (trained: it follows the chat format).
export const demoModel = path.join(root, 'models', 'demo');

// Why these tests cannot run here, or null.
export function skipReason() {
  if (!existsSync(path.join(model, 'config.json'))) return `fixture model not found: ${model}`;
  if (!existsSync(bin)) return `lumen binary not found: ${bin} (set LUMEN_BIN)`;
  return null;
}

// Starts the server (on modelPath, the fixture by default); resolves to
// { url, port, proc, log(), stop() }.
export function startServer(args = [], modelPath = model) {
  return new Promise((resolve, reject) => {
    const proc = spawn(bin, ['serve', '-m', modelPath, '--port', '0', '--threads', '1', '--quiet', ...args], {
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    let done = false;
    const timer = setTimeout(() => {
      if (!done) {
        done = true;
        proc.kill('SIGKILL');
        reject(new Error(`lumen serve did not start:\n${log}`));
      }
    }, 30000);
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => {
      log += d;
      const m = /http:\/\/127\.0\.0\.1:(\d+)/.exec(log);
      if (m && !done) {
        done = true;
        clearTimeout(timer);
        const port = Number(m[1]);
        resolve({
          port,
          url: `http://127.0.0.1:${port}`,
          proc,
          log: () => log,
          stop: () => stopServer(proc),
        });
      }
    });
    proc.on('exit', (code) => {
      if (!done) {
        done = true;
        clearTimeout(timer);
        reject(new Error(`lumen serve exited with ${code}:\n${log}`));
      }
    });
  });
}

// SIGTERM; resolves to the exit code (0 = clean shutdown).
function stopServer(proc) {
  return new Promise((resolve) => {
    if (proc.exitCode !== null) return resolve(proc.exitCode);
    const t = setTimeout(() => proc.kill('SIGKILL'), 20000);
    proc.on('exit', (code, sig) => {
      clearTimeout(t);
      resolve(code ?? `signal ${sig}`);
    });
    proc.kill('SIGTERM');
  });
}
