-- examples/openresty/ as shipped: the same nginx command as its comment
-- (`nginx -p examples/openresty/ -c nginx.conf`, from a copy of the
-- repository layout in a temporary folder, on a free port), one request,
-- its id in the answer (light thread) and in the error log (timer, log
-- phase).  Suite: `make openresty`.
local uv = require("luv")
local N = require("support.nginx")

local sh, slurp = N.sh, N.slurp

-- one HTTP/1.0 GET with an X-Request-Id header: status, body (nil, err)
local function get(port, path, id, timeout)
  local t = uv.new_tcp()
  local chunks, result = {}, nil
  local function finish(...)
    if result then return end
    result = table.pack(...)
    if not t:is_closing() then t:close() end
  end
  t:connect("127.0.0.1", port, function(err)
    if err then return finish(nil, err) end
    t:write("GET " .. path .. " HTTP/1.0\r\nHost: localhost\r\nX-Request-Id: " .. id .. "\r\n\r\n")
    t:read_start(function(rerr, data)
      if rerr then return finish(nil, rerr) end
      if data then chunks[#chunks + 1] = data; return end
      local resp = table.concat(chunks)
      local st = tonumber(resp:match("^HTTP/1%.%d (%d%d%d)"))
      finish(st, resp:match("\r\n\r\n(.*)$"))
    end)
  end)
  local timer = uv.new_timer()
  timer:start((timeout or 5) * 1000, 0, function() finish(nil, "timeout") end)
  while not result do uv.run("once") end
  timer:close()
  uv.run("nowait")
  return result[1], result[2]
end

describe("#openresty examples/openresty", function()
  local root, prefix, port, started

  setup(function()
    local p = io.popen("mktemp -d " .. (os.getenv("TMPDIR") or "/tmp") .. "/ah-example-XXXXXX")
    root = p:read("l")
    p:close()
    prefix = root .. "/examples/openresty"
    port = N.free_port()
    local src = N.ROOT .. "/examples/openresty"
    -- the repository's layout: examples/openresty/ and lua/ two levels up;
    -- workers run as nobody when the master is root: let them in
    assert(sh(("mkdir -p '%s/logs' '%s/temp' && ln -s '%s/lua' '%s/lua' && cp '%s/app.lua' '%s/' && chmod -R 755 '%s'")
      :format(prefix, prefix, N.ROOT, root, src, prefix, root)))
    local conf = slurp(src .. "/nginx.conf")
    assert(conf ~= "", "examples/openresty/nginx.conf not readable")
    local n
    conf, n = conf:gsub("listen 127%.0%.0%.1:8080;", ("listen 127.0.0.1:%d;"):format(port))
    assert.are.equal(1, n, "nginx.conf: the listen line changed")
    local f = assert(io.open(prefix .. "/nginx.conf", "w"))
    f:write(conf)
    f:close()
    local ok = sh(("cd '%s' && %s -p examples/openresty/ -c nginx.conf 2>'%s/start.err'"):format(root, N.NGINX, root))
    assert(ok, "nginx did not start: " .. slurp(root .. "/start.err") .. slurp(prefix .. "/logs/error.log"))
    started = true
  end)

  teardown(function()
    if started then
      sh(("cd '%s' && %s -p examples/openresty/ -c nginx.conf -s quit 2>/dev/null"):format(root, N.NGINX))
      local pid = tonumber(slurp(prefix .. "/logs/nginx.pid"))
      for _ = 1, 200 do
        if not (pid and sh("kill -0 " .. pid .. " 2>/dev/null")) then break end
        uv.sleep(50)
      end
      if pid and sh("kill -0 " .. pid .. " 2>/dev/null") then sh("kill -9 " .. pid) end
    end
    if root and not os.getenv("AH_KEEP_PREFIX") then sh("rm -rf '" .. root .. "'") end
  end)

  it("carries the request id into the light thread, the timer and the log phase", function()
    local st, body
    for _ = 1, 100 do -- until it accepts
      st, body = get(port, "/", "probe", 2)
      if st then break end
      uv.sleep(50)
    end
    assert.are.equal(200, st, body)
    local ids = { "req-a1", "req-b2", "req-c3" }
    for _, id in ipairs(ids) do
      st, body = get(port, "/", id)
      assert.are.equal(200, st, body)
      assert.are.equal(("hello %s (light thread saw %s)\n"):format(id, id), body)
    end
    local log
    for _ = 1, 100 do -- the timers run after their requests
      log = slurp(prefix .. "/logs/error.log")
      local all = true
      for _, id in ipairs(ids) do
        if not log:find("timer request_id=" .. id, 1, true) then all = false end
      end
      if all then break end
      uv.sleep(50)
    end
    for _, id in ipairs(ids) do
      for _, what in ipairs { "timer", "thread", "done" } do
        assert.truthy(log:find(what .. " request_id=" .. id:gsub("%-", "%%-") .. "[^%w%-]"), what .. " " .. id .. ":\n" .. log)
      end
    end
    assert.falsy(log:find("%[error%]") or log:find("%[alert%]"), log)
  end)
end)
