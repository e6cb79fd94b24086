// Node's twin of bench/http_server.lua's coroutine style: per request a
// timer, then fs.open -> fs.read -> fs.close of a 512-byte file, the
// answer.  Usage: node bench/node_server.js <none|als|counting|hooks> [timer ms]
// (1 ms unless given; Node runs a 0 ms setTimeout after 1 ms).  als: an
// AsyncLocalStorage run per request; counting: the same and four hooks
// that count their events; hooks: four empty hooks.  Prints "PORT <n>";
// on SIGTERM "STATS served=<n> mismatches=<n> events=<n>".
'use strict';
const http = require('http');
const fs = require('fs');
const os = require('os');
const path = require('path');
const ah = require('async_hooks');
const ctx = process.argv[2] || 'none';
const ms = process.argv[3] === undefined ? 1 : Number(process.argv[3]);

const file = path.join(os.tmpdir(), `ah-bench-${process.pid}`);
fs.writeFileSync(file, 'x'.repeat(512));

let als = null;
let inits = 0, befores = 0, afters = 0, destroys = 0;
if (ctx === 'als' || ctx === 'counting') als = new ah.AsyncLocalStorage();
if (ctx === 'counting') {
  ah.createHook({
    init() { inits++; }, before() { befores++; }, after() { afters++; }, destroy() { destroys++; },
  }).enable();
} else if (ctx === 'hooks') {
  ah.createHook({ init() {}, before() {}, after() {}, destroy() {} }).enable();
} else if (ctx !== 'none' && ctx !== 'als') {
  throw new Error(`unknown context kind ${ctx}`);
}

let n = 0, served = 0, mismatches = 0;
function handle(id, req, res) {
  setTimeout(() => {
    fs.open(file, 'r', (oerr, fd) => {
      fs.read(fd, Buffer.alloc(512), 0, 512, 0, (err, bytes) => {
        fs.close(fd, () => {
          // the same answer in every configuration (see bench/http_server.lua)
          const got = als ? als.getStore() : id;
          if (als && got !== id) mismatches++;
          served++;
          res.end(`${got} ${bytes}\n`);
        });
      });
    });
  }, ms);
}
const server = http.createServer((req, res) => {
  n++;
  if (als) als.run(n, handle, n, req, res); else handle(n, req, res);
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
process.on('SIGTERM', () => {
  const events = inits + befores + afters + destroys;
  try { fs.unlinkSync(file); } catch (e) { /* already gone */ }
  process.stdout.write(`STATS served=${served} mismatches=${mismatches} events=${events}\n`, () => {
    server.close();
    process.exit(0);
  });
});
