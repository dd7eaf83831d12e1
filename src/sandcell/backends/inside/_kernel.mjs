// sandcell Node kernel: the long-lived JavaScript (or TypeScript) interpreter of a session, inside
// its sandbox; the Node twin of _kernel.py, speaking the same channel. Standalone on purpose: it
// imports only Node's builtins and acorn (from the runtime's packages), never sandcell.
//
//   node [permission flags] /sandcell/kernel.mjs [--typescript] [--display] [--outputs DIR]
//        [--modules DIR] [--require-from DIR]
//
// The host hands the kernel one end of a socket pair as its standard input: the cell channel.
// Each message is a 4-byte big-endian length and that many bytes of UTF-8 JSON, as _kernel.py's:
//
// * host to kernel: {"op": "cell", "id": N, "code": TEXT, "scope": NAME, "cwd": PATH} (scope and
//   cwd optional), or {"op": "drop", "id": N, "scope": NAME}
// * kernel to host: {"op": "hello", "pid": PID, "display": BOOL} once, then for each cell
//   {"op": "started", "id": N} as it starts the cell's code, then {"op": "done", "id": N,
//   "status": "ok"|"error"|"interrupted"|"exit", "error": TYPE, "exit_code": CODE,
//   "out_dir": PATH|null}
//
// A cell is JavaScript (TypeScript with --typescript: its types are stripped by Node's
// stripTypeScriptTypes, which keeps every position). It is parsed with acorn as a module with
// top-level await, and rewritten as Node's REPL does, so that it runs as a script in the
// kernel's realm and its top-level names persist: a var, let, const, class or destructuring
// declaration becomes an assignment to a global (declared once with var, so a later cell may
// declare the name again, a const included); a function declaration stays and is made a global;
// a static import becomes an awaited dynamic import bound to the same names. A cell that awaits
// runs in an async function; the value of its last statement, when that is an expression, is the
// cell's value. Without a scope, cells run in the kernel's own global context (as the REPL's
// `node` does); a scope has a vm context of its own (its own globals, Node's own given to it) and
// its own working directory, as _kernel.py's scopes. `require` (from /sandbox/, so the runtime's
// /node_modules is found) and `import()` work in every cell.
//
// SIGINT interrupts the running cell (the state stays): a synchronous loop through vm's
// breakOnSigint, a cell waiting on a promise by giving up on it. Between cells SIGINT is ignored.
// `process.exit(n)` in a cell ends the cell with status "exit" and exit_code n (the kernel goes
// on, as after Python's SystemExit). An error ends the cell with status "error", the error's
// name in "error" and its stack on stderr (the cell's frames, at the cell's lines: <cell N>).
// What a cell writes to stdout and stderr reaches fds 1 and 2 as it is written, and is flushed
// before the reply.
//
// With --display, a cell's value is a rich output, written as _display.py writes a Python value:
// a manifest NNNN.json ({kind, data, files}) in a per-cell directory under /tmp (or --outputs):
// an array of plain records as a table (text/plain, text/html, application/json in pandas'
// "table" orientation), another array or plain object as a value with text/plain and
// application/json, anything else as text/plain; undefined shows nothing. display(obj) shows obj
// at once, marked "displayed".
//
// Limitations: a SIGINT that comes in the instant (tens of microseconds) a cell's synchronous part
// ends falls between Node's breakOnSigint watchdog and the kernel's listener: Node drops it (an
// async cell then goes on waiting, and the host's grace period ends the session, as for a cell
// that ignores the interrupt) or, later in that instant, ends the process (the session ends).
// The host interrupts at a cell's time limit, so only a cell whose synchronous part ends just
// then meets it. Synchronous code that runs after
// the cell's first await (a continuation on the
// microtask queue) is outside breakOnSigint's reach: a SIGINT there is seen only when that code
// yields, and a loop that never yields is ended by the host's grace period with the session.
// Security limitations: the cells share this process and realm; they can read and write the
// control channel (fd 0), replace the kernel's globals or exit. Nothing the kernel reports is
// trusted by the host beyond framing and shape; limits are the sandbox's (cgroups, rlimits) and
// Node's permission model's, never this code's.

import { Buffer } from "node:buffer";
import fs from "node:fs";
import net from "node:net";
import util from "node:util";
import vm from "node:vm";
import { createRequire, stripTypeScriptTypes } from "node:module";
import { EventEmitter } from "node:events";
import { Readable, Writable } from "node:stream";
import { fileURLToPath } from "node:url";

const MAX_MESSAGE = 64 * 1024 * 1024;
const MAX_TEXT_BYTES = 1024 * 1024;
const MAX_OUTPUTS = 64;
const TABLE_ROWS = 60;
const TABLE_COLS = 20;
const JSON_ROWS = [1000, 100, 10];
const TRUNCATED = "\n... [truncated by sandcell]";
const KERNEL_FILE = fileURLToPath(import.meta.url);

// What the kernel needs, taken before any cell can replace it.
const jsonStringify = JSON.stringify;
const jsonParse = JSON.parse;
const realExit = process.reallyExit.bind(process);
const inspect = util.inspect;
const encoder = new TextEncoder();
const { writeSync, openSync, closeSync, mkdirSync, lstatSync, readdirSync, unlinkSync, rmdirSync } = fs;
const { O_WRONLY, O_CREAT, O_TRUNC, O_NOFOLLOW } = fs.constants;
const chdir = process.chdir.bind(process);
const cwd = process.cwd.bind(process);
const warn = process.emitWarning.bind(process);

function writeAll(fd, data) {
  const bytes = typeof data === "string" ? encoder.encode(data) : data;
  let off = 0;
  while (off < bytes.length) {
    try {
      off += writeSync(fd, bytes, off, bytes.length - off);
    } catch (e) {
      if (e.code !== "EAGAIN") throw e; // a non-blocking descriptor that is full: try again
    }
  }
}

const say = (text) => {
  try {
    writeAll(2, `sandcell-kernel: ${text}\n`);
  } catch {
    // stderr is gone: nothing else to tell
  }
};

// -- arguments ------------------------------------------------------------------------------

const options = {
  typescript: false,
  display: false,
  outputs: "/tmp/.sandcell-outputs",
  modules: "/node_modules",
  requireFrom: "/sandbox/",
};
{
  const args = process.argv.slice(2);
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === "--typescript") options.typescript = true;
    else if (arg === "--display") options.display = true;
    else if (arg === "--outputs" && i + 1 < args.length) options.outputs = args[++i];
    else if (arg === "--modules" && i + 1 < args.length) options.modules = args[++i];
    else if (arg === "--require-from" && i + 1 < args.length) options.requireFrom = args[++i];
    else {
      say(`unknown argument ${jsonStringify(arg)}`);
      realExit(125);
    }
  }
}

// Node's experimental features the kernel itself uses warn once on stderr: not the cell's output.
process.emitWarning = function emitWarning(warning, ...rest) {
  const text = String(warning && warning.message ? warning.message : warning);
  if (/stripTypeScriptTypes|USE_MAIN_CONTEXT_DEFAULT_LOADER/.test(text)) return;
  return warn(warning, ...rest);
};

const acorn = createRequire(`${options.modules.replace(/\/+$/, "")}/`)("acorn");
const importLoader = vm.constants.USE_MAIN_CONTEXT_DEFAULT_LOADER;

// -- the channel ----------------------------------------------------------------------------

function send(msg) {
  const body = encoder.encode(jsonStringify(msg));
  const frame = new Uint8Array(4 + body.length);
  new DataView(frame.buffer).setUint32(0, body.length);
  frame.set(body, 4);
  // Written at once, not queued on the event loop: a "started" must reach the host before a
  // synchronous cell holds the loop.
  writeAll(0, frame);
}

// -- rewriting a cell -----------------------------------------------------------------------

class CellSyntaxError extends SyntaxError {
  constructor(message, line, column) {
    super(message);
    this.name = "SyntaxError";
    this.line = line;
    this.column = column;
  }
}

const PARSE = {
  ecmaVersion: "latest",
  allowAwaitOutsideFunction: true,
  allowHashBang: true,
  locations: true,
};

function parse(code) {
  try {
    return acorn.parse(code, { ...PARSE, sourceType: "module" });
  } catch (moduleError) {
    // Sloppy-mode code (a `with`, an octal literal) is no module but runs as a script.
    try {
      return acorn.parse(code, { ...PARSE, sourceType: "script" });
    } catch {
      const loc = moduleError.loc || { line: 1, column: 0 };
      throw new CellSyntaxError(moduleError.message, loc.line, loc.column);
    }
  }
}

function patternNames(node, out) {
  if (!node) return out;
  switch (node.type) {
    case "Identifier":
      out.push(node.name);
      break;
    case "ObjectPattern":
      for (const p of node.properties) patternNames(p.type === "RestElement" ? p.argument : p.value, out);
      break;
    case "ArrayPattern":
      for (const e of node.elements) patternNames(e, out);
      break;
    case "AssignmentPattern":
      patternNames(node.left, out);
      break;
    case "RestElement":
      patternNames(node.argument, out);
      break;
    default:
      break;
  }
  return out;
}

const FUNCTION_TYPES = new Set(["FunctionDeclaration", "FunctionExpression", "ArrowFunctionExpression"]);

// Whether a statement awaits at the cell's top level (not inside a function of its own).
function awaits(node) {
  if (!node || typeof node.type !== "string") return false;
  if (node.type === "AwaitExpression") return true;
  if ((node.type === "ForOfStatement" && node.await) || node.type === "ImportDeclaration") return true;
  if (FUNCTION_TYPES.has(node.type)) return false;
  if (node.type === "PropertyDefinition" || node.type === "MethodDefinition" || node.type === "StaticBlock") {
    return node.type === "PropertyDefinition" && node.computed ? awaits(node.key) : false;
  }
  for (const key of Object.keys(node)) {
    if (key === "loc" || key === "start" || key === "end") continue;
    const value = node[key];
    if (Array.isArray(value)) {
      if (value.some((v) => v && typeof v === "object" && awaits(v))) return true;
    } else if (value && typeof value === "object" && awaits(value)) {
      return true;
    }
  }
  return false;
}

class Edits {
  constructor(code) {
    this.code = code;
    this.list = [];
  }
  // Replace code[start:end] with text, keeping the replaced text's line breaks, so every line of
  // the cell keeps its number in a stack trace.
  replace(start, end, text) {
    const breaks = this.code.slice(start, end).split("\n").length - 1;
    this.list.push([start, end, text + "\n".repeat(breaks)]);
  }
  insert(at, text) {
    this.list.push([at, at, text]);
  }
  apply() {
    const sorted = this.list.map((e, i) => [...e, i]).sort((a, b) => a[0] - b[0] || a[3] - b[3]);
    let out = "";
    let pos = 0;
    for (const [start, end, text] of sorted) {
      out += this.code.slice(pos, start) + text;
      pos = Math.max(pos, end);
    }
    return out + this.code.slice(pos);
  }
}

function keyText(code, node) {
  return node.type === "Identifier" ? jsonStringify(node.name) : code.slice(node.start, node.end);
}

function importCall(code, stmt) {
  const source = code.slice(stmt.source.start, stmt.source.end);
  const attrs = stmt.attributes || [];
  if (attrs.length === 0) return `import(${source})`;
  const pairs = attrs.map((a) => `${keyText(code, a.key)}: ${code.slice(a.value.start, a.value.end)}`);
  return `import(${source}, { with: { ${pairs.join(", ")} } })`;
}

function rewriteImport(code, stmt, edits, names) {
  const call = `(await ${importCall(code, stmt)})`;
  const specs = stmt.specifiers;
  if (specs.length === 0) {
    edits.replace(stmt.start, stmt.end, `await ${importCall(code, stmt)};`);
    return;
  }
  const namespace = specs.find((s) => s.type === "ImportNamespaceSpecifier");
  const parts = [];
  let source = call;
  if (namespace) {
    names.push(namespace.local.name);
    parts.push(`${namespace.local.name} = ${call};`);
    source = namespace.local.name;
  }
  const picks = [];
  for (const s of specs) {
    if (s.type === "ImportDefaultSpecifier") picks.push(`default: ${s.local.name}`);
    else if (s.type === "ImportSpecifier") picks.push(`${keyText(code, s.imported)}: ${s.local.name}`);
    else continue;
    names.push(s.local.name);
  }
  if (picks.length > 0) {
    const specifier = code.slice(stmt.source.start, stmt.source.end);
    parts.push(`({ ${picks.join(", ")} } = globalThis.__sandcell.imported(${source}, ${specifier}));`);
  }
  edits.replace(stmt.start, stmt.end, parts.join(" "));
}

function rewriteDeclaration(code, decl, edits, names, exportStart) {
  if (decl.type === "VariableDeclaration") {
    const kept = decl.declarations;
    const start = exportStart ?? decl.start;
    edits.replace(start, kept[0].start, "void (");
    for (const d of kept) {
      patternNames(d.id, names);
      if (d.init) {
        edits.insert(d.start, "(");
        edits.insert(d.end, ")");
      } else if (decl.kind === "var") {
        edits.replace(d.start, d.end, "0");
      } else {
        edits.insert(d.start, "(");
        edits.insert(d.end, " = undefined)");
      }
    }
    const last = kept[kept.length - 1];
    edits.replace(last.end, decl.end, ");");
    return null;
  }
  if (decl.type === "ClassDeclaration") {
    names.push(decl.id.name);
    if (exportStart !== undefined) edits.replace(exportStart, decl.start, "");
    edits.insert(decl.start, `${decl.id.name} = `);
    edits.insert(decl.end, ";");
    return null;
  }
  if (decl.type === "FunctionDeclaration") {
    if (exportStart !== undefined) edits.replace(exportStart, decl.start, "");
    return decl.id.name;
  }
  return null;
}

// The cell as a script for vm: {source, lineOffset, isAsync, hasValue}.
function rewrite(code) {
  let program = parse(code);
  let text = code;
  const trimmed = code.trim();
  // `{a: 1}` alone is an object, as in the REPL, not a block with a label.
  if (trimmed.startsWith("{") && trimmed.endsWith("}")) {
    try {
      const wrapped = `(${code})`;
      const candidate = acorn.parse(wrapped, { ...PARSE, sourceType: "module" });
      if (candidate.body.length === 1 && candidate.body[0].type === "ExpressionStatement") {
        program = candidate;
        text = wrapped;
      }
    } catch {
      // a block after all
    }
  }
  const edits = new Edits(text);
  const names = [];
  const functions = [];
  const isAsync = program.body.some(awaits);
  for (const stmt of program.body) {
    if (stmt.type === "ImportDeclaration") {
      rewriteImport(text, stmt, edits, names);
    } else if (stmt.type === "ExportNamedDeclaration" && stmt.declaration) {
      const fn = rewriteDeclaration(text, stmt.declaration, edits, names, stmt.start);
      if (fn) functions.push(fn);
    } else if (stmt.type.startsWith("Export")) {
      const { line, column } = stmt.loc.start;
      throw new CellSyntaxError("a cell exports nothing: declare the name instead", line, column);
    } else {
      const fn = rewriteDeclaration(text, stmt, edits, names);
      if (fn) functions.push(fn);
    }
  }
  const tail = program.body[program.body.length - 1];
  const hasValue = Boolean(tail && tail.type === "ExpressionStatement");
  // The value is returned by an async cell: "return (" goes right after the statement before
  // (or on the wrapper's own line), so the expression keeps its line and column.
  let returnsFirst = false;
  if (isAsync && hasValue) {
    const prev = program.body[program.body.length - 2];
    if (prev) edits.insert(prev.end, ";return (");
    else returnsFirst = true;
    edits.insert(tail.expression.end, ")");
  }
  const body = edits.apply();
  const unique = [...new Set(names)];
  const hoisted = `${unique.length ? `var ${unique.join(", ")}; ` : ""}this.__sandcell.started(); `;
  if (!isAsync) {
    // Functions stay declarations: at a script's top level they are globals already.
    return { source: `${hoisted}\n${body}`, isAsync, hasValue };
  }
  const exported = functions.map((f) => `this.${f} = ${f};`).join(" ");
  return {
    source: `${hoisted}(async function () { ${exported}${returnsFirst ? " return (" : ""}\n${body}\n}).call(this)`,
    isAsync,
    hasValue,
  };
}

function compile(code) {
  let source = code;
  if (options.typescript) {
    try {
      source = stripTypeScriptTypes(code, { mode: "strip" });
    } catch (e) {
      if (e && e.code === "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX") {
        // enums, namespaces, parameter properties: transformed (lines kept, columns may move)
        source = stripTypeScriptTypes(code, { mode: "transform" });
      } else {
        throw new CellSyntaxError(String(e && e.message ? e.message : e), 1, 0);
      }
    }
  }
  return rewrite(source);
}

// -- errors ---------------------------------------------------------------------------------

function errorName(e) {
  if (e instanceof Error || (e && typeof e === "object" && typeof e.stack === "string")) {
    return String(e.name || (e.constructor && e.constructor.name) || "Error");
  }
  if (e === null) return "null";
  return typeof e === "object" ? String((e.constructor && e.constructor.name) || "Object") : typeof e;
}

// What a notebook shows: the cell's frames and what they called, not the kernel's or vm's.
function userStack(e) {
  let stack;
  try {
    stack = typeof e.stack === "string" ? e.stack : null;
  } catch {
    stack = null;
  }
  if (!stack) return `Uncaught ${inspect(e)}`;
  const lines = stack.split("\n");
  const out = [];
  let inFrames = false;
  for (const line of lines) {
    const frame = /^\s+at /.test(line);
    if (frame) {
      inFrames = true;
      if (line.includes(KERNEL_FILE) || line.includes("node:vm:") || line.includes(import.meta.url)) break;
      if (line.includes("node:internal/process/task_queues")) continue; // the await that resumed it
      out.push(line);
    } else if (!inFrames) {
      out.push(line);
    }
  }
  return out.join("\n");
}

function printSyntaxError(e, filename, code) {
  const line = code.split("\n")[e.line - 1] ?? "";
  writeAll(2, `${filename}:${e.line}\n${line}\n${" ".repeat(e.column)}^\n\nSyntaxError: ${e.message}\n`);
}

// -- rich outputs ---------------------------------------------------------------------------

// Removes what is at path as _kernel.py's _remove_tree does: a link or a file a cell put there
// goes (what it pointed at stays), a directory with all beneath it. Not fs.rmSync: its retries
// and checks cost a cell ~0.1 ms more.
function removeTree(path) {
  let st;
  try {
    st = lstatSync(path, { throwIfNoEntry: false });
  } catch {
    return;
  }
  if (st === undefined) return;
  if (!st.isDirectory()) {
    try {
      unlinkSync(path);
    } catch {
      // a cell removed it already
    }
    return;
  }
  let entries;
  try {
    entries = readdirSync(path, { withFileTypes: true });
  } catch {
    return;
  }
  for (const entry of entries) {
    const child = `${path}/${entry.name}`;
    if (entry.isDirectory()) removeTree(child);
    else {
      try {
        unlinkSync(child);
      } catch {
        // a cell removed it already
      }
    }
  }
  try {
    rmdirSync(path);
  } catch {
    // a cell's file it could not remove: the next cell's directory is made beside it
  }
}

function cap(text) {
  const bytes = encoder.encode(text);
  if (bytes.length <= MAX_TEXT_BYTES) return text;
  const keep = MAX_TEXT_BYTES - encoder.encode(TRUNCATED).length;
  return new TextDecoder("utf-8", { fatal: false }).decode(bytes.subarray(0, keep)).replace(/\uFFFD$/, "") + TRUNCATED;
}

function isPlainObject(v) {
  if (v === null || typeof v !== "object") return false;
  const proto = Object.getPrototypeOf(v);
  return proto === null || proto === Object.prototype || Object.getPrototypeOf(proto) === null;
}

function jsonText(v) {
  try {
    const text = jsonStringify(v, (_k, x) => (typeof x === "bigint" ? x.toString() : x));
    return typeof text === "string" && encoder.encode(text).length <= MAX_TEXT_BYTES ? text : null;
  } catch {
    return null; // a cycle, a getter that throws
  }
}

function valueType(v) {
  if (typeof v === "boolean") return "boolean";
  if (typeof v === "bigint") return "integer";
  if (typeof v === "number") return Number.isInteger(v) ? "integer" : "number";
  if (typeof v === "string") return "string";
  return v instanceof Date ? "datetime" : "any";
}

// A column's type in the table schema: its values' one type (integers among numbers are
// numbers), "string" for a mix, as pandas would hold it (an object column).
function fieldType(values) {
  let type = null;
  for (const v of values) {
    if (v === null || v === undefined) continue;
    const t = valueType(v);
    if (type === null || type === t) type = t;
    else if ((type === "integer" || type === "number") && (t === "integer" || t === "number")) type = "number";
    else type = "string";
  }
  return type ?? "string";
}

function cellText(v) {
  if (v === undefined) return "NaN"; // a record without the column: missing, as pandas shows it
  if (v === null) return "null";
  if (typeof v === "string") return v;
  if (v instanceof Date) return v.toISOString();
  return inspect(v, { breakLength: Infinity, depth: 1 });
}

function escapeHtml(s) {
  return s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
}

// Rows and columns shown in the text and HTML forms: the first and last halves past the cap.
function shown(count, max) {
  if (count <= max) return { head: count, tail: 0 };
  return { head: Math.ceil(max / 2), tail: Math.floor(max / 2) };
}

// An array of plain records as a pandas DataFrame shows: the same three forms.
function tableData(rows) {
  if (!Array.isArray(rows) || rows.length === 0 || !rows.every(isPlainObject)) return null;
  const columns = [];
  const seen = new Set();
  for (const row of rows) {
    for (const key of Object.keys(row)) {
      if (!seen.has(key)) {
        seen.add(key);
        columns.push(key);
      }
    }
  }
  if (columns.length === 0) return null;
  const r = shown(rows.length, TABLE_ROWS);
  const c = shown(columns.length, TABLE_COLS);
  const rowIdx = [...Array(r.head).keys(), ...(r.tail ? [null] : []), ...Array.from({ length: r.tail }, (_, i) => rows.length - r.tail + i)];
  const colIdx = [...Array(c.head).keys(), ...(c.tail ? [null] : []), ...Array.from({ length: c.tail }, (_, i) => columns.length - c.tail + i)];
  const grid = [["", ...colIdx.map((j) => (j === null ? "..." : columns[j]))]];
  for (const i of rowIdx) {
    if (i === null) grid.push(["...", ...colIdx.map(() => "...")]);
    else grid.push([String(i), ...colIdx.map((j) => (j === null ? "..." : cellText(rows[i][columns[j]])))]);
  }
  const widths = grid[0].map((_, k) => Math.max(...grid.map((line) => line[k].length)));
  const lines = grid.map((line) => line.map((cell, k) => (k === 0 ? cell.padEnd(widths[k]) : cell.padStart(widths[k]))).join("  ").trimEnd());
  let text = lines.join("\n");
  if (r.tail || c.tail) text += `\n\n[${rows.length} rows x ${columns.length} columns]`;
  const head = grid[0].slice(1).map((h) => `      <th>${escapeHtml(h)}</th>`).join("\n");
  const body = grid
    .slice(1)
    .map((line) => `    <tr>\n      <th>${escapeHtml(line[0])}</th>\n${line.slice(1).map((v) => `      <td>${escapeHtml(v)}</td>`).join("\n")}\n    </tr>`)
    .join("\n");
  let html = `<table border="1" class="dataframe">\n  <thead>\n    <tr style="text-align: right;">\n      <th></th>\n${head}\n    </tr>\n  </thead>\n  <tbody>\n${body}\n  </tbody>\n</table>`;
  if (r.tail || c.tail) html += `\n<p>${rows.length} rows × ${columns.length} columns</p>`;
  const data = { "text/plain": cap(text), "text/html": cap(html) };
  const fields = [{ name: "index", type: "integer" }, ...columns.map((name) => ({ name, type: fieldType(rows.map((row) => row[name])) }))];
  for (const n of JSON_ROWS) {
    const records = rows.slice(0, n).map((row, i) => {
      const record = { index: i };
      for (const name of columns) record[name] = row[name] === undefined ? null : row[name];
      return record;
    });
    const json = jsonText({ schema: { fields, primaryKey: ["index"], pandas_version: "1.4.0" }, data: records });
    if (json !== null) {
      data["application/json"] = json;
      break;
    }
  }
  return data;
}

class Writer {
  constructor(outDir, seq) {
    this.outDir = outDir;
    this.seq = seq;
    this.written = 0;
    this.names = []; // the manifests written, for the next cell to remove
  }

  emit(kind, data, displayed) {
    if (this.written >= MAX_OUTPUTS) {
      say(`more than ${MAX_OUTPUTS} outputs in one cell; a ${kind} was dropped`);
      return;
    }
    const name = `${String(this.seq).padStart(4, "0")}.json`;
    const manifest = { kind, data, files: [] };
    if (displayed) manifest.displayed = true;
    try {
      // O_NOFOLLOW: a name planted as a link is refused rather than written through.
      const path = `${this.outDir}/${name}`;
      const flags = O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW;
      let fd;
      try {
        fd = openSync(path, flags, 0o644);
      } catch (e) {
        if (!e || e.code !== "ENOENT") throw e;
        // the cell removed its directory: made again
        mkdirSync(this.outDir, { recursive: true, mode: 0o700 });
        fd = openSync(path, flags, 0o644);
      }
      try {
        writeAll(fd, jsonStringify(manifest));
      } finally {
        closeSync(fd);
      }
    } catch (e) {
      say(`cannot write a ${kind} to ${this.outDir}: ${e && e.message ? e.message : e}`);
      return;
    }
    this.names.push(name);
    this.seq += 1;
    this.written += 1;
  }

  value(v, displayed = false) {
    if (v === undefined) return;
    try {
      const table = tableData(v);
      if (table !== null) {
        this.emit("table", table, displayed);
        return;
      }
      const data = { "text/plain": cap(inspect(v, { depth: 4, maxArrayLength: 200, maxStringLength: MAX_TEXT_BYTES })) };
      if (Array.isArray(v) || isPlainObject(v)) {
        const json = jsonText(v);
        if (json !== null) data["application/json"] = json;
      }
      this.emit("value", data, displayed);
    } catch (e) {
      say(`cannot show the value: ${errorName(e)}: ${e && e.message ? e.message : e}`);
    }
  }
}

// -- scopes and the kernel ------------------------------------------------------------------

// Node's own globals (console, process, Buffer, timers, fetch...), as the process starts: what
// a scope's fresh context is given. Taken before any cell puts its names on globalThis.
const NODE_GLOBALS = (() => {
  const bare = vm.runInNewContext("Object.getOwnPropertyNames(globalThis)");
  const builtins = new Set(bare);
  // console too: a bare context's is V8's own, which prints nowhere.
  builtins.delete("console");
  return Object.getOwnPropertyNames(globalThis).filter((n) => !builtins.has(n) && n !== "globalThis");
})();

class CellExit {
  constructor(code) {
    this.code = code;
  }
}

const state = {
  inCell: false,
  interrupt: null, // the running cell's way to give up on an await
  started: null, // says "started" for the running cell, once
  writer: null,
  seq: 0,
};

function display(...objs) {
  for (const obj of objs) {
    if (state.writer) state.writer.value(obj, true);
    else console.log(obj);
  }
}

// What every context's cells reach: require, display, and the import helper the rewriting uses.
function cellGlobals(target) {
  const require = createRequire(options.requireFrom);
  const define = (name, value) =>
    Object.defineProperty(target, name, { value, writable: true, configurable: true, enumerable: false });
  define("require", require);
  if (!("display" in target)) define("display", display);
  define("__sandcell", {
    started() {
      if (state.started) state.started();
    },
    // Named imports of a CommonJS module Node's lexer did not see are its exports' properties.
    imported(ns, specifier) {
      return new Proxy(ns, {
        get(module, key) {
          if (key in module) return module[key];
          const fallback = module.default;
          if (fallback !== null && (typeof fallback === "object" || typeof fallback === "function") && key in fallback) {
            return fallback[key];
          }
          throw new SyntaxError(`The requested module '${specifier}' does not provide an export named '${String(key)}'`);
        },
      });
    },
  });
}

class Scope {
  constructor(dir) {
    this.dir = dir;
    const sandbox = {};
    for (const name of NODE_GLOBALS) {
      const desc = Object.getOwnPropertyDescriptor(globalThis, name);
      if (desc) Object.defineProperty(sandbox, name, desc);
    }
    this.context = vm.createContext(sandbox, { name: "sandcell scope" });
    const global = vm.runInContext("globalThis", this.context);
    Object.defineProperty(global, "global", { value: global, writable: true, configurable: true });
    cellGlobals(global);
  }
}

// Each cell's outputs directory, <outputs>/<id>, made fresh as the cell starts; the one before
// it removed then. In the common case by what the kernel knows it wrote there (its manifests,
// then the empty directory): three system calls, where a sweep of the whole outputs directory
// (lstat, two directory reads, each an open, reads and a close) costs a cell ~1 ms on gVisor,
// whose system calls are dear. What else is there is removed whole: a directory of the next
// cell's id made in advance, anything a cell added to its own directory; the outputs directory
// is swept once as the kernel starts. A cell's own files elsewhere under it stay, as anywhere in
// /tmp (the host reads only <outputs>/<id> of the cell it ran).
function freshOutputs(outDir, previous) {
  if (previous !== null) {
    for (const name of previous.names) {
      try {
        unlinkSync(`${previous.dir}/${name}`);
      } catch {
        // the cell removed it, or made its name a directory: removeTree below
      }
    }
    try {
      rmdirSync(previous.dir);
    } catch (e) {
      if (!e || e.code !== "ENOENT") removeTree(previous.dir);
    }
  }
  try {
    mkdirSync(outDir, { mode: 0o700 });
    return;
  } catch (e) {
    if (e && e.code === "EEXIST") removeTree(outDir);
    // missing, or a file where it goes (a link to a directory would be followed: cells cannot
    // make links under the permission model, and the host opens no part through a link)
    else removeTree(options.outputs);
  }
  mkdirSync(outDir, { recursive: true, mode: 0o700 });
}

class Kernel {
  constructor() {
    this.scopes = new Map();
    this.lastOutputs = null; // {dir, names} of the last cell's outputs directory
    cellGlobals(globalThis);
    if (options.display) removeTree(options.outputs);
  }

  async scopedCell(id, code, name, dir) {
    if (name === null) return this.cell(id, code, null);
    let scope = this.scopes.get(name);
    if (!scope) {
      scope = new Scope(dir);
      this.scopes.set(name, scope);
    }
    let home = null;
    try {
      home = cwd();
    } catch {
      // the kernel's directory was removed: nothing to go back to
    }
    try {
      if (scope.dir !== null) chdir(scope.dir);
    } catch (e) {
      writeAll(2, `${userStack(e)}\n`);
      return { op: "done", id, status: "error", error: errorName(e) };
    }
    try {
      return await this.cell(id, code, scope.context);
    } finally {
      try {
        scope.dir = cwd();
      } catch {
        // the cell removed its directory
      }
      if (home !== null) {
        try {
          chdir(home);
        } catch {
          // or the kernel's
        }
      }
    }
  }

  async cell(id, code, context) {
    const filename = `<cell ${id}>`;
    let outDir = null;
    if (options.display) {
      outDir = `${options.outputs}/${id}`;
      freshOutputs(outDir, this.lastOutputs);
    }
    const reply = { op: "done", id, out_dir: outDir };
    const writer = outDir !== null ? new Writer(outDir, state.seq) : null;
    this.lastOutputs = writer !== null ? { dir: outDir, names: writer.names } : null;
    state.inCell = true;
    // The cell's script says "started" as its first statement, under breakOnSigint's watchdog:
    // the host's SIGINT, sent once it reads that, can only come while the watchdog is there to
    // take it (before, Node's own SIGINT handling is being swapped and may drop it).
    state.started = () => {
      if (state.started === null) return;
      state.started = null;
      send({ op: "started", id });
    };
    try {
      let compiled;
      try {
        compiled = compile(code);
      } catch (e) {
        state.started(); // no code of the cell runs: said before its error
        throw e;
      }
      const script = new vm.Script(compiled.source, {
        filename,
        lineOffset: -1,
        importModuleDynamically: importLoader,
      });
      state.writer = writer;
      const run = { breakOnSigint: true, displayErrors: false };
      let value = context === null ? script.runInThisContext(run) : script.runInContext(context, run);
      if (compiled.isAsync) {
        const pending = value;
        pending.catch(() => {}); // given up on when interrupted: its end is no one's
        const interrupted = new Promise((_, reject) => {
          state.interrupt = () => reject(new InterruptedError());
        });
        value = await Promise.race([pending, interrupted]);
      }
      if (writer !== null && compiled.hasValue) writer.value(value);
      reply.status = "ok";
    } catch (e) {
      if (e instanceof CellExit) {
        reply.status = "exit";
        reply.exit_code = e.code;
      } else if (e instanceof InterruptedError || (e && e.code === "ERR_SCRIPT_EXECUTION_INTERRUPTED")) {
        reply.status = "interrupted";
        freshStdio();
        writeAll(2, "Interrupted: the cell was stopped (SIGINT)\n");
      } else if (e instanceof CellSyntaxError) {
        reply.status = "error";
        reply.error = "SyntaxError";
        printSyntaxError(e, filename, code);
      } else {
        reply.status = "error";
        reply.error = errorName(e);
        writeAll(2, `${userStack(e)}\n`);
      }
    } finally {
      if (state.started) state.started();
      state.inCell = false;
      state.interrupt = null;
      state.writer = null;
      if (writer !== null) state.seq = writer.seq;
    }
    return reply;
  }
}

class InterruptedError extends Error {}

// -- process-wide behaviour ------------------------------------------------------------------

// process.exit in a cell ends the cell, not the kernel; outside a cell (a timer a cell left) it
// ends the kernel, as it would end a program.
process.exit = function exit(code) {
  const status = code === undefined ? (process.exitCode ?? 0) : Number(code) | 0;
  if (state.inCell) throw new CellExit(status);
  realExit(status);
};

process.on("SIGINT", () => {
  // Only a running cell is interrupted (a synchronous one through breakOnSigint, which takes
  // the signal itself); between cells the signal is ignored.
  if (state.inCell && state.interrupt) state.interrupt();
});

process.on("uncaughtException", (e) => {
  if (e instanceof CellExit) return; // process.exit outside a cell: the kernel is ending
  try {
    writeAll(2, `Uncaught ${userStack(e)}\n`);
  } catch {
    // nowhere to say it
  }
});

process.on("unhandledRejection", (e) => {
  if (e instanceof CellExit) {
    if (!state.inCell) realExit(e.code);
    return;
  }
  try {
    writeAll(2, `Unhandled promise rejection: ${userStack(e)}\n`);
  } catch {
    // nowhere to say it
  }
});

// A cell's process.stdin is empty (fd 0 is the channel).
Object.defineProperty(process, "stdin", {
  value: Readable.from([]),
  configurable: true,
  writable: true,
});

// A cell's output goes to fds 1 and 2 by synchronous writes, never through Node's stdio streams:
// a SIGINT that stops a cell inside a stream's write (breakOnSigint terminates the script where
// it is) leaves that stream's state half-changed, and a stream that holds its data until the
// event loop turns would not be flushed before the reply. console writes through sinks with no
// state at all; process.stdout and process.stderr are plain Writables, made afresh after a cell
// is interrupted.
class FdSink extends EventEmitter {
  constructor(fd) {
    super();
    this.fd = fd;
  }

  write(chunk, encoding, callback) {
    writeAll(this.fd, typeof chunk === "string" ? encoder.encode(chunk) : chunk);
    const done = typeof encoding === "function" ? encoding : callback;
    if (typeof done === "function") done();
    return true;
  }
}

function fdStream(fd) {
  const stream = new Writable({
    decodeStrings: false,
    write(chunk, encoding, callback) {
      try {
        writeAll(fd, typeof chunk === "string" ? Buffer.from(chunk, encoding) : chunk);
        callback();
      } catch (e) {
        callback(e);
      }
    },
  });
  stream.fd = fd;
  stream.isTTY = false;
  return stream;
}

function freshStdio() {
  for (const [name, fd] of [["stdout", 1], ["stderr", 2]]) {
    Object.defineProperty(process, name, { value: fdStream(fd), configurable: true, writable: true });
  }
}

freshStdio();
globalThis.console = new console.Console({
  stdout: new FdSink(1),
  stderr: new FdSink(2),
  colorMode: false,
});

// -- serving ---------------------------------------------------------------------------------

async function serve() {
  const kernel = new Kernel();
  const queue = [];
  let wake = null;
  let closed = false;
  const ctl = new net.Socket({ fd: 0, readable: true, writable: false });
  let buf = Buffer.alloc(0);
  ctl.on("data", (chunk) => {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 4) {
      const size = buf.readUInt32BE(0);
      if (size > MAX_MESSAGE) {
        say(`message of ${size} bytes is too large`);
        realExit(70);
      }
      if (buf.length < 4 + size) break;
      let msg;
      try {
        msg = jsonParse(buf.subarray(4, 4 + size).toString("utf8"));
      } catch {
        msg = null;
      }
      buf = buf.subarray(4 + size);
      queue.push(msg && typeof msg === "object" && !Array.isArray(msg) ? msg : { op: "invalid" });
    }
    if (wake) wake();
  });
  const end = () => {
    closed = true;
    if (wake) wake();
  };
  ctl.on("end", end);
  ctl.on("close", end);
  ctl.on("error", end);
  send({ op: "hello", pid: process.pid, display: options.display });
  for (;;) {
    while (queue.length === 0 && !closed) await new Promise((resolve) => (wake = resolve));
    wake = null;
    if (queue.length === 0) break;
    const msg = queue.shift();
    const { op, scope = null, cwd: dir = null } = msg;
    const id = Number.isInteger(msg.id) ? msg.id : 0;
    let reply;
    if (op === "cell" && typeof msg.code === "string" && (scope === null || typeof scope === "string") && (dir === null || typeof dir === "string")) {
      reply = await kernel.scopedCell(id, msg.code, scope, dir);
    } else if (op === "drop" && typeof scope === "string") {
      kernel.scopes.delete(scope);
      reply = { op: "done", id, status: "ok" };
    } else {
      reply = { op: "done", id, status: "error", error: "protocol" };
    }
    send(reply);
  }
  realExit(0);
}

serve().catch((e) => {
  say(`the kernel failed: ${e && e.stack ? e.stack : e}`);
  realExit(70);
});
