-- Shared by the luv specs (spec/06-luv_*_spec.lua).
local H = require("helpers")
local assert = require("luassert")
local L = {}

-- A registration made while nothing but a frame observes it (no hook
-- enabled, executionAsyncResource() never called) takes a path of its own;
-- the busted process leaves that state when a spec first calls
-- executionAsyncResource(), so these cases run in a fresh process, after
-- this prelude: luv, its own uv.run taken before install(), the library
-- installed, an AsyncLocal `v` (default "clean") and `fd`, a file open for
-- reading that holds "abc".
L.PRELUDE = [[
      local uv = require("luv")
      package.loaded["luv.rawrun"] = uv.run -- luv's own, taken before install
      local ah = require("async_hooks").install()
      local core = require("async_hooks.core")
      local v = ah.AsyncLocal.new { default = "clean" }
      local path = os.tmpname()
      local f = assert(io.open(path, "w")); f:write("abc"); f:close()
      local fd = assert(uv.fs_open(path, "r", 420))
      os.remove(path)
]]

--- Run `code` after the prelude in a fresh process and check its output
-- (`H.lua_ok`).
function L.fresh(code, expected, what)
  return H.lua_ok(L.PRELUDE .. code, expected, what)
end

--- A hook, enabled and given to `track`, that logs every event as
-- `{ "init", id, type }`, `{ "before", id }`, ...; returns the log and the
-- type of each id.
function L.recorder(track)
  local ah = require("async_hooks")
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

--- Checks that every before/after of an id comes after its init and before
-- its destroy; returns each followed id's state ("live" or "dead").
function L.check_order(log)
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

return L
