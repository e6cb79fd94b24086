-- The demo: an OpenResty-style HTTP server on luv where a request id follows
-- each request through timers, file reads and an upstream TCP call, into a
-- logger that is given nothing about the request.  Run with `make demo`.
package.path = "examples/?.lua;" .. package.path
local uv = require("luv") -- luv first, on the main thread
local ah = require("async_hooks").install()
local app = require("app")
local log = require("reqlog")

local FILE = "examples/demo.lua"
local N = tonumber(arg[1]) or 8

local upstream, up_port = app.upstream_server(3)
local roots = {}

-- One coroutine per request.  Everything below reads the request id from the
-- AsyncLocal; nothing passes it along.
local function handler(req, respond)
  coroutine.wrap(function()
    local id = req.headers["x-request-id"] or "?"
    log.request_id:set(id)
    roots[id] = ah.executionAsyncId()
    log.info("%s %s", req.method, req.path)
    app.sleep(tonumber(req.path:match("(%d+)$")) or 1)
    log.info("woke up")
    local data = app.read_file(FILE)
    log.info("read %d bytes", #data)
    local answer = app.upstream(up_port, id)
    log.info("upstream answered %s", answer)
    respond(log.request_id:get())
    log.info("responded")
  end)()
end

local server, port = app.http_server(handler)
print(("demo: server on 127.0.0.1:%d, upstream on :%d, %d concurrent requests\n"):format(port, up_port, N))

local failures = 0
local function check(cond, msg)
  if not cond then
    failures = failures + 1
    print("MISMATCH: " .. msg)
  end
end

-- phase 2: one request traced with createHook, printed as a tree
local function trace_one(after)
  local node = {}
  local hook = ah.createHook {
    init = function(id, type, trigger)
      node[id] = { type = type, trigger = trigger, calls = 0, kids = {} }
      if node[trigger] then table.insert(node[trigger].kids, id) end
    end,
    before = function(id) if node[id] then node[id].calls = node[id].calls + 1 end end,
  }:enable()
  log.echo = false
  app.http_get(port, "/sleep/2", { ["X-Request-Id"] = "traced" }, function(body)
    hook:disable()
    log.echo = true
    print("\n== createHook trace of request 'traced' (async resources it created) ==")
    local function show(id, depth)
      local n = node[id]
      local what = n.type == "coroutine" and "resume" or "callback"
      print(("%s%s #%d  (%d %s%s)"):format(("  "):rep(depth), n.type, id, n.calls, what,
        n.calls == 1 and "" or "s"))
      for _, k in ipairs(n and n.kids or {}) do show(k, depth + 1) end
    end
    local root = roots.traced
    node[root] = node[root] or { type = "coroutine", calls = 1, kids = {} }
    -- resources registered by the request coroutine
    for id, n in pairs(node) do
      if n.trigger == root and id ~= root then
        local seen = false
        for _, k in ipairs(node[root].kids) do seen = seen or k == id end
        if not seen then table.insert(node[root].kids, id) end
      end
    end
    table.sort(node[root].kids)
    show(root, 0)
    check(body == "traced", "traced request answered " .. tostring(body))
    after()
  end)
end

-- phase 1: N concurrent requests, the earlier ones sleeping longer, so that
-- their log lines interleave
local answered = 0
for i = 1, N do
  local id = ("req-%02d"):format(i)
  app.http_get(port, "/sleep/" .. (N - i + 1) * 4, { ["X-Request-Id"] = id }, function(body)
    check(body == id, ("request %s answered %s"):format(id, tostring(body)))
    answered = answered + 1
    if answered == N then
      trace_one(function()
        server:close()
        upstream:close()
      end)
    end
  end)
end

uv.run()

-- every log line must carry the id of the request it was written for
local per = {}
for _, l in ipairs(log.lines) do
  per[l.id] = (per[l.id] or 0) + 1
  local echoed = l.text:match("upstream answered pong:(%S+)")
  if echoed then check(echoed == l.id, l.text) end
end
for i = 1, N do
  local id = ("req-%02d"):format(i)
  check(per[id] == 5, ("request %s has %s log lines, expected 5"):format(id, tostring(per[id])))
end
check(per["-"] == nil, "a log line without a request id")
print(("\n%d requests, %d log lines: %s"):format(N, #log.lines,
  failures == 0 and "every line carries its own request's id" or (failures .. " mismatches")))
ah.uninstall()
os.exit(failures == 0 and 0 or 1)
