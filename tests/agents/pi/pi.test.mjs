// pi.test.mjs - pi-coding-agent (@mariozechner/pi-coding-agent, pinned in
// package.json) against `lumen serve` on the demo model, as a custom
// OpenAI-compatible provider (~/.pi/agent/models.json), one turn in print
// mode (-p).
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';

import { assertCleanTurn, assertToolRoundTrip, isolated, modelName, runTurn, skipReason, toolNames } from '../lib/harness.mjs';

const dir = path.dirname(fileURLToPath(import.meta.url));
const skip = skipReason(dir, 'pi');
const tools = ['read', 'bash', 'edit', 'write']; // pi's default tool set

// The agent's config in HOME: the provider, and compaction off (its default
// reserve of 16384 tokens asks a 4096-token model for more than it has).
function setup(prompt) {
  return ({ home, work, url }) => {
    const agentDir = path.join(home, '.pi', 'agent');
    writeFileSync(path.join(work, 'hello.txt'), 'The secret word is lumen-pi-4821.\n');
    writeConfig(agentDir, url);
    return {
      cmd: path.join(dir, 'node_modules', '.bin', 'pi'),
      args: ['-p', '--provider', 'lumen', '--model', modelName, '--no-session', '--offline', prompt],
      env: { PI_CODING_AGENT_DIR: agentDir, PI_OFFLINE: '1', PI_TELEMETRY: '0' },
    };
  };
}

function writeConfig(agentDir, url) {
  const models = {
    providers: {
      lumen: {
        baseUrl: `${url}/v1`,
        api: 'openai-completions',
        apiKey: 'unused',
        compat: { supportsDeveloperRole: false, supportsReasoningEffort: false },
        models: [{ id: modelName, contextWindow: 4096, maxTokens: 256 }],
      },
    },
  };
  mkdirSync(agentDir, { recursive: true });
  writeFileSync(path.join(agentDir, 'models.json'), JSON.stringify(models, null, 2));
  writeFileSync(path.join(agentDir, 'settings.json'), JSON.stringify({ compaction: { enabled: false } }));
}

// pi prints only the answer's content, never its reasoning. pi sends no
// temperature, and sampled at the default, the demo model's answer stays
// inside the <think> block its template opens for all 256 tokens about one
// turn in five (measured: 8 of 40), leaving pi nothing to print. Greedy, the
// block closes, so the proxy asks lumen for temperature 0 (the recorded
// request stays what pi sent).
const greedy = (body) => ({ ...body, temperature: 0 });

test('pi: one turn through /v1/chat/completions with its tools', { skip: skip ?? false }, async (t) => {
  t.diagnostic(`network isolated: ${isolated()}`);
  const r = await runTurn({ name: 'pi', setup: setup('Write a Python function add(a, b).'), rewrite: greedy });
  assertCleanTurn(r, '/v1/chat/completions');
  assert.ok(r.run.stdout.trim().length > 0, 'pi printed no answer');
  const first = r.chats[0];
  assert.deepEqual(toolNames(first.body).sort(), [...tools].sort());
  assert.equal(first.body.stream, true);
  assert.equal(first.body.model, modelName);
  t.diagnostic(`pi ran ${r.run.seconds.toFixed(1)} s; ${r.chats.length} chat request(s)`);
});

test('pi: a tool call and its result round trip (--debug-tool-call)', { skip: skip ?? false }, async (t) => {
  const args = { path: 'hello.txt' };
  const r = await runTurn({
    name: 'pi',
    lumenArgs: ['--debug-tool-call', `read=${JSON.stringify(args)}`],
    setup: setup('What is the secret word in hello.txt?'),
  });
  assertCleanTurn(r, '/v1/chat/completions');
  assertToolRoundTrip(r, 'read', args, 'lumen-pi-4821');
  t.diagnostic(`pi ran ${r.run.seconds.toFixed(1)} s; ${r.chats.length} chat request(s)`);
});
