// Node's twin of bench/http_server.lua: per request a timer, one file read,
// the answer.  Usage: node bench/node_server.js <none|als|hooks> [timer ms]
// (1 ms unless given; Node runs a 0 ms setTimeout after 1 ms).  Prints
// "PORT <n>"; on SIGTERM "STATS served=<n> mismatches=<n>".
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
const fd = fs.openSync(file, 'r');
fs.unlinkSync(file);

let als = null;
if (ctx === 'als') als = new ah.AsyncLocalStorage();
else if (ctx === 'hooks') ah.createHook({ init() {}, before() {}, after() {}, destroy() {} }).enable();
else if (ctx !== 'none') throw new Error(`unknown context kind ${ctx}`);

let n = 0, served = 0, mismatches = 0;
function handle(id, req, res) {
  setTimeout(() => {
    fs.read(fd, Buffer.alloc(512), 0, 512, 0, (err, bytes) => {
      // the same answer in every configuration (see bench/http_server.lua)
      const got = als ? als.getStore() : id;
      if (als && got !== id) mismatches++;
      served++;
      res.end(`${got} ${bytes}\n`);
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
  process.stdout.write(`STATS served=${served} mismatches=${mismatches}\n`, () => {
    server.close();
    process.exit(0);
  });
});
