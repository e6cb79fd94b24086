-- Rule 6: the hook protocol holds for every thread: per asyncId, init first
-- and once, before/after balanced, destroy once and last; also for threads
-- the library did not create and for coroutines a finalizer resurrects.
local H = require("helpers")

-- the checker every program below starts with: events go through check(),
-- problems() lists what broke the protocol
local CHECKER = [==[
local ah = require("async_hooks")
local raw_create, raw_resume = coroutine.create, coroutine.resume
ah.install()
local state, depth, broken, events = {}, {}, {}, {}
local function bad(msg) broken[#broken + 1] = msg end
local function check(kind, id)
  events[#events + 1] = kind .. " " .. id
  local s = state[id]
  if kind == "init" then
    if s then bad("init twice for " .. id) end
    state[id], depth[id] = "live", 0
  elseif not s then
    bad(kind .. " " .. id .. " without its init")
  elseif s == "destroyed" then
    bad(kind .. " " .. id .. " after its destroy")
  elseif kind == "before" then
    depth[id] = depth[id] + 1
  elseif kind == "after" then
    depth[id] = depth[id] - 1
    if depth[id] < 0 then bad("after without before for " .. id) end
  elseif kind == "destroy" then
    if depth[id] ~= 0 then bad("destroy inside a slice of " .. id) end
    state[id] = "destroyed"
  end
end
ah.createHook {
  init = function(id) check("init", id) end,
  before = function(id) check("before", id) end,
  after = function(id) check("after", id) end,
  destroy = function(id) check("destroy", id) end,
}:enable()
local function problems() return #broken == 0 and "ok" or table.concat(broken, "; ") end
]==]

local function run(body, expected)
  local out = H.lua_ok(CHECKER .. body, expected)
  return out
end

describe("threads the library did not create", function()
  it("resumed by the library: adopted, with an init first (trigger: the resumer's id)", function()
    run([==[
local c = raw_create(function() coroutine.yield(ah.executionAsyncId()); return 1 end)
local _, id = coroutine.resume(c)
coroutine.resume(c)
ah.flush()
print(problems(), events[1] == "init " .. id, events[#events] == "destroy " .. id)
]==], { { "protocol: ok", "init first: true", "destroy last: true" } })
  end)

  it("touching the library while resumed behind its back: no event at all, also when collected", function()
    run([==[
local v = ah.AsyncLocal.new()
local ids = {}
for i = 1, 3 do
  local c = raw_create(function() ids[i] = ah.executionAsyncId(); v:set(i); coroutine.yield() end)
  raw_resume(c)
end
collectgarbage(); collectgarbage(); ah.flush()
local seen = false
for _, e in ipairs(events) do
  for _, id in ipairs(ids) do if e:match(" " .. id .. "$") then seen = true end end
end
print(problems(), seen)
]==], { { "protocol: ok", "any event for them: false" } })
  end)

  it("touched first, resumed by the library later: its init comes before its first slice", function()
    local out = run([==[
local c = raw_create(function()
  local id = ah.executionAsyncId()
  coroutine.yield(id)
  coroutine.yield(id)
end)
local _, id = raw_resume(c) -- registered silently
coroutine.resume(c)        -- adopted here
coroutine.close(c)
ah.flush()
print(problems(), table.concat(events, ","))
]==])
    local status, evs = out:match("^(%S+)\t(.*)\n$")
    assert.equal("ok", status)
    local id = evs:match("^init (%d+),")
    assert.is_not_nil(id, evs)
    assert.equal(("init %s,before %s,after %s,destroy %s"):format(id, id, id, id), evs)
  end)

  it("closed by the library without a resume: init, then destroy", function()
    run([==[
local c = raw_create(function() coroutine.yield() end)
raw_resume(c)
coroutine.close(c)
ah.flush()
print(problems(), #events)
]==], { { "protocol: ok", "events: 2" } })
  end)
end)

describe("a coroutine resurrected by a finalizer", function()
  -- the library saw it collected: it got its destroy; resumed again, it is
  -- adopted like a thread the library did not create (a new id, its init,
  -- the resumer's context)
  for _, value in ipairs { "'plain'", "{ 'table' }" } do
    it("gets no event under its old id after its destroy (value " .. value .. ")", function()
      run(([==[
local v = ah.AsyncLocal.new()
local kept, old
do
  local c = coroutine.create(function()
    v:set(%s)
    old = ah.executionAsyncId()
    coroutine.yield()
    return ah.executionAsyncId(), v:get()
  end)
  coroutine.resume(c)
  setmetatable({}, { __gc = function() kept = c end })
end
collectgarbage(); collectgarbage(); ah.flush()
local ok, id, got = coroutine.resume(kept)
ah.flush()
print(problems(), ok, id ~= old, got == nil, state[old], state[id])
]==]):format(value), { { "protocol: ok", "resumed: true", "a new asyncId: true",
        "its value gone: true", "the old id: destroyed", "the new id: destroyed" } })
    end)
  end
end)
