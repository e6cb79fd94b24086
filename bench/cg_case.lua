--- One measured case for bench/instructions.lua:
--   lua5.4 bench/cg_case.lua <case>[@inc] <variant> <n>
-- runs <case> n times under <variant>: "raw" (library loaded, not installed,
-- raw coroutines and luv), "installed" (installed, nothing set), "value"
-- (installed, an AsyncLocal set around the case), "hooks" (installed, four
-- empty hooks enabled, nothing set) or "hooks_res" (the same, with an init
-- that takes its 4th parameter: resources are made for it), "count" (four
-- hooks that count their events, an APM's shape; nothing set),
-- "count_value" (the same with an AsyncLocal set: in request, per request)
-- or "count_destroy" (one destroy hook that counts).  Only the
-- public API is used.  Prints
-- "CASE-OK <detail>" at the end; a case that did not carry the context it
-- should have fails instead, so a broken fast path cannot pass as a fast one.
package.path = "bench/?.lua;examples/?.lua;" .. package.path
local case, variant, n = arg[1], arg[2], tonumber(arg[3])
-- "<case>@inc": the same case under the incremental collector (embedders'
-- default; the stand-alone lua5.4 runs the generational one)
if case:match("@inc$") then
  collectgarbage("incremental")
  case = case:gsub("@inc$", "")
end
local uv = require("luv") -- main thread, before the library
local ah = require("async_hooks")
local raw = { create = coroutine.create, resume = coroutine.resume, yield = coroutine.yield }
local co = variant == "raw" and raw or ah.coroutine
local v = ah.AsyncLocal.new()
local VARIANTS = { raw = true, installed = true, value = true, hooks = true, hooks_res = true,
  count = true, count_value = true, count_destroy = true }
assert(VARIANTS[variant], "unknown variant " .. tostring(variant))
assert(n and n >= 1, "n must be a positive integer")

local function with_value(f, ...)
  if variant == "value" or variant == "count_value" then return v:run(1, f, ...) end
  return f(...)
end
if variant ~= "raw" then ah.install() end
if variant == "hooks" then
  ah.createHook { init = function() end, before = function() end,
    after = function() end, destroy = function() end }:enable()
elseif variant == "hooks_res" then -- the same, but init can see its resource
  ah.createHook { init = function(_, _, _, _) end, before = function() end,
    after = function() end, destroy = function() end }:enable()
end
-- the counting hooks' events by kind (checked at the end)
local counted = { init = 0, before = 0, after = 0, destroy = 0 }
if variant == "count" or variant == "count_value" then
  ah.createHook {
    init = function() counted.init = counted.init + 1 end,
    before = function() counted.before = counted.before + 1 end,
    after = function() counted.after = counted.after + 1 end,
    destroy = function() counted.destroy = counted.destroy + 1 end,
  }:enable()
elseif variant == "count_destroy" then
  ah.createHook { destroy = function() counted.destroy = counted.destroy + 1 end }:enable()
end
-- what v:get() must return inside a callback or coroutine of the case
local expected = (variant == "value" or variant == "count_value") and 1 or nil

local cases = {}

--- luv 0 ms timer chain: each step re-arms the same timer, so every step is
-- one registration and one dispatch.
function cases.timer_chain()
  local t = uv.new_timer()
  local left, seen = n, "unset"
  local function step()
    left = left - 1
    if left <= 0 then seen = v:get(); t:close() return end
    t:start(0, 0, step)
  end
  t:start(0, 0, step)
  uv.run()
  assert(left == 0, "the chain ran every step")
  assert(seen == expected, ("callback saw %s, expected %s"):format(tostring(seen), tostring(expected)))
  return "steps=" .. n
end

--- A chain with a new timer per step, closed in its callback (what a
-- request's `sleep(0)` does): no re-arming of the same handle.
function cases.timer_new()
  local left, seen = n, "unset"
  local function step(t)
    t:close()
    left = left - 1
    if left <= 0 then seen = v:get() return end
    local t2 = uv.new_timer()
    t2:start(0, 0, function() step(t2) end)
  end
  local t = uv.new_timer()
  t:start(0, 0, function() step(t) end)
  uv.run()
  assert(left == 0, "the chain ran every step")
  assert(seen == expected, ("callback saw %s, expected %s"):format(tostring(seen), tostring(expected)))
  return "steps=" .. n
end

--- The same with an idle handle re-registered each step (next-tick style).
function cases.idle_chain()
  local t = uv.new_idle()
  local left, seen = n, "unset"
  local function step()
    left = left - 1
    if left <= 0 then seen = v:get(); t:stop(); t:close() return end
    t:start(step)
  end
  t:start(step)
  uv.run()
  assert(left == 0, "the chain ran every step")
  assert(seen == expected, ("callback saw %s, expected %s"):format(tostring(seen), tostring(expected)))
  return "steps=" .. n
end

--- The request path of the HTTP benchmark without its socket: per request a
-- coroutine (`wrap`), a value set in it (variant "value"; the others pass
-- the id by hand), a 0 ms sleep on a new timer and a file read through the
-- thread pool, each parked with the await idiom of examples/app.lua, then
-- the value read back.  Requests run one after another, in batches of 10.
-- request_coro, request_sleep and request_read do one part each (the
-- coroutine and its value always), to split the cost up.
local function request(sleep, read)
  local app = require("app")
  local fd = app.data_fd(64)
  local wrap = variant == "raw" and coroutine.wrap or ah.coroutine.wrap
  local set = variant == "value" or variant == "count_value"
  local lv = v
  local done, bad = 0, 0
  local function one(id)
    wrap(function()
      if set then lv:set(id) end
      if sleep then app.sleep(0) end
      local data = ("x"):rep(64)
      if read then data = select(2, app.await(function(k) uv.fs_read(fd, 64, 0, k) end)) end
      local got = set and lv:get() or id
      if got ~= id or #data ~= 64 then bad = bad + 1 end
      done = done + 1
    end)()
  end
  -- batches of 10 concurrent requests, each started from the main chunk
  -- with nothing set (as a server's read callback starts them)
  for b = 0, n - 1, 10 do
    for id = b + 1, math.min(n, b + 10) do one(id) end
    uv.run()
  end
  local left = n - done
  uv.fs_close(fd)
  assert(left == 0 and bad == 0, ("requests left %d, wrong %d"):format(left, bad))
  return "requests=" .. n
end
function cases.request() return request(true, true) end
function cases.request_coro() return request(false, false) end
function cases.request_sleep() return request(true, false) end
function cases.request_read() return request(false, true) end

--- resume/yield round trip of one coroutine.
function cases.switch()
  local seen = "unset"
  local c = co.create(function()
    local y = co.yield
    seen = v:get()
    while true do y() end
  end)
  local resume = co.resume
  for _ = 1, n do resume(c) end
  assert(seen == expected, ("coroutine saw %s, expected %s"):format(tostring(seen), tostring(expected)))
  return "round trips=" .. n
end

--- create + run a coroutine to completion.
function cases.lifecycle()
  local create, resume, f = co.create, co.resume, function(x) return x end
  for i = 1, n do resume(create(f), i) end
  local seen = "unset"
  resume(create(function() seen = v:get() end))
  assert(seen == expected, ("coroutine saw %s, expected %s"):format(tostring(seen), tostring(expected)))
  return "coroutines=" .. n
end

--- One set() in a fresh coroutine (its first frame), and the coroutine run
-- to completion; set_get reads it back before it ends.  Compared with
-- lifecycle under the same variant: the difference is what set() (and get())
-- cost a coroutine, its frame's anchoring, release and collection included.
local function set_in_fresh(read)
  local create, resume, lv = co.create, co.resume, v
  local f = read and function(i) lv:set(i); return lv:get() end
    or function(i) lv:set(i) end
  for i = 1, n do resume(create(f), i) end
  local ok, got = resume(create(function() lv:set(3); return lv:get() end))
  assert(ok and got == 3, "the coroutine read back its value")
  assert(v:get() == expected, "set in a coroutine stays in it")
  return "coroutines=" .. n
end
function cases.set_fresh() return set_in_fresh(false) end
function cases.set_get() return set_in_fresh(true) end

--- v:get() with a value set in the current frame ...
function cases.get()
  v:set(1)
  local x
  for _ = 1, n do x = v:get() end
  assert(x == 1)
  return "calls=" .. n
end

--- ... against the cheapest Lua equivalent: a method call returning a field,
-- `obj:m()` with `m` returning `self.x`, in the usual class idiom (`m` found
-- through the metatable's `__index`) ...
function cases.method()
  local C = {}
  C.__index = C
  function C:m() return self.x end
  local obj = setmetatable({ x = 1 }, C)
  local x
  for _ = 1, n do x = obj:m() end
  assert(x == 1)
  return "class method"
end

--- ... and with `m` an own field of the object (one lookup less).
function cases.method_own()
  local obj = { x = 1, m = function(self) return self.x end }
  local x
  for _ = 1, n do x = obj:m() end
  assert(x == 1)
  return "own field"
end

--- ... and the floor for any C `get()`: `obj:m()` with `m` a bare C
-- function of the standard library (rawlen) as an own field.
function cases.cfloor()
  local obj = { m = rawlen }
  local x
  for _ = 1, n do x = obj:m() end
  assert(x == 0)
  return "C function"
end

--- run(v, fn) against a plain call.
function cases.run()
  local f = function() end
  for i = 1, n do v:run(i, f) end
  return "calls=" .. n
end
function cases.call()
  local f = function() end
  for i = 1, n do f(i) end
  return "calls=" .. n
end

local fn = assert(cases[case], "unknown case " .. tostring(case))
local detail = case:match("^request") and fn() or with_value(fn)
if variant:match("^count") then
  -- every event reached the counting hooks: as many befores as afters,
  -- at least one event per operation
  collectgarbage()
  ah.flush()
  local total = counted.init + counted.before + counted.after + counted.destroy
  assert(counted.before == counted.after and total >= n,
    ("counting hooks saw init %d, before %d, after %d, destroy %d for n=%d")
      :format(counted.init, counted.before, counted.after, counted.destroy, n))
  detail = ("%s (events: init %d, before %d, after %d, destroy %d)"):format(detail,
    counted.init, counted.before, counted.after, counted.destroy)
end
io.stdout:write("CASE-OK ", tostring(detail), "\n")
