-- Fault-injection workload (spec/11): an enable() and then a disable() of
-- the same hook from inside a hook, where the disable() may fail for lack
-- of memory.  Both changes are pending until the dispatch ends; a failed
-- one must change nothing, so the next events still find hooks that match
-- their counts (a half-written count once made the next `before` call
-- `false` as the only hook: found by a review).
local ah, r, h1, h2, armed
local function noop() end
return {
  setup = function()
    ah = require("async_hooks")
    r = ah.AsyncResource.new("R")
    h2 = ah.createHook { before = noop }
    h1 = ah.createHook { before = function()
      if not armed then return end
      armed = false
      h2:enable()           -- inside a dispatch: pending until its end
      pcall(h2.disable, h2) -- may fail for lack of memory: must change nothing
    end }
    h1:enable()
  end,
  work = function()
    armed = true
    r:runInAsyncScope(noop)
  end,
  check = function()
    -- before events with whatever the failed run left
    r:runInAsyncScope(noop)
    r:runInAsyncScope(noop)
  end,
}
