// opencode.test.mjs - opencode (opencode-ai, pinned in package.json; the npm
// package carries the prebuilt binary) against `lumen serve` on the demo
// model as a custom provider (@ai-sdk/openai-compatible, which the binary
// bundles) in opencode.json, one turn with `opencode run`.
//
// Offline: OPENCODE_DISABLE_MODELS_FETCH stops the fetch of the model
// catalogue; the provider package is bundled, so nothing is installed at
// start; auto-update, sharing and LSP downloads are off.
//
// opencode's build agent (system prompt and ten tools) is about 10,000 tokens
// of the demo model's tokenizer, beyond its 4096-token context, and a
// context-length error sends opencode into compaction retries. The config
// keeps the read tool and a one-line prompt.
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { assertCleanTurn, assertToolRoundTrip, isolated, modelName, runTurn, skipReason, toolNames } from '../lib/harness.mjs';

const dir = path.dirname(fileURLToPath(import.meta.url));
const skip = skipReason(dir, 'opencode');
const off = ['bash', 'edit', 'write', 'glob', 'grep', 'task', 'todowrite', 'webfetch', 'skill'];

function config(url) {
  return {
    $schema: 'https://opencode.ai/config.json',
    autoupdate: false,
    share: 'disabled',
    provider: {
      lumen: {
        npm: '@ai-sdk/openai-compatible',
        name: 'lumen',
        options: { baseURL: `${url}/v1`, apiKey: 'unused' },
        models: { [modelName]: { name: modelName, tool_call: true, limit: { context: 4096, output: 256 } } },
      },
    },
    model: `lumen/${modelName}`,
    small_model: `lumen/${modelName}`,
    tools: Object.fromEntries(off.map((t) => [t, false])),
    agent: { build: { prompt: 'You are a coding assistant. Use the tools when they help.' } },
  };
}

function setup(prompt) {
  return ({ home, work, url }) => {
    const cfg = path.join(home, '.config', 'opencode');
    mkdirSync(cfg, { recursive: true });
    writeFileSync(path.join(cfg, 'opencode.json'), JSON.stringify(config(url), null, 2));
    writeFileSync(path.join(work, 'hello.txt'), 'The secret word is lumen-opencode-4821.\n');
    return {
      cmd: path.join(dir, 'node_modules', '.bin', 'opencode'),
      args: ['run', prompt],
      env: {
        OPENCODE_DISABLE_MODELS_FETCH: '1',
        OPENCODE_DISABLE_AUTOUPDATE: '1',
        OPENCODE_DISABLE_LSP_DOWNLOAD: '1',
        OPENCODE_DISABLE_SHARE: '1',
        OPENCODE_DISABLE_CLAUDE_CODE: '1',
      },
    };
  };
}

test('opencode: one turn through /v1/chat/completions with its tools', { skip: skip ?? false }, async (t) => {
  t.diagnostic(`network isolated: ${isolated()}`);
  const r = await runTurn({ name: 'opencode', setup: setup('Write a Python function add(a, b).') });
  assertCleanTurn(r, '/v1/chat/completions');
  assert.ok(r.run.stdout.trim().length > 0, 'opencode printed no answer');
  const main = r.chats.filter((x) => x.body.tools);
  assert.ok(main.length >= 1, 'no request carried tools');
  assert.deepEqual(toolNames(main[0].body), ['read']);
  assert.equal(main[0].body.tool_choice, 'auto');
  assert.equal(main[0].body.model, modelName);
  t.diagnostic(`opencode ran ${r.run.seconds.toFixed(1)} s; ${r.chats.length} chat request(s)`);
});

test('opencode: a tool call and its result round trip (--debug-tool-call)', { skip: skip ?? false }, async (t) => {
  let args;
  const r = await runTurn({
    name: 'opencode',
    lumenArgs: ({ work }) => {
      args = { filePath: path.join(work, 'hello.txt') };
      return ['--debug-tool-call', `read=${JSON.stringify(args)}`];
    },
    setup: setup('What is the secret word in hello.txt?'),
  });
  assertCleanTurn(r, '/v1/chat/completions');
  assertToolRoundTrip(r, 'read', args, 'lumen-opencode-4821');
  t.diagnostic(`opencode ran ${r.run.seconds.toFixed(1)} s; ${r.chats.length} chat request(s)`);
});
