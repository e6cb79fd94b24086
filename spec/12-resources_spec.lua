-- The resource tables of luv registrations: `op` (the luv
-- function's name), `handle` where there is one, `path` (and `new_path`) for
-- fs calls that take paths, `host`/`port` for tcp_connect and udp_send,
-- `host`/`service` for getaddrinfo.  Every test does real I/O and checks
-- both what `init` received and what `executionAsyncResource()` returns
-- inside the callback (the same table).
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")

local tmpfile = H.tmpfile

-- the resource's fields other than `handle`, as a sorted "k=v" string
local function fields(res)
  local ks = {}
  for k, v in pairs(res) do
    if k ~= "handle" then ks[#ks + 1] = k .. "=" .. tostring(v) end
  end
  table.sort(ks)
  return table.concat(ks, " ")
end

describe("luv resource fields", function()
  local track, untrack = H.hook_tracker()
  local inits -- list of {id, type, resource}, in init order
  local by_id

  before_each(function()
    ah.install()
    inits, by_id = {}, {}
    track(ah.createHook {
      init = function(id, type, _, res)
        local e = { id = id, type = type, res = res }
        inits[#inits + 1] = e
        by_id[id] = e
      end,
    }):enable()
  end)
  after_each(function()
    untrack()
    ah.uninstall()
  end)

  -- the resources that init saw for `op`, in order
  local function of(op)
    local out = {}
    for _, e in ipairs(inits) do
      if e.res.op == op then out[#out + 1] = e end
    end
    return out
  end

  -- `executionAsyncResource()` inside a callback, checked against init's
  local function here(seen, key)
    local res = ah.executionAsyncResource()
    local e = by_id[ah.executionAsyncId()]
    assert(e and e.res == res, "not the init resource")
    seen[key] = res
  end

  it("fs calls that take a path: op and path (new_path for the second one)", function()
    local path = tmpfile("x")
    local other = path .. ".moved"
    local seen = {}
    uv.fs_stat(path, function(err)
      assert.is_nil(err)
      here(seen, "stat")
      uv.fs_rename(path, other, function(err2)
        assert.is_nil(err2)
        here(seen, "rename")
        uv.fs_unlink(other, function(err3)
          assert.is_nil(err3)
          here(seen, "unlink")
        end)
      end)
    end)
    uv.run()
    assert.equal("op=fs_stat path=" .. path, fields(seen.stat))
    assert.equal("new_path=" .. other .. " op=fs_rename path=" .. path, fields(seen.rename))
    assert.equal("op=fs_unlink path=" .. other, fields(seen.unlink))
    for _, e in ipairs(inits) do
      assert.equal("uv_fs", e.type)
      assert.is_nil(e.res.handle)
    end
    assert.equal(3, #inits)
  end)

  it("fs calls on an fd: op, no path; a failed call still names its path", function()
    local path = tmpfile("hello")
    local seen = {}
    uv.fs_open(path, "r", 438, function(err, fd)
      assert.is_nil(err)
      here(seen, "open")
      uv.fs_read(fd, 5, 0, function(err2, data)
        assert.is_nil(err2)
        assert.equal("hello", data)
        here(seen, "read")
        uv.fs_fstat(fd, function()
          here(seen, "fstat")
          uv.fs_close(fd, function() here(seen, "close") end)
        end)
      end)
    end)
    uv.fs_open("/nonexistent/dir/file", "r", 438, function(err)
      assert.matches("ENOENT", err)
      here(seen, "enoent")
    end)
    uv.run()
    os.remove(path)
    assert.equal("op=fs_open path=" .. path, fields(seen.open))
    assert.equal("op=fs_read", fields(seen.read))
    assert.equal("op=fs_fstat", fields(seen.fstat))
    assert.equal("op=fs_close", fields(seen.close))
    assert.equal("op=fs_open path=/nonexistent/dir/file", fields(seen.enoent))
  end)

  it("fs_opendir / fs_readdir / fs_closedir: the path, then the uv_dir as handle", function()
    local dir = os.tmpname()
    os.remove(dir)
    assert(uv.fs_mkdir(dir, 448))
    local seen = {}
    local d
    uv.fs_opendir(dir, function(err, dd)
      assert.is_nil(err)
      d = dd
      here(seen, "opendir")
      uv.fs_readdir(d, function()
        here(seen, "readdir")
        uv.fs_closedir(d, function() here(seen, "closedir") end)
      end)
    end, 4)
    uv.run()
    assert(uv.fs_rmdir(dir))
    assert.equal("op=fs_opendir path=" .. dir, fields(seen.opendir))
    assert.is_nil(seen.opendir.handle)
    assert.equal("op=fs_readdir", fields(seen.readdir))
    assert.equal(d, seen.readdir.handle)
    assert.equal("op=fs_closedir", fields(seen.closedir))
  end)

  it("timers: timer_start through both forms, and close, with the handle", function()
    local seen = {}
    local a, b = uv.new_timer(), uv.new_timer()
    a:start(1, 0, function()
      here(seen, "method")
      a:close(function() here(seen, "close") end)
    end)
    uv.timer_start(b, 1, 0, function()
      here(seen, "function")
      uv.close(b)
    end)
    uv.run()
    assert.equal("op=timer_start", fields(seen.method))
    assert.equal(a, seen.method.handle)
    assert.equal("op=timer_start", fields(seen["function"]))
    assert.equal(b, seen["function"].handle)
    assert.equal("op=close", fields(seen.close))
    assert.equal(a, seen.close.handle)
    local closes = of("close")
    assert.equal(1, #closes) -- uv.close(b) gave no callback: no resource
    assert.equal("uv_timer", closes[1].type) -- a close has the handle's type
  end)

  it("a timer re-armed twice inside its callback: the callback keeps its own resource", function()
    local t = uv.new_timer()
    local n, same = 0, {}
    local function cb()
      n = n + 1
      if n > 1 then t:close() return end
      local mine = ah.executionAsyncResource()
      t:start(0, 0, cb)
      same[1] = ah.executionAsyncResource() == mine
      t:start(0, 0, cb)
      same[2] = ah.executionAsyncResource() == mine
      same[3] = by_id[ah.executionAsyncId()].res == mine
    end
    t:start(0, 0, cb)
    uv.run()
    assert.same({ true, true, true }, same)
    assert.equal(2, n)
  end)

  it("a timer re-armed inside a scope its callback opened: the scope's resource, then the callback's", function()
    local t = uv.new_timer()
    local n, got = 0, {}
    local function cb()
      n = n + 1
      if n > 1 then t:close() return end
      local ar = ah.AsyncResource.new("AR")
      ar:runInAsyncScope(function()
        got[1] = ah.executionAsyncResource() == ar
        t:start(0, 0, cb) -- the running callback's own handle
        got[2] = ah.executionAsyncResource() == ar
      end)
      got[3] = ah.executionAsyncResource() == by_id[ah.executionAsyncId()].res
    end
    t:start(0, 0, cb)
    uv.run()
    assert.same({ true, true, true }, got)
  end)

  it("a nested uv.run (in a coroutine) whose callback re-arms the outer callback's handle", function()
    local t, i = uv.new_timer(), uv.new_idle()
    local got = {}
    t:start(0, 0, function()
      i:start(function()
        local mine = ah.executionAsyncResource()
        i:stop(); i:close()
        t:start(0, 0, function() t:close() end) -- the outer callback's handle
        got[1] = ah.executionAsyncResource() == mine
        got[2] = mine == by_id[ah.executionAsyncId()].res
      end)
      coroutine.wrap(function() uv.run("nowait") end)() -- luv runs it on the main thread
      got[3] = ah.executionAsyncResource() == by_id[ah.executionAsyncId()].res
    end)
    uv.run()
    assert.same({ true, true, true }, got)
  end)

  it("tcp: listen, tcp_connect (host, port), read_start, write, shutdown, close", function()
    local seen = {}
    local server = uv.new_tcp()
    assert(server:bind("127.0.0.1", 0))
    local port = server:getsockname().port
    local conn
    assert(server:listen(8, function(err)
      assert.is_nil(err)
      here(seen, "listen")
      conn = uv.new_tcp()
      server:accept(conn)
      conn:read_start(function(err2, data)
        assert.is_nil(err2)
        here(seen, "read_start")
        if data then
          conn:write("pong:" .. data, function()
            here(seen, "write")
          end)
        else
          conn:close(function() here(seen, "close") end)
          server:close()
        end
      end)
    end))
    local client = uv.new_tcp()
    client:connect("127.0.0.1", port, function(err)
      assert.is_nil(err)
      here(seen, "connect")
      client:write("ping")
      client:read_start(function(_, data)
        if data then
          client:shutdown(function()
            here(seen, "shutdown")
          end)
        else
          client:close()
        end
      end)
    end)
    uv.run()
    assert.equal("op=listen", fields(seen.listen))
    assert.equal(server, seen.listen.handle)
    assert.equal("host=127.0.0.1 op=tcp_connect port=" .. port, fields(seen.connect))
    assert.equal(client, seen.connect.handle)
    assert.equal("op=read_start", fields(seen.read_start))
    assert.equal(conn, seen.read_start.handle)
    assert.equal("op=write", fields(seen.write))
    assert.equal(conn, seen.write.handle)
    assert.equal("op=shutdown", fields(seen.shutdown))
    assert.equal(client, seen.shutdown.handle)
    assert.equal("op=close", fields(seen.close))
    assert.equal(conn, seen.close.handle)
    -- types: the handle's for handle callbacks, the request's for requests
    assert.equal("uv_tcp", of("listen")[1].type)
    assert.equal("uv_tcp", of("read_start")[1].type)
    assert.equal("uv_connect", of("tcp_connect")[1].type)
    assert.equal("uv_write", of("write")[1].type)
    assert.equal(1, #of("write")) -- the client's write gave no callback: none
  end)

  it("udp: udp_recv_start with the handle, udp_send with host and port", function()
    local seen = {}
    local rx = uv.new_udp()
    assert(rx:bind("127.0.0.1", 0))
    local port = rx:getsockname().port
    rx:recv_start(function(err, data)
      assert.is_nil(err)
      if data then
        here(seen, "recv")
        rx:recv_stop()
        rx:close()
      end
    end)
    local tx = uv.new_udp()
    tx:send("hi", "127.0.0.1", port, function(err)
      assert.is_nil(err)
      here(seen, "send")
      tx:close()
    end)
    uv.run()
    assert.equal("op=udp_recv_start", fields(seen.recv))
    assert.equal(rx, seen.recv.handle)
    assert.equal("host=127.0.0.1 op=udp_send port=" .. port, fields(seen.send))
    assert.equal(tx, seen.send.handle)
    assert.equal("uv_udp_send", of("udp_send")[1].type)
  end)

  it("getaddrinfo: host and service (service absent when not given)", function()
    local seen = {}
    uv.getaddrinfo("localhost", "80", { socktype = "stream" }, function(err)
      assert.is_nil(err)
      here(seen, "both")
    end)
    uv.getaddrinfo("localhost", nil, { socktype = "stream" }, function(err)
      assert.is_nil(err)
      here(seen, "host")
    end)
    uv.run()
    assert.equal("host=localhost op=getaddrinfo service=80", fields(seen.both))
    assert.equal("host=localhost op=getaddrinfo", fields(seen.host))
    assert.equal("uv_getaddrinfo", of("getaddrinfo")[1].type)
  end)

  it("handles made by the call: new_async and spawn get their handle", function()
    local seen = {}
    local a
    a = uv.new_async(function()
      here(seen, "async")
      a:close()
    end)
    a:send()
    local p
    p = uv.spawn("true", {}, function(code)
      assert.equal(0, code)
      here(seen, "spawn")
      p:close()
    end)
    uv.run()
    assert.equal("op=new_async", fields(seen.async))
    assert.equal(a, seen.async.handle)
    assert.equal("op=spawn", fields(seen.spawn))
    assert.equal(p, seen.spawn.handle)
  end)

  it("a bad argument raises luv's error unchanged; no init, library state intact", function()
    local err = select(2, pcall(uv.fs_stat, {}, function() end))
    assert.matches("bad argument #1 to '[%w.]*fs_stat' %(string expected, got table%)", err)
    err = select(2, pcall(uv.tcp_connect, uv.new_timer(), "127.0.0.1", 1, function() end))
    assert.matches("uv_tcp expected", err)
    assert.equal(0, #inits)
    assert.equal(1, ah.executionAsyncId())
    local seen = {}
    uv.fs_stat("/", function() here(seen, "ok") end)
    uv.run()
    assert.equal("op=fs_stat path=/", fields(seen.ok))
  end)

  it("core.luv_wrap checks its spec table by name", function()
    -- luv_wrap(orig, {op = name, kind = ..., pos = n, fields = {name, pos, ...}})
    local wrap = require("async_hooks.core").luv_wrap
    local function err(spec) return select(2, pcall(wrap, print, spec)) end
    assert.matches("table expected", err(nil))
    assert.matches("field 'op' %(string expected%)", err { pos = 1, kind = "handle" })
    assert.matches("invalid kind 'timer'", err { op = "x", pos = 1, kind = "timer" })
    assert.matches("invalid kind 'nil'", err { op = "x", pos = 1 })
    assert.matches("field 'pos'", err { op = "x", pos = 99, kind = "handle" })
    assert.matches("bad field position", err { op = "x", pos = 1, kind = "handle", fields = { "path", 16 } })
    assert.matches("bad field name", err { op = "x", pos = 1, kind = "handle", fields = { 1, 1 } })
    assert.matches("C function without upvalues", select(2, pcall(wrap, function() end, { op = "x", pos = 1, kind = "handle" })))
    assert.equal("function", type(wrap(print, { op = "x", pos = 1, kind = "handle", fields = { "a", 1, "b", 2 } })))
  end)
end)

describe("luv resources made lazily", function()
  -- In a fresh process: no hook, executionAsyncResource() not called yet, a
  -- value set (so registrations are tracked but get no resource table).
  -- The table made when executionAsyncResource() is first called inside the
  -- callback must still be complete.
  local function run(body)
    local out = H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      v:set("request")
      local function fields(res)
        local ks = {}
        for k, x in pairs(res) do
          ks[#ks + 1] = k .. "=" .. (k == "handle" and type(x) or tostring(x))
        end
        table.sort(ks)
        print(v:get(), table.concat(ks, " "))
      end
    ]] .. body)
    return out
  end

  it("through the callback entry: fs path, tcp host/port, timer handle, new_async handle", function()
    local out = run([[
      uv.fs_stat("/", function() fields(ah.executionAsyncResource()) end)
      local s = uv.new_tcp()
      s:bind("127.0.0.1", 0)
      s:listen(1, function() end)
      local c = uv.new_tcp()
      c:connect("127.0.0.1", s:getsockname().port, function()
        fields(ah.executionAsyncResource())
        c:close(); s:close()
      end)
      uv.run()
      local t = uv.new_timer()
      t:start(1, 0, function() fields(ah.executionAsyncResource()); t:close() end)
      local a
      a = uv.new_async(function() fields(ah.executionAsyncResource()); a:close() end)
      a:send()
      uv.run()
    ]])
    out = out:gsub("port=%d+", "port=P")
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    table.sort(lines)
    assert.same({
      "request\thandle=userdata host=127.0.0.1 op=tcp_connect port=P",
      "request\thandle=userdata op=new_async",
      "request\thandle=userdata op=timer_start",
      "request\top=fs_stat path=/",
    }, lines)
  end)

  it("a hook enabled later: before, the callback and after see the same complete table", function()
    local out = run([[
      local path = os.tmpname()
      local inside
      uv.fs_open(path, "r", 438, function(err, fd)
        inside = ah.executionAsyncResource()
        assert(inside == ah.executionAsyncResource())
        uv.fs_close(fd)
      end)
      local res = {}
      local h = ah.createHook {
        before = function() res.before = ah.executionAsyncResource() end,
        after = function() res.after = ah.executionAsyncResource() end,
      }:enable()
      uv.run()
      h:disable()
      os.remove(path)
      print(res.before == inside, res.after == inside, inside.path == path)
      fields(inside)
      -- the top level again: its fixed table, not the callback's
      print(ah.executionAsyncResource() ~= inside, next(ah.executionAsyncResource()))
    ]])
    assert.equal("true\ttrue\ttrue\nrequest\top=fs_open path=" .. out:match("path=(%S+)") .. "\ntrue\tnil\n", out)
  end)

  it("through the trampoline itself (callback registered, then uninstall)", function()
    local out = run([[
      uv.getaddrinfo("localhost", "80", { socktype = "stream" }, function()
        fields(ah.executionAsyncResource())
      end)
      uv.fs_rename("/nonexistent/a", "/nonexistent/b", function()
        fields(ah.executionAsyncResource())
      end)
      ah.uninstall() -- luv now calls the trampolines directly
      uv.run()
    ]])
    local lines = {}
    for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
    table.sort(lines)
    assert.same({
      "request\thost=localhost op=getaddrinfo service=80",
      "request\tnew_path=/nonexistent/b op=fs_rename path=/nonexistent/a",
    }, lines)
  end)
end)

describe("init hooks that cannot see the resource", function()
  -- A Lua init hook with fewer than 4 parameters and no `...` cannot reach
  -- its 4th argument: no resource table is made just to be passed to it
  -- (core.stats().init_resources counts the hooks that can see one).  The
  -- resource is then made when executionAsyncResource() first asks, and is
  -- the same table in before, in the callback and in after.
  local core = require("async_hooks.core")
  local track = H.installed_each()

  it("counts the init hooks that can see it: 4 parameters, `...`, a C function", function()
    local function count() return core.stats().init_resources end
    local three = track(ah.createHook { init = function(_, _, _) end }):enable()
    assert.equal(0, count())
    local none = track(ah.createHook { init = function() end, before = function(_, _, _, _) end }):enable()
    assert.equal(0, count()) -- before's parameters do not count
    local four = track(ah.createHook { init = function(_, _, _, _) end }):enable()
    assert.equal(1, count())
    local vararg = track(ah.createHook { init = function(...) return ... end }):enable()
    assert.equal(2, count())
    local cfn = track(ah.createHook { init = rawequal }):enable()
    assert.equal(3, count())
    four:disable(); vararg:disable(); cfn:disable()
    assert.equal(0, count())
    -- changed inside a hook: counted when the outermost dispatch ends, with
    -- the lists
    local inner = ah.createHook { init = function(_, _, _, r) return r end }
    local seen
    local outer = track(ah.createHook {
      before = function() inner:enable(); seen = count() end,
    }):enable()
    track(inner)
    ah.AsyncResource.new("T"):runInAsyncScope(function() end)
    assert.equal(0, seen)
    assert.equal(1, count())
    outer:disable(); inner:disable(); three:disable(); none:disable()
    assert.equal(0, count())
  end)

  it("an init hook that sees it, enabled by a finalizer during a registration, gets it", function()
    -- a __gc that enables the hook runs inside the allocations of one
    -- registration in many (generational collector, small steps); the
    -- resource it gets must be the one the callback finds later
    local body = [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local nilseen, total, mism = 0, 0, 0
      local initres = {}
      local S = ah.createHook { init = function(id, _, _, res)
        total = total + 1
        if res == nil then nilseen = nilseen + 1 end
        initres[id] = res or false
      end }
      if KIND ~= "first" then ah.createHook { init = function(_, _) end }:enable() end
      local armed = false
      local mt = { __gc = function() if armed then S:enable() end end }
      if KIND == "fs" then -- (a quick record: these settings reach it)
        collectgarbage("incremental", 0, 100, 0)
      else
        collectgarbage("generational", 1, 100)
      end
      local left, pad = 3000, 0
      local function tick()
        local r = initres[ah.executionAsyncId()]
        if r ~= nil and r ~= ah.executionAsyncResource() then mism = mism + 1 end
        S:disable()
        for _ = 1, KIND == "fs" and 30 or 1 do setmetatable({}, mt) end
        left = left - 1
        pad = (pad + 7) % 200
        if left > 0 then
          local p = {}
          for i = 1, pad do p[i] = i end -- (varies where the steps fall)
          if KIND == "fs" then
            armed = true; uv.fs_stat("/", tick); armed = false
          else
            local h = uv.new_idle()
            armed = true; h:start(function() h:stop(); h:close(); tick() end); armed = false
          end
        end
      end
      tick()
      uv.run()
      print(total > 10, nilseen, mism)
    ]]
    -- idle: a record; fs: a quick record; first: no init hook before
    for _, kind in ipairs { "idle", "fs", "first" } do
      H.lua_ok(("local KIND = %q\n"):format(kind) .. body,
        { { "more than 10 inits seen: true", "inits with a nil resource: 0", "callbacks not on init's resource: 0" } }, kind)
    end
  end)

  it("a re-arm inside a scope, the callback's resource made after its entry (by a nested run)", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      ah.createHook { init = function(id, ty) end }:enable() -- cannot see its resource
      local t = uv.new_timer()
      local n, E, idA2, idA = 0
      t:start(0, 5, function() -- repeating
        n = n + 1
        if n == 2 then -- fired again by the nested run: the same registration
          idA2 = ah.executionAsyncId()
          E = ah.executionAsyncResource() -- its resource, made now
          return
        end
        if n > 2 then t:close() return end
        idA = ah.executionAsyncId()
        uv.run("once")
        ah.AsyncResource.new("AR"):runInAsyncScope(function()
          t:start(0, 0, function() n = 99; t:close() end)
        end)
        print(idA == idA2, ah.executionAsyncResource() == E)
      end)
      uv.run()
    ]], { { "the nested run's call has the same asyncId: true", "the resource made then is kept: true" } })
  end)

  it("hooks that can see it get the table; the others the same call (4 arguments)", function()
    local got, nargs = {}, {}
    track(ah.createHook { init = function(id, type, trigger) got[id] = { type, trigger } end }):enable()
    track(ah.createHook { init = function(...) nargs[#nargs + 1] = select("#", ...); got[select(4, ...)] = true end })
      :enable()
    local t = uv.new_timer()
    local inside
    t:start(1, 0, function() inside = ah.executionAsyncResource(); t:close() end)
    uv.fs_stat("/", function() end)
    coroutine.wrap(function() end)()
    uv.run()
    assert.same({ 4, 4, 4 }, nargs) -- timer_start, fs_stat, the coroutine
    assert.is_true(got[inside]) -- the timer's, passed to the vararg hook
    assert.equal("timer_start", inside.op)
  end)

  it("made when asked for, the same in before, the callback and after: records, requests, coroutines",
    function()
      -- in a fresh process: executionAsyncResource() never called before
      -- the registrations (it turns every later resource eager)
      local out = H.lua_ok([[
        local uv = require("luv")
        local ah = require("async_hooks").install()
        local core = require("async_hooks.core")
        local types, seen, order = {}, {}, {} -- seen[id]: every resource seen in its context
        local function note()
          local id = ah.executionAsyncId()
          if types[id] then
            if not seen[id] then seen[id] = {}; order[#order + 1] = id end
            table.insert(seen[id], ah.executionAsyncResource())
          end
        end
        ah.createHook {
          init = function(id, type) types[id] = type end,
          before = note,
          after = note,
        }:enable()
        assert(core.stats().init_resources == 0)
        local t = uv.new_timer()
        local path = os.tmpname()
        local co
        t:start(1, 0, function() note(); t:close() end)
        uv.fs_stat(path, function() note() end)
        co = coroutine.create(function() note(); coroutine.yield(); note() end)
        uv.run() -- the first executionAsyncResource() call: in a callback's before hook
        coroutine.resume(co)
        coroutine.resume(co)
        os.remove(path)
        for _, id in ipairs(order) do
          local list, same = seen[id], true
          for i = 2, #list do same = same and list[i] == list[1] end
          local r = list[1]
          print(types[id], #list, same, r.op or "-", r.handle == t, r.path == path, r.thread == co)
        end
      ]])
      -- before, inside, after (per slice: the coroutine has two)
      assert.equal(table.concat({
        "coroutine\t6\ttrue\t-\tfalse\tfalse\ttrue",
        "uv_fs\t3\ttrue\tfs_stat\tfalse\ttrue\tfalse",
        "uv_timer\t3\ttrue\ttimer_start\ttrue\tfalse\tfalse",
      }, "\n") .. "\n", (function()
        local lines = {}
        for l in out:gmatch("[^\n]+") do lines[#lines + 1] = l end
        table.sort(lines)
        return table.concat(lines, "\n") .. "\n"
      end)())
    end)
end)
