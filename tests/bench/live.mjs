// live.mjs - what the live tests share: the lumen binary (LUMEN_BIN, default
// build/release/lumen), and `lumen serve` on the demo model on a free port.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { startServer, stopServer } from '../../tools/lib/lumen_serve.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
export const root = path.resolve(here, '..', '..');
export const bin = process.env.LUMEN_BIN || path.join(root, 'build', 'release', 'lumen');
export const demoModel = path.join(root, 'models', 'demo');

export function skipReason() {
  if (!existsSync(bin)) return `lumen binary not found: ${bin} (set LUMEN_BIN)`;
  if (!existsSync(path.join(demoModel, 'config.json'))) return `demo model not found: ${demoModel}`;
  return null;
}

// Resolves to { url, stop() }.
export async function serveDemo(args = []) {
  const s = await startServer(bin, ['serve', '-m', demoModel, '--alias', 'demo', '--port', '0', '--threads', '1', '--quiet', ...args]);
  return { url: s.url, log: s.log, stop: () => stopServer(s) };
}
