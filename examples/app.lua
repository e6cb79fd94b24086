--- A tiny OpenResty-style server on luv: one coroutine per request and an
-- `await` helper that parks the request's coroutine until a luv callback
-- resumes it.  Shared by the demo and the benchmarks.
local uv = require("luv")

local M = {}

--- Park the running coroutine until the callback given to `start` fires;
-- returns the callback's arguments.
-- @tparam function start receives the callback `k` to hand to luv
function M.await(start)
  local co = coroutine.running()
  start(function(...)
    local ok, err = coroutine.resume(co, ...)
    if not ok then error(err, 0) end
  end)
  return coroutine.yield()
end

--- Sleep `ms` milliseconds.
function M.sleep(ms)
  local t = uv.new_timer()
  M.await(function(k) t:start(ms, 0, k) end)
  t:close()
end

--- Read a whole file through luv's thread pool.
function M.read_file(path)
  local err, fd = M.await(function(k) uv.fs_open(path, "r", 420, k) end)
  assert(not err, err)
  local err2, st = M.await(function(k) uv.fs_fstat(fd, k) end)
  assert(not err2, err2)
  local err3, data = M.await(function(k) uv.fs_read(fd, st.size, 0, k) end)
  assert(not err3, err3)
  M.await(function(k) uv.fs_close(fd, k) end)
  return data
end

--- Send `payload` to a TCP server on loopback and read its answer.
function M.upstream(port, payload)
  local c = uv.new_tcp()
  local err = M.await(function(k) c:connect("127.0.0.1", port, k) end)
  assert(not err, err)
  M.await(function(k) c:write(payload, k) end)
  local chunks = {}
  M.await(function(k)
    c:read_start(function(rerr, data)
      if data then chunks[#chunks + 1] = data else k(rerr) end
    end)
  end)
  c:close()
  return table.concat(chunks)
end

--- A file descriptor open on `bytes` bytes of `ch` (an unlinked temporary
-- file), for servers that read a file per request.
function M.data_fd(bytes, ch)
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write((ch or "x"):rep(bytes))
  f:close()
  local fd = assert(uv.fs_open(path, "r", 420))
  os.remove(path)
  return fd
end

--- A TCP server that answers "pong:<payload>" after `delay` ms, then closes.
function M.upstream_server(delay)
  local server = uv.new_tcp()
  assert(server:bind("127.0.0.1", 0))
  server:listen(1024, function()
    local c = uv.new_tcp()
    server:accept(c)
    c:read_start(function(err, data)
      if not data then return c:close() end
      local t = uv.new_timer()
      t:start(delay, 0, function()
        t:close()
        c:write("pong:" .. data, function() c:shutdown(function() c:close() end) end)
      end)
    end)
  end)
  return server, server:getsockname().port
end

--- A minimal HTTP/1.1 server (GET, keep-alive, no pipelining).
-- `handler(req, respond)` is called from the read callback; `respond(body)`
-- writes a 200 answer.
function M.http_server(handler, port)
  local server = uv.new_tcp()
  assert(server:bind("127.0.0.1", port or 0))
  server:listen(1024, function(lerr)
    if lerr then return end
    local client = uv.new_tcp()
    server:accept(client)
    local buf = ""
    client:read_start(function(err, data)
      if err or not data then
        if not client:is_closing() then client:close() end
        return
      end
      buf = buf .. data
      while true do
        local e = buf:find("\r\n\r\n", 1, true)
        if not e then break end
        local head = buf:sub(1, e - 1)
        buf = buf:sub(e + 4)
        local method, path = head:match("^(%u+) (%S+)")
        local headers = {}
        for k, v in head:gmatch("\r\n([^:\r\n]+):%s*([^\r\n]*)") do headers[k:lower()] = v end
        handler({ method = method, path = path, headers = headers }, function(body)
          if client:is_closing() then return end
          client:write(("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s")
            :format(#body, body))
        end)
      end
    end)
  end)
  return server, server:getsockname().port
end

--- One HTTP GET on a fresh connection; calls `done(body)`.
function M.http_get(port, path, headers, done)
  local c = uv.new_tcp()
  c:connect("127.0.0.1", port, function(err)
    assert(not err, err)
    local req = { "GET " .. path .. " HTTP/1.1\r\nHost: localhost\r\n" }
    for k, v in pairs(headers or {}) do req[#req + 1] = k .. ": " .. v .. "\r\n" end
    req[#req + 1] = "\r\n"
    c:write(table.concat(req))
    local buf = ""
    c:read_start(function(rerr, data)
      if data then buf = buf .. data end
      local e = buf:find("\r\n\r\n", 1, true)
      local len = tonumber(buf:match("Content%-Length: (%d+)"))
      if e and len and #buf >= e + 3 + len then
        c:read_stop()
        c:close()
        done(buf:sub(e + 4, e + 3 + len))
      elseif not data then
        c:close()
        done(nil, rerr)
      end
    end)
  end)
end

return M
