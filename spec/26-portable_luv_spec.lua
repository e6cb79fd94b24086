-- luv callbacks on every runtime the library supports (see
-- spec/25-portable_spec.lua): Lua 5.1 syntax, run under lua5.4 (the C core)
-- and luajit, lua5.1, lua5.2, lua5.3 (the pure-Lua backend).
local uv = require("luv") -- on the main thread, before the library
local ah = require("async_hooks")
local H = require("helpers")
local P = require("support.portable")
local AsyncLocal = ah.AsyncLocal

-- a hook that logs "init <type>", "before <type>", ... by the id's type
local function typed_recorder(track)
  local log, types = {}, {}
  track(ah.createHook {
    init = function(id, t) types[id] = t; log[#log + 1] = "init " .. t end,
    before = function(id) if types[id] then log[#log + 1] = "before " .. types[id] end end,
    after = function(id) if types[id] then log[#log + 1] = "after " .. types[id] end end,
    destroy = function(id) if types[id] then log[#log + 1] = "destroy " .. types[id] end end,
  }):enable()
  return log
end

describe("luv on " .. P.RUNTIME .. " (" .. ah.backend .. ")", function()
  local track = H.installed_each()

  it("a timer's callback runs in the context of t:start and of uv.timer_start", function()
    local v = AsyncLocal.new { default = "loop" }
    local seen = {}
    v:run("method", function()
      local t = uv.new_timer()
      t:start(1, 0, function() seen[#seen + 1] = v:get(); t:close() end)
    end)
    v:run("function", function()
      local t = uv.new_timer()
      uv.timer_start(t, 1, 0, function() seen[#seen + 1] = v:get(); uv.close(t) end)
    end)
    uv.run()
    table.sort(seen)
    assert.same({ "function", "method" }, seen)
    assert.equal("loop", v:get())
  end)

  it("ids: the callback's own, triggered by the registering context", function()
    local registering, id, trig, res
    local t = uv.new_timer()
    AsyncLocal.new():run("observed", function()
      registering = ah.executionAsyncId()
      t:start(1, 0, function()
        id, trig, res = ah.executionAsyncId(), ah.triggerAsyncId(), ah.executionAsyncResource()
        t:close()
      end)
    end)
    uv.run()
    assert.is_true(id > registering)
    assert.equal(registering, trig)
    assert.equal("timer_start", res.op)
    assert.equal(t, res.handle)
    assert.equal(1, ah.executionAsyncId())
  end)

  it("ids of a registration made inside runInAsyncScope", function()
    ah.executionAsyncResource() -- (from now on, every registration is tracked)
    local registering, id, trig, res
    local t = uv.new_timer()
    -- (a value set: a registration nothing observes may skip its resource)
    local req = ah.AsyncResource.new("Req")
    AsyncLocal.new():run("observed", function()
      req:runInAsyncScope(function()
        registering = ah.executionAsyncId()
        t:start(1, 0, function()
          id, trig, res = ah.executionAsyncId(), ah.triggerAsyncId(), ah.executionAsyncResource()
          t:close()
        end)
      end)
    end)
    uv.run()
    assert.is_true(id > registering)
    assert.equal(registering, trig)
    assert.equal("timer_start", res.op)
    assert.equal(t, res.handle)
    assert.equal(1, ah.executionAsyncId())
  end)

  it("a registration nothing observes: ids 0, no events for a hook enabled later", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "clean" }
      local t = uv.new_timer()
      local id, trig, seen
      local n = 0
      t:start(1, 1, function() -- no hook, no value, no resource asked for
        n = n + 1
        seen = (seen or "") .. v:get()
        v:set("dirty")
        id, trig = ah.executionAsyncId(), ah.triggerAsyncId()
        if n == 2 then t:close() end
      end)
      local events = 0
      ah.createHook { before = function() events = events + 1 end, after = function() events = events + 1 end }:enable()
      uv.run()
      print(id, trig, events, seen, v:get())
    ]], { { "its executionAsyncId: 0", "its triggerAsyncId: 0", "events: 0", "each call clean: cleanclean",
      "the loop's value: clean" } })
  end)

  it("a set inside one call of a repeating callback is gone at the next", function()
    local v = AsyncLocal.new { default = "clean" }
    local seen = {}
    local t = uv.new_timer()
    t:start(1, 1, function()
      seen[#seen + 1] = v:get()
      v:set("dirty")
      if #seen == 3 then t:close() end
    end)
    uv.run()
    assert.same({ "clean", "clean", "clean" }, seen)
    assert.equal("clean", v:get())
  end)

  it("a handle re-registered with nothing observing: each registration its own call, clean", function()
    -- (a fresh interpreter: no resource asked for yet, so that these
    -- registrations are the ones nothing observes; the same callback
    -- started again from inside itself, then another callback, then the
    -- first again from a value's scope and from the empty context)
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "clean" }
      local seen = {}
      local t = uv.new_timer()
      local second
      local function first()
        seen[#seen + 1] = "first " .. v:get()
        if #seen < 3 then
          t:start(0, 0, first)
        elseif #seen == 3 then
          t:start(0, 0, second)
        elseif #seen == 5 then -- (in "scoped": from the empty context again)
          ah.Snapshot.empty():run(function() t:start(0, 0, first) end)
        else
          t:close()
        end
        v:set("dirty") -- (after the registration: not its context)
      end
      second = function()
        seen[#seen + 1] = "second " .. v:get()
        v:run("scoped", function() t:start(0, 0, first) end)
        v:set("dirty")
      end
      t:start(0, 0, first)
      uv.run()
      print(table.concat(seen, ","))
      print(v:get())
    ]], { "first clean,first clean,first clean,second clean,first scoped,first clean", "clean" })
  end)

  -- (a child's prelude: `collect()` runs full cycles until nothing more is
  -- freed: a closed handle's own finalizer takes a cycle; LuaJIT's
  -- compiled traces may hold values they were specialised on, and are
  -- dropped first; `weak` is a weak-keyed table; `count(weak)` its size)
  local COLLECT = [[
    local weak = setmetatable({}, { __mode = "k" })
    local function collect()
      if jit then jit.flush() end
      local before
      repeat
        before = collectgarbage("count")
        collectgarbage()
      until collectgarbage("count") >= before
    end
    local function count(t)
      local n = 0
      for _ in pairs(t) do n = n + 1 end
      return n
    end
  ]]

  it("a closed handle whose registrations replaced one another is collected, also after uninstall()", function()
    H.lua_ok(COLLECT .. [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      -- a timer whose callback starts it again twice, then closes it,
      -- its first start made by `first`
      local function chain(first)
        local t = uv.new_timer()
        local n = 0
        local function step()
          n = n + 1
          if n < 3 then t:start(0, 0, step) else t:close() end
        end
        first(function() t:start(0, 0, step) end)
        weak[t] = true
      end
      chain(function(start) start() end) -- (nothing observes: untracked)
      uv.run()
      collect()
      print(next(weak) == nil)
      -- (with a value: tracked registrations, one replacing another)
      local v = ah.AsyncLocal.new()
      chain(function(start) v:run("x", start) end)
      uv.run()
      collect()
      print(next(weak) == nil)
      -- (closed after uninstall(): the library does not see the close)
      do
        local t = uv.new_timer()
        t:start(1000, 0, function() end)
        t:start(1000, 0, function() end)
        v:run("y", function()
          t:start(1000, 0, function() end)
          t:start(1000, 0, function() end)
        end)
        weak[t] = true
        t:stop()
        ah.uninstall()
        t:close()
      end
      uv.run()
      collect()
      print(next(weak) == nil)
    ]], { "true", "true", "true" })
  end)

  it("handles closed by a close saved before install() are collected, tracked or not", function()
    -- (the library does not see that close: its records of the handles go
    -- with luv's hold on them)
    H.lua_ok(COLLECT .. [[
      local uv = require("luv")
      local close = uv.close
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local function timers(n)
        for _ = 1, n do
          local t = uv.new_timer()
          t:start(0, 0, function() close(t) end)
          t:start(0, 0, function() close(t) end) -- (one replacing another)
          weak[t] = true
        end
      end
      timers(20) -- (nothing observes: untracked)
      uv.run()
      collect()
      print("untracked alive: " .. count(weak))
      v:run("tracked", function() timers(20) end)
      uv.run()
      collect()
      print("tracked alive: " .. count(weak))
    ]], { "untracked alive: 0", "tracked alive: 0" })
  end)

  it("a replaced registration's callback and frame are collected while its handle stays open", function()
    H.lua_ok(COLLECT .. [[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      local function noop() end
      -- each time: a registration holding `key` in its frame (a value's
      -- scope) or in its callback, then another in its place
      local function register(how)
        local key = {}
        weak[key] = how
        if how == "frame" then
          v:run(key, function() t:start(1000, 0, noop) end)
        else
          t:start(1000, 0, function() return key end)
        end
      end
      local function replaced(how, again)
        register(how)
        again()
        collect()
        print(how .. " collected: " .. tostring(next(weak) == nil))
        for k in pairs(weak) do weak[k] = nil end
      end
      replaced("frame", function() v:run("other", function() t:start(1000, 0, noop) end) end)
      replaced("callback", function() v:run("other", function() t:start(1000, 0, noop) end) end)
      -- (the first one nothing observes: untracked, then a tracked one)
      replaced("callback", function() v:run("other", function() t:start(1000, 0, noop) end) end)
      t:close()
      uv.run()
    ]], { "frame collected: true", "callback collected: true", "callback collected: true" })
  end)

  it("a registration ended inside a scope of its callback: its own destroy, not the scope's", function()
    -- (closed inside runInAsyncScope, and started again there: the ended
    -- registration's destroy carries its id)
    local inits, destroys = {}, {}
    track(ah.createHook {
      init = function(id, type) if type == "uv_timer" then inits[#inits + 1] = id end end,
      destroy = function(id) destroys[#destroys + 1] = id end,
    }):enable()
    local ar = ah.AsyncResource.new("AR")
    local t = uv.new_timer()
    local n = 0
    local function cb()
      n = n + 1
      if n == 1 then
        ar:runInAsyncScope(function() t:start(0, 0, cb) end)
      else
        ar:runInAsyncScope(function() t:close() end)
      end
    end
    t:start(0, 0, cb)
    uv.run()
    ah.flush()
    assert.equal(2, #inits)
    assert.same(inits, destroys)
    assert.is_true(inits[1] ~= ar:asyncId() and inits[2] ~= ar:asyncId())
  end)

  it("a nested call and the outer one see one resource, whichever asks first; a reused record starts afresh", function()
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    -- a repeating registration whose first call runs the loop once more:
    -- the second call, nested, asks for the resource before the outer one
    local function phase(name)
      local n, inner, outer = 0, nil, nil
      v:run(name, function()
        t:start(1, 1, function()
          n = n + 1
          if n == 1 then
            uv.run("once")
            outer = ah.executionAsyncResource()
          else
            inner = ah.executionAsyncResource()
            t:stop()
          end
        end)
      end)
      uv.run()
      return inner, outer
    end
    local a_inner, a_outer = phase("A")
    v:run("B", function() t:start(1000, 0, function() end) end) -- (replaces A's registration)
    local c_inner, c_outer = phase("C") -- (may take A's record again)
    t:close()
    uv.run()
    assert.is_not_nil(a_inner)
    assert.equal(a_inner, a_outer)
    assert.equal(c_inner, c_outer)
    assert.is_true(c_inner ~= a_inner)
  end)

  it("a record kept for reuse and collected before it is taken: a new one", function()
    -- (a call hook that collects inside the library, between its finding
    -- the replaced record and its taking it: a debugger or a profiler that
    -- allocates does the same at a smaller scale)
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      local function noop() end
      local seen
      v:run("x", function()
        t:start(1000, 0, noop)
        t:start(1000, 0, noop) -- (replaces the first: its record kept for reuse)
        debug.sethook(function()
          local info = debug.getinfo(2, "S")
          if info.source:find("luv_lua", 1, true) then collectgarbage() end
        end, "c")
        local ok, e = pcall(t.start, t, 0, 0, function() seen = v:get() end)
        debug.sethook()
        print(ok, e)
      end)
      uv.run()
      print(seen)
      t:close()
      uv.run()
    ]], { { "true", "0" }, "x" })
  end)

  it("a callback called again while it runs (uv.run inside it): its own frame and ids, the outer's back after", function()
    -- (a repeating timer whose first call runs the loop once more, in a
    -- resource's scope: the second call runs nested; Neovim's vim.wait
    -- does this)
    local v = AsyncLocal.new()
    local t = uv.new_timer()
    local n, reg, first, out, events = 0, nil, nil, {}, {}
    local tid
    track(ah.createHook {
      init = function(id, type) if type == "uv_timer" then tid = id end end,
      before = function(id) if id == tid then events[#events + 1] = "before" end end,
      after = function(id) if id == tid then events[#events + 1] = "after" end end,
    }):enable()
    local ar = ah.AsyncResource.new("OUTER")
    v:run("registered", function()
      reg = ah.executionAsyncId()
      t:start(1, 1, function()
        n = n + 1
        local mine = "call" .. n
        local id, res = ah.executionAsyncId(), ah.executionAsyncResource()
        out[#out + 1] = ("%s starts: %s, trigger %s"):format(mine, tostring(v:get()), tostring(ah.triggerAsyncId() == reg))
        v:set(mine)
        if n == 1 then
          first = { id, res }
          ar:runInAsyncScope(function()
            uv.run("once")
            out[#out + 1] = "in the scope: " .. tostring(ah.executionAsyncId() == ar:asyncId())
          end)
        else
          out[#out + 1] = "nested, the first call's ids: " .. tostring(id == first[1] and res == first[2])
          t:stop()
          t:close()
        end
        out[#out + 1] = mine .. " ends: " .. tostring(v:get()) .. ", its ids: " ..
          tostring(ah.executionAsyncId() == id and ah.executionAsyncResource() == res)
      end)
    end)
    uv.run()
    assert.same({ "call1 starts: registered, trigger true", "call2 starts: registered, trigger true",
      "nested, the first call's ids: true", "call2 ends: call2, its ids: true", "in the scope: true",
      "call1 ends: call1, its ids: true" }, out)
    assert.equal(tid, first[1])
    assert.same({ "before", "before", "after", "after" }, events)
  end)

  it("a handle re-registered in a context: each registration its own ids, value and resource", function()
    -- (each step sets a value of its own, then registers the next from
    -- inside its callback: the next step sees the context of its
    -- registration)
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "-" }
      local t = uv.new_timer()
      local ids, trigs, values, resources = {}, {}, {}, {}
      local function step()
        local n = #ids + 1
        ids[n], trigs[n], values[n] = ah.executionAsyncId(), ah.triggerAsyncId(), v:get()
        if n == 4 then resources[1] = ah.executionAsyncResource() end
        if n > 4 then resources[#resources + 1] = ah.executionAsyncResource() end
        v:set("step " .. n)
        if n < 7 then t:start(0, 0, step) else t:close() end
      end
      v:run("start", function() t:start(0, 0, step) end)
      uv.run()
      local ok = true
      for n = 2, #ids do
        if ids[n] <= ids[n - 1] or trigs[n] ~= ids[n - 1] then ok = false end
      end
      print(#ids, ok, table.concat(values, ","))
      print(resources[1] ~= resources[2] and resources[2] ~= resources[3] and resources[3] ~= resources[4]
        and resources[1] ~= resources[3])
    ]], { { "steps: 7", "each step its own id, triggered by the last: true",
      "start,step 1,step 2,step 3,step 4,step 5,step 6" }, { "each registration its own resource: true" } })
  end)

  it("a handle re-registered with hooks: each registration's events once, in order", function()
    H.lua_ok([=[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local log = {}
      ah.createHook {
        init = function(id, t) if t == "uv_timer" then log[#log + 1] = "init " .. id end end,
        before = function(id) log[#log + 1] = "before " .. id end,
        after = function(id) log[#log + 1] = "after " .. id end,
        destroy = function(id) log[#log + 1] = "destroy " .. id end,
      }:enable()
      local t = uv.new_timer()
      local n, ids = 0, {}
      local function step()
        n = n + 1
        ids[n] = ah.executionAsyncId()
        if n < 5 then t:start(0, 0, step) else t:close() end
      end
      t:start(0, 0, step)
      uv.run()
      -- each id: init, before, after, destroy, in this order, once each
      local seen, ok = {}, true
      local order = { init = 1, before = 2, after = 3, destroy = 4 }
      for _, line in ipairs(log) do
        local kind, id = line:match("^(%a+) (%d+)$")
        id = tonumber(id)
        local last = seen[id] or 0
        if order[kind] ~= last + 1 then ok = false end
        seen[id] = order[kind]
      end
      local distinct = {}
      for i = 1, 5 do
        if seen[ids[i]] ~= 4 or distinct[ids[i]] then ok = false end
        distinct[ids[i]] = true
      end
      print(n, ok)
    ]=], { { "steps: 5", "each registration init, before, after, destroy once: true" } })
  end)

  it("a callback whose handle is re-registered under a coroutine it resumes keeps its context", function()
    H.lua_ok([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local v = ah.AsyncLocal.new { default = "-" }
      local t = uv.new_timer()
      local got = {}
      local function last() got[#got + 1] = "last " .. v:get(); t:close() end
      local function first()
        local id = ah.executionAsyncId()
        local co = ah.coroutine.wrap(function()
          v:set("co")
          t:start(0, 0, last)
          t:start(0, 0, last) -- (replaces the one before)
        end)
        co()
        got[#got + 1] = "first " .. v:get() .. " " .. tostring(ah.executionAsyncId() == id)
      end
      v:run("A", function() t:start(0, 0, first) end)
      uv.run()
      print(table.concat(got, ","))
    ]], { "first A true,last co" })
  end)

  it("events: init with the luv type, before/after per call, destroy of requests and closed handles", function()
    local log = typed_recorder(track)
    local t = uv.new_timer()
    t:start(1, 0, function()
      uv.fs_stat("/", function() end)
    end)
    uv.run()
    t:close()
    uv.run()
    local s = table.concat(log, ",")
    assert.matches("init uv_timer,before uv_timer,init uv_fs,after uv_timer", s, 1, true)
    assert.matches("before uv_fs,after uv_fs,destroy uv_fs", s, 1, true)
    assert.matches("destroy uv_timer", s, 1, true)
  end)

  it("a handle closed inside its own callback: destroy after its after", function()
    local log = typed_recorder(track)
    local t = uv.new_timer()
    t:start(1, 0, function() t:close() end)
    uv.run()
    assert.same({ "init uv_timer", "before uv_timer", "after uv_timer", "destroy uv_timer" }, log)
  end)

  it("a replaced handle callback is destroyed; closing destroys the last one", function()
    local inits, destroyed = {}, {}
    track(ah.createHook {
      init = function(id) inits[#inits + 1] = id end,
      destroy = function(id) destroyed[#destroyed + 1] = id end,
    }):enable()
    local t = uv.new_timer()
    t:start(1000, 0, function() end)
    t:start(1000, 0, function() end) -- its destroy: queued, delivered as the loop runs
    t:stop()
    t:close()
    uv.run()
    assert.same({ inits[1], inits[2] }, destroyed)
  end)

  it("fs requests: the resource has op and path; the context of the call", function()
    local v = AsyncLocal.new()
    local got
    v:run("fs", function()
      uv.fs_stat("/", function(err, st)
        local res = ah.executionAsyncResource()
        got = { v:get(), res.op, res.path, err == nil and st.type }
      end)
    end)
    uv.run()
    assert.same({ "fs", "fs_stat", "/", "directory" }, got)
  end)

  it("TCP on loopback: listen, connect, write and read carry their own contexts", function()
    local v = AsyncLocal.new { default = "none" }
    local server = uv.new_tcp()
    assert(server:bind("127.0.0.1", 0))
    local port = server:getsockname().port
    local saw = {}
    v:run("server", function()
      server:listen(16, function()
        local client = uv.new_tcp()
        server:accept(client)
        saw.listen = v:get()
        client:read_start(function(_, data)
          if data then
            saw.read = v:get()
            client:write(data, function() saw.server_write = v:get() end)
          else
            client:close()
            server:close()
          end
        end)
      end)
    end)
    local log = typed_recorder(track)
    v:run("client", function()
      local c = uv.new_tcp()
      c:connect("127.0.0.1", port, function(err)
        assert.is_nil(err)
        saw.connect = v:get()
        v:set("after connect")
        c:write("hi", function() saw.client_write = v:get() end)
        c:read_start(function(_, data)
          saw.echo = data
          saw.client_read = v:get()
          c:close()
        end)
      end)
    end)
    uv.run()
    assert.same({ listen = "server", read = "server", server_write = "server", connect = "client",
      client_write = "after connect", client_read = "after connect", echo = "hi" }, saw)
    local s = table.concat(log, ",")
    assert.matches("init uv_connect", s, 1, true)
    assert.matches("init uv_write", s, 1, true)
    assert.matches("init uv_tcp", s, 1, true)
  end)

  it("a second luv table given to install(): each registration's events once", function()
    if ah.backend == "lua54" then
      pending("the C core integrates one luv table per state (package.loaded.luv or opts.luv)")
      return
    end
    local log = typed_recorder(track)
    local other = {}
    for k, f in pairs(uv) do other[k] = f end
    ah.install { luv = other } -- (the handle metatables are the same)
    local v = AsyncLocal.new()
    v:run("x", function()
      local t = uv.new_timer()
      t:start(1, 0, function() t:close() end)
    end)
    uv.run()
    local n = 0
    for _, line in ipairs(log) do if line == "init uv_timer" then n = n + 1 end end
    assert.equal(1, n)
  end)

  it("a handle registered while installed and closed after uninstall() is collected", function()
    local weak = setmetatable({}, { __mode = "k" })
    do
      local t = uv.new_timer()
      AsyncLocal.new():run("x", function() t:start(1000, 0, function() end) end)
      weak[t] = true
      t:stop()
      ah.uninstall()
      t:close()
    end
    uv.run()
    H.gc()
    assert.is_nil(next(weak))
  end)

  it("luv_covered names the wrapped functions", function()
    local covered = {}
    for _, name in ipairs(ah.luv_covered) do covered[name] = true end
    for _, name in ipairs { "timer_start", "fs_open", "tcp_connect", "write", "read_start", "close" } do
      assert.is_true(covered[name], name)
    end
  end)

  it("uninstall puts the original functions back, methods included", function()
    local t = uv.new_timer()
    local start, method = uv.timer_start, t.start
    ah.uninstall()
    assert.are_not.equal(start, uv.timer_start)
    assert.are_not.equal(method, t.start)
    ah.install()
    assert.equal(start, uv.timer_start)
    assert.equal(method, t.start)
    t:close()
    uv.run()
  end)

  it("luv's argument errors come out as without the library: named, at the caller's line", function()
    local t = uv.new_timer()
    assert.equal("bad argument #1 to 'fs_stat' (string expected, got table)",
      H.raised_here(function() uv.fs_stat({}) end))
    assert.equal("bad argument #1 to 'fs_stat' (string expected, got table)",
      H.raised_here(function() uv.fs_stat({}, function() end) end))
    assert.equal("bad argument #1 to 'start' (number expected, got string)",
      H.raised_here(function() t:start("a", 0, function() end) end))
    assert.equal("bad argument #2 to 'timer_start' (number expected, got string)",
      H.raised_here(function() uv.timer_start(t, "a", 0, function() end) end))
    t:close()
    uv.run()
  end)

  it("a call luv refuses makes no registration: no init, no destroy", function()
    local log = typed_recorder(track)
    local t = uv.new_timer()
    assert.is_false(pcall(uv.fs_stat, {}, function() end))
    assert.is_false(pcall(t.start, t, "a", 0, function() end))
    t:close()
    uv.run()
    assert.same({}, log)
  end)

  it("an error in a callback keeps its message: luv reports it and exits", function()
    local status, out, err = H.run_lua([[
      local uv = require("luv")
      local ah = require("async_hooks").install()
      local t = uv.new_timer()
      t:start(1, 0, function() t:close(); error("boom at the user's line") end)
      uv.run()
      print("not reached")
    ]])
    assert.are_not.equal(0, status)
    assert.equal("", out)
    assert.matches("^Uncaught Error: [^\n]*:4: boom at the user's line\n", err)
  end)

  it("luv found as luvit's package.loaded.uv and Neovim's vim.uv", function()
    local why = P.core_differs("the C core integrates package.loaded.luv or opts.luv only")
    if why then pending(why); return end
    for _, setup in ipairs {
      "package.loaded.uv = require('luv'); package.loaded.luv = nil",
      "vim = { uv = require('luv') }; package.loaded.luv = nil",
      "vim = { loop = require('luv') }; package.loaded.luv = nil",
    } do
      H.lua_ok(setup .. [[

        local uv = require("luv")
        local ah = require("async_hooks").install()
        local v = ah.AsyncLocal.new()
        local t = uv.new_timer()
        v:run("found", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
        uv.run()
      ]], { "found" }, setup)
    end
  end)

  it("Neovim: vim.loop's callbacks and coroutines carry the context (nvim --headless)", function()
    if not P.has_command("nvim") then
      pending("nvim is not installed (Debian: neovim)")
      return
    end
    local pwd = io.popen("pwd")
    local root = pwd:read("*l")
    pwd:close()
    local script = H.tmpfile(([[
      package.path = %q .. package.path
      local ah = require("async_hooks").install()
      local uv = vim.uv or vim.loop
      local v = ah.AsyncLocal.new { default = "-" }
      local out = { ah.backend }
      v:run("req", function()
        local t = uv.new_timer()
        t:start(1, 0, function() out[#out + 1] = "timer " .. v:get(); t:close() end)
        uv.fs_stat("/", function() out[#out + 1] = "fs " .. v:get() end)
        coroutine.wrap(function() out[#out + 1] = "co " .. v:get() end)()
      end)
      vim.wait(2000, function() return #out >= 4 end)
      table.sort(out)
      io.stdout:write(table.concat(out, " "), "\n")
      vim.cmd("qa!")
    ]]):format(root .. "/lua/?.lua;" .. root .. "/lua/?/init.lua;"))
    -- (nvim runs without the sanitizer runtime an ASan run preloads: its
    -- own allocations are not this project's to check; its LuaJIT takes
    -- the 5.1 build of the pure-Lua backend's C helper, where it is built,
    -- not the one on this runtime's path)
    local helper = root .. "/build/purelua/5.1"
    local f = io.open(helper .. "/async_hooks/luvcb.so")
    local cpath = f and ("LUA_CPATH='" .. helper .. "/?.so;;'") or "-u LUA_CPATH"
    if f then f:close() end
    local p = io.popen("env -u LD_PRELOAD " .. cpath .. " timeout 60 nvim --headless -u NONE -c 'luafile "
      .. script .. "' 2>&1 </dev/null")
    local out = p:read("*a")
    p:close()
    os.remove(script)
    assert.equal("co req fs req luv_lua timer req\n", out)
  end)

  it("luv required after install() is patched as it loads", function()
    H.lua_ok([[
      local ah = require("async_hooks").install()
      local uv = require("luv")
      local v = ah.AsyncLocal.new()
      local t = uv.new_timer()
      v:run("late", function() t:start(1, 0, function() print(v:get()); t:close() end) end)
      uv.run()
    ]], { "late" })
  end)
end)
