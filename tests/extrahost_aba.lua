-- review finding 4 (fallback mode, run by tests/extrahost.c): a thread
-- allocated at the address of a collected one whose slot was not reclaimed
-- yet must not inherit that slot's context (id, frame)
local ah = require("async_hooks")
local rawcreate, rawresume = coroutine.create, coroutine.resume
local v = ah.AsyncLocal.new()
v:set("A's value")
local bad, ids = 0, {}
for _ = 1, 2000 do
  local A = ah.coroutine.create(function() local _ = ah.executionAsyncId(); coroutine.yield() end)
  ah.coroutine.resume(A)
  A = nil
  collectgarbage(); collectgarbage()
  local C = rawcreate(function() return ah.executionAsyncId(), v:get() end)
  local _, id, val = rawresume(C)
  if val ~= nil or ids[id] then bad = bad + 1 end
  ids[id] = true
end
v:set(nil)
print("extrahost aba: wrong context in " .. bad .. " of 2000")
assert(bad == 0, "a new thread got a collected thread's context")
print("extrahost aba: ok")
