-- A coroutine reachable only from an object with a finalizer: Lua clears
-- weak values (the library's thread-by-slot table) before it resurrects
-- the objects to finalize, and the finalizer here resumes the coroutine to
-- its end.  Giving its slot back must not fail (in fallback mode the
-- thread-keyed lookup entry cannot be found through the cleared table),
-- and the slots must all come back.  Run by spec/11 through extrahost.
local ah = require("async_hooks").install()
local core = require("async_hooks.core")
local co = ah.coroutine
local log = {}
ah.createHook { destroy = function(id) log[#log + 1] = "destroy " .. id end }:enable()
local function flush() co.resume(co.create(function() end)) end -- a delivery point
do
  local c = co.create(function() co.yield(); log[#log + 1] = "resumed" end)
  co.resume(c)
  setmetatable({ c = c }, { __gc = function(o) assert(co.resume(o.c)) end })
end
collectgarbage()
collectgarbage()
collectgarbage()
flush()
collectgarbage()
collectgarbage()
flush()
local resumed = 0
for _, l in ipairs(log) do if l == "resumed" then resumed = resumed + 1 end end
assert(resumed == 1, table.concat(log, ", "))
assert(core.stats().slots == 1, "slots in use: " .. core.stats().slots)
print("extrahost resurrect: ok")
