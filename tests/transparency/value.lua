-- Transparency mode "value": installed, and an AsyncLocal with a value set
-- at top level, so that every coroutine and luv callback of the test runs
-- in a context that carries it.  The frames hold values by AsyncLocal
-- (weakly): the AsyncLocal stays reachable the way an application's does,
-- from its loaded module (this one's package.loaded entry), and nothing
-- else is kept.
local ah = require("async_hooks").install()
local current = ah.AsyncLocal.new({ name = "transparency" })
current:set({ request = 1 })
return current
