// Runs the reference workspace tools over a batch of cases and writes what each call returned.
//
// Usage: node driver.cjs MODULES_DIR CASES.json BASE_DIR OUT.jsonl
//
// MODULES_DIR holds the node_modules of tests/oracle/package.json (setup installs it under
// .venv/opt/mastra). Each case gets a fresh directory BASE_DIR/<id>/ws built from its fixture;
// its tool calls run in order, and one JSON line per case goes to OUT.jsonl (not stdout, which
// the library may log to). tests/_oracle.py runs the same cases through agentvfs and compares.
'use strict';

const fs = require('node:fs');
const path = require('node:path');
const crypto = require('node:crypto');
const { createRequire } = require('node:module');

const [modulesDir, casesFile, baseDir, outFile] = process.argv.slice(2);
const load = createRequire(path.join(path.resolve(modulesDir), 'package.json'));
const { Workspace, LocalFilesystem, LocalSandbox, createWorkspaceTools, createSkillTools } = load('@mastra/core/workspace');
const { toJSONSchema } = load('zod');

const CALL_TIMEOUT_MS = 30000;

function buildFixture(root, entries) {
  fs.mkdirSync(root, { recursive: true });
  const dirs = [];
  for (const e of entries) {
    const p = path.join(root, e.path);
    fs.mkdirSync(path.dirname(p), { recursive: true });
    if (e.dir) {
      fs.mkdirSync(p, { recursive: true });
      dirs.push(e);
    } else if (e.symlink !== undefined) {
      fs.symlinkSync(e.symlink, p);
    } else {
      fs.writeFileSync(p, Buffer.from(e.data_b64, 'base64'));
      if (e.mode !== undefined) fs.chmodSync(p, e.mode);
      const t = new Date(e.mtime * 1000);
      fs.utimesSync(p, t, t);
    }
  }
  // Directory times last, deepest first: creating entries inside changes them.
  dirs.sort((a, b) => b.path.split('/').length - a.path.split('/').length);
  for (const e of dirs) {
    const t = new Date(e.mtime * 1000);
    fs.utimesSync(path.join(root, e.path), t, t);
  }
}

// What is on disk after the calls: names, kinds and content digests.
function snapshot(root) {
  const out = [];
  const walk = (rel) => {
    const names = fs.readdirSync(path.join(root, rel)).sort();
    for (const name of names) {
      const r = rel ? rel + '/' + name : name;
      const st = fs.lstatSync(path.join(root, r));
      if (st.isSymbolicLink()) out.push([r, 'link', fs.readlinkSync(path.join(root, r))]);
      else if (st.isDirectory()) {
        out.push([r, 'dir', '']);
        walk(r);
      } else out.push([r, 'file', crypto.createHash('sha256').update(fs.readFileSync(path.join(root, r))).digest('hex')]);
    }
  };
  if (fs.existsSync(root)) walk('');
  else out.push(['', 'gone', '']);
  return out;
}

// A deterministic embedder and an in-memory cosine store, written the same way as in
// tests/_oracle.py so that both sides compute bit-identical scores.
function embed(text) {
  const v = new Array(27).fill(0);
  for (const ch of text.toLowerCase()) {
    const c = ch.charCodeAt(0) - 97;
    if (c >= 0 && c < 26) v[c] += 1 + c / 100;
    else v[26] += 0.01;
  }
  v[26] += 0.001;
  return v;
}

class PlainVectorStore {
  indexes = new Map();
  async createIndex({ indexName }) {
    if (!this.indexes.has(indexName)) this.indexes.set(indexName, new Map());
  }
  async upsert({ indexName, vectors, metadata, ids }) {
    const index = this.indexes.get(indexName);
    ids.forEach((id, i) => index.set(id, { vector: vectors[i], metadata: metadata[i] }));
    return ids;
  }
  async query({ indexName, queryVector, topK }) {
    const index = this.indexes.get(indexName) ?? new Map();
    const norm = (a) => Math.sqrt(a.reduce((s, x) => s + x * x, 0));
    const hits = [...index.entries()].map(([id, { vector, metadata }]) => ({
      id,
      score: vector.reduce((s, x, i) => s + x * queryVector[i], 0) / (norm(vector) * norm(queryVector)),
      metadata,
    }));
    hits.sort((a, b) => b.score - a.score);
    return hits.slice(0, topK);
  }
  async deleteVector({ indexName, id }) {
    this.indexes.get(indexName)?.delete(id);
  }
  async deleteVectors({ indexName, filter, ids }) {
    const index = this.indexes.get(indexName);
    if (!index) return;
    for (const [id, { metadata }] of [...index]) {
      const matches = filter && Object.entries(filter).every(([k, v]) => metadata[k] === v);
      if (ids?.includes(id) || matches) index.delete(id);
    }
  }
}

function sandboxFor(spec, root) {
  if (!spec.sandbox) return undefined;
  return new LocalSandbox({ workingDirectory: root, env: { PATH: process.env.PATH } });
}

function withTimeout(promise) {
  let timer;
  return Promise.race([
    promise,
    new Promise((_, reject) => {
      timer = setTimeout(() => reject(new Error(`oracle: call timed out after ${CALL_TIMEOUT_MS}ms`)), CALL_TIMEOUT_MS);
    }),
  ]).finally(() => clearTimeout(timer));
}

function substitute(value, vars) {
  if (typeof value === 'string') return value.replace(/\$PID/g, vars.pid ?? '0');
  if (Array.isArray(value)) return value.map((v) => substitute(v, vars));
  if (value && typeof value === 'object') {
    return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, substitute(v, vars)]));
  }
  return value;
}

// The model-facing form of a result: a list of parts, as agentvfs's to_model_output gives.
async function modelParts(tool, result) {
  // A tool's toModelOutput answers undefined where the result itself is what the model gets.
  const m = tool.toModelOutput ? await tool.toModelOutput(result) : undefined;
  if (m !== undefined) {
    if (m && m.type === 'text') return [{ type: 'text', text: m.value }];
    if (m && m.type === 'content') {
      return m.value.map((p) =>
        p.type === 'text' ? { type: 'text', text: p.text } : { type: 'media', data: p.data, media_type: p.mediaType },
      );
    }
    return [{ type: 'json', value: m }];
  }
  if (typeof result === 'string') return [{ type: 'text', text: result }];
  if (result && typeof result === 'object' && result.error === true && result.validationErrors) {
    return [{ type: 'invalid', text: result.message, fields: Object.keys(result.validationErrors.fields || {}) }];
  }
  return [{ type: 'json', value: result ?? null }];
}

async function runCase(c) {
  const root = path.join(baseDir, c.id, 'ws');
  buildFixture(root, c.files);
  const spec = c.workspace || {};
  const options = {
    id: 'oracle-ws',
    name: 'Oracle workspace',
    filesystem: new LocalFilesystem({ basePath: root, readOnly: Boolean(spec.read_only) }),
  };
  const sandbox = sandboxFor(spec, root);
  if (sandbox) options.sandbox = sandbox;
  if (spec.bm25) options.bm25 = true;
  if (spec.vector) {
    options.vectorStore = new PlainVectorStore();
    options.embedder = async (text) => embed(text);
  }
  if (spec.auto_index_paths) options.autoIndexPaths = spec.auto_index_paths;
  if (spec.skills) options.skills = spec.skills;
  const hookLog = [];
  if (spec.tools || spec.hooks) options.tools = { ...(spec.tools || {}) };
  if (spec.hooks === 'log') {
    // The same log tests/_oracle.py keeps: who was called with what, and what came back.
    options.tools.hooks = {
      beforeToolCall: (ctx) => {
        hookLog.push(['before', ctx.toolName, ctx.workspaceToolName, ctx.input]);
        if (ctx.input && ctx.input.path === 'blocked.txt') return { proceed: false, output: 'BLOCKED BY HOOK' };
        return undefined;
      },
      afterToolCall: (ctx) => {
        hookLog.push(['after', ctx.toolName, ctx.workspaceToolName, ctx.output ?? null, ctx.error ? String(ctx.error.message) : null]);
      },
    };
  }
  const calls = [];
  const inspected = {};
  let ws;
  let tree;
  try {
    ws = new Workspace(options);
    await ws.init();
    const tools = await createWorkspaceTools(ws);
    // The agent adds the skill tools beside the workspace tools; agentvfs's create_tools does both.
    if (spec.skills && ws.skills) Object.assign(tools, createSkillTools(ws.skills));
    if (c.inspect) {
      inspected.toolset = Object.entries(tools).map(([key, t]) => [key, t.id, Boolean(t.requireApproval), t.description]);
      // Input schemas as a caller fills them in (defaulted fields are optional).
      inspected.schemas = Object.entries(tools).map(([key, t]) => [key, toJSONSchema(t.inputSchema, { io: 'input' })]);
      inspected.instructions = ws.getInstructions();
      const info = await ws.getInfo({ includeFileCount: true });
      inspected.info = Object.fromEntries(Object.entries(info).filter(([k]) => !['createdAt', 'lastAccessedAt'].includes(k)));
    }
    const vars = {};
    for (const call of c.calls) {
      const tool = tools[call.tool] ?? tools['mastra_workspace_' + call.tool];
      if (!tool) {
        calls.push({ kind: 'absent' });
        continue;
      }
      try {
        const result = await withTimeout(tool.execute(substitute(call.input, vars), {}));
        const parts = await modelParts(tool, result);
        const text = parts.length && parts[0].type === 'text' ? parts[0].text : '';
        const pid = /\(PID: (\d+)\)/.exec(text);
        if (pid) vars.pid = pid[1];
        calls.push({ kind: 'ok', parts });
      } catch (e) {
        calls.push({ kind: 'error', message: String(e && e.message !== undefined ? e.message : e) });
      }
      if (call.wait_ms) await new Promise((r) => setTimeout(r, call.wait_ms));
    }
  } catch (e) {
    calls.push({ kind: 'setup-error', message: String(e && e.message) });
  } finally {
    tree = snapshot(path.join(baseDir, c.id));
    try {
      if (ws) await ws.destroy();
    } catch (e) {
      // The outputs are already recorded; a failing teardown changes none of them.
    }
  }
  return { id: c.id, root, calls, tree, hooks: hookLog, inspected };
}

async function main() {
  const { cases } = JSON.parse(fs.readFileSync(casesFile, 'utf8'));
  const out = fs.openSync(outFile, 'w');
  for (const c of cases) {
    const record = await runCase(c);
    fs.writeSync(out, JSON.stringify(record) + '\n');
  }
  fs.closeSync(out);
}

main().then(
  () => process.exit(0),
  (e) => {
    process.stderr.write(`oracle driver failed: ${e && e.stack}\n`);
    process.exit(1);
  },
);
