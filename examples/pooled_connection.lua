-- The pooled-connection pitfall and its fix (docs/patterns.md, "Work that must not
-- inherit the request").
--
-- A pool opens its one connection lazily, while serving whichever request
-- comes first.  The connection's reader is a luv callback, so it captures
-- the context of the call that registered it: request 1's.  Every later
-- reply, also request 2's, is then read "inside request 1": its log lines
-- carry the wrong id.  Opening the connection in `Snapshot.empty()` gives
-- the reader the empty context instead; each request still sees its own id
-- once its coroutine is resumed with the reply.
local uv = require("luv")
local ah = require("async_hooks").install()

local request_id = ah.AsyncLocal.new { name = "request_id", default = "-" }
local function log(fmt, ...) print(("  [%s] " .. fmt):format(request_id:get(), ...)) end

-- a line echo server on loopback
local function echo_server()
  local server = uv.new_tcp()
  assert(server:bind("127.0.0.1", 0))
  assert(server:listen(16, function()
    local c = uv.new_tcp()
    server:accept(c)
    c:read_start(function(_, data)
      if data then c:write(data) else c:close() end
    end)
  end))
  return server, server:getsockname().port
end

-- a pool of one connection; query() is called from a request's coroutine
local function new_pool(port, isolate)
  local pool = { waiting = {}, pending = {}, buf = "" }

  local function open()
    pool.conn = uv.new_tcp()
    pool.conn:connect("127.0.0.1", port, function(err)
      assert(not err, err)
      pool.conn:read_start(function(rerr, data)
        assert(not rerr, rerr)
        if not data then return end
        pool.buf = pool.buf .. data
        for line in pool.buf:gmatch("([^\n]*)\n") do
          log("reader got %s", line)
          local waiter = table.remove(pool.waiting, 1)
          assert(coroutine.resume(waiter, line))
        end
        pool.buf = pool.buf:match("[^\n]*$")
      end)
      pool.connected = true
      for _, m in ipairs(pool.pending) do pool.conn:write(m) end
      pool.pending = {}
    end)
  end

  function pool.query(msg)
    if not pool.conn then
      if isolate then ah.Snapshot.empty():run(open) else open() end
    end
    pool.waiting[#pool.waiting + 1] = coroutine.running()
    if pool.connected then pool.conn:write(msg .. "\n") else pool.pending[#pool.pending + 1] = msg .. "\n" end
    return coroutine.yield()
  end

  function pool.close() pool.conn:close() end
  return pool
end

local function scenario(isolate)
  print(isolate and "pool opened in Snapshot.empty():" or "pool opened inside request 1:")
  local server, port = echo_server()
  local pool = new_pool(port, isolate)
  local function request(id, msg, after)
    coroutine.wrap(function()
      request_id:set(id)
      log("reply %s", pool.query(msg))
      if after then after() end
    end)()
  end
  request("req-1", "q1", function()
    request("req-2", "q2", function() pool.close(); server:close() end)
  end)
  uv.run()
end

scenario(false)
scenario(true)
