local ah = require("async_hooks")
local core = require("async_hooks.core")
local H = require("helpers")
local co = ah.coroutine
local AsyncResource = ah.AsyncResource

-- a trivial resume: a flush point for queued destroys
local function boundary() co.wrap(function() end)() end

-- per-id invariants: init at most once and first, before/after balanced
-- and nested, destroy at most once and after the last after
local function check_invariants(log)
  local state = {}
  local stack = {}
  for _, line in ipairs(log) do
    local ev, id = line:match("^(%a+) (%d+)")
    id = tonumber(id)
    local s = state[id] or { init = 0, open = 0, destroyed = false }
    state[id] = s
    assert.is_false(s.destroyed, "event after destroy: " .. line)
    if ev == "init" then
      assert.equal(0, s.init, "init twice: " .. id)
      s.init = 1
    elseif ev == "before" then
      s.open = s.open + 1
      stack[#stack + 1] = id
    elseif ev == "after" then
      assert.is_true(s.open > 0, "after without before: " .. id)
      s.open = s.open - 1
      assert.equal(id, stack[#stack], "after out of order")
      stack[#stack] = nil
    elseif ev == "destroy" then
      assert.equal(0, s.open, "destroy inside a scope: " .. id)
      s.destroyed = true
    end
  end
  return state
end

-- the entries of `log` ("event id", or an id) about the ids in the table
-- `ids`, and the markers the test wrote (entries with no id): under the GC
-- stress runs a coroutine an earlier spec left suspended can be collected
-- meanwhile, and its destroy lands in the log
local function only(log, ids)
  local keep = {}
  for _, id in pairs(ids) do keep[tostring(id)] = true end
  local t = {}
  for _, e in ipairs(log) do
    local id = type(e) == "number" and tostring(e) or e:match(" (%d+)$")
    if id == nil or keep[id] then t[#t + 1] = e end
  end
  return t
end

describe("createHook", function()
  local track, untrack = H.hook_tracker()
  after_each(untrack)

  it("validates its callbacks", function()
    assert.error_matches(function() ah.createHook { init = 1 } end, "hook.init must be a function")
    assert.error_matches(function() ah.createHook { before = "x" } end, "hook.before must be a function")
    assert.error_matches(function() ah.createHook { after = {} } end, "hook.after must be a function")
    assert.error_matches(function() ah.createHook { destroy = true } end, "hook.destroy must be a function")
    assert.error_matches(function() ah.createHook(nil) end, "bad argument #1 to 'createHook' %(table expected")
    assert.same({ 0, 0, 0, 0 }, { core.hook_counts() })
    local h = ah.createHook {}
    assert.error_matches(function() h.enable({}) end, "bad self")
  end)

  it("is off until enabled; enable/disable return the hook and are idempotent", function()
    local n = 0
    local h = track(ah.createHook { init = function() n = n + 1 end })
    boundary()
    assert.equal(0, n)
    assert.equal(h, h:enable())
    assert.equal(h, h:enable())
    assert.same({ 1, 0, 0, 0 }, { core.hook_counts() })
    boundary()
    assert.equal(1, n)
    assert.equal(h, h:disable())
    assert.equal(h, h:disable())
    assert.same({ 0, 0, 0, 0 }, { core.hook_counts() })
    boundary()
    assert.equal(1, n)
  end)

  it("coroutines: init at create, before/after per resume slice, destroy at the end", function()
    local seen = {}
    local h, log = H.recorder(ah, seen)
    seen.all = true
    track(h):enable()
    local outer = ah.executionAsyncId()
    local c = co.create(function() co.yield(); co.yield() end)
    local id
    for k in pairs(seen) do if k ~= "all" then id = k end end
    seen.all = false
    co.resume(c)
    co.resume(c)
    co.resume(c)
    co.resume(c) -- dead: no events
    assert.same({
      ("init %d coroutine %d"):format(id, outer),
      "before " .. id, "after " .. id,
      "before " .. id, "after " .. id,
      "before " .. id, "after " .. id,
      "destroy " .. id,
    }, log)
  end)

  it("coroutines: destroy on error, on close, and on collection while suspended", function()
    local log, ids = {}, {}
    local function mine() return only(log, ids) end
    track(ah.createHook { destroy = function(id) log[#log + 1] = id end }):enable()
    local e = co.create(function() ids.e = ah.executionAsyncId(); error("x") end)
    local eid = co.wrap(function() return ah.executionAsyncId() end)
    co.resume(e)
    local closed = co.create(function() ids.closed = ah.executionAsyncId(); co.yield() end)
    co.resume(closed)
    co.close(closed)
    local n = #mine()
    assert.equal(2, n)
    do
      local lost = co.create(function() ids.lost = ah.executionAsyncId(); co.yield() end)
      co.resume(lost)
    end
    H.gc()
    assert.equal(n, #mine(), "never delivered inside __gc")
    co.wrap(function() ids.boundary = ah.executionAsyncId() end)() -- boundary()
    assert.equal(n + 2, #mine()) -- the collected one, and boundary()'s own
    assert.is_number(eid())
  end)

  it("before/after see the coroutine's id and resource", function()
    local inits, checks = {}, {}
    track(ah.createHook {
      init = function(id, _, _, res) inits[id] = res end,
      before = function(id)
        checks[#checks + 1] = (ah.executionAsyncId() == id) and (ah.executionAsyncResource() == inits[id])
      end,
      after = function(id)
        checks[#checks + 1] = (ah.executionAsyncId() == id) and (ah.executionAsyncResource() == inits[id])
      end,
    }):enable()
    local c = co.create(function()
      local r = ah.executionAsyncResource()
      co.yield(r)
    end)
    local _, r = co.resume(c)
    co.resume(c)
    assert.equal(c, r.thread)
    assert.same({ true, true, true, true }, checks)
  end)

  -- test-enable-in-init / test-async-hooks-enable-recursive
  it("a hook enabled inside init sees neither that init nor inits nested in it", function()
    local nested_inits = 0
    local nested = track(ah.createHook { init = function() nested_inits = nested_inits + 1 end })
    local outer_inits, nested_call = 0, false
    track(ah.createHook {
      init = function()
        outer_inits = outer_inits + 1
        nested:enable()
        if not nested_call then
          nested_call = true
          co.create(function() end)
        end
      end,
    }):enable()
    co.create(function() end)
    assert.equal(2, outer_inits)
    assert.equal(0, nested_inits)
    co.create(function() end) -- after the dispatch: now it is enabled
    assert.equal(1, nested_inits)
  end)

  -- test-disable-in-init
  it("a hook disabled inside init still receives that init and nested ones", function()
    local nested_inits = 0
    local nested
    local nested_call = false
    track(ah.createHook {
      init = function()
        nested:disable()
        if not nested_call then
          nested_call = true
          co.create(function() end)
        end
      end,
    }):enable()
    nested = track(ah.createHook { init = function() nested_inits = nested_inits + 1 end }):enable()
    co.create(function() end)
    assert.equal(2, nested_inits)
    co.create(function() end)
    assert.equal(2, nested_inits)
  end)

  -- test-enable-disable
  it("enable/disable inside before/after take effect at once", function()
    local logs = { {}, {}, {} }
    local hooks3 = {}
    local function mk(i, extra)
      local function rec(ev) return function(id) table.insert(logs[i], ev .. " " .. id) end end
      local t = { init = function(id) table.insert(logs[i], "init " .. id) end,
        before = rec("before"), after = rec("after"), destroy = rec("destroy") }
      for k, f in pairs(extra or {}) do
        local base = t[k]
        t[k] = function(id) base(id); f(id) end
      end
      hooks3[i] = track(ah.createHook(t))
    end
    local enabled2, disabled1, count = false, false, 2
    mk(1)
    mk(2, { before = function() if not disabled1 then disabled1 = true; hooks3[1]:disable() end end })
    mk(3, {
      before = function() if not enabled2 then enabled2 = true; hooks3[2]:enable() end end,
      after = function() count = count - 1; if count == 0 then hooks3[3]:disable() end end,
    })
    hooks3[1]:enable()
    hooks3[3]:enable()
    local r1 = AsyncResource.new("Immediate")
    local r2
    r1:runInAsyncScope(function()
      r2 = AsyncResource.new("Immediate")
    end)
    r1:emitDestroy()
    r2:runInAsyncScope(function() end)
    r2:emitDestroy()
    local a, b = r1:asyncId(), r2:asyncId()
    local function L(...) local t = {}; for i, f in ipairs({ ... }) do t[i] = f:gsub("A", a):gsub("B", b) end; return t end
    local ab = { a, b }
    assert.same(L("init A", "before A", "init B", "after A", "destroy A", "before B"), only(logs[1], ab))
    -- hook2 was enabled during hook3's first before: misses init and before of A
    assert.same(L("init B", "after A", "destroy A", "before B", "after B", "destroy B"), only(logs[2], ab))
    -- hook3 disabled itself in its second after: no destroy of B
    assert.same(L("init A", "before A", "init B", "after A", "destroy A", "before B", "after B"), only(logs[3], ab))
  end)

  -- test-async-hooks-late-hook-enable
  it("a hook enabled inside an ordinary callback gets its after without its before", function()
    local r = AsyncResource.new("late")
    local log = {}
    local h = track(ah.createHook {
      before = function(id) log[#log + 1] = "before " .. id end,
      after = function(id) log[#log + 1] = "after " .. id end,
      destroy = function(id) log[#log + 1] = "destroy " .. id end,
    })
    r:runInAsyncScope(function() h:enable() end)
    r:emitDestroy()
    assert.same({ "after " .. r:asyncId(), "destroy " .. r:asyncId() }, only(log, { r:asyncId() }))
  end)

  -- the same for a coroutine slice, also when no hook at all
  -- was enabled when the resume started
  it("a hook enabled inside a coroutine slice gets that slice's after", function()
    local log = {}
    local h = track(ah.createHook {
      before = function(id) log[#log + 1] = "before " .. id end,
      after = function(id) log[#log + 1] = "after " .. id end,
      destroy = function(id) log[#log + 1] = "destroy " .. id end,
    })
    local id
    local c = co.create(function()
      id = ah.executionAsyncId()
      h:enable()
      co.yield()
    end)
    assert.is_true(co.resume(c))
    assert.same({ "after " .. id }, only(log, { id }))
    assert.is_true(co.resume(c))
    -- (the destroy is delivered as that resume returns)
    assert.same({ "after " .. id, "before " .. id, "after " .. id, "destroy " .. id }, only(log, { id }))
    check_invariants({ table.unpack(only(log, { id }), 2) })
    h:disable()
    -- through wrap, and a coroutine that returns at once
    log = {}
    local wid
    co.wrap(function() wid = ah.executionAsyncId(); h:enable() end)()
    assert.same({ "after " .. wid, "destroy " .. wid }, only(log, { wid }))
  end)

  it("a hook enabled inside a coroutine slice gets after for the scopes open in it", function()
    local log = {}
    local h = track(ah.createHook {
      before = function(id) log[#log + 1] = "before " .. id end,
      after = function(id) log[#log + 1] = "after " .. id end,
    })
    local r = AsyncResource.new("scope")
    local id
    local c = co.create(function()
      id = ah.executionAsyncId()
      r:runInAsyncScope(function() h:enable(); co.yield() end)
    end)
    assert.is_true(co.resume(c))
    assert.same({ "after " .. r:asyncId(), "after " .. id }, log)
    assert.is_true(co.resume(c))
    assert.same({ "after " .. r:asyncId(), "after " .. id, "before " .. id, "before " .. r:asyncId(),
      "after " .. r:asyncId(), "after " .. id }, log)
    check_invariants({ table.unpack(log, 3) })
  end)

  -- what a hook change inside a dispatch triggers runs where
  -- failing is safe, never inside the scope entry that must not fail
  it("a failing notification of a hook change made inside before leaves no context switched", function()
    local calls = 0
    local prev = core.on_destroy_hooks(function() calls = calls + 1; error("notify failed") end)
    local d = track(ah.createHook { destroy = function() end })
    local h = track(ah.createHook { before = function() d:enable() end })
    h:enable()
    local r = AsyncResource.new("X")
    local top = ah.executionAsyncId()
    local inside
    local ok, err = pcall(r.runInAsyncScope, r, function() inside = ah.executionAsyncId() end)
    core.on_destroy_hooks(prev)
    assert.equal(r:asyncId(), inside)           -- the scope ran
    assert.is_false(ok)                          -- the notification failed ...
    assert.matches("notify failed", err)
    assert.equal(1, calls)
    assert.equal(top, ah.executionAsyncId())     -- ... after the scope was left
    assert.equal(0, core.stats().active)         -- so queued destroys still flush
    local destroyed = {}
    local d2 = track(ah.createHook { destroy = function(id) destroyed[#destroyed + 1] = id end }):enable()
    r:emitDestroy()
    assert.same({ r:asyncId() }, only(destroyed, { r:asyncId() }))
    d2:disable()
  end)

  it("enable/disable inside init of the same hook is deferred", function()
    local n = 0
    local h
    h = track(ah.createHook { init = function() n = n + 1; h:disable() end }):enable()
    co.create(function() end)
    co.create(function() end)
    assert.equal(1, n)
  end)

  -- test-async-hooks-close-during-destroy
  it("destroys queued while running a destroy hook are delivered too", function()
    local ids, count = {}, 0
    local res2
    track(ah.createHook {
      init = function(id, type) if type == "foobar" then ids[id] = true end end,
      destroy = function(id)
        if not ids[id] then return end
        count = count + 1
        if count == 1 then res2:emitDestroy() end
      end,
    }):enable()
    local res1 = AsyncResource.new("foobar")
    res2 = AsyncResource.new("foobar")
    res1:emitDestroy()
    boundary()
    assert.equal(2, count)
  end)

  it("destroy is never delivered inside another hook", function()
    local in_hook, violations, destroyed = false, 0, {}
    local function enter(f) return function(...) in_hook = true; f(...); in_hook = false end end
    track(ah.createHook {
      init = enter(function(_, type)
        if type ~= "outer" then return end
        -- a coroutine that runs to completion inside init
        co.wrap(function() end)()
        AsyncResource.new("inner"):emitDestroy()
      end),
      destroy = function(id)
        if in_hook then violations = violations + 1 end
        destroyed[#destroyed + 1] = id
      end,
    }):enable()
    AsyncResource.new("outer")
    boundary()
    assert.equal(0, violations)
    assert.is_true(#destroyed >= 2)
  end)

  it("keeps the per-id invariants through a mixed program", function()
    local h, log = H.recorder(ah)
    track(h):enable()
    local v = ah.AsyncLocal.new()
    local cs = {}
    for i = 1, 20 do
      cs[i] = co.create(function()
        local r = AsyncResource.new("R")
        r:runInAsyncScope(function()
          v:run(i, function() co.yield() end)
        end)
        if i % 3 == 0 then error("e") end
        co.yield()
        r:emitDestroy()
      end)
    end
    for round = 1, 3 do
      for i = 1, 20 do
        if round == 2 and i % 5 == 0 then co.close(cs[i]) else co.resume(cs[i]) end
      end
    end
    cs = nil -- luacheck: ignore 311 (dropped for the collector)
    H.gc()
    boundary()
    local state = check_invariants(log)
    local n = 0
    for _, s in pairs(state) do
      if s.init == 1 then n = n + 1 end
    end
    assert.is_true(n >= 40)
  end)
end)

describe("fatal hook errors", function()
  for _, kind in ipairs { "init", "before", "after", "destroy" } do
    it("an error in " .. kind .. " prints it with a traceback and exits with status 1", function()
      local code, out, err = H.run_lua(([[
        local ah = require("async_hooks")
        ah.createHook { %s = function() error("hook exploded") end }:enable()
        local c = ah.coroutine.create(function() end)
        ah.coroutine.resume(c)
        ah.coroutine.wrap(function() end)()
        print("not reached")
      ]]):format(kind))
      assert.equal(1, code)
      assert.equal("", out)
      assert.matches("hook exploded", err)
      assert.matches("stack traceback", err)
      assert.matches(kind, err)
    end)
  end
end)

-- when queued destroys are delivered: never inside a hook or a finalizer,
-- after the last after of the resource's own scopes, at the next flush point
describe("destroy delivery", function()
  -- review finding: a user's finalizer that ends a resource, or
  -- runs a scope or a coroutine (flush points), had destroys delivered inside
  -- the finalizer
  describe("and a user's finalizer", function()
    it("is never delivered inside it: the next flush point outside delivers it", function()
      local in_gc, log = false, {}
      local h = ah.createHook { destroy = function(id) log[#log + 1] = { id, in_gc } end }
      h:enable()
      local r1, r2 = AsyncResource.new("R1"), AsyncResource.new("R2")
      local r1id = r1:asyncId()
      local ran = 0
      setmetatable({}, { __gc = function()
        in_gc = true
        r1:emitDestroy()
        r2:runInAsyncScope(function() end)
        co.wrap(function() end)()
        ran = ran + 1
        in_gc = false
      end })
      H.gc()
      assert.equal(1, ran)
      for _, e in ipairs(log) do assert.is_false(e[2], "destroy " .. e[1] .. " inside the finalizer") end
      boundary()
      h:disable()
      local got = {}
      for _, e in ipairs(log) do got[e[1]] = (got[e[1]] or 0) + 1; assert.is_false(e[2]) end
      assert.equal(1, got[r1id]) -- delivered once, outside
    end)
  end)

  -- emitDestroy inside runInAsyncScope, the scope spanning a yield: the
  -- scope stays out once its resource's destroy was asked for (no later
  -- before/after); the destroy is queued at once, so it is not lost when
  -- the coroutine fails or is abandoned inside the scope
  describe("of emitDestroy inside the resource's own scope", function()
    local function events()
      local log = {}
      local h = ah.createHook {
        before = function(id) log[#log + 1] = "before " .. id end,
        after = function(id) log[#log + 1] = "after " .. id end,
        destroy = function(id) log[#log + 1] = "destroy " .. id end,
      }
      return h, log
    end

    it("comes after the scope's last after: the scope stays out across later yields", function()
      local h, log = events()
      h:enable()
      local r = AsyncResource.new("R")
      local c = co.create(function()
        r:runInAsyncScope(function()
          r:emitDestroy()
          co.yield()
        end)
      end)
      local cid = core.stats().next_id - 1
      co.resume(c)
      log[#log + 1] = "--"
      co.resume(c)
      h:disable()
      local rid = r:asyncId()
      local R, C = tostring(rid), tostring(cid)
      assert.same({ "before " .. C, "before " .. R, "after " .. R, "after " .. C, "destroy " .. R, "--",
        "before " .. C, "after " .. C, "destroy " .. C }, only(log, { rid, cid }))
    end)

    it("is delivered when the coroutine fails or is abandoned inside the scope", function()
      for _, how in ipairs { "resume", "wrap", "abandon" } do
        local h, log = events()
        h:enable()
        local r = AsyncResource.new("R", { requireManualDestroy = true })
        local R = tostring(r:asyncId())
        local f = function() r:runInAsyncScope(function() r:emitDestroy(); co.yield(); error("boom") end) end
        if how == "wrap" then
          local w = co.wrap(f)
          w()
          assert.is_false(pcall(w))
        else
          local c = co.create(f)
          co.resume(c)
          if how == "resume" then assert.is_false(co.resume(c)) end
        end
        h:disable()
        local n, after_last = 0, 0
        for i, e in ipairs(log) do
          if e == "destroy " .. R then n = n + 1 end
          if e == "after " .. R then after_last = i end
          if e == "destroy " .. R then assert.is_true(i > after_last, how) end
        end
        assert.equal(1, n, how .. ": " .. table.concat(log, ", "))
      end
    end)

    it("on the main thread and nested: after the outermost scope of the resource", function()
      local h, log = events()
      h:enable()
      local r = AsyncResource.new("R")
      r:runInAsyncScope(function()
        r:runInAsyncScope(function() r:emitDestroy() end)
        log[#log + 1] = "inner closed"
      end)
      r:emitDestroy() -- once only
      h:disable()
      local R = tostring(r:asyncId())
      assert.same({ "before " .. R, "before " .. R, "after " .. R, "inner closed", "after " .. R,
        "destroy " .. R }, only(log, { R }))
    end)

    it("is delivered once when its scope never closes", function()
      local h, log = events()
      h:enable()
      local rid
      do
        local r = AsyncResource.new("R") -- destroyed on collection (no requireManualDestroy)
        rid = r:asyncId()
        local c = co.create(function() r:runInAsyncScope(function() r:emitDestroy(); co.yield() end) end)
        co.resume(c)
        r, c = nil, nil -- luacheck: ignore 311 (abandoned inside the scope)
      end
      collectgarbage() -- one full collection, as without the library
      boundary()
      h:disable()
      local n = 0
      for _, e in ipairs(log) do if e == "destroy " .. rid then n = n + 1 end end
      assert.equal(1, n)
    end)

    it("is delivered at once when no scope of it is open", function()
      local h, log = events()
      h:enable()
      local r = AsyncResource.new("R", { requireManualDestroy = true })
      r:runInAsyncScope(function() end)
      r:emitDestroy()
      h:disable()
      assert.same({ "before " .. r:asyncId(), "after " .. r:asyncId(), "destroy " .. r:asyncId() },
        only(log, { r:asyncId() }))
    end)
  end)

  -- review finding: the frame scopes (AsyncLocal:run,
  -- Snapshot:run, Snapshot.wrap, AsyncLocalStorage.bind) did not deliver
  -- queued destroys when they returned at top level
  describe("queued destroys at the frame scopes", function()
    it("are delivered when a scope returns at top level", function()
      local log = {}
      local h = ah.createHook { destroy = function(id) log[#log + 1] = id end }
      h:enable()
      local v = ah.AsyncLocal.new()
      local scopes = {
        function() v:run(1, function() end) end,
        function() ah.Snapshot.new():run(function() end) end,
        function() ah.Snapshot.wrap(function() end)() end,
        function() ah.AsyncLocalStorage.bind(function() end)() end,
        function() ah.AsyncLocalStorage.new():run({}, function() end) end,
      }
      for i, scope in ipairs(scopes) do
        log = {}
        local id = AsyncResource.new("R"):asyncId() -- dropped at once
        H.gc()
        assert.same({}, only(log, { id }), "scope " .. i .. ": delivered before a flush point")
        scope()
        assert.same({ id }, only(log, { id }), "scope " .. i)
      end
      -- inside a coroutine: at the end of its resume, not inside it
      log = {}
      local id = AsyncResource.new("R"):asyncId()
      local inside
      co.wrap(function()
        H.gc()
        v:run(1, function() end)
        inside = #only(log, { id })
      end)()
      h:disable()
      assert.equal(0, inside)
      assert.same({ id }, only(log, { id }))
    end)
  end)
end)
