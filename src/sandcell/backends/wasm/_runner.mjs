// sandcell's WebAssembly rung: CPython compiled to WebAssembly (Pyodide), run by Node.js inside
// the namespaces sandbox of an ordinary run. Standalone: it imports nothing of sandcell.
//
//   node [permission flags] /sandcell/runner.mjs /sandcell/wasm.json
//
// The settings file (written by the host, read-only here) names Pyodide's directory, its memory
// snapshot, the program, the working directory, the directories to mount and the Wasm heap's
// maximum. Two modes:
//
// * "run": load Pyodide, run the program once as `python main.py` would (exit status, traceback
//   on stderr), exit. Stdout and stderr are the process's; stdin is read from fd 0.
// * "kernel": a session's kernel or a pooled sandbox. Pyodide runs on a worker thread; this thread
//   serves the cell channel on fd 0 (4-byte big-endian length, then JSON, as `_kernel.py`) and
//   turns SIGINT into Pyodide's interrupt (a KeyboardInterrupt in the running cell).
//
// What the program can reach is cut at four places, each enough on its own for what it covers:
// the Python side (`_lockdown.py`: no `js`, `pyodide`, `pyodide_js`, `ctypes`, `micropip`, no
// JavaScript object left reachable), this JavaScript realm (no `process`, `require`, `fetch`,
// `WebAssembly` compile of new code, `eval` or `Function` of strings: Node's
// --disallow-code-generation-from-strings), Node's permission model (files: the listed
// directories only; no child processes, addons, WASI, inspector; workers only in kernel mode),
// and around all of it the namespaces sandbox (seccomp, Landlock, cgroups, no network).

import fs from "node:fs";
import net from "node:net";
import { isMainThread, parentPort, workerData, Worker } from "node:worker_threads";

const settingsPath = isMainThread ? process.argv[2] : workerData.settingsPath;
const S = JSON.parse(fs.readFileSync(settingsPath, "utf8"));
const writeAll = (fd, bytes) => {
  let off = 0;
  while (off < bytes.length) {
    try {
      off += fs.writeSync(fd, bytes, off, bytes.length - off);
    } catch (e) {
      if (e.code === "EAGAIN") continue;
      throw e;
    }
  }
};
const encoder = new TextEncoder();
// WebAssembly's libc (musl) numbers, as Pyodide's errno module has them.
const EACCES = 2;
const ENOSPC = 51;
const say = (text) => writeAll(2, encoder.encode(`sandcell-wasm: ${text}\n`));

// The Wasm heap's maximum: every WebAssembly.Memory made from here on grows at most to it, so a
// program that asks for more gets a MemoryError from its allocator, inside the cgroup's limit.
function capMemory(maxBytes) {
  const Original = WebAssembly.Memory;
  const pages = Math.max(1, Math.floor(maxBytes / 65536));
  function Capped(desc) {
    const d = { ...desc };
    d.maximum = Math.min(d.maximum ?? pages, pages);
    if (d.initial > d.maximum) d.initial = d.maximum;
    return new Original(d);
  }
  Capped.prototype = Original.prototype;
  WebAssembly.Memory = Capped;
}

// What a program writes outside the mounted directories lands in Pyodide's in-memory filesystem,
// whose file data are JavaScript arrays, outside the Wasm heap and its maximum: it gets a budget
// of its own (the sandbox's /tmp size), and a write past it fails with ENOSPC.
function capMemfs(FS, budget) {
  const MEMFS = FS.filesystems.MEMFS;
  let used = 0;
  const size = (node) => (node.contents ? node.contents.length : 0);
  const charge = (node, wanted, grow) => {
    const before = size(node);
    if (wanted > before && used + (wanted - before) > budget) throw new FS.ErrnoError(ENOSPC);
    grow();
    used += size(node) - before;
  };
  // A write (its fast path for a new file replaces the data outright) and a truncate that grows.
  const fileOps = MEMFS.ops_table.file.stream;
  const write = fileOps.write;
  fileOps.write = (stream, buffer, offset, length, position, canOwn) => {
    let n;
    charge(stream.node, position + length, () => {
      n = write(stream, buffer, offset, length, position, canOwn);
    });
    return n;
  };
  const resize = MEMFS.resizeFileStorage.bind(MEMFS);
  MEMFS.resizeFileStorage = (node, newSize) => charge(node, newSize, () => resize(node, newSize));
  const dirOps = MEMFS.ops_table.dir.node;
  const unlink = dirOps.unlink;
  dirOps.unlink = (parent, name) => {
    const node = parent.contents[name];
    unlink(parent, name);
    if (node && ArrayBuffer.isView(node.contents)) used -= size(node); // a file's data
  };
}

async function loadPython(stdinFromFd) {
  capMemory(S.heap_max_bytes);
  // Emscripten's NODEFS reads the fs constants through process.binding, which Node's permission
  // model refuses: they are the same as fs.constants.
  const constants = { fs: fs.constants };
  process.binding = (name) => {
    if (name === "constants") return constants;
    throw new Error(`process.binding(${name}) is not available`);
  };
  const { loadPyodide } = await import(`${S.pyodide_dir}/pyodide.mjs`);
  const snapshot = S.snapshot ? fs.readFileSync(S.snapshot) : undefined;
  const py = await loadPyodide({
    indexURL: `${S.pyodide_dir}/`,
    lockFileURL: `${S.pyodide_dir}/pyodide-lock.json`,
    packageCacheDir: `${S.pyodide_dir}/`,
    jsglobals: Object.freeze(Object.create(null)),
    env: { ...S.env },
    fullStdLib: false,
    checkAPIVersion: true,
    ...(snapshot ? { _loadSnapshot: snapshot } : {}),
  });
  // Raw bytes, unbuffered on this side: Python's own buffering decides when they are written.
  py.setStdout({ write: (buf) => (writeAll(1, buf), buf.length) });
  py.setStderr({ write: (buf) => (writeAll(2, buf), buf.length) });
  if (stdinFromFd) {
    py.setStdin({
      read(buf) {
        try {
          return fs.readSync(0, buf, 0, buf.length, null);
        } catch (e) {
          if (e.code === "EOF") return 0;
          throw e;
        }
      },
    });
  } else {
    py.setStdin({ read: () => 0 });
  }
  const FS = py.FS;
  // Node's permission model refuses a write outside the writable directories with an error
  // Emscripten does not know (ERR_ACCESS_DENIED): as EACCES, not a broken stream.
  const NODEFS = FS.filesystems.NODEFS;
  const convert = NODEFS.convertNodeCode.bind(NODEFS);
  NODEFS.convertNodeCode = (e) => (e && e.code === "ERR_ACCESS_DENIED" ? EACCES : convert(e));
  const mkdirs = (path) => {
    let cur = "";
    for (const part of path.split("/").filter(Boolean)) {
      cur += `/${part}`;
      try {
        FS.mkdir(cur);
      } catch {
        // exists
      }
    }
  };
  capMemfs(FS, S.memfs_bytes);
  for (const [hostPath, wasmPath] of S.mounts) {
    mkdirs(wasmPath);
    FS.mount(FS.filesystems.NODEFS, { root: hostPath }, wasmPath);
  }
  // The program's text, for tracebacks' source lines, at the path it has outside.
  mkdirs(S.program_path.slice(0, S.program_path.lastIndexOf("/")));
  if (S.program) FS.writeFile(S.program_path, fs.readFileSync(S.program));
  FS.chdir(S.cwd);
  const lockdown = fs.readFileSync(S.lockdown, "utf8");
  // In a namespace of its own: the program's __main__ is emptied before it runs.
  const ns = py.globals.get("dict")();
  ns.set("_sandcell_env", py.toPy(S.env));
  ns.set("_sandcell_paths", py.toPy(S.python_paths));
  ns.set("_sandcell_compiled", py.toPy(S.compiled_modules));
  // The display module (notebook outputs), as source: this interpreter is not the host's.
  const display = S.display ? [fs.readFileSync(S.display.module, "utf8"), S.display.module, S.display.dir] : undefined;
  ns.set("_sandcell_display", py.toPy(display));
  py.runPython(lockdown, { globals: ns, filename: "<sandcell wasm lockdown>" });
  const driver = ns.get("_sandcell_driver");
  ns.destroy();
  return { py, driver };
}

// After Pyodide is loaded, this realm keeps nothing a leaked JavaScript object could use to reach
// Node: the globals that lead to the process, modules, the network or new code are removed.
function emptyRealm() {
  for (const name of [
    "process", "require", "module", "exports", "fetch", "Request", "Response", "Headers",
    "WebSocket", "EventSource", "XMLHttpRequest", "Worker", "SharedWorker", "importScripts",
    "Buffer", "navigator", "BroadcastChannel", "MessageChannel", "MessagePort", "caches",
    "FormData", "WebAssembly", "global",
  ]) {
    try {
      delete globalThis[name];
    } catch {
      // not configurable: left, and unreachable from Python (no JavaScript object reaches it)
    }
  }
  // Emscripten's exit (os._exit) sets process.exitCode and throws its ExitStatus: that is all
  // of `process` it keeps, and the runner exits with the status.
  globalThis.process = { exitCode: undefined };
  // Node's console holds the process's streams: a plain one that writes to stderr instead.
  const line = (...args) => writeAll(2, encoder.encode(`${args.map(String).join(" ")}\n`));
  globalThis.console = Object.freeze({ log: line, error: line, warn: line, info: line, debug: line });
}

async function runOnce() {
  const { driver } = await loadPython(true);
  const exitFn = process.reallyExit.bind(process);
  emptyRealm();
  let status;
  try {
    status = driver.run_program(S.program_path);
  } catch (e) {
    status = exitStatus(e); // os._exit(status)
    if (status === undefined) {
      say(`the program could not be run: ${e && e.message ? e.message : e}`);
      status = 70;
    }
  }
  exitFn(status);
}

// -- kernel mode -------------------------------------------------------------------------------

function kernelMain() {
  const interrupt = new Int32Array(new SharedArrayBuffer(4));
  const worker = new Worker(new URL(import.meta.url), {
    workerData: { settingsPath, interrupt },
    stdout: false,
    stderr: false,
  });
  // The channel as a socket on the event loop, not blocking reads on libuv's thread pool: an
  // exit would wait for a pool thread blocked in read() for ever.
  const ctl = new net.Socket({ fd: 0, readable: true, writable: true });
  const end = (status) => {
    ctl.destroy();
    process.reallyExit(status);
  };
  const frame = (msg) => {
    const body = Buffer.from(JSON.stringify(msg), "utf8");
    const head = Buffer.alloc(4);
    head.writeUInt32BE(body.length, 0);
    ctl.write(Buffer.concat([head, body]));
  };
  let inCell = false;
  process.on("SIGINT", () => {
    if (inCell) Atomics.store(interrupt, 0, 2);
  });
  const queue = [];
  let busy = false;
  const next = () => {
    if (busy || queue.length === 0) return;
    busy = true;
    worker.postMessage(queue.shift());
  };
  worker.on("message", (m) => {
    if (m.op === "hello") {
      frame({ op: "hello", pid: process.pid, display: Boolean(S.display) });
      ctl.on("data", onData);
      return;
    }
    if (m.op === "started") {
      inCell = true;
      frame(m);
      return;
    }
    if (m.op === "exit") {
      // os._exit in a cell: everything the cell wrote is out; the kernel ends with its status.
      ctl.end(() => end(m.status));
      return;
    }
    if (m.op === "done") {
      inCell = false;
      Atomics.store(interrupt, 0, 0);
      frame(m);
      busy = false;
      next();
    }
  });
  worker.on("error", (e) => {
    say(`the interpreter failed: ${e && e.message ? e.message : e}`);
    end(70);
  });
  worker.on("exit", (code) => end(code === 0 ? 0 : 70));
  ctl.on("end", () => end(0)); // the host closed the channel: the session ends
  ctl.on("error", () => end(0));
  let buf = Buffer.alloc(0);
  function onData(chunk) {
    buf = Buffer.concat([buf, chunk]);
    while (buf.length >= 4) {
      const size = buf.readUInt32BE(0);
      if (buf.length < 4 + size) break;
      const body = buf.subarray(4, 4 + size).toString("utf8");
      buf = buf.subarray(4 + size);
      let msg;
      try {
        msg = JSON.parse(body);
      } catch {
        msg = { op: "invalid" };
      }
      queue.push(msg);
    }
    next();
  }
}

async function kernelWorker() {
  const { py, driver } = await loadPython(false);
  py.setInterruptBuffer(workerData.interrupt);
  driver.kernel_exits();
  emptyRealm();
  const port = parentPort;
  port.on("message", (msg) => {
    const id = Number(msg.id ?? 0);
    const started = () => port.postMessage({ op: "started", id });
    let reply;
    try {
      if (msg.op === "cell" && typeof msg.code === "string") {
        started();
        const fn = S.programs ? driver.program_cell : driver.run_cell;
        const args = S.programs
          ? [id, msg.code, S.program_path]
          : [id, msg.code, msg.scope ?? undefined, msg.cwd ?? undefined];
        const result = fn(...args);
        reply = result.toJs({ dict_converter: Object.fromEntries });
        result.destroy();
        if (reply.op === "exit") {
          // os._exit(status) in the cell: the kernel ends with it, as a process would.
          port.postMessage({ op: "exit", status: reply.status });
          return;
        }
      } else if (msg.op === "drop" && typeof msg.scope === "string") {
        driver.drop_scope(msg.scope);
        reply = { op: "done", id, status: "ok" };
      } else {
        reply = { op: "done", id, status: "error", error: "protocol" };
      }
    } catch (e) {
      const status = exitStatus(e);
      if (status !== undefined) {
        // os._exit(status): the kernel ends with that status, as a process would; the host
        // sees the session's interpreter gone.
        port.postMessage({ op: "exit", status });
        return;
      }
      say(`a cell could not be run: ${e && e.message ? e.message : e}`);
      reply = { op: "done", id, status: "error", error: "InternalError" };
    }
    port.postMessage({ ...reply, op: "done", id, out_dir: reply.out_dir ?? null });
  });
  port.postMessage({ op: "hello" });
}

// An error of the runner itself is one line, never Node's report of an uncaught exception,
// which quotes the throwing line: Pyodide's is a megabyte of minified JavaScript.
// Emscripten's exit (os._exit) throws its ExitStatus; Pyodide may pass it on wrapped, its
// message kept: the status, or undefined for any other error.
function exitStatus(e) {
  if (e && Number.isInteger(e.status)) return e.status;
  const m = /Program terminated with exit\((\d+)\)/.exec(String(e && e.message));
  return m ? Number(m[1]) : undefined;
}

const failed = (e) => {
  say(`the interpreter could not start: ${e && e.message ? e.message : e}`);
  process.reallyExit(70);
};
try {
  if (!isMainThread) {
    await kernelWorker();
  } else if (S.mode === "kernel") {
    kernelMain();
  } else {
    await runOnce();
  }
} catch (e) {
  failed(e);
}
