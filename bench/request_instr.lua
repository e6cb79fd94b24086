--- User-space instructions per request on the issue's request shape, without
-- a network client: a luv TCP server and its client in one process on
-- loopback, one connection, one request in flight.  Per request the server
-- runs one coroutine that does fs_open -> fs_read -> fs_close, a 0 ms timer,
-- one AsyncLocal set and one get, and writes its answer; the client sends
-- the next request when the answer arrives.
--   lua5.4 bench/request_instr.lua            -- the table (callgrind)
--   lua5.4 bench/request_instr.lua run <cfg> <n>  -- one run
-- cfg: none (no library) | asynclocal | hooks (the AsyncLocal and four
-- hooks that count their events).  Each configuration runs under callgrind
-- for N1 and N2 requests; the figure is (count(N2) - count(N1)) / (N2 - N1),
-- so start-up and shutdown cancel.  BENCH_REQI_N1, BENCH_REQI_N2 (300, 1300).
-- The collector's cycles fall differently in the two runs (about +-0.5 %);
-- BENCH_REQI_GC=stop runs with the collector stopped, to compare small
-- changes (a figure without the collector's share).
package.path = "bench/?.lua;examples/?.lua;" .. package.path

local function run(cfg, n)
  if os.getenv("BENCH_REQI_GC") == "stop" then collectgarbage("stop") end
  local uv = require("luv")
  local setid, getid
  local events = 0
  if cfg ~= "none" then
    local ah = require("async_hooks").install()
    local v = ah.AsyncLocal.new()
    setid = function(id) v:set(id) end
    getid = function() return v:get() end
    if cfg == "hooks" then
      ah.createHook {
        init = function() events = events + 1 end,
        before = function() events = events + 1 end,
        after = function() events = events + 1 end,
        destroy = function() events = events + 1 end,
      }:enable()
    elseif cfg ~= "asynclocal" then
      error("unknown configuration " .. cfg)
    end
  end
  local app = require("app")
  local await, sleep = app.await, app.sleep
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(("x"):rep(512))
  f:close()

  local served, mismatches = 0, 0
  local function request(conn, id)
    coroutine.wrap(function()
      if setid then setid(id) end
      local err, fd = await(function(k) uv.fs_open(path, "r", 420, k) end)
      assert(not err, err)
      local err2, data = await(function(k) uv.fs_read(fd, 512, 0, k) end)
      assert(not err2, err2)
      await(function(k) uv.fs_close(fd, k) end)
      sleep(0)
      local got = id
      if getid then
        got = getid()
        if got ~= id then mismatches = mismatches + 1 end
      end
      served = served + 1
      conn:write(("%s %d\n"):format(tostring(got), #data))
    end)()
  end

  local server = uv.new_tcp()
  assert(server:bind("127.0.0.1", 0))
  server:listen(16, function(lerr)
    assert(not lerr, lerr)
    local conn = uv.new_tcp()
    server:accept(conn)
    local buf, next_id = "", 0
    conn:read_start(function(err, data)
      if err or not data then return conn:close() end
      buf = buf .. data
      while true do
        local e = buf:find("\n", 1, true)
        if not e then break end
        buf = buf:sub(e + 1)
        next_id = next_id + 1
        request(conn, next_id)
      end
    end)
  end)
  local port = server:getsockname().port

  local client = uv.new_tcp()
  local sent = 0
  client:connect("127.0.0.1", port, function(cerr)
    assert(not cerr, cerr)
    local cbuf = ""
    client:read_start(function(err, data)
      assert(not err, err)
      if not data then return end
      cbuf = cbuf .. data
      while true do
        local e = cbuf:find("\n", 1, true)
        if not e then break end
        cbuf = cbuf:sub(e + 1)
        if sent < n then
          sent = sent + 1
          client:write("GET\n")
        else
          client:close()
          server:close()
          return
        end
      end
    end)
    sent = 1
    client:write("GET\n")
  end)
  uv.run()
  uv.run() -- the closes
  os.remove(path)
  io.stdout:write(("STATS served=%d mismatches=%d events=%d\n"):format(served, mismatches, events))
end

if arg[1] == "run" then
  return run(arg[2], assert(tonumber(arg[3]), "n"))
end

local N1 = tonumber(os.getenv("BENCH_REQI_N1")) or 300
local N2 = tonumber(os.getenv("BENCH_REQI_N2")) or 1300
local LUA = os.getenv("LUA") or "lua5.4"

local function count(cfg, n)
  local p = io.popen(("valgrind --tool=callgrind --callgrind-out-file=/dev/null %s bench/request_instr.lua run %s %d 2>&1")
    :format(LUA, cfg, n))
  local s = p:read("a")
  p:close()
  local ins, served = tonumber(s:match("Collected : (%d+)")), tonumber(s:match("served=(%d+)"))
  local mism, events = tonumber(s:match("mismatches=(%d+)")), tonumber(s:match("events=(%d+)"))
  if not (ins and served == n and mism == 0) then error(("%s %d failed:\n%s"):format(cfg, n, s), 0) end
  return ins, events
end

io.stdout:write(("instructions per request (callgrind; (count(%d) - count(%d)) / %d)\n"):format(N2, N1, N2 - N1))
local base
for _, cfg in ipairs(arg[1] and { table.unpack(arg) } or { "none", "asynclocal", "hooks" }) do
  local a, ea = count(cfg, N1)
  local b, eb = count(cfg, N2)
  local per = (b - a) / (N2 - N1)
  local line = ("%-12s %9.0f"):format(cfg, per)
  if cfg == "none" then base = per
  elseif base then line = line .. ("   %+8.0f over none"):format(per - base) end
  if cfg == "hooks" then line = line .. ("   %.1f hook events per request"):format((eb - ea) / (N2 - N1)) end
  io.stdout:write(line, "\n")
  io.stdout:flush()
end
