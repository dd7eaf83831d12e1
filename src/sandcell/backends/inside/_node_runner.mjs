// sandcell's pooled Node.js sandbox: Node started ahead, waiting to become one program.
// Standalone: it imports nothing of sandcell, and runs inside the sandbox only.
//
//   node [the runtime's permission flags] /sandcell/node_runner.mjs [typescript] pooled
//
// Fd 0 is the host's channel (4-byte big-endian length, then UTF-8 JSON, as the session
// kernel's). The runner says {"op": "hello", "pid": PID}, then blocks in read() until the host
// sends {"op": "run", "path": "/sandcell/main.js"} (or main.ts), having written that file into
// the control directory, and answers {"op": "started"}. The channel is then closed and
// /dev/null takes fd 0 (a cold run's program has an empty input too), argv becomes what
// `node main.js` gives, and Node's own entry point runs the program: CommonJS or ESM by Node's
// syntax detection, TypeScript's types stripped, exit codes, uncaught errors and rejections
// exactly as for `node main.js` (the stack's last frames name this file's timer instead of
// Node's main). Whatever the program does, this process ends with it, and the sandbox is
// destroyed: nothing here is trusted by the host beyond the hello's framing.

import fs from "node:fs";
import Module from "node:module";
import util from "node:util";

const CHANNEL = 0;
const PROGRAMS = new Set(["/sandcell/main.js", "/sandcell/main.ts"]);
const MAX_MESSAGE = 64 * 1024;
const WARM_TS = "/sandcell/node_warm.ts";

function fail(text) {
  fs.writeSync(2, `sandcell-node-runner: ${text}\n`);
  process.exit(125);
}

function readExact(n) {
  const buf = Buffer.alloc(n);
  let off = 0;
  while (off < n) {
    let got;
    try {
      got = fs.readSync(CHANNEL, buf, off, n - off, null);
    } catch (e) {
      if (e.code === "EAGAIN" || e.code === "EINTR") continue;
      throw e;
    }
    if (got === 0) return null;
    off += got;
  }
  return buf;
}

function send(msg) {
  const body = Buffer.from(JSON.stringify(msg), "utf8");
  const head = Buffer.alloc(4);
  head.writeUInt32BE(body.length);
  const data = Buffer.concat([head, body]);
  let off = 0;
  while (off < data.length) off += fs.writeSync(CHANNEL, data, off, data.length - off);
}

function receive() {
  const head = readExact(4);
  if (head === null) return null;
  const size = head.readUInt32BE();
  if (size > MAX_MESSAGE) fail(`a message of ${size} bytes is too large`);
  const body = readExact(size);
  if (body === null) return null;
  return JSON.parse(body.toString("utf8"));
}

// What a program's start would do anyway, done while waiting where nothing of it shows: the
// formatting every console.log goes through (a millisecond of a first call's CPU), and with
// "typescript" Node's type stripper, loaded by a TypeScript module of sandcell's and forgotten
// again (about 100 ms). process.stdout itself is not made: that would set fd 1 non-blocking
// under a program that writes to it with fs.writeSync only.
if (process.argv[2] === "typescript") {
  Module.createRequire(import.meta.url)(WARM_TS);
  delete Module._cache[WARM_TS];
}
util.format("%s", 1);
send({ op: "hello", pid: process.pid });
const msg = receive();
// The host went away before a program came: the sandbox is being destroyed.
if (msg === null) process.exit(0);
if (msg.op !== "run" || !PROGRAMS.has(msg.path)) fail(`unexpected message ${JSON.stringify(msg)}`);
// From here what happens is the program's: the host tells a runner that failed before from a
// program that failed.
send({ op: "started" });
fs.closeSync(CHANNEL);
// The lowest free descriptor: 0. Nothing else opens files while this runs.
const stdin = fs.openSync("/dev/null", "r");
if (stdin !== CHANNEL) fail(`/dev/null opened as fd ${stdin}, not 0`);
process.argv.splice(1, process.argv.length - 1, msg.path);
// On a fresh tick, so that none of this module's frames sit below the program's.
setImmediate(() => Module.runMain());
