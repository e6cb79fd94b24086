--- Runs bench/hookcall.c's loop under callgrind (see bench/http_instr.lua):
--   lua5.4 bench/hookcall.lua <each|bare> <n>
-- n calls from C of a hook that counts its events, like the HTTP bench's.
local hookcall = require("hookcall")
local mode, n = arg[1], assert(math.tointeger(tonumber(arg[2])), "n")
local events = 0
local hook = { function() events = events + 1 end }
assert(hookcall[mode], "mode: each or bare")(hook, n)
assert(events == n, "the hook did not run n times")
