-- Transparency mode "resource hooks": installed, and a hook whose init takes
-- the resource (four parameters: the library makes a resource for every
-- coroutine and registration), whose before/after ask for
-- executionAsyncResource() and check it, plus a destroy.  Nothing is kept:
-- the results go to locals of the hook functions only.  The library holds
-- the hook.
local ah = require("async_hooks").install()
local executionAsyncResource = ah.executionAsyncResource
local type, error = type, error
local function check(asyncId)
  local resource = executionAsyncResource()
  if type(resource) ~= "table" and type(resource) ~= "userdata" then
    error("executionAsyncResource() in a hook of " .. asyncId .. ": " .. type(resource))
  end
end
ah.createHook({
  init = function(asyncId, type_, triggerAsyncId, resource) -- luacheck: no unused
    local _ = resource
  end,
  before = check,
  after = check,
  destroy = function(asyncId) end, -- luacheck: no unused
}):enable()
