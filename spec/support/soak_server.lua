--- Soak server: the demo server shape (coroutine per request, 1 ms timer,
-- file read) with an AsyncLocal and all four hooks enabled (the destroy
-- pattern keeps a map keyed by asyncId).  Every response checks that both
-- the AsyncLocal and the hook map still hold the id from the request's own
-- path; a mismatch answers "MISMATCH".  On SIGTERM it prints its statistics.
-- Run by spec/10-soak_spec.lua (with spec/support/soak_wrk.lua as wrk's
-- script) from the repository's root.
package.path = "examples/?.lua;bench/?.lua;" .. package.path
local uv = require("luv")
local ah = require("async_hooks").install()
local app = require("app")

local rid = ah.AsyncLocal.new { name = "rid" }
local map, live = {}, 0
ah.createHook {
  init = function(id, _, trigger) map[id] = map[trigger]; live = live + 1 end,
  before = function() end,
  after = function() end,
  destroy = function(id) map[id] = nil; live = live - 1 end,
}:enable()

local fd = app.data_fd(256, "y")
local rss = require("util").rss_kb

local served, mismatches, rss_warm = 0, 0, nil
local server, port = app.http_server(function(req, respond)
  coroutine.wrap(function()
    local id = req.path:match("id=(%d+)") or "none"
    rid:set(id)
    map[ah.executionAsyncId()] = id
    app.sleep(1)
    local _, data = app.await(function(k) uv.fs_read(fd, 256, 0, k) end)
    local ok = rid:get() == id and map[ah.executionAsyncId()] == id and #data == 256
    served = served + 1
    if served == 20000 then collectgarbage(); rss_warm = rss() end
    if not ok then mismatches = mismatches + 1 end
    respond(ok and id or "MISMATCH")
  end)()
end)
io.stdout:write("PORT ", port, "\n")
io.stdout:flush()
local sig = uv.new_signal()
sig:start("sigterm", function()
  sig:close()
  server:close()
  collectgarbage()
  collectgarbage()
  io.stdout:write(("STATS served=%d mismatches=%d rss_warm=%d rss_end=%d live=%d\n"):format(
    served, mismatches, rss_warm or 0, rss(), live))
  io.stdout:flush()
  uv.stop()
end)
uv.run()
