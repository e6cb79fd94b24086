-- Transparency mode "empty hooks": installed, and a hook with the four
-- callbacks enabled, each doing nothing (an init that cannot see its fourth
-- argument, so no resource is made for it).  The library holds the hook.
local ah = require("async_hooks").install()
local function nothing() end
ah.createHook({ init = nothing, before = nothing, after = nothing, destroy = nothing }):enable()
