local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local core = require("async_hooks.core")
local H = require("helpers")
local AsyncLocal = ah.AsyncLocal

-- Every test runs the loop until it is empty; handles are closed.
local function run_loop()
  uv.run()
end

local tmpfile = H.tmpfile

describe("luv integration", function()
  local track, untrack = H.hook_tracker()
  before_each(function() ah.install() end)
  after_each(function()
    untrack()
    ah.uninstall()
  end)

  it("install patches luv; uninstall restores every original function", function()
    ah.uninstall()
    local before = {}
    for k, f in pairs(uv) do before[k] = f end
    local timer_mt = getmetatable(uv.new_timer())
    local tcp_mt = debug.getregistry().uv_tcp
    local tstart, twrite = timer_mt.__index.start, tcp_mt.__index.write
    ah.install()
    assert.is_true(core.luv_attached())
    assert.are_not.equal(before.timer_start, uv.timer_start)
    assert.are_not.equal(before.fs_read, uv.fs_read)
    assert.equal(uv.timer_start, timer_mt.__index.start)
    assert.equal(uv.write, tcp_mt.__index.write)
    assert.equal(before.timer_stop, uv.timer_stop) -- no callback: untouched
    assert.equal(before.try_write, uv.try_write)
    ah.install() -- idempotent
    ah.uninstall()
    assert.is_false(core.luv_attached())
    for k, f in pairs(before) do assert.equal(f, uv[k], k) end
    assert.equal(tstart, timer_mt.__index.start)
    assert.equal(twrite, tcp_mt.__index.write)
    ah.install()
    run_loop()
  end)

  it("covers every callback-taking luv function", function()
    ah.uninstall()
    local orig = {}
    for k, f in pairs(uv) do orig[k] = f end
    ah.install()
    local covered = {}
    for _, name in ipairs(ah.luv_covered) do covered[name] = true end
    local present = 0
    for _, name in ipairs { "timer_start", "idle_start", "prepare_start", "check_start", "new_async",
      "poll_start", "signal_start", "signal_start_oneshot", "fs_event_start", "fs_poll_start", "listen",
      "read_start", "udp_recv_start", "spawn", "close", "tcp_close_reset", "write", "write2", "shutdown",
      "tcp_connect", "pipe_connect", "udp_send", "getaddrinfo", "getnameinfo", "random", "new_work",
      "fs_read", "fs_write", "fs_opendir", "fs_open", "fs_close", "fs_stat", "fs_scandir" } do
      assert.is_true(covered[name], name)
      -- luv 1.44 has every one of these: each is patched by install()
      assert.equal("function", type(orig[name]), name)
      assert.are_not.equal(orig[name], uv[name], name)
      present = present + 1
    end
    assert.equal(33, present)
  end)

  it("nested timers under different run values each see their own", function()
    local v = AsyncLocal.new { default = "none" }
    local seen = {}
    for i = 1, 5 do
      v:run("r" .. i, function()
        local t = uv.new_timer()
        t:start(5 * (6 - i), 0, function()
          seen[#seen + 1] = v:get()
          local t2 = uv.new_timer()
          uv.timer_start(t2, 1, 0, function()
            seen[#seen + 1] = v:get() .. "/inner"
            t2:close()
          end)
          t:close()
        end)
      end)
    end
    assert.equal("none", v:get())
    run_loop()
    table.sort(seen)
    assert.same({ "r1", "r1/inner", "r2", "r2/inner", "r3", "r3/inner", "r4", "r4/inner", "r5", "r5/inner" }, seen)
    assert.equal("none", v:get())
  end)

  it("a set in one callback is not visible in the next unrelated one", function()
    local v = AsyncLocal.new { default = "clean" }
    local second
    local a, b = uv.new_timer(), uv.new_timer()
    a:start(1, 0, function() v:set("dirty"); a:close() end)
    b:start(20, 0, function() second = v:get(); b:close() end)
    run_loop()
    assert.equal("clean", second)
    assert.equal("clean", v:get())
  end)

  it("untracked callbacks in an empty context take the path with no Lua calls", function()
    local code, out = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local t = uv.new_idle()
      local n = 0
      t:start(function() n = n + 1; if n == 100 then t:stop(); t:close() end end)
      uv.run()
      print(n, core.stats().fast_callbacks)
    ]])
    assert.equal(0, code)
    assert.equal("100\t100\n", out)
  end)

  it("callbacks run in the root context when nothing was captured", function()
    -- in a fresh process: nothing has made the library observe anything yet
    local code, out = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "d" }
      local t = uv.new_timer()
      t:start(1, 0, function() print(ah.executionAsyncId(), ah.triggerAsyncId(), v:get()); t:close() end)
      v:run("outer", function() uv.run() end) -- uv.run inside a scope
      print(v:get())
    ]])
    assert.equal(0, code)
    assert.equal("0\t0\td\nd\n", out)
  end)

  it("ids: a tracked callback has its own asyncId, triggered by the registering context", function()
    local v = AsyncLocal.new()
    local cid, ctrig, outer
    local t = uv.new_timer()
    local c = coroutine.wrap(function()
      outer = ah.executionAsyncId()
      v:run(1, function()
        t:start(1, 0, function() cid, ctrig = ah.executionAsyncId(), ah.triggerAsyncId(); t:close() end)
      end)
    end)
    c()
    run_loop()
    assert.equal(outer, ctrig)
    assert.is_true(cid > outer)
    assert.equal(1, ah.executionAsyncId())
  end)

  it("repeating timers and timer:again keep the registration's context", function()
    local v = AsyncLocal.new()
    local seen = {}
    local t = uv.new_timer()
    v:run("rep", function()
      t:start(1, 1, function()
        seen[#seen + 1] = v:get()
        if #seen == 3 then t:stop() end
      end)
    end)
    run_loop()
    assert.same({ "rep", "rep", "rep" }, seen)
    t:set_repeat(1)
    v:run("other", function() t:again() end)
    local n = 0
    local stopper = uv.new_timer()
    stopper:start(10, 0, function() t:close(); stopper:close() end)
    seen = {}
    run_loop()
    assert.is_true(#seen >= 1)
    for _, s in ipairs(seen) do assert.equal("rep", s); n = n + 1 end
  end)

  it("fs open/read/close chains keep the context (both callback positions of fs_read)", function()
    local path = tmpfile("hello world")
    local v = AsyncLocal.new()
    local out = {}
    v:run("fs", function()
      uv.fs_open(path, "r", 438, function(err, fd)
        assert.is_nil(err)
        out[#out + 1] = v:get()
        uv.fs_read(fd, 5, 0, function(err2, data)
          out[#out + 1] = v:get() .. ":" .. data
          uv.fs_read(fd, 5, function(err3, data2) -- offset omitted
            out[#out + 1] = v:get() .. ":" .. tostring(data2)
            uv.fs_close(fd, function()
              out[#out + 1] = v:get() .. ":closed"
            end)
          end)
        end)
      end)
    end)
    run_loop()
    os.remove(path)
    assert.same({ "fs", "fs:hello", "fs:hello", "fs:closed" }, out)
  end)

  it("synchronous fs calls are untouched", function()
    local path = tmpfile("abc")
    local fd = assert(uv.fs_open(path, "r", 438))
    assert.equal("abc", uv.fs_read(fd, 3, 0))
    assert.is_true(uv.fs_close(fd))
    assert.equal(3, uv.fs_stat(path).size)
    os.remove(path)
  end)

  -- uv.walk(fn) calls fn at once, once per handle, through luv's cb_pcall:
  -- a call, not a registration, so fn runs in the caller's context (found
  -- by a review: it ran in the root context)
  it("uv.walk runs its function in the caller's context, with no hook events", function()
    local v = AsyncLocal.new()
    local events = 0
    local t = uv.new_timer()
    local seen = {}
    v:run("request", function()
      uv.walk(function(h)
        if h == t then seen[#seen + 1] = { ah.executionAsyncId(), v:get() } end
      end)
    end)
    local co_seen
    coroutine.wrap(function()
      v:set("co")
      local id = ah.executionAsyncId()
      uv.walk(function(h) if h == t then co_seen = { id, ah.executionAsyncId(), v:get() } end end)
    end)()
    local tick = uv.new_timer()
    local in_cb
    track(ah.createHook { before = function() events = events + 1 end,
      after = function() events = events + 1 end }):enable()
    v:run("cb", function()
      tick:start(0, 0, function()
        local id = ah.executionAsyncId()
        local before = events
        uv.walk(function(h) if h == t then in_cb = { id, ah.executionAsyncId(), v:get(), events - before } end end)
        tick:close()
      end)
    end)
    t:close()
    run_loop()
    assert.same({ { 1, "request" } }, seen)
    assert.equal(co_seen[1], co_seen[2])
    assert.equal("co", co_seen[3])
    assert.is_true(in_cb[1] > 1)
    assert.same({ in_cb[1], in_cb[1], "cb", 0 }, in_cb)
  end)

  it("TCP echo server: 50 concurrent clients each see only their own value", function()
    local v = AsyncLocal.new()
    local server = uv.new_tcp()
    assert(server:bind("127.0.0.1", 0))
    local port = server:getsockname().port
    local server_saw = {}
    server:listen(128, function(err)
      assert.is_nil(err)
      local client = uv.new_tcp()
      server:accept(client)
      client:read_start(function(err2, data)
        if data then
          server_saw[#server_saw + 1] = v:get() -- the server's context: nil
          client:write(data)
        else
          client:close()
        end
      end)
    end)
    local results, done = {}, 0
    for i = 1, 50 do
      v:run("client" .. i, function()
        local c = uv.new_tcp()
        c:connect("127.0.0.1", port, function(err)
          assert.is_nil(err)
          c:write("ping" .. i, function(werr)
            assert.is_nil(werr)
            assert.equal("client" .. i, v:get())
          end)
          c:read_start(function(rerr, data)
            assert.is_nil(rerr)
            if data then
              results[i] = { v:get(), data }
              c:shutdown(function()
                assert.equal("client" .. i, v:get())
                c:close(function()
                  done = done + 1
                  if done == 50 then server:close() end
                end)
              end)
            end
          end)
        end)
      end)
    end
    run_loop()
    assert.equal(50, done)
    for i = 1, 50 do
      assert.same({ "client" .. i, "ping" .. i }, results[i])
    end
    for _, s in ipairs(server_saw) do assert.is_nil(s) end
  end)

  it("UDP send and receive", function()
    local v = AsyncLocal.new()
    local rx = uv.new_udp()
    assert(rx:bind("127.0.0.1", 0))
    local port = rx:getsockname().port
    local got
    v:run("receiver", function()
      rx:recv_start(function(err, data)
        if data then
          got = { v:get(), data }
          rx:close()
        end
      end)
    end)
    local tx = uv.new_udp()
    local sent
    v:run("sender", function()
      tx:send("datagram", "127.0.0.1", port, function(err)
        sent = v:get()
        tx:close()
      end)
    end)
    run_loop()
    assert.same({ "receiver", "datagram" }, got)
    assert.equal("sender", sent)
  end)

  it("pipes: connect, write, read", function()
    local v = AsyncLocal.new()
    local path = os.tmpname()
    os.remove(path)
    local server = uv.new_pipe(false)
    assert(server:bind(path))
    local got
    v:run("srv", function()
      server:listen(8, function()
        local c = uv.new_pipe(false)
        server:accept(c)
        c:read_start(function(err, data)
          if data then got = { v:get(), data } else c:close(); server:close() end
        end)
      end)
    end)
    local connected
    v:run("cli", function()
      local p = uv.new_pipe(false)
      p:connect(path, function(err)
        connected = v:get()
        p:write("via pipe", function() p:close() end)
      end)
    end)
    run_loop()
    os.remove(path)
    assert.equal("cli", connected)
    assert.same({ "srv", "via pipe" }, got)
  end)

  it("getaddrinfo('localhost'), getnameinfo and random", function()
    local v = AsyncLocal.new()
    local seen = {}
    v:run("dns", function()
      uv.getaddrinfo("localhost", nil, { socktype = "stream" }, function(err, res)
        assert.is_nil(err)
        assert.is_true(#res > 0)
        seen[#seen + 1] = v:get()
      end)
      uv.getnameinfo({ ip = "127.0.0.1", port = 80 }, function(err)
        seen[#seen + 1] = v:get()
      end)
      uv.random(8, nil, function(err, bytes)
        assert.equal(8, #bytes)
        seen[#seen + 1] = v:get()
      end)
    end)
    run_loop()
    assert.same({ "dns", "dns", "dns" }, seen)
  end)

  it("spawn of `true`: the exit callback keeps the context", function()
    local v = AsyncLocal.new()
    local got
    v:run("child", function()
      local handle
      handle = uv.spawn("true", {}, function(code, signal)
        got = { v:get(), code, signal }
        handle:close()
      end)
      assert.truthy(handle)
    end)
    run_loop()
    assert.same({ "child", 0, 0 }, got)
  end)

  it("new_async + async_send, idle, check and prepare", function()
    local v = AsyncLocal.new()
    local seen = {}
    local async
    v:run("async", function()
      async = uv.new_async(function(x)
        seen[#seen + 1] = v:get() .. ":" .. tostring(x)
        async:close()
      end)
    end)
    local idle, check, prepare = uv.new_idle(), uv.new_check(), uv.new_prepare()
    v:run("idle", function()
      idle:start(function() seen[#seen + 1] = v:get(); idle:stop(); idle:close() end)
    end)
    v:run("check", function()
      check:start(function() seen[#seen + 1] = v:get(); check:stop(); check:close() end)
    end)
    v:run("prepare", function()
      uv.prepare_start(prepare, function() seen[#seen + 1] = v:get(); prepare:stop(); prepare:close() end)
    end)
    async:send("42")
    run_loop()
    table.sort(seen)
    assert.same({ "async:42", "check", "idle", "prepare" }, seen)
  end)

  it("callable tables work where luv accepts them", function()
    local v = AsyncLocal.new()
    local got
    local cb = setmetatable({}, { __call = function(self, err, st) got = { v:get(), type(st) } end })
    v:run("callable", function() uv.fs_stat("/", cb) end)
    run_loop()
    assert.same({ "callable", "table" }, got)
  end)

  it("callbacks registered before install() keep working", function()
    ah.uninstall()
    local v = AsyncLocal.new()
    local fired = 0
    local t = uv.new_timer()
    v:run("old", function()
      t:start(5, 1, function()
        fired = fired + 1
        if fired == 2 then t:close() end
      end)
    end)
    ah.install()
    run_loop()
    assert.equal(2, fired)
  end)

  it("handles closed inside their own callbacks", function()
    local v = AsyncLocal.new()
    local closes = {}
    for i = 1, 10 do
      v:run(i, function()
        local t = uv.new_timer()
        t:start(1, 1, function()
          t:close(function() closes[#closes + 1] = v:get() end)
        end)
      end)
    end
    run_loop()
    table.sort(closes)
    assert.same({ 1, 2, 3, 4, 5, 6, 7, 8, 9, 10 }, closes)
  end)

  it("luv argument errors read as they do without the library", function()
    local ok, err = pcall(function() uv.new_timer():start(nil) end)
    assert.is_false(ok)
    assert.matches("06%-luv_spec.lua:%d+: bad argument #1 to 'start' %(number expected, got nil%)", err)
    ok, err = pcall(uv.timer_start, nil)
    assert.is_false(ok)
    assert.matches("bad argument #1 to 'luv.timer_start' %(uv_timer expected, got nil%)", err)
    run_loop()
  end)

  describe("with hooks", function()
    it("init types, before/after per callback, destroy after one-shot requests", function()
      local events, types = {}, {}
      track(ah.createHook {
        init = function(id, type, trigger, res) types[id] = type; events[#events + 1] = "init " .. type end,
        before = function(id) events[#events + 1] = "before " .. types[id] end,
        after = function(id) events[#events + 1] = "after " .. types[id] end,
        destroy = function(id) if types[id] then events[#events + 1] = "destroy " .. types[id] end end,
      }):enable()
      local t = uv.new_timer()
      t:start(1, 0, function()
        uv.fs_stat("/", function() end)
      end)
      run_loop()
      t:close()
      run_loop()
      local s = table.concat(events, ",")
      assert.matches("init uv_timer,before uv_timer,init uv_fs,after uv_timer", s, 1, true)
      assert.matches("before uv_fs,after uv_fs,destroy uv_fs", s, 1, true)
      assert.matches("destroy uv_timer", s, 1, true)
    end)

    it("executionAsyncResource is the init resource, with the handle", function()
      local res = {}
      local ok = true
      track(ah.createHook {
        init = function(id, type, trigger, r) res[id] = r end,
        before = function(id) ok = ok and ah.executionAsyncResource() == res[id] end,
      }):enable()
      local t = uv.new_timer()
      local inside
      t:start(1, 0, function() inside = ah.executionAsyncResource(); t:close() end)
      run_loop()
      assert.is_true(ok)
      assert.equal(t, inside.handle)
    end)

    it("a replaced handle callback is destroyed; closing destroys the last one", function()
      local destroyed, inits = {}, {}
      track(ah.createHook {
        init = function(id, type) inits[#inits + 1] = id end,
        destroy = function(id) destroyed[#destroyed + 1] = id end,
      }):enable()
      local t = uv.new_timer()
      t:start(1000, 0, function() end)
      t:start(1000, 0, function() end) -- replaces
      run_loop() -- a timer of 1 s would block: stop it
      t:stop()
      t:close()
      run_loop()
      assert.equal(2, #inits)
      assert.same({ inits[1], inits[2] }, destroyed)
    end)

    it("untracked registrations: a hook enabled later sees no events for them", function()
      local code, out = H.run_lua([[
        local uv = require("luv")
        local ah = require("async_hooks").install()
        local t = uv.new_timer()
        local id
        t:start(5, 0, function() id = ah.executionAsyncId(); t:close() end) -- nothing observable
        local events = 0
        ah.createHook {
          before = function() events = events + 1 end,
          after = function() events = events + 1 end,
        }:enable()
        uv.run()
        print(id, events)
        -- registered now, with a hook enabled: tracked
        local t2 = uv.new_timer()
        t2:start(1, 0, function() id = ah.executionAsyncId(); t2:close() end)
        uv.run()
        print(id > 1, events)
      ]])
      assert.equal(0, code)
      assert.equal("0\t0\ntrue\t2\n", out)
    end)

    it("queued destroys are delivered on the next loop iteration", function()
      local destroyed = {}
      track(ah.createHook { destroy = function(id) destroyed[id] = true end }):enable()
      local id = ah.AsyncResource.new("gc-me"):asyncId()
      H.gc()
      assert.is_nil(destroyed[id])
      local t = uv.new_timer()
      t:start(1, 0, function() t:close() end)
      run_loop()
      assert.is_true(destroyed[id])
    end)

    it("an error in a callback restores the context and emits after", function()
      core.luv_flags(1 + 4) -- luv: no exit, no message
      local v = AsyncLocal.new { default = "clean" }
      local log = {}
      track(ah.createHook {
        before = function(id) log[#log + 1] = "before" end,
        after = function(id) log[#log + 1] = "after" end,
      }):enable()
      local t, t2 = uv.new_timer(), uv.new_timer()
      local later
      v:run("ctx", function()
        t:start(1, 0, function() t:close(); v:set("dirty"); error("callback failed") end)
      end)
      t2:start(20, 0, function() later = v:get(); t2:close() end)
      run_loop()
      core.luv_flags(0)
      assert.equal("clean", later)
      assert.equal("clean", v:get())
      assert.equal(1, ah.executionAsyncId())
      assert.equal(0, core.stats().active)
      -- the failing callback and the later one, each balanced
      assert.same({ "before", "after", "before", "after" }, log)
    end)
  end)

  it("an error in a callback keeps luv's behaviour: message, traceback, exit status", function()
    local script = [[
      local uv = require("luv")
      %s
      local t = uv.new_timer()
      local v = { run = function(_, _, f) return f() end }
      if package.loaded.async_hooks then v = package.loaded.async_hooks.AsyncLocal.new() end
      v:run(1, function() t:start(1, 0, function() error("boom in callback") end) end)
      uv.run()
    ]]
    local code1, _, err1 = H.run_lua(script:format(""))
    local code2, _, err2 = H.run_lua(script:format('require("async_hooks").install()'))
    assert.equal(code1, code2)
    assert.matches("Uncaught Error: .-boom in callback", err2)
    assert.matches("stack traceback", err2)
    -- the same text, traceback included: the trampoline adds no frame
    local function norm(s) return (s:gsub("/tmp/lua_%w+", "F")) end
    assert.equal(norm(err1), norm(err2))
  end)

  -- Quick records are made only while nothing but a frame observes a
  -- registration, which this process stopped being when a spec first called
  -- executionAsyncResource(): each of these runs in a fresh one.
  describe("quick records (a request, or the first registration on a fresh handle, observed by a frame only)", function()
    local PRELUDE = [[
      local uv = require("luv")
      package.loaded["luv.rawrun"] = uv.run -- luv's own, taken before install
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local v = ah.AsyncLocal.new { default = "clean" }
      local path = os.tmpname()
      local f = assert(io.open(path, "w")); f:write("abc"); f:close()
      local fd = assert(uv.fs_open(path, "r", 420))
      os.remove(path)
      -- what luv holds for the callback cb: the quick record is a C closure
      -- whose first upvalue is cb
      local function held_by_luv(cb)
        for _, x in pairs(debug.getregistry()) do
          if x == cb then return "the callback" end
          if type(x) == "function" and select(2, debug.getupvalue(x, 1)) == cb then
            return debug.getinfo(x, "S").what == "C" and "a C closure over it" or "?"
          end
          if type(x) == "userdata" and select(2, pcall(debug.getuservalue, x, 1)) == cb then
            return "a record"
          end
        end
        return "nothing"
      end
    ]]
    local function fresh(code, expected)
      local status, out, err = H.run_lua(PRELUDE .. code)
      assert.equal("", err)
      assert.equal(0, status)
      assert.equal(expected, out)
    end

    it("luv gets a function; the handle keeps a mark, and its re-arm a record it then reuses", function()
      fresh([[
        local t = uv.new_timer()
        local kept, seen = {}, {}
        local function step()
          seen[#seen + 1] = v:get()
          kept[#kept + 1] = debug.getuservalue(t, 1)
          if #seen < 5 then t:start(0, 0, step) else t:close() end
        end
        local held, read
        v:run("q", function() t:start(0, 0, step); held = held_by_luv(step) end)
        local cb = function(_, data) read = data .. ":" .. v:get() end
        v:run("r", function() uv.fs_read(fd, 3, 0, cb) end)
        print(held, held_by_luv(cb))
        uv.run()
        -- kept: what the handle keeps at each step, before it re-arms
        print(table.concat(seen, " "), read, kept[1], type(kept[2]), type(kept[3]),
              kept[3] == kept[4], kept[4] == kept[5])
      ]], "a C closure over it\ta C closure over it\n"
        .. "q q q q q\tabc:r\ttrue\tuserdata\tfunction\ttrue\ttrue\n")
    end)

    -- with hooks enabled a request is still a quick record (its destroy
    -- follows its one callback): its resource is made for its init, kept in
    -- the closure, and is the callback's executionAsyncResource()
    it("a request made while hooks are enabled: init, before, after, destroy, one resource", function()
      fresh([[
        local ev, inits = {}, {}
        local mine
        ah.createHook {
          init = function(id, type, trigger, res)
            if type == "uv_fs" then mine = id; inits[id] = res; ev[#ev + 1] = "init" end
          end,
          before = function(id) if id == mine then ev[#ev + 1] = "before" end end,
          after = function(id) if id == mine then ev[#ev + 1] = "after" end end,
          destroy = function(id) if id == mine then ev[#ev + 1] = "destroy" end end,
        }:enable()
        local seen
        local cb = function(_, data)
          ev[#ev + 1] = "cb"
          seen = { ah.executionAsyncId() == mine, ah.executionAsyncResource(), data }
        end
        local trigger = ah.executionAsyncId()
        uv.fs_read(fd, 3, 0, cb)
        print(held_by_luv(cb), inits[mine].op, inits[mine].handle)
        uv.run()
        uv.run() -- delivers the destroy queued at the callback's exit
        print(table.concat(ev, " "), seen[1], seen[2] == inits[mine], seen[3], trigger == 1)
      ]], "a C closure over it\tfs_read\tnil\ninit before cb after destroy\ttrue\ttrue\tabc\ttrue\n")
    end)

    -- the dispatch keeps where the running quick record sits (not R[]):
    -- a loop run inside its callback has its own, and the outer one's is
    -- found again when that loop returns
    it("its resource, first asked for in a callback whose loop runs inside another's", function()
      fresh([[
        local t = uv.new_timer()
        local res = {}
        v:run("outer", function()
          uv.fs_read(fd, 3, 0, function()
            v:run("inner", function()
              t:start(0, 0, function()
                res.inner = ah.executionAsyncResource()
                res.inner2 = ah.executionAsyncResource()
                t:close()
              end)
            end)
            uv.run("default") -- inside the read's callback (an argument:
                              -- its callbacks sit at another index)
            res.outer = ah.executionAsyncResource()
            res.outer2 = ah.executionAsyncResource()
          end)
        end)
        uv.run()
        print(res.inner.op, res.inner.handle == t, res.inner == res.inner2,
              res.outer.op, res.outer == res.outer2, res.outer ~= res.inner)
      ]], "timer_start\ttrue\ttrue\tfs_read\ttrue\ttrue\n")
    end)

    -- under hooks, a record's callback leaves R[] alone until
    -- executionAsyncResource() is first called: the resource is then found
    -- from where the dispatch keeps the record
    it("a record's resource first asked for in its callback: init's, also after a re-arm from it", function()
      fresh([==[
        local inits, seen = {}, {}
        ah.createHook { init = function(id, type, _, res) inits[id] = res end }:enable()
        local t = uv.new_timer()
        local n = 0
        local function step()
          n = n + 1
          local id = ah.executionAsyncId()
          if n == 1 then
            t:start(0, 0, step) -- re-armed from its own callback, first
            local r1 = ah.executionAsyncResource()
            local r2 = ah.executionAsyncResource()
            seen[1] = { r1 == inits[id], r1 == r2, r1.handle == t, r1.op }
          else
            local r = ah.executionAsyncResource()
            seen[2] = { r == inits[id], r.handle == t }
            t:close()
          end
        end
        t:start(0, 0, step)
        uv.run()
        print(seen[1][1], seen[1][2], seen[1][3], seen[1][4], seen[2][1], seen[2][2])
      ]==], "true\ttrue\ttrue\ttimer_start\ttrue\ttrue\n")
    end)

    it("ids: its own asyncId, triggered by the registering context; the loop's ids come back", function()
      fresh([[
        local ids, outer = {}, nil
        ah.coroutine.wrap(function()
          v:set(1)
          outer = ah.executionAsyncId()
          local t = uv.new_timer()
          t:start(0, 0, function()
            ids.timer = { ah.executionAsyncId(), ah.triggerAsyncId(), v:get() }
            t:close()
          end)
          uv.fs_read(fd, 1, 0, function()
            ids.read = { ah.executionAsyncId(), ah.triggerAsyncId(), v:get() }
          end)
        end)()
        uv.run()
        print(ids.timer[2] == outer, ids.read[2] == outer, ids.timer[1] > outer, ids.read[1] > outer,
              ids.timer[1] ~= ids.read[1], ids.timer[3], ids.read[3], ah.executionAsyncId(),
              core.stats().active, v:get())
      ]], "true\ttrue\ttrue\ttrue\ttrue\t1\t1\t1\t0\tclean\n")
    end)

    it("its resource, first asked for inside its callback: its own, the same on each call and across a repeating timer's calls", function()
      fresh([[
        local t = uv.new_timer()
        local seen, req = {}, nil
        v:run(1, function()
          t:start(1, 1, function()
            local r = ah.executionAsyncResource()
            seen[#seen + 1] = r
            assert(r == ah.executionAsyncResource())
            if #seen == 3 then t:close() end
          end)
          uv.fs_read(fd, 1, 0, function() req = ah.executionAsyncResource() end)
        end)
        uv.run()
        print(seen[1] == seen[2], seen[2] == seen[3], seen[1].op, seen[1].handle == t,
              req.op, req ~= seen[1], ah.executionAsyncResource() ~= seen[1])
      ]], "true\ttrue\ttimer_start\ttrue\tfs_read\ttrue\ttrue\n")
    end)

    it("its resource keeps its identity where the dispatch is not in front"
      .. " (after uninstall, uv.run from a coroutine, a uv.run taken before install)", function()
      for _, how in ipairs { "uninstall", "coroutine", "raw" } do
        fresh(([[
          local how = %q
          local rawrun = package.loaded["luv.rawrun"]
          local t = uv.new_timer()
          local seen = {}
          v:run(1, function()
            t:start(1, 1, function()
              seen[#seen + 1] = ah.executionAsyncResource()
              if #seen == 3 then t:close() end
            end)
          end)
          if how == "uninstall" then ah.uninstall(); uv.run()
          elseif how == "coroutine" then coroutine.wrap(function() uv.run() end)()
          else rawrun() end
          print(seen[1] == seen[2], seen[2] == seen[3], seen[1].op, seen[1].handle == t)
        ]]):format(how), "true\ttrue\ttimer_start\ttrue\n")
      end
    end)

    it("a resource whose length is a record's size is not taken for its record", function()
      -- a table's raw length is its border: a resource with as many array
      -- entries as a record has bytes once passed for a record (a crash)
      for _, how in ipairs { "slow", "uninstall" } do
        fresh(([[
          local how, k, ops = %q, 0, {}
          local size = core.luv_record_size
          local t = uv.new_timer()
          v:run(1, function()
            t:start(1, 1, function()
              k = k + 1
              local res = ah.executionAsyncResource()
              if k == 1 then for i = 1, size do res[i] = i end end
              ops[k] = tostring(res.op) .. ":" .. tostring(#res == size) .. ":" .. tostring(v:get())
              if k == 1 and how == "uninstall" then ah.uninstall() end
              if k == 3 then t:close() end
            end)
          end)
          uv.run()
          print(table.concat(ops, " "), size > 0)
        ]]):format(how), "timer_start:true:1 timer_start:true:1 timer_start:true:1\ttrue\n")
      end
    end)

    it("an error in its callback keeps its traceback when it runs as a record (resource asked for meanwhile)", function()
      local function run(record)
        local status, out, err = H.run_lua(PRELUDE .. ([[
          core.luv_flags(1) -- luv: no exit, the message kept
          local function inner() error("boom") end
          local function cb() inner() end
          v:run(1, function()
            local t = uv.new_timer()
            if %s then t:start(1, 0, function() end) end -- then a record
            t:start(1, 0, function() t:close(); cb() end)
          end)
          ah.executionAsyncResource() -- from now on a quick record runs as a record
          uv.run()
          print("done")
        ]]):format(tostring(record)))
        return status, out, (err:gsub("/tmp/lua_%w+", "SCRIPT"))
      end
      local s1, o1, e1 = run(false)
      local s2, o2, e2 = run(true)
      assert.equal(0, s1)
      assert.equal("done\n", o1)
      assert.truthy(e1:find("in upvalue 'inner'", 1, true))
      assert.equal(s2, s1)
      assert.equal(o2, o1)
      assert.equal(e2, e1)
    end)

    it("an asyncId taken by a finalizer while it is made is not its own too", function()
      for _, mode in ipairs { "generational", "incremental" } do
        fresh(([[
          collectgarbage(%q)
          local fin, ids = {}, {}
          v:run("x", function()
            for _ = 1, 20000 do
              setmetatable({}, { __gc = function() fin[ah.AsyncResource.new("FIN"):asyncId()] = true end })
              uv.fs_stat(".", function() ids[#ids + 1] = ah.executionAsyncId() end)
            end
          end)
          uv.run()
          local dup, seen = 0, {}
          for _, id in ipairs(ids) do
            if fin[id] or seen[id] then dup = dup + 1 end
            seen[id] = true
          end
          print(#ids, dup)
        ]]):format(mode), "20000\t0\n")
      end
    end)

    -- review finding (older): luv refusing a call with nil, err (the
    -- callback will never run) left an init without a destroy
    it("a registration luv refuses with nil, err gets no init (and so no destroy)", function()
      for _, hooks in ipairs { "init", "init,destroy" } do
        fresh(([[
          local inits, destroys = {}, 0
          ah.createHook {
            init = function(id, type) if type == "uv_timer" then inits[#inits + 1] = id end end,
            destroy = %s,
          }:enable()
          local t = uv.new_timer()
          t:close()
          local r, err = t:start(0, 0, function() end) -- a closing handle
          uv.run()
          local t2 = uv.new_timer()
          t2:start(0, 0, function() t2:close() end)
          uv.run()
          print(r, type(err), #inits, (debug.getuservalue(t, 1)))
        ]]):format(hooks == "init" and "nil" or "function() destroys = destroys + 1 end"),
          "nil\tstring\t1\tnil\n")
      end
    end)

    -- review finding (helper-27, this session): luv stores a handle
    -- start's callback before libuv's call; when libuv then refuses a
    -- handle that is not closing (read_start on a reading stream:
    -- EALREADY), the new callback runs, and ran with before/after but no
    -- init and no destroy
    it("a handle start luv refuses after taking the callback (EALREADY) gets init, before/after and destroy", function()
      for _, tracked_first in ipairs { false, true } do
        fresh(([[
          local ev, types = {}, {}
          local hook = { init = function(id, ty) types[id] = ty; ev[#ev + 1] = { "init", id } end,
            before = function(id) ev[#ev + 1] = { "before", id } end,
            after = function(id) ev[#ev + 1] = { "after", id } end,
            destroy = function(id) ev[#ev + 1] = { "destroy", id } end }
          local server, client = uv.new_tcp(), uv.new_tcp()
          server:bind("127.0.0.1", 0)
          local port = server:getsockname().port
          local got
          v:run("req", function() server:listen(8, function()
            local conn = uv.new_tcp()
            server:accept(conn)
            if %s then ah.createHook(hook):enable() end
            conn:read_start(function() end)
            if not %s then ah.createHook(hook):enable() end
            ev = {}
            local r, err = conn:read_start(function(_, data)
              got = { id = ah.executionAsyncId(), data = data, value = v:get() }
              conn:close(); server:close(); client:close()
            end)
            ev[#ev + 1] = { tostring(r) .. ":" .. tostring(err):match("^%%u+") }
          end) end)
          client:connect("127.0.0.1", port, function() client:write("hello") end)
          uv.run()
          uv.run("nowait")
          -- the read registration's events (R), after the listen callback's
          -- own after (the hook was enabled inside it)
          local out = {}
          for _, e in ipairs(ev) do
            out[#out + 1] = e[1] .. (e[2] == got.id and " R" or e[2] and " other" or "")
          end
          print(table.concat(out, ", "), types[got.id], got.data, got.value)
        ]]):format(tostring(tracked_first), tostring(tracked_first)),
          -- (destroy other: the first read_start's registration, replaced,
          -- when the hook saw it made)
          ("init R, nil:EALREADY, after other, %sbefore R, after R, destroy R\tuv_tcp\thello\treq\n")
            :format(tracked_first and "destroy other, " or ""))
      end
    end)

    -- review finding (helper-27, this session): a re-arm kept the record's
    -- first spec, so a resource made later named the first function
    it("a resource made lazily after signal_start_oneshot re-armed a signal_start names signal_start_oneshot", function()
      fresh([[
        ah.createHook { init = function() end }:enable() -- cannot see resources
        local sig = uv.new_signal()
        sig:start("sigusr1", function() print("the replaced callback ran") end)
        local op, same
        uv.signal_start_oneshot(sig, "sigusr1", function()
          local r = ah.executionAsyncResource()
          op, same = r.op, r.handle == sig and r == ah.executionAsyncResource()
          sig:close()
        end)
        uv.kill(uv.os_getpid(), "sigusr1")
        uv.run()
        uv.run("nowait")
        print(op, same)
      ]], "signal_start_oneshot\ttrue\n")
    end)

    it("a handle luv refused keeps nothing", function()
      fresh([[
        local idle, t = uv.new_idle(), uv.new_timer()
        local ok
        v:run(1, function() ok = pcall(uv.timer_start, idle, 0, 0, function() end) end)
        v:run(1, function() t:start(0, 0, function() t:close() end) end)
        uv.run()
        idle:close()
        uv.run()
        print(ok, (debug.getuservalue(idle, 1)), (debug.getuservalue(t, 1)))
      ]], "false\tnil\ttrue\n")
    end)

    it("hooks enabled after its registration see its before and after, and a request's destroy", function()
      fresh([[
        local log, ids = {}, {}
        local t = uv.new_timer()
        v:run("q", function()
          t:start(1, 0, function() ids.timer = ah.executionAsyncId(); t:close() end)
          uv.fs_read(fd, 1, 0, function() ids.read = ah.executionAsyncId() end)
        end)
        ah.createHook {
          before = function(id) log[#log + 1] = "before " .. id end,
          after = function(id) log[#log + 1] = "after " .. id end,
          destroy = function(id) log[#log + 1] = "destroy " .. id end,
        }:enable()
        uv.run()
        local function has(x) for _, e in ipairs(log) do if e == x then return true end end return false end
        print(has("before " .. ids.timer), has("after " .. ids.timer), has("before " .. ids.read),
              has("after " .. ids.read), has("destroy " .. ids.read), core.stats().active)
      ]], "true\ttrue\ttrue\ttrue\ttrue\t0\n")
    end)

    it("an error in its callback restores the context (a timer and a request)", function()
      fresh([[
        core.luv_flags(1 + 4) -- luv: no exit, no message
        local t, t2 = uv.new_timer(), uv.new_timer()
        local later
        v:run("ctx", function()
          t:start(1, 0, function() t:close(); v:set("dirty"); error("timer failed") end)
          uv.fs_read(fd, 1, 0, function() v:set("dirty"); error("read failed") end)
        end)
        t2:start(20, 0, function() later = { v:get(), ah.executionAsyncId() }; t2:close() end)
        uv.run()
        print(later[1], later[2], v:get(), ah.executionAsyncId(), core.stats().active)
      ]], "clean\t0\tclean\t1\t0\n")
    end)

    it("pending across uninstall(), it still runs in its context, with its ids", function()
      fresh([[
        local t = uv.new_timer()
        local seen, outer = {}, nil
        v:run("armed", function()
          outer = ah.executionAsyncId()
          t:start(1, 0, function()
            seen.timer = { v:get(), ah.triggerAsyncId() == outer }
            t:close()
          end)
          uv.fs_read(fd, 1, 0, function() seen.read = { v:get(), ah.triggerAsyncId() == outer } end)
        end)
        ah.uninstall() -- luv calls them without the library's cb_pcall
        uv.run()
        print(seen.timer[1], seen.timer[2], seen.read[1], seen.read[2], v:get(), core.stats().active)
      ]], "armed\ttrue\tarmed\ttrue\tclean\t0\n")
    end)

    it("lets its callback and value go once it ended (both collectors)", function()
      for _, mode in ipairs { "generational", "incremental" } do
        fresh(([[
          collectgarbage("%s")
          local weak = setmetatable({}, { __mode = "k" })
          local done = 0
          do
            local a, b = {}, {}
            weak[a], weak[b] = true, true
            v:run(a, function()
              local t = uv.new_timer()
              t:start(0, 0, function() done = done + 1; t:close() end)
            end)
            v:run(b, function() uv.fs_read(fd, 1, 0, function() done = done + 1 end) end)
          end
          uv.run()
          collectgarbage("collect"); collectgarbage("collect")
          print(done, next(weak))
        ]]):format(mode), "2\tnil\n")
      end
    end)
  end)

  it("a re-armed registration pending across uninstall() still runs in its context", function()
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    local seen, steps = {}, 0
    local function step()
      steps = steps + 1
      seen[#seen + 1] = v:get()
      if steps == 1 then
        t:start(1, 0, step) -- re-armed: luv gets the record's closure
        ah.uninstall()      -- its callback runs without the library's cb_pcall
      else
        t:close()
      end
    end
    v:run("armed", function() t:start(1, 0, step) end)
    run_loop()
    assert.same({ "armed", "armed" }, seen)
    assert.is_nil(v:get())
    assert.equal(0, core.stats().active)
  end)

  it("a re-armed slot can be re-armed again, stopped and closed from outside", function()
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    local seen = {}
    v:run("a", function() t:start(1000, 0, function() seen[#seen + 1] = "a" end) end)
    v:run("b", function() t:start(1000, 0, function() seen[#seen + 1] = "b" end) end)
    v:run("c", function() t:start(1, 0, function() seen[#seen + 1] = v:get(); t:close() end) end)
    run_loop()
    assert.same({ "c" }, seen)
  end)

  it("re-arming from coroutines with frames of their own captures each one's", function()
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    local seen = {}
    local co = ah.coroutine
    for _, name in ipairs { "one", "two", "three", "four" } do
      local c = v:run(name, function()
        return co.create(function()
          t:start(name == "four" and 1 or 1000, 0, function() seen[#seen + 1] = v:get(); t:close() end)
        end)
      end)
      assert.is_true(co.resume(c))
    end
    v:run("main", function() end)
    run_loop()
    assert.same({ "four" }, seen)
  end)

  it("a chain re-armed from its callback captures the frame at each re-arm", function()
    local v, w = AsyncLocal.new(), AsyncLocal.new()
    local function chain(inside) -- inside: the loop runs in the registration's frame
      local t = uv.new_timer()
      local seen, left = {}, 5
      local function step()
        left = left - 1
        seen[#seen + 1] = tostring(v:get()) .. "/" .. tostring(w:get())
        if left % 2 == 0 then w:set(left) end -- before the re-arm: the next step's
        if left > 0 then t:start(0, 0, step) else t:close() end
        w:set("after") -- after it: nobody's
      end
      v:run("chain", function()
        t:start(0, 0, step)
        if inside then run_loop() end
      end)
      if not inside then run_loop() end
      assert.same({ "chain/nil", "chain/4", "chain/4", "chain/2", "chain/2" }, seen)
      assert.is_nil(w:get())
      assert.is_nil(v:get())
    end
    chain(false)
    chain(true)
    -- no set at all: every step in the loop's own frame
    local t, n, seen = uv.new_timer(), 0, {}
    local function step()
      n = n + 1
      seen[n] = v:get()
      if n < 3 then t:start(0, 0, step) else t:close() end
    end
    v:run("same", function() t:start(0, 0, step); run_loop() end)
    assert.same({ "same", "same", "same" }, seen)
  end)

  it("luv required after install() is integrated when it loads", function()
    local code, out = H.run_lua([[
      local ah = require("async_hooks").install()
      local uv = require("luv")
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      v:run("late", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
      uv.run()
      ah.uninstall()
      print(package.preload.luv == nil)
    ]])
    assert.equal(0, code)
    assert.equal("late\ntrue\n", out)
  end)
  describe("handle registrations (per handle and callback slot)", function()
    local function recorder()
      local log, types = {}, {}
      local h = track(ah.createHook {
        init = function(id, type) types[id] = type; log[#log + 1] = { "init", id, type } end,
        before = function(id) log[#log + 1] = { "before", id } end,
        after = function(id) log[#log + 1] = { "after", id } end,
        destroy = function(id) log[#log + 1] = { "destroy", id } end,
      })
      h:enable()
      return log, types
    end
    -- every before/after of id comes after its init and before its destroy
    local function check_order(log)
      local state = {}
      for _, e in ipairs(log) do
        local kind, id = e[1], e[2]
        if kind == "init" then
          assert.is_nil(state[id], "init twice for " .. id)
          state[id] = "live"
        elseif state[id] then -- ids made before the hook are not followed
          assert.equal("live", state[id], kind .. " of " .. id .. " after its destroy")
          if kind == "destroy" then state[id] = "dead" end
        end
      end
      return state
    end

    it("a write or shutdown from the read callback leaves the read_start registration alive", function()
      local log, types = recorder()
      local server = uv.new_tcp()
      assert(server:bind("127.0.0.1", 0))
      local reads, read_ids = 0, {}
      server:listen(8, function()
        local conn = uv.new_tcp()
        server:accept(conn)
        conn:read_start(function(err, data)
          read_ids[ah.executionAsyncId()] = true
          if data then
            reads = reads + 1
            conn:write(data) -- a request on the same handle
          else
            conn:shutdown(function() conn:close(); server:close() end)
          end
        end)
      end)
      local c = uv.new_tcp()
      c:connect("127.0.0.1", server:getsockname().port, function()
        local sent = 0
        local function send()
          sent = sent + 1
          c:write("x" .. sent, function() end)
        end
        c:read_start(function(err, data)
          if data and sent < 3 then send() elseif data then c:shutdown(function() c:close() end) end
        end)
        send()
      end)
      run_loop()
      assert.is_true(reads >= 3)
      local state = check_order(log)
      -- one read_start registration on the server side served every read,
      -- EOF included, and was destroyed only when its handle closed
      local n = 0
      for id in pairs(read_ids) do
        n = n + 1
        assert.equal("uv_tcp", types[id])
        assert.equal("dead", state[id])
      end
      assert.equal(1, n)
    end)

    it("udp: send on the receiving handle keeps its recv_start registration", function()
      local log, types = recorder()
      local rx = uv.new_udp()
      assert(rx:bind("127.0.0.1", 0))
      local port = rx:getsockname().port
      local got, recv_ids = 0, {}
      rx:recv_start(function(err, data)
        if not data then return end
        recv_ids[ah.executionAsyncId()] = true
        got = got + 1
        if got < 3 then
          rx:send("again", "127.0.0.1", port, function() end) -- to itself
        else
          rx:close()
        end
      end)
      rx:send("first", "127.0.0.1", port, function() end)
      run_loop()
      assert.equal(3, got)
      local state = check_order(log)
      local n = 0
      for id in pairs(recv_ids) do
        n = n + 1
        assert.equal("uv_udp", types[id])
        assert.equal("dead", state[id]) -- at close, not at the first send
      end
      assert.equal(1, n)
    end)

    it("re-arming a slot from outside its callback destroys the old registration; close the last", function()
      local log = recorder()
      local t = uv.new_idle()
      local seen = {}
      local v = AsyncLocal.new()
      v:run("a", function() t:start(function() seen[#seen + 1] = v:get() end) end)
      v:run("b", function() t:start(function() seen[#seen + 1] = v:get(); t:stop() end) end)
      run_loop()
      t:close()
      run_loop()
      assert.same({ "b" }, seen)
      local inits, destroys = {}, {}
      for _, e in ipairs(log) do
        if e[1] == "init" and e[3] == "uv_idle" then inits[#inits + 1] = e[2] end
        if e[1] == "destroy" then destroys[#destroys + 1] = e[2] end
      end
      assert.equal(2, #inits)
      assert.same(inits, destroys)
      check_order(log)
    end)

    it("a chain re-armed from its own callback: each step its own asyncId, ids balanced", function()
      local log = recorder()
      local t = uv.new_timer()
      local v = AsyncLocal.new()
      local ids, vals = {}, {}
      local left = 5
      local function step()
        ids[#ids + 1] = ah.executionAsyncId()
        vals[#vals + 1] = v:get()
        left = left - 1
        if left == 0 then t:close() return end
        v:run(left, function() t:start(0, 0, step) end)
      end
      v:run("first", function() t:start(0, 0, step) end)
      run_loop()
      assert.same({ "first", 4, 3, 2, 1 }, vals)
      for i = 2, #ids do assert.is_true(ids[i] > ids[i - 1]) end
      local state = check_order(log)
      for _, id in ipairs(ids) do assert.equal("dead", state[id]) end
    end)

    it("listen and read_start on one handle are separate slots", function()
      local log = recorder()
      local p = uv.new_pipe(false)
      local path = os.tmpname()
      os.remove(path)
      assert(p:bind(path))
      p:listen(1, function() end)
      local listen_id
      for _, e in ipairs(log) do if e[1] == "init" then listen_id = e[2] end end
      -- read_start on a listening pipe fails in libuv, but luv registers the
      -- callback first: the listen registration must survive it
      pcall(p.read_start, p, function() end)
      local tick = uv.new_timer() -- a callback's exit delivers queued destroys
      tick:start(0, 0, function() tick:close() end)
      uv.run("once")
      local state = check_order(log)
      assert.equal("live", state[listen_id])
      p:close()
      run_loop()
      os.remove(path)
      state = check_order(log)
      assert.equal("dead", state[listen_id])
    end)
  end)

  it("uninstall() runs no user code; a later install and uv.run still work", function()
    local code, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local h = ah.createHook { destroy = function() end }:enable()
      local ran = false
      local t = uv.new_timer()
      t:start(0, 0, function() ran = true; t:close() end)
      uv.sleep(5) -- the timer is due
      ah.uninstall()
      print("after uninstall", ran)
      ah.install()
      ah.uninstall()
      h:disable()
      uv.run()
      print("after run", ran)
      -- exit without running the loop again: luv 1.44 would crash here on a
      -- handle closed since the loop last ran
    ]])
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("after uninstall\tfalse\nafter run\ttrue\n", out)
  end)

  it("a resource asked for in a re-armed chain step is that step's", function()
    local t = uv.new_timer()
    local v = AsyncLocal.new()
    local res, left = {}, 3
    local function step()
      left = left - 1
      if left > 0 then t:start(0, 0, step) end -- re-armed before asking
      res[#res + 1] = ah.executionAsyncResource()
      if left == 0 then t:close() end
    end
    v:run(1, function() t:start(0, 0, step) end)
    run_loop()
    assert.equal(3, #res)
    for i, r in ipairs(res) do
      assert.equal("timer_start", r.op, i)
      assert.equal(t, r.handle, i)
      for j = 1, i - 1 do assert.are_not.equal(res[j], r) end
    end
  end)

  -- in a fresh process: the first executionAsyncResource() call switches
  -- records to making their resource at entry (and this file made it)
  local nested = [[
    local uv = require("luv")
    local ah = require("async_hooks").install()
    local v = ah.AsyncLocal.new()
    local a, b = uv.new_timer(), uv.new_timer()
    local h = ah.createHook{init = function() end}:enable()
    a:start(0, 0, function() -- has a resource (an init hook was on)
      uv.run("nowait") -- b fires here
      local ra = ah.executionAsyncResource()
      print("a", ra.op, ra.handle == a)
      a:close()
    end)
    h:disable()
    %s
    uv.run()
  ]]

  it("a nested tracked callback without a resource does not see the outer callback's", function()
    local code, out, err = H.run_lua(nested:format([[
      v:run("x", function()
        b:start(0, 0, function()
          local rb = ah.executionAsyncResource()
          print("b", v:get(), rb.op, rb.handle == b, rb.handle == a)
          b:close()
        end)
      end)]]))
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("b\tx\ttimer_start\ttrue\tfalse\na\ttimer_start\ttrue\n", out)
  end)

  it("a nested untracked callback does not see the outer callback's resource", function()
    local code, out, err = H.run_lua(nested:format([[
      b:start(0, 0, function()
        local rb = ah.executionAsyncResource()
        print("b", type(rb), type(rb) == "table" and rb.handle == a)
        b:close()
      end)]]))
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("b\ttable\tfalse\na\ttimer_start\ttrue\n", out)
  end)

  it("a callback keeps its frame when a nested callback re-arms its registration and the collector runs", function()
    -- the frame a callback runs in is held by the dispatch itself, not by
    -- the thread's anchor: here nothing else holds {"a"} once b re-armed a
    local code, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local a, b = uv.new_timer(), uv.new_timer()
      local step = 0
      local function afn()
        step = step + 1
        if step == 1 then
          uv.run("nowait") -- b fires here and re-arms a in its own context
          collectgarbage()
          collectgarbage()
          print("a", v:get()[1])
        else
          print("a again", v:get()[1])
          a:close()
        end
      end
      v:run({ "a" }, function() a:start(0, 0, afn) end)
      v:run({ "b" }, function()
        b:start(0, 0, function()
          a:start(0, 0, afn)
          b:close()
          collectgarbage()
          print("b", v:get()[1])
        end)
      end)
      uv.run()
      print("top", v:get())
    ]])
    assert.equal("", err)
    assert.equal(0, code)
    -- a, re-armed with 0 ms inside the nested run, fires again inside it
    assert.equal("b\tb\na again\tb\na\ta\ntop\tnil\n", out)
  end)

  it("a before hook that writes a frame does not leave the caller's frame unanchored", function()
    local code, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "default" }
      local w = ah.AsyncLocal.new()
      ah.createHook { before = function(id) w:run(id, function() end) end }:enable()
      v:set({ "top" }) -- the main thread's frame: held by its anchor only
      local t = uv.new_timer()
      v:run("cb", function() t:start(0, 0, function() print("cb", v:get()); t:close() end) end)
      uv.run()
      collectgarbage()
      collectgarbage()
      local got = v:get()
      print("after", type(got) == "table" and got[1] or got)
    ]])
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("cb\tcb\nafter\ttop\n", out)
  end)

  it("a callback re-armed from itself after an init hook was enabled keeps its own resource", function()
    local code, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      local inits = {}
      v:run("ctx", function()
        t:start(0, 0, function()
          local running = ah.executionAsyncId()
          ah.createHook{init = function(id, _, _, res) inits[id] = res end}:enable()
          t:start(1000, 0, function() end) -- re-armed: a new registration
          local res = ah.executionAsyncResource()
          local newid = next(inits)
          print(running ~= newid, res ~= inits[newid], res == ah.executionAsyncResource(),
                res.op, res.handle == t, inits[newid].handle == t, v:get())
          t:close()
        end)
      end)
      uv.run()
    ]])
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("true\ttrue\ttrue\ttimer_start\ttrue\ttrue\tctx\n", out)
  end)

  it("a Lua error in the flush at a callback's exit does not escape luv's loop", function()
    -- on_destroy_hooks' function is told at the flush that ends an inline
    -- callback when an after hook enabled the first destroy hook
    local code, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local v = ah.AsyncLocal.new()
      local told, raising = {}, true
      core.on_destroy_hooks(function(on)
        told[#told + 1] = on
        if raising then error("raised in on_destroy_hooks") end
      end)
      local dh = ah.createHook{ destroy = function() end }
      local en = ah.createHook{ after = function() dh:enable() end }:enable()
      local t = uv.new_timer()
      v:run("x", function() t:start(0, 0, function() t:stop() end) end)
      print(pcall(uv.run))
      raising = false
      en:disable() -- told again (the failed notice is retried)
      local st = core.stats()
      print(v:get(), ah.executionAsyncId(), st.active, st.dispatching, #told, told[1], told[2])
      t:close()
      uv.run()
      dh:disable()
      print(#told, told[3])
    ]])
    assert.equal("", err)
    assert.equal(0, code)
    assert.equal("true\tfalse\nnil\t1\t0\t0\t2\ttrue\ttrue\n3\tfalse\n", out)
  end)
end)

-- review findings (helper-32): every install()/uninstall() cycle made a new
-- set of wrappers (each anchoring its spec for the life of the state), and
-- install() ignored a luv module required again while installed
describe("luv across install cycles and re-required modules", function()
  it("install()/uninstall() cycles keep memory flat", function()
    local status, out, err = H.run_lua([[
      require("luv")
      local ah = require("async_hooks")
      local function mem() collectgarbage(); collectgarbage(); return collectgarbage("count") end
      ah.install(); ah.uninstall()
      local m0 = mem()
      for _ = 1, 300 do ah.install(); ah.uninstall() end
      print(math.floor((mem() - m0) * 1024 / 300))
    ]])
    assert.equal("", err)
    assert.equal(0, status)
    assert.is_true(tonumber(out) < 64, "bytes per cycle: " .. out) -- was about 15000
  end)

  it("install() patches a luv module required again, and uninstall() restores both", function()
    local status, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local orig = debug.getregistry().uv_timer.__index.start
      package.loaded.luv = nil
      local uv2 = require("luv")
      assert(uv2 ~= uv)
      ah.install()
      local v = ah.AsyncLocal.new()
      v:set("ctx")
      local got1, got2
      local t1, t2 = uv2.new_timer(), uv2.new_timer()
      uv2.timer_start(t1, 1, 0, function() got1 = v:get(); t1:close() end)
      t2:start(1, 0, function() got2 = v:get(); t2:close() end)
      uv2.run()
      ah.uninstall()
      local raw = debug.getregistry().uv_timer.__index.start
      print(got1, got2, rawget(uv, "timer_start") == rawget(uv2, "timer_start"), raw == rawget(uv2, "timer_start"),
        raw ~= orig)
      uv2.run("nowait")
    ]])
    assert.equal("", err)
    assert.equal(0, status)
    assert.equal("ctx\tctx\ttrue\ttrue\ttrue\n", out)
  end)
end)
