--- A lua-http server on cqueues whose logger is given nothing, yet every
-- line carries its request's id: the handler sets the id, starts two
-- sub-tasks with `cq:wrap` and waits for them; each sub-task sleeps and
-- logs.  Every line also shows `executionAsyncId()` and `triggerAsyncId()`:
-- a sub-task's trigger is the id of the handler that started it.
--
-- Then the same program is its own client: `n` requests at once (lua-http's
-- client, each in its own `cq:wrap` thread) on loopback, and a check of
-- every line.  Run: `lua5.4 examples/lua_http.lua [n]` (lua-http is
-- packaged for Lua 5.1-5.3 on Debian: see examples/README.md for LUA_PATH).
local ah = require("async_hooks").install()
local cqueues = require("cqueues")
local condition = require("cqueues.condition")
local http_server = require("http.server")
local http_headers = require("http.headers")
local http_request = require("http.request")

local N = tonumber(arg and arg[1]) or 4

local request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }

local lines = {}

--- The logger: it reads the request id from the context.
local function log(fmt, ...)
  local line = ("[req %s] eid=%d trigger=%d " .. fmt):format(request_id:get(), ah.executionAsyncId(),
    ah.triggerAsyncId(), ...)
  lines[#lines + 1] = line
  print(line)
end

local cq = cqueues.new()

local function onstream(_, stream)
  local req = assert(stream:get_headers())
  request_id:set(req:get("x-request-id") or "?")
  log("handler %s", req:get(":path"))
  -- two sub-tasks; the handler answers when both are done
  local pending, done = 2, condition.new()
  for i = 1, 2 do
    cq:wrap(function()
      log("sub-task %d started", i)
      cqueues.sleep(0.005 * i)
      log("sub-task %d done", i)
      pending = pending - 1
      if pending == 0 then done:signal() end
    end)
  end
  while pending > 0 do done:wait() end
  log("responding")
  local res = http_headers.new()
  res:append(":status", "200")
  res:append("content-type", "text/plain")
  assert(stream:write_headers(res, false))
  assert(stream:write_chunk(request_id:get() .. "\n", true))
end

local server = http_server.listen {
  host = "127.0.0.1",
  port = 0,
  cq = cq,
  onstream = onstream,
  onerror = function(_, context, op, err) error(("%s on %s: %s"):format(op, tostring(context), tostring(err))) end,
}
assert(server:listen())
local _, host, port = server:localname()

-- the client: N requests at once, each answered with its own id
local answers, finished = {}, 0
for i = 1, N do
  local id = ("r%02d"):format(i)
  cq:wrap(function()
    local r = http_request.new_from_uri(("http://%s:%d/item/%d"):format(host, port, i))
    r.headers:upsert("x-request-id", id)
    local headers, stream = assert(r:go(10))
    assert(headers:get(":status") == "200")
    answers[id] = assert(stream:get_body_as_string())
    finished = finished + 1
  end)
end

repeat
  local ok, err = cq:step(1)
  if not ok then error(err) end
until finished == N
server:close()

-- the check: the request id of every line, and every sub-task's trigger
local bad, handler_of = 0, {}
for _, line in ipairs(lines) do
  local id, eid, what = line:match("^%[req (%S+)%] eid=(%d+) trigger=%d+ (%S+)")
  if what == "handler" then handler_of[id] = eid end
end
for _, line in ipairs(lines) do
  local id, trigger, what = line:match("^%[req (%S+)%] eid=%d+ trigger=(%d+) (%S+)")
  if not id or id == "-" or id == "?" or not handler_of[id]
      or (what == "sub-task" and trigger ~= handler_of[id]) then
    bad = bad + 1
    print("MISMATCH: " .. line)
  end
end
for i = 1, N do
  local id = ("r%02d"):format(i)
  if answers[id] ~= id .. "\n" then
    bad = bad + 1
    print("MISMATCH: answer to " .. id .. ": " .. tostring(answers[id]))
  end
end
if bad == 0 then
  print(("%d requests, %d log lines: every line carries its own request's id, "
    .. "every sub-task's trigger is its handler"):format(N, #lines))
end
os.exit(bad == 0 and 0 or 1)
