-- async_hooks.otel on Lua 5.4 (the C core): the context storage for
-- opentelemetry-lua across coroutines and luv callbacks, and isolate().
-- opentelemetry-lua itself needs ngx (spec/24-otel_openresty_spec.lua runs
-- it in nginx); here a model of its context module drives the storage the
-- way it does: every step reads the stack through the storage, changes it
-- in place (table.insert / table.remove) and measures it with `#`.
local uv = require("luv") -- on the main thread, before anything else
local ah = require("async_hooks")
local H = require("helpers")
local otel = require("async_hooks.otel")

local KEY = "__opentelemetry_context__"

-- the context operations of opentelemetry-lua, as seen by the storage
local function model(storage)
  local C = {}
  function C.attach(x)
    if storage[KEY] then
      table.insert(storage[KEY], x)
    else
      storage[KEY] = { x }
    end
    return #storage[KEY]
  end
  function C.detach(token)
    if #storage[KEY] == token then
      table.remove(storage[KEY])
      return true
    end
    return false
  end
  -- "fresh": what opentelemetry-lua returns without a stack (a new context)
  function C.current()
    if storage[KEY] then return storage[KEY][#storage[KEY]] end
    return "fresh"
  end
  return C
end

-- a request, a child and a grandchild of each kind, as in a server: the
-- scenario with coroutines that interleave; returns the list of mismatches
local function coroutine_scenario(storage, n)
  local C = model(storage)
  local bad, threads = {}, {}
  local function expect(what, want, got)
    if want ~= got then bad[#bad + 1] = ("%s: %s expected, got %s"):format(what, tostring(want), tostring(got)) end
  end
  for i = 1, n do
    threads[#threads + 1] = coroutine.create(function()
      local req = "req" .. i
      local tok = C.attach(req)
      local child = coroutine.create(function()
        expect("child's parent " .. i, req, C.current())
        local ctok = C.attach(req .. "/co")
        coroutine.yield()
        expect("child's current " .. i, req .. "/co", C.current())
        expect("child's detach " .. i, true, C.detach(ctok))
        expect("child after detach " .. i, req, C.current())
      end)
      assert(coroutine.resume(child))
      coroutine.yield()
      expect("request's current " .. i, req, C.current())
      assert(coroutine.resume(child))
      expect("request's detach " .. i, true, C.detach(tok))
    end)
  end
  -- interleave: each request's first slice, then each second slice, ...
  for _ = 1, 3 do
    for _, t in ipairs(threads) do
      if coroutine.status(t) == "suspended" then assert(coroutine.resume(t)) end
    end
  end
  return bad
end

-- the init hook the storage enables, off again after each test
local function hook_off()
  local h = otel._hook()
  if h then h:disable() end
end

describe("async_hooks.otel storage", function()
  H.installed_each()
  after_each(hook_off)

  it("a shared table (ngx.ctx's behaviour) mixes the stacks of interleaved coroutines", function()
    assert.is_true(#coroutine_scenario({}, 5) > 0)
  end)

  it("gives every coroutine its own stack, starting at its creator's", function()
    assert.same({}, coroutine_scenario(otel.storage(), 30))
  end)

  it("a child starts from the stack as it was when it was created, not when it first reads", function()
    local C = model(otel.storage())
    local tok = C.attach("a")
    local tok2 = C.attach("b")
    local seen
    local co = coroutine.wrap(function()
      seen = C.current()
      local t = C.attach("c")
      seen = seen .. " " .. C.current() .. " " .. tostring(C.detach(t)) .. " " .. C.current()
    end)
    assert.is_true(C.detach(tok2))
    assert.equal("a", C.current())
    co()
    assert.equal("b c true b", seen)
    assert.equal("a", C.current())
    assert.is_true(C.detach(tok))
  end)

  it("an empty stack inherited from the creator reads as nil; the context's own empty stack does not", function()
    local s = otel.storage()
    local C = model(s)
    assert.is_nil(s[KEY])
    assert.is_true(C.detach(C.attach("a")))
    assert.same({}, s[KEY]) -- as ngx.ctx keeps it
    local inherited = "unset"
    coroutine.wrap(function() inherited = s[KEY] end)()
    assert.is_nil(inherited)
    assert.same({}, s[KEY])
  end)

  it("a coroutine's attach/detach never disturbs its resumer, across yields", function()
    local C = model(otel.storage())
    local tok = C.attach("main")
    local co = coroutine.wrap(function()
      local t = C.attach("co")
      coroutine.yield(C.current())
      coroutine.yield(tostring(C.detach(t)) .. " " .. C.current())
      return C.current()
    end)
    assert.equal("co", co())
    assert.equal("main", C.current())
    local t2 = C.attach("main2")
    assert.equal("true main", co())
    assert.equal("main2", C.current())
    assert.is_true(C.detach(t2))
    assert.equal("main", co())
    assert.equal("main", C.current())
    assert.is_true(C.detach(tok))
  end)

  it("luv callbacks: each has its own stack from its registration; concurrent requests keep their traces", function()
    local s = otel.storage()
    local C = model(s)
    local bad, done = {}, 0
    local function expect(what, want, got)
      if want ~= got then bad[#bad + 1] = ("%s: %s expected, got %s"):format(what, tostring(want), tostring(got)) end
    end
    local N = 30
    for i = 1, N do
      coroutine.wrap(function()
        local req = "req" .. i
        local tok = C.attach(req)
        local t = uv.new_timer()
        t:start((i * 7) % 5, 0, function()
          t:close()
          expect("timer's parent " .. i, req, C.current())
          local ttok = C.attach(req .. "/timer")
          local t2 = uv.new_timer()
          t2:start((i * 3) % 4, 0, function()
            t2:close()
            expect("nested timer's parent " .. i, req .. "/timer", C.current())
            local ntok = C.attach(req .. "/timer/nested")
            expect("nested detach " .. i, true, C.detach(ntok))
            done = done + 1
          end)
          expect("timer's current " .. i, req .. "/timer", C.current())
          expect("timer's detach " .. i, true, C.detach(ttok))
        end)
        -- the request goes on while its timers wait, and ends its span
        -- before they run
        expect("request's current " .. i, req, C.current())
        expect("request's detach " .. i, true, C.detach(tok))
      end)()
    end
    assert.is_nil(s[KEY])
    uv.run()
    assert.same({}, bad)
    assert.equal(N, done)
  end)

  it("an attach left in a luv callback ends with it: the next callback does not see it", function()
    local s = otel.storage()
    local C = model(s)
    local seen = {}
    for i = 1, 2 do
      local t = uv.new_timer()
      t:start(i, 0, function()
        t:close()
        seen[i] = C.current()
        C.attach("leak" .. i)
      end)
    end
    uv.run()
    assert.same({ "fresh", "fresh" }, seen)
    assert.equal("fresh", C.current())
  end)

  it("values other than tables are per context too; each storage has its own values", function()
    local s1, s2 = otel.storage(), otel.storage()
    s1.x = 1
    assert.is_nil(s2.x)
    local inside
    coroutine.wrap(function()
      inside = s1.x
      s1.x = 2
      coroutine.yield()
    end)()
    assert.equal(1, inside)
    assert.equal(1, s1.x)
    s1.x = nil
    assert.is_nil(s1.x)
    s1.t = { 1, 2, k = "v" }
    assert.same({ 1, 2, k = "v" }, s1.t)
  end)

  it("Snapshot.empty():run and runInAsyncScope have stacks of their own; run scopes share the context's", function()
    local s = otel.storage()
    local C = model(s)
    local tok = C.attach("outer")
    local res = ah.AsyncResource.new("work")
    C.attach("after new") -- not seen by the resource's scope
    ah.Snapshot.empty():run(function()
      assert.equal("fresh", C.current())
      C.attach("empty")
    end)
    res:runInAsyncScope(function()
      assert.equal("outer", C.current())
      C.attach("scope")
    end)
    assert.equal("after new", C.current())
    -- a scope of the same context shares its stack, as ngx.ctx would
    local v = ah.AsyncLocal.new()
    local inner = v:run(1, function() return C.attach("run") end)
    assert.equal("run", C.current())
    assert.is_true(C.detach(inner))
    assert.is_true(C.detach(tok + 1))
    assert.is_true(C.detach(tok))
    -- except a context's first value stored inside a scope: it ends with it
    coroutine.wrap(function()
      v:run(1, function() C.attach("first") end)
      assert.equal("fresh", C.current())
    end)()
  end)

  it("every run of a repeating luv timer starts from the stack of its registration", function()
    local C = model(otel.storage())
    local tok = C.attach("req")
    local seen, n = {}, 0
    local t = uv.new_timer()
    t:start(1, 1, function()
      n = n + 1
      seen[n] = C.current() .. " " .. C.attach("run" .. n)
      if n == 3 then t:close() end
    end)
    assert.is_true(C.detach(tok))
    uv.run()
    assert.same({ "req 2", "req 2", "req 2" }, seen)
  end)

  it("a context created by a context that has not read its inherited stack yet starts from that stack", function()
    local C = model(otel.storage())
    local tok = C.attach("a")
    local got
    local outer = coroutine.wrap(function()
      local inner = coroutine.wrap(function() got = C.current() end)
      inner()
    end)
    assert.is_true(C.detach(tok))
    C.attach("b")
    outer()
    assert.equal("a", got)
  end)

  it("the copies kept for new contexts go with them: memory stays bounded", function()
    local C = model(otel.storage())
    local tok = C.attach("a")
    local function burst()
      for _ = 1, 2000 do coroutine.create(function() return C.current() end) end
    end
    burst()
    H.gc()
    local base = collectgarbage("count")
    for _ = 1, 20 do burst() end
    H.gc()
    -- (40000 copies kept would be several MiB; what the rest of the suite
    -- left in this state moves the heap by tens of KiB)
    assert.is_true(collectgarbage("count") - base < 1024, "grew by " .. (collectgarbage("count") - base) .. " KiB")
    assert.is_true(C.detach(tok))
  end)

  it("keeps nothing in the table itself; protects its metatable; nil and NaN keys raise", function()
    local s = otel.storage()
    s[KEY] = { "a" }
    assert.is_nil(rawget(s, KEY))
    assert.is_nil(next(s))
    assert.equal("async_hooks.otel storage", getmetatable(s))
    assert.has_error(function() setmetatable(s, {}) end)
    assert.equal("table index is nil", H.raised_here(function() s[nil] = 1 end))
    assert.equal("table index is NaN", H.raised_here(function() s[0 / 0] = 1 end))
    assert.is_nil(s[0 / 0])
  end)
end)

describe("async_hooks.otel isolate", function()
  H.installed_each()
  after_each(hook_off)

  -- a processor that arms a luv timer from on_end, as opentelemetry-lua's
  -- batch span processor arms ngx.timer.at
  local function processor(log)
    local P = {}
    P.__index = P
    local v = ah.AsyncLocal.new { default = "-" }
    function P:on_end(span)
      log[#log + 1] = "on_end " .. v:get()
      local t = uv.new_timer()
      t:start(0, 0, function()
        t:close()
        log[#log + 1] = "export " .. span .. " " .. v:get()
      end)
      return self, "ok"
    end
    function P.force_flush() log[#log + 1] = "flush " .. v:get() end
    function P.shutdown() error({ "shutdown failed" }) end
    return setmetatable({}, P), v
  end

  it("runs the processor's methods and the timers they arm in the empty context", function()
    local log = {}
    local p, v = processor(log)
    local s = otel.storage()
    assert.equal(p, otel.isolate(p))
    v:run("request", function()
      s[KEY] = { "request span" }
      local self_, ok = p:on_end("span1")
      assert.equal(p, self_)
      assert.equal("ok", ok)
      p:force_flush()
    end)
    uv.run()
    assert.same({ "on_end -", "flush -", "export span1 -" }, log)
  end)

  it("without isolate the export runs in the request's context", function()
    local log = {}
    local p, v = processor(log)
    v:run("request", function() p:on_end("span1") end)
    uv.run()
    assert.same({ "on_end request", "export span1 request" }, log)
  end)

  it("passes errors through unchanged; is idempotent; leaves absent methods absent; takes method names", function()
    local log = {}
    local p = processor(log)
    otel.isolate(p)
    local f = p.on_end
    assert.equal(p, otel.isolate(p))
    assert.equal(f, p.on_end)
    assert.is_nil(rawget(p, "flush_all"))
    local ok, e = pcall(p.shutdown, p)
    assert.is_false(ok)
    assert.same({ "shutdown failed" }, e)
    local q = { mine = setmetatable({}, { __call = function() return 42 end }), other = 1 }
    otel.isolate(q, { "mine", "other", "absent" })
    assert.equal("function", type(q.mine))
    assert.equal(42, q.mine())
    assert.equal(1, q.other)
    assert.is_nil(q.absent)
  end)

  it("a batch processor's on_end that arms no timer (timer running, queue not full) runs as it is", function()
    local v = ah.AsyncLocal.new { default = "-" }
    local seen = {}
    local p = { is_timer_running = true, max_queue_size = 2, queue = {} }
    function p.get_queue_size(self) return #self.queue end
    function p.on_end(self, span)
      seen[#seen + 1] = span .. " " .. v:get()
      self.queue[#self.queue + 1] = span
    end
    otel.isolate(p)
    v:run("request", function()
      p:on_end("a") -- timer running, queue 0 < 2
      p:on_end("b") -- 1 < 2
      p:on_end("c") -- full: may arm a timer
      p.is_timer_running = false
      p.queue = {}
      p:on_end("d") -- no timer running: arms one
    end)
    assert.same({ "a request", "b request", "c -", "d -" }, seen)
  end)

  it("raises at the caller's line for bad arguments", function()
    assert.equal("bad argument #1 to 'isolate' (table expected, got nil)", H.raised_here(function() otel.isolate() end))
    assert.equal("bad argument #2 to 'isolate' (table expected, got string)",
      H.raised_here(function() otel.isolate({}, "on_end") end))
    assert.equal("bad argument #2 to 'isolate' (method names expected, got number at 2)",
      H.raised_here(function() otel.isolate({}, { "on_end", 3 }) end))
  end)
end)
