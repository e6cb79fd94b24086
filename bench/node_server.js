// Node's side of the HTTP benchmark, the same shape as bench/http_server.lua:
// per request one 1 ms timer, one file read, the answer.
// Usage: node bench/node_server.js <none|als|hooks>
'use strict';
const http = require('http');
const fs = require('fs');
const os = require('os');
const path = require('path');
const ah = require('async_hooks');
const ctx = process.argv[2] || 'none';

const file = path.join(os.tmpdir(), `ah-bench-${process.pid}`);
fs.writeFileSync(file, 'x'.repeat(512));
const fd = fs.openSync(file, 'r');
fs.unlinkSync(file);

let als = null;
if (ctx === 'als') als = new ah.AsyncLocalStorage();
if (ctx === 'hooks') ah.createHook({ init() {}, before() {}, after() {}, destroy() {} }).enable();

let n = 0;
function handle(req, res) {
  setTimeout(() => {
    fs.read(fd, Buffer.alloc(512), 0, 512, 0, (err, bytes) => {
      const id = als ? als.getStore() : '-';
      res.end(`${id} ${bytes}\n`);
    });
  }, 1);
}
const server = http.createServer((req, res) => {
  n++;
  if (als) als.run(n, handle, req, res); else handle(req, res);
});
server.listen(0, '127.0.0.1', () => {
  process.stdout.write(`PORT ${server.address().port}\n`);
});
process.on('SIGTERM', () => { server.close(); process.exit(0); });
