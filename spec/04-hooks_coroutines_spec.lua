-- Hooks and coroutines, each case in a fresh process: the resource that
-- before/after of a coroutine slice see and leave behind, what a coroutine
-- keeps alive, and its destroy when it is collected or closed from a hook.
local H = require("helpers")

describe("before and after hooks of a coroutine slice", function()
  -- before/after run with the coroutine's resource current; the resumer's
  -- own resource, held by its thread's anchor only, is back afterwards,
  -- also when the hook wrote a resource anchor and the collector ran
  it("restore the resumer's resource, which stays alive", function()
    H.lua_ok([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local seen = {}
ah.createHook {
  before = function()
    seen.before = ah.executionAsyncResource()
    if seen.write and not seen.busy then
      seen.busy = true
      ah.AsyncResource.new("X"):runInAsyncScope(function() end)
      seen.busy = false
    end
    collectgarbage()
    collectgarbage()
  end,
  after = function() seen.after = ah.executionAsyncResource() end,
}:enable()
local outer = co.create(function()
  ah.executionAsyncResource().mark = "outer" -- held by the thread's anchor only
  for _, write in ipairs { false, true } do
    seen.write = write
    local inner = co.create(function() seen.inside = ah.executionAsyncResource(); co.yield() end)
    co.resume(inner)
    print(write, seen.before == seen.inside, seen.after == seen.inside, seen.inside.thread == inner)
    collectgarbage()
    collectgarbage()
    print(write, ah.executionAsyncResource().mark)
  end
end)
print(co.resume(outer))
]==], {
      { "anchor written: false", "the last before saw the coroutine's: true", "after saw it: true", "its thread: true" },
      { "anchor written: false", "the resumer's after the collections: outer" },
      { "anchor written: true", "the last before saw the coroutine's: false", "after saw it: true", "its thread: true" },
      { "anchor written: true", "the resumer's after the collections: outer" },
      { "the outer resume: true" },
    })
  end)

  -- the coroutine's resource is reported for the resumer's slot without
  -- being written anywhere; whatever switches that slot inside the hook
  -- (a scope, a luv callback of a loop run there, another coroutine's
  -- events) has its own, and the coroutine's is back after it
  it("report the coroutine's resource around scopes, loops and coroutines run inside the hook", function()
    H.lua_ok([==[
local uv = require("luv")
local ah = require("async_hooks").install()
local co = ah.coroutine
local res = ah.executionAsyncResource
local inits, log, busy = {}, {}, false
local function say(...) log[#log + 1] = table.concat({ ... }, " ") end
local target
ah.createHook {
  init = function(id, _, _, r) inits[id] = r end,
  before = function(id)
    if busy or id ~= target then return end
    busy = true
    local mine = res()
    say("before", tostring(mine == inits[id]), tostring(mine.thread ~= nil))
    local ar = ah.AsyncResource.new("SCOPE")
    ar:runInAsyncScope(function() say("scope", tostring(res() == ar)) end)
    say("after scope", tostring(res() == mine))
    local t = uv.new_timer()
    t:start(0, 0, function()
      say("timer", res().op, tostring(res().handle == t))
      t:close()
    end)
    uv.run()
    say("after loop", tostring(res() == mine))
    local other = co.create(function() say("other", tostring(res() ~= mine)); co.yield() end)
    co.resume(other)
    say("after other", tostring(res() == mine), ah.executionAsyncId() == id and "id" or "bad id")
    busy = false
  end,
}:enable()
local c = co.create(function() co.yield() end)
target = next(inits) -- c's asyncId (its init is the only one so far)
co.resume(c)
print(table.concat(log, "\n"))
print("top", tostring(res() == res()), tostring(res().thread == nil))
]==], {
      "before true true",
      "scope true",
      "after scope true",
      "timer timer_start true",
      "after loop true",
      "other true",
      "after other true id",
      { "top", "the same twice: true", "the main thread's (no thread field): true" },
    })
  end)

  -- review finding: no resource made before the close (no init hook, not
  -- asked for): the one made then is the coroutine's for the rest of the
  -- event (anchored by its thread), not a new table per call
  it("an after hook that closes its coroutine and asks for the resource only then: one table", function()
    H.lua_ok([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local res = ah.executionAsyncResource
local c, first
ah.createHook {
  after = function()
    if not c then return end
    local cc = c
    c = nil
    coroutine.close(cc)
    first = res()
    print(tostring(first == res()), tostring(first.thread == cc))
  end,
}:enable()
ah.createHook { after = function() if first then print(tostring(res() == first)); first = nil end end }:enable()
c = co.create(function() co.yield() end)
co.resume(c)
]==], {
      { "the same twice: true", "its thread: true" },
      { "the next after hook sees the same: true" },
    })
  end)

  -- review finding (older): a coroutine that yielded inside a scope
  -- reported the scope's resource to its own after/before hooks
  for _, with_init in ipairs { true, false } do
    it("a coroutine that yields inside a scope reports its own resource to its hooks (init: "
       .. tostring(with_init) .. ")", function()
      H.lua_ok(([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local res = ah.executionAsyncResource
local WITH_INIT = %s
local mine, inits, seen = nil, {}, {}
ah.createHook {
  init = WITH_INIT and function(id, _, _, r) inits[id] = r end or nil,
  before = function(id) if id == mine then seen[#seen + 1] = res() end end,
  after = function(id) if id == mine then seen[#seen + 1] = res() end end,
}:enable()
local ar = ah.AsyncResource.new("SCOPE")
local c = co.create(function()
  mine = ah.executionAsyncId()
  co.yield()
  ar:runInAsyncScope(function() co.yield() end) -- yields inside the scope
  co.yield()
  return res()
end)
local last
for _ = 1, 4 do local _, r = co.resume(c); last = r end
local own, same = seen[1], true
for i = 1, #seen do if seen[i] ~= own then same = false end end
print(#seen, same, own ~= ar, own.thread == c, last == own, not WITH_INIT or own == inits[mine])
]==]):format(tostring(with_init)), {
        -- after (1st slice), before + after (2nd, yields in the scope),
        -- before + after (3rd: the scope closes, then a yield), before + after
        { "hook calls: 7", "one resource in all: true", "not the scope's: true", "its thread: true",
          "the coroutine's own: true", "init's: true" } })
    end)
  end

  -- review finding: the after that follows a before hook that closed its
  -- coroutine ran with the resumer's ids; it runs in the coroutine's
  it("the after of a coroutine closed by its before hook runs in the coroutine's context", function()
    H.lua_ok([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local res = ah.executionAsyncResource
local c, seen = nil, {}
ah.createHook {
  before = function(id)
    if not c or seen.before then return end
    seen.before = { id, ah.executionAsyncId(), ah.triggerAsyncId(), res() }
    coroutine.close(c)
  end,
  after = function(id)
    if not seen.before or seen.after then return end
    seen.after = { id, ah.executionAsyncId(), ah.triggerAsyncId(), res() }
  end,
}:enable()
local creator = ah.executionAsyncId()
c = co.create(function() co.yield() end)
print(co.resume(c))
local b, a = seen.before, seen.after
print(a[1] == b[1], a[2] == b[1], a[3] == creator, b[3] == creator, a[4] == b[4], a[4].thread == c)
print(ah.executionAsyncId() == creator, res().thread == nil)
]==], {
      { "resume: false", "cannot resume dead coroutine" },
      { "after's id is before's: true", "after's executionAsyncId the coroutine's: true",
        "after's triggerAsyncId the creator: true", "before's triggerAsyncId the creator: true",
        "after's resource before's: true", "its thread: true" },
      { "executionAsyncId back to the creator: true", "the main thread's resource: true" },
    })
  end)

  for _, with_init in ipairs { true, false } do
    it("an after hook that closes its coroutine still sees its resource (init hook: " .. tostring(with_init) .. ")",
      function()
        H.lua_ok(([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local res = ah.executionAsyncResource
local WITH_INIT = %s
local inits, c, seen = {}, nil, {}
ah.createHook {
  init = WITH_INIT and function(id, _, _, r) inits[id] = r end or nil,
  after = function(id)
    if not c or seen.done then return end
    seen.done = true
    local before_close = res()
    coroutine.close(c)
    local after_close = res()
    print(tostring(before_close == after_close), tostring(after_close.thread == c),
      tostring(not WITH_INIT or after_close == inits[id]), ah.executionAsyncId() == id)
  end,
}:enable()
c = co.create(function() co.yield() end)
co.resume(c)
print(coroutine.status(c), tostring(res().thread == nil))
]==]):format(tostring(with_init)), {
          { "the same before and after the close: true", "its thread: true", "init's: true",
            "executionAsyncId the coroutine's: true" },
          { "status: dead", "the main thread's resource after: true" },
        })
      end)
  end
end)

describe("what a coroutine keeps alive under hooks", function()
  -- anchored by its thread: alive as long as the coroutine, dropped when it
  -- ends, and never what keeps an abandoned coroutine alive
  it("the resource made for its init stays the same table while it lives, and goes with it", function()
    H.lua_ok([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
local inits, last = {}, nil
ah.createHook { init = function(id, _, _, r) inits[id] = r; last = r end }:enable()
local c = co.create(function()
  for _ = 1, 3 do co.yield(ah.executionAsyncResource()) end
  return ah.executionAsyncResource()
end)
local id = next(inits)
local weak = setmetatable({ inits[id] }, { __mode = "v" })
inits[id], last = nil, nil -- only the coroutine holds it now
for _ = 1, 6 do collectgarbage() end
local _, r1 = co.resume(c)
print(r1 == weak[1], r1.thread == c)
r1 = nil -- luacheck: ignore 311
for _ = 1, 6 do collectgarbage() end
local _, r2 = co.resume(c)
print(r2 == weak[1])
r2 = nil -- luacheck: ignore 311
-- abandoned while suspended: it and its resource go at one collection
local wc = setmetatable({ c }, { __mode = "v" })
c = nil -- luacheck: ignore 311
collectgarbage()
print(wc[1] == nil, weak[1] == nil)
-- one that ends drops it at once
local d = co.create(function() co.yield(); return 1 end)
co.resume(d)
local wd = setmetatable({ last }, { __mode = "v" })
inits, last = {}, nil
co.resume(d)
collectgarbage()
print(wd[1] == nil, coroutine.status(d))
]==], {
      { "1st resume, init's: true", "its thread: true" },
      { "2nd resume, init's: true" },
      { "abandoned, collected: true", "its resource collected: true" },
      { "ended, its resource collected: true", "status: dead" },
    })
  end)

  it("a frame captured with a value set stays while it lives, and goes with it at one collection", function()
    H.lua_ok([==[
local ah = require("async_hooks").install()
local co = ah.coroutine
ah.createHook { destroy = function() end }:enable()
local v = ah.AsyncLocal.new()
local weak = setmetatable({}, { __mode = "v" })
local c = v:run({ "captured" }, function()
  weak[1] = v:get()
  return co.create(function() while true do co.yield(v:get()[1]) end end)
end)
for _ = 1, 6 do collectgarbage() end
print(select(2, co.resume(c)), weak[1] ~= nil)
for _ = 1, 6 do collectgarbage() end
print(select(2, co.resume(c)), weak[1] ~= nil)
c = nil -- luacheck: ignore 311
collectgarbage()
print(weak[1] == nil)
]==], {
      { "value: captured", "frame alive: true" },
      { "value: captured", "frame alive: true" },
      { "frame collected with the coroutine: true" },
    })
  end)
end)

describe("destroy of a coroutine", function()
  -- made by the per-cycle sentinel only for coroutines that lived through
  -- pend_age collection cycles; one collected before that gets its destroy
  -- from the sentinel itself
  for _, mode in ipairs { "generational", "incremental" } do
    it("every abandoned or finished coroutine is destroyed once (" .. mode .. ")", function()
      H.lua_ok(('collectgarbage("%s")\n'):format(mode) .. [==[
local ah = require("async_hooks").install()
local core = require("async_hooks.core")
local co = ah.coroutine
local destroyed = {}
ah.createHook { destroy = function(id) destroyed[id] = (destroyed[id] or 0) + 1 end }:enable()
local function flush() co.resume(co.create(function() end)) end -- a delivery point
-- 1: abandoned at once, collected before its token is made
local id1
do
  local c = co.create(function() id1 = ah.executionAsyncId(); co.yield() end)
  co.resume(c)
end
print("pending tokens", core.stats().pending_tokens)
collectgarbage(); collectgarbage(); collectgarbage()
flush()
print("abandoned at once", destroyed[id1])
-- 2: lives through pend_age collections (its token is made at the last),
-- then abandoned
local id2
local keep = co.create(function() id2 = ah.executionAsyncId(); co.yield() end)
co.resume(keep)
for _ = 1, core.stats().pend_age - 1 do collectgarbage() end
print("young", core.stats().pending_tokens, destroyed[id2])
collectgarbage()
print("token made", core.stats().pending_tokens, destroyed[id2])
keep = nil
collectgarbage(); collectgarbage(); collectgarbage()
flush()
print("abandoned later", destroyed[id2])
-- 3: finished: destroyed once, no token ever made
local id3
co.resume(co.create(function() id3 = ah.executionAsyncId() end))
collectgarbage(); collectgarbage()
flush()
print("finished", destroyed[id3], core.stats().pending_tokens)
-- 4: many coroutines alive across a collection, then all abandoned
local many, ids = {}, {}
for i = 1, 200 do
  many[i] = co.create(function() ids[i] = ah.executionAsyncId(); co.yield() end)
  co.resume(many[i])
end
for _ = 1, core.stats().pend_age do collectgarbage() end
local made = core.stats().pending_tokens
many = nil
collectgarbage(); collectgarbage(); collectgarbage()
flush()
local n = 0
for i = 1, 200 do if destroyed[ids[i]] == 1 then n = n + 1 end end
print("many", made, n, core.stats().slots)
]==], {
        { "pending tokens", "pending: 1" },
        { "abandoned at once", "destroys: 1" },
        { "young", "pending: 1", "destroys: nil" },
        { "token made", "pending: 0", "destroys: nil" },
        { "abandoned later", "destroys: 1" },
        { "finished", "destroys: 1", "pending: 0" },
        { "many", "pending: 0", "destroyed once: 200", "slots: 1" },
      }, mode)
    end)
  end

  it("closed by an after hook as it returns: its slot given back once, one destroy", function()
    H.lua_ok([[
      local ah = require("async_hooks").install()
      local co = ah.coroutine
      local target, destroyed = nil, {}
      ah.createHook {
        after = function()
          if target then
            local t = target
            target = nil
            assert(co.close(t))
          end
        end,
        destroy = function(id) destroyed[#destroyed + 1] = id end,
      }:enable()
      local id
      local c = co.create(function() id = ah.executionAsyncId(); return 1 end)
      target = c
      print(co.resume(c))
      -- two new coroutines get two slots (a slot given back twice would be
      -- handed out twice)
      local a = co.create(function() co.yield(ah.executionAsyncId()) end)
      local b = co.create(function() co.yield(ah.executionAsyncId()) end)
      local _, ia = co.resume(a)
      local _, ib = co.resume(b)
      print(ia ~= ib, co.status(a), co.status(b), co.resume(a), co.resume(b))
      local n = 0
      for _, d in ipairs(destroyed) do if d == id then n = n + 1 end end
      print("destroyed", n)
    ]], {
      { "resume: true", "result: 1" },
      { "two new coroutines, two ids: true", "suspended", "suspended", "resumed: true", "resumed: true" },
      { "destroyed", "times: 1" },
    })
  end)
end)
